"""Train a small random Llama on one GPU, the same initial weights, data and seed for each variant:
HF eager (`hf`), HF + torch.compile of the whole model (`hf_compile`), HF patched by epic.integrations
(`epic`: the fused kernels, fallback="never"), the patched model under torch.compile (`epic_compile`) and Liger (`liger`: apply_liger_kernel_to_llama on the
model; skipped with a note where it is not installed). Writes a JSON with each variant's loss curve,
|loss - HF eager's loss| at each step and its maximum, the median step time after warm-up, peak memory
(torch.cuda.max_memory_allocated) and, per parameter, the gradient after step 1 against HF eager's
(max |g - g_hf| / max |g_hf|); prints a short table.

  python bench/train_llama.py [--steps 50] [--layers 4] [--variants hf,hf_compile,epic,epic_compile,liger] [--chunk-rows N]
                              [--loss-policy fused|save] [--out F.json]
  python bench/train_llama.py --prebuild        # build epic's kernels for these sizes only (nvcc, no GPU)
  python bench/train_llama.py --device cpu ...  # a smoke run (epic's unfused torch form; no peak memory)

epic's kernels build first, all at once (about 2-3 minutes on 16 cores when the cache is cold; or
prebuild them into EPIC_CACHE_DIR on any machine with nvcc and carry the cache over). The defaults run
in a few minutes on one H200. Liger patches functions of transformers' Llama module, not only the
model; they are put back after its run, so the order of the variants does not matter.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic.integrations  # noqa: E402
from epic.integrations import programs  # noqa: E402

VARIANTS = ("hf", "hf_compile", "epic", "epic_compile", "liger")
ALIASES = {"compile": "hf_compile"}       # the name older commands used


def add_model_args(ap, steps: int, warmup: int) -> None:
    """The model, data and training options this script and bench/fsdp2_gpus.py share."""
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=warmup, help="steps left out of the median step time")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap, steps=50, warmup=5)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="hf (HF eager) always runs: the others compare with it")
    ap.add_argument("--chunk-rows", type=int, default=None,
                    help="epic's LM head backward on this many tokens at a time (apply_epic_to_llama's chunk_rows)")
    ap.add_argument("--loss-policy", default="fused", choices=("fused", "save"),
                    help="epic's LM head: gradients computed in the forward (fused) or by a backward program (save)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke run, epic through its unfused torch form")
    ap.add_argument("--out", default="train_llama.json")
    ap.add_argument("--prebuild", action="store_true", help="only build epic's kernels (no GPU needed)")
    args = ap.parse_args(argv)
    names = [ALIASES.get(v, v) for v in args.variants.split(",") if v]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    args.variants = ["hf"] + [v for v in dict.fromkeys(names) if v != "hf"]   # HF eager first: the others compare with it
    if args.warmup >= args.steps:
        ap.error("--warmup must be below --steps")
    return args


def config(args):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, num_key_value_heads=args.heads, vocab_size=args.vocab,
                       max_position_embeddings=args.seq, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def _launches(f, rows: int, chunk_rows: int | None) -> list:
    """[(compiled program, the row counts it runs at)] of an epic.autograd function: a forward and a
    backward program (the backward on each chunk's rows), or a fused loss (policy "fused": one program
    computing the gradients too; with chunks, its first chunk and a variant for the later ones)."""
    if f.backward is not None:
        chunks = sorted({min(chunk_rows, rows), rows % chunk_rows} - {0}) if chunk_rows else [rows]
        return [(f.forward, [rows]), (f.backward, chunks)]
    if not chunk_rows or rows <= chunk_rows:
        return [(f.forward, [rows])]
    return [(f.forward, [chunk_rows]), (f.later, sorted({chunk_rows, rows % chunk_rows} - {0}))]


def build_epic_kernels(cfg, rows: int, chunk_rows: int | None = None, loss_policy: str = "fused") -> float:
    """Every kernel the patched model launches (each program at each row count it runs at), in one
    parallel nvcc run instead of one program at a time on first use; returns the seconds it took."""
    from epic.runtime import build
    dims = dict(M=rows, E=cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads),
                D=cfg.hidden_size, F=cfg.intermediate_size, V=cfg.vocab_size)
    units = []
    for f, chunks in ((programs.decoder_mlp(float(cfg.rms_norm_eps), "never"), None),
                      (programs.lm_head_loss("never", chunk_rows, loss_policy), chunk_rows)):
        for prog, counts in _launches(f, rows, chunks):
            for m in counts:
                sizes = {k: v for k, v in {**dims, "M": m}.items() if k in prog.program.dims}
                units += [u for _, u in prog.units(sizes)]
    units = list({(u.name, u.source): u for u in units}.values())     # chunks of two row counts share some
    t = time.perf_counter()
    build.build_all(units)              # one nvcc per core, as memory allows
    return time.perf_counter() - t


def batches(args):
    """The same token batches for every variant; the first 64 tokens of each sequence are a prompt
    that is not trained on (label -100), as in instruction tuning."""
    g = torch.Generator().manual_seed(args.seed + 1)
    out = []
    prompt = min(64, args.seq // 2)
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        labels = ids.clone()
        labels[:, :prompt] = -100
        out.append((ids.to(args.device), labels.to(args.device)))
    return out


@contextlib.contextmanager
def llama_module_kept():
    """Puts back what a patch set on transformers' Llama module and classes (Liger's
    apply_liger_kernel_to_llama replaces the RoPE function, the RMSNorm and MLP classes and, without
    a model, LlamaForCausalLM.forward for every model made afterwards)."""
    from transformers.models.llama import modeling_llama as m
    module = dict(vars(m))
    forward = m.LlamaForCausalLM.forward
    try:
        yield
    finally:
        for name in set(vars(m)) - set(module):
            delattr(m, name)
        for name, value in module.items():
            if vars(m).get(name) is not value:
                setattr(m, name, value)
        m.LlamaForCausalLM.forward = forward


def make_model(cfg, init_state, variant, device, chunk_rows=None, loss_policy="fused"):
    from transformers import LlamaForCausalLM
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.load_state_dict(init_state)
    run = model
    if variant == "hf_compile":
        run = torch.compile(model)
    elif variant in ("epic", "epic_compile"):
        epic.integrations.apply_epic_to_llama(model, fallback="never" if device == "cuda" else "eager",
                                              chunk_rows=chunk_rows, loss_policy=loss_policy)
        if variant == "epic_compile":        # attention and the norms compiled, epic's programs as custom ops
            run = torch.compile(model)
    elif variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama(model=model)
    return model, run


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(cfg, init_state, data, args, variant, reference):
    """(result, gradients after step 1); reference: HF eager's (result, gradients), None for HF eager."""
    model, run = make_model(cfg, init_state, variant, args.device, args.chunk_rows, args.loss_policy)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, times, grads = [], [], None
    for step, (ids, labels) in enumerate(data):
        _sync(args.device)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = run(input_ids=ids, labels=labels).loss
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        _sync(args.device)
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    result = {"loss": losses, "step_ms": 1e3 * statistics.median(times[args.warmup:]), "first_step_s": times[0],
              "max_memory_allocated": torch.cuda.max_memory_allocated() if args.device == "cuda" else None}
    if reference is not None:
        ref_result, ref_grads = reference
        diff = [abs(a - b) for a, b in zip(losses, ref_result["loss"])]
        result["loss_abs_diff"] = diff
        result["max_loss_abs_diff"] = max(diff)
        result["grad_rel_diff"] = {n: ((g.float() - ref_grads[n].float()).abs().max()
                                       / ref_grads[n].float().abs().max().clamp_min(1e-30)).item()
                                   for n, g in grads.items()}
    del model, run, opt
    return result, grads


