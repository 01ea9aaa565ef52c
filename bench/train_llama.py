"""Train a small random Llama on one GPU, the same data and seed for each variant: HF eager, HF +
torch.compile, HF patched by epic.integrations (the fused kernels, fallback="never"), and Liger where
it is installed. Writes a JSON with each variant's loss curve, mean step time after warm-up, peak
memory (torch.cuda.max_memory_allocated) and, per parameter, the gradient after step 1 against HF
eager's (max |g - g_hf| / max |g_hf|); prints a short table.

  python bench/train_llama.py [--steps 50] [--layers 4] [--variants hf,compile,epic,liger] [--chunk-rows N]
                              [--out F.json]
  python bench/train_llama.py --prebuild        # build epic's kernels for these sizes only (nvcc, no GPU)

epic's kernels build first, all at once (about 2-3 minutes on 16 cores when the cache is cold; or
prebuild them into EPIC_CACHE_DIR on any machine with nvcc and carry the cache over). The defaults run
in a few minutes on one H200.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic.integrations  # noqa: E402
from epic.integrations import programs  # noqa: E402

VARIANTS = ("hf", "compile", "epic", "liger")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the mean step time")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="hf (HF eager) always runs: the others compare with it")
    ap.add_argument("--chunk-rows", type=int, default=None,
                    help="epic's LM head backward on this many tokens at a time (apply_epic_to_llama's chunk_rows)")
    ap.add_argument("--out", default="train_llama.json")
    ap.add_argument("--prebuild", action="store_true", help="only build epic's kernels (no GPU needed)")
    args = ap.parse_args(argv)
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    if args.warmup >= args.steps:
        ap.error("--warmup must be below --steps")
    return args


def config(args):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, num_key_value_heads=args.heads, vocab_size=args.vocab,
                       max_position_embeddings=args.seq, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def build_epic_kernels(cfg, rows: int, chunk_rows: int | None = None) -> float:
    """Every kernel the patched model launches (both programs, forward and backward; a chunked
    backward at each chunk's row count), in one parallel nvcc run instead of one program at a time
    on first use; returns the seconds it took."""
    from epic.runtime import build
    dims = dict(M=rows, E=cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads),
                D=cfg.hidden_size, F=cfg.intermediate_size, V=cfg.vocab_size)
    chunks = sorted({min(chunk_rows, rows), rows % chunk_rows} - {0}) if chunk_rows else [rows]
    units = []
    for f, backward_rows in ((programs.decoder_mlp(float(cfg.rms_norm_eps), "never"), [rows]),
                             (programs.lm_head_loss("never", chunk_rows), chunks)):
        for prog, counts in ((f.forward, [rows]), (f.backward, backward_rows)):
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
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        labels = ids.clone()
        labels[:, :64] = -100
        out.append((ids.cuda(), labels.cuda()))
    return out


def make_model(cfg, init_state, variant, chunk_rows=None):
    from transformers import LlamaForCausalLM
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.load_state_dict(init_state)
    run = model
    if variant == "compile":
        run = torch.compile(model)
    elif variant == "epic":
        epic.integrations.apply_epic_to_llama(model, fallback="never", chunk_rows=chunk_rows)
    elif variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama(model=model)
    return model, run


def train(cfg, init_state, data, args, variant, reference_grads):
    model, run = make_model(cfg, init_state, variant, args.chunk_rows)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    torch.cuda.reset_peak_memory_stats()
    losses, times, grads = [], [], None
    for step, (ids, labels) in enumerate(data):
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = run(input_ids=ids, labels=labels).loss
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    result = {"loss": losses, "step_ms": 1e3 * sum(times[args.warmup:]) / len(times[args.warmup:]),
              "first_step_s": times[0], "max_memory_allocated": torch.cuda.max_memory_allocated()}
    if reference_grads is not None:
        result["grad_rel_diff"] = {n: ((g.float() - reference_grads[n].float()).abs().max()
                                       / reference_grads[n].float().abs().max().clamp_min(1e-30)).item()
                                   for n, g in grads.items()}
    del model, run, opt
    return result, grads


def table(results: dict) -> str:
    rows = [f"{'variant':<9} {'loss[0]':>8} {'loss[-1]':>9} {'step ms':>8} {'peak GiB':>9} {'max grad diff':>14}"]
    for name, r in results.items():
        if "error" in r:
            rows.append(f"{name:<9} {r['error'][:70]}")
            continue
        diff = max(r["grad_rel_diff"].values()) if "grad_rel_diff" in r else float("nan")
        rows.append(f"{name:<9} {r['loss'][0]:>8.4f} {r['loss'][-1]:>9.4f} {r['step_ms']:>8.1f} "
                    f"{r['max_memory_allocated'] / 2**30:>9.2f} {diff:>14.2e}")
    return "\n".join(rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = config(args)
    variants = args.variants.split(",")
    report = {"config": {k: getattr(args, k) for k in ("steps", "warmup", "layers", "hidden", "intermediate", "heads",
                                                       "vocab", "seq", "batch", "lr", "seed", "chunk_rows")}}
    if args.prebuild or "epic" in variants:
        report["epic_build_s"] = build_epic_kernels(cfg, args.batch * args.seq, args.chunk_rows)
        print(f"epic kernels built in {report['epic_build_s']:.0f} s", flush=True)
        if args.prebuild:
            return 0
    report["gpu"] = torch.cuda.get_device_name()
    torch.manual_seed(args.seed)
    from transformers import LlamaForCausalLM
    init_state = {k: v.cuda() for k, v in LlamaForCausalLM(cfg).to(torch.bfloat16).state_dict().items()}
    data = batches(args)
    results, reference = {}, None
    for variant in ["hf"] + [v for v in variants if v != "hf"]:   # HF eager first: the others compare with it
        torch.manual_seed(args.seed)
        try:
            results[variant], grads = train(cfg, init_state, data, args, variant, reference)
        except ImportError as e:
            results[variant] = {"error": f"not installed: {e}"}
            continue
        except Exception as e:                                 # recorded: the other variants still run
            results[variant] = {"error": f"{type(e).__name__}: {e}"}
            continue
        finally:
            gc.collect()
            torch.cuda.empty_cache()
        if variant == "hf":
            reference = grads
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