def table(results: dict) -> str:
    rows = [f"{'variant':<11} {'loss[0]':>8} {'loss[-1]':>9} {'max |dloss|':>11} {'step ms':>8} {'peak GiB':>9} "
            f"{'max grad diff':>14}"]
    nan = float("nan")
    for name, r in results.items():
        if "error" in r:
            rows.append(f"{name:<11} {r['error'][:90]}")
            continue
        diff = max(r["grad_rel_diff"].values()) if "grad_rel_diff" in r else nan
        peak = r["max_memory_allocated"] / 2**30 if r["max_memory_allocated"] is not None else nan
        rows.append(f"{name:<11} {r['loss'][0]:>8.4f} {r['loss'][-1]:>9.4f} {r.get('max_loss_abs_diff', nan):>11.2e} "
                    f"{r['step_ms']:>8.1f} {peak:>9.2f} {diff:>14.2e}")
    return "\n".join(rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = config(args)
    report = {"config": {k: getattr(args, k) for k in ("steps", "warmup", "layers", "hidden", "intermediate", "heads",
                                                       "vocab", "seq", "batch", "lr", "seed", "chunk_rows",
                                                       "loss_policy", "device")},
              "variants_asked": args.variants}
    if args.prebuild or ({"epic", "epic_compile"} & set(args.variants) and args.device == "cuda"):
        report["epic_build_s"] = build_epic_kernels(cfg, args.batch * args.seq, args.chunk_rows, args.loss_policy)
        print(f"epic kernels built in {report['epic_build_s']:.0f} s", flush=True)
        if args.prebuild:
            return 0
    report["gpu"] = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    torch.manual_seed(args.seed)
    from transformers import LlamaForCausalLM
    init_state = {k: v.to(args.device) for k, v in LlamaForCausalLM(cfg).to(torch.bfloat16).state_dict().items()}
    data = batches(args)
    results, reference = {}, None
    for variant in args.variants:
        torch.manual_seed(args.seed)
        try:
            with llama_module_kept():
                results[variant], grads = train(cfg, init_state, data, args, variant, reference)
        except ImportError as e:
            results[variant] = {"error": f"not installed: {e}"}
            continue
        except Exception as e:                                 # recorded: the other variants still run
            results[variant] = {"error": f"{type(e).__name__}: {e}"}
            continue
        finally:
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
        if variant == "hf":
            reference = (results[variant], grads)
        print(f"{variant}: loss {results[variant]['loss'][0]:.4f} -> {results[variant]['loss'][-1]:.4f}, "
              f"{results[variant]['step_ms']:.1f} ms/step", flush=True)
    report["variants"] = results
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
