"""Benchmark on one GPU: per workload and M, the bare cuBLAS GEMM, eager torch, torch.compile and
epic, as median ms (triton do_bench, L2 flushed) and ratios to the bare GEMM in the same run.

  python bench/bench.py [--rows 64,8192] [--work resid_norm,bias_gelu,...] [--no-compile]
                        [--configs coop_128x256x64_c2x1,pp_128x128x64_c1x2,...] [--out results.json]

Workloads follow ../shared/anchors/torch_baselines.py (Llama-3-8B shapes, bf16). Kernels come from
the epic cache (EPIC_CACHE_DIR); build them ahead on a CPU machine with bench/prebuild.py.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
D, DFF, DQKV, VOCAB = 4096, 14336, 6144, 128256
bf = torch.bfloat16


@contextlib.contextmanager
def nodes_from(directory: str | None):
    """Kernels generated inside read epic's custom node headers (templates/nodes: epic_nodes/*.hpp)
    from `directory` instead of the package's, e.g. another commit's, written out with
    `git archive HEAD templates/nodes | tar -x -C DIR --strip-components 2`. The generated source
    prints the headers it uses, so its cache key (and library) is its own: an A/B of a node change in
    one process. None: the package's headers."""
    from epic.codegen import emit
    if directory is None:
        yield
        return
    root = Path(directory)
    if not (root / "epic_nodes").is_dir():
        raise SystemExit(f"--nodes-from {directory}: no epic_nodes/ in it")
    with mock.patch.object(emit, "_header_file", lambda name: (root / name).read_text()):
        yield


@contextlib.contextmanager
def combine_rows(rows: int | None, in_flight: int | None = None):
    """Combine kernels generated inside merge `rows` rows (columns) per warp from the first one on:
    combine.py's grouped form with kGroupFrom = 0 and kRowsPerWarp = rows (1: a warp per row), and
    with in_flight given, kInFlight = in_flight loads at once per lane. The constants are printed into
    the kernel, so its cache key (and library) is its own: an A/B of the rows per warp, of the loads in
    flight and of where grouping should start, in one process. Combines without the grouped form (a
    whole-tensor combine, one finishing tiles) are generated as they are. None: unchanged."""
    from epic.codegen import emit
    if rows is None:
        yield
        return
    if rows < 1 or 32 % rows:
        raise SystemExit(f"rows{rows}: the rows a warp merges must divide 32")
    if in_flight is not None and not 1 <= in_flight <= 64:
        raise SystemExit(f"rows{rows}x{in_flight}: from 1 to 64 loads in flight")
    original = emit.render_combine

    def render(spec):
        text = original(spec)
        text = re.sub(r"constexpr int kGroupFrom = \d+;", "constexpr int kGroupFrom = 0;", text)
        if in_flight is not None:
            text = re.sub(r"constexpr int kInFlight = \d+;", f"constexpr int kInFlight = {in_flight};", text)
        return re.sub(r"constexpr int kRowsPerWarp = \d+;", f"constexpr int kRowsPerWarp = {rows};", text)
    with mock.patch.object(emit, "render_combine", render):
        yield


@contextlib.contextmanager
def unfused_combines(on: bool = True):
    """Grouped combine kernels generated inside merge each reduction in a loop of its own (combine.py's
    FUSE_LOOPS off), as before one loop merged them all: the `unfused` candidate. off: unchanged."""
    from epic.codegen import combine
    with mock.patch.object(combine, "FUSE_LOOPS", not on):
        yield


@contextlib.contextmanager
def unpicked_combines(on: bool = True):
    """Programs compiled inside merge a picked column's partials from every tile, as before the combine
    read only the tile of the label (split_reductions.PICK off): the `unpicked` candidate."""
    from epic.passes import split_reductions
    with mock.patch.object(split_reductions, "PICK", not on):
        yield


# labels of the default configuration compiled anew with its combine kernels changed
COMBINE_VARIANTS = {"unfused": unfused_combines, "unpicked": unpicked_combines}


def variant_list(text: str) -> list[str]:
    """An argparse type: comma-separated COMBINE_VARIANTS labels (prebuild.py's --combine-variants,
    sustained.py's --variants)."""
    labels = [v for v in text.split(",") if v]
    unknown = sorted(set(labels) - set(COMBINE_VARIANTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)} (known: {', '.join(COMBINE_VARIANTS)})")
    return labels


def combine_variant(label: str):
    """The context of a COMBINE_VARIANTS label; any other label: unchanged."""
    return COMBINE_VARIANTS[label]() if label in COMBINE_VARIANTS else contextlib.nullcontext()


def combine_rows_label(label: str) -> tuple[int, int | None] | None:
    """combine_rows's arguments for a `rowsR` or `rowsRxF` candidate label (rows1, rows4, rows8x16: 8
    rows per warp, 16 loads in flight per lane), else None."""
    m = re.fullmatch(r"rows(\d+)(?:x(\d+))?", label)
    return (int(m.group(1)), int(m.group(2)) if m.group(2) else None) if m else None


def bench(fn):
    import triton.testing as tt
    fn()
    torch.cuda.synchronize()
    return tt.do_bench(fn, warmup=25, rep=200, return_mode="median")


def host_us(fn, n=200):
    """Host time per call: n calls without synchronizing (the GPU queue absorbs them)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


def graphed(fn):
    """fn captured in a CUDA graph (static buffers): its replay has no host overhead."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def rand(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(bf)


def weight(k, n):
    """A [K, N] operand laid out K-major, as nn.Linear keeps W[N, K] (passed as W.t())."""
    return rand(n, k, scale=k ** -0.5).t()


# Each workload: (epic program, function M -> (gemm, eager, epic_args, gemm_shapes))
def w_resid_norm(m):
    x, wo, z, g = rand(m, D), weight(D, D), rand(m, D), rand(D)
    def gemm(): return x @ wo
    def eager():
        h = x @ wo + z
        return h, h * g, torch.rsqrt(h.float().pow(2).mean(-1) + 1e-6)
    return gemm, eager, dict(x=x, wo=wo, z=z, gamma=g)


def w_resid_parts(*names):
    """residual + RMSNorm's operands, only those named (a program refuses arguments it does not declare)."""
    def make(m):
        x, wo, z, g = rand(m, D), weight(D, D), rand(m, D), rand(D)
        def gemm(): return x @ wo
        def eager(): return x @ wo
        return gemm, eager, dict(x=x, wo=wo, **{k: v for k, v in dict(z=z, gamma=g).items() if k in names})
    return make


def w_bias_gelu(m, n=DFF):
    x, w, b = rand(m, D), weight(D, n), rand(n)
    def gemm(): return x @ w
    def eager(): return F.gelu(x @ w + b, approximate="tanh")
    return gemm, eager, dict(x=x, w=w, bias=b)


def w_rope(m):
    x, w = rand(m, D), weight(D, DQKV)
    pos = (torch.arange(m, device="cuda") % 4096).float()
    inv = 1.0 / (500000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
    freq = inv.repeat_interleave(2).repeat(DQKV // 128)
    freq[D + 1024:] = 0
    cos, sin = (pos[:, None] * inv[None, :]).cos(), (pos[:, None] * inv[None, :]).sin()
    def gemm(): return x @ w
    def eager():
        h = x @ w
        qk = h[:, : D + 1024].unflatten(-1, (-1, 64, 2)).float()
        a, b = qk[..., 0], qk[..., 1]
        c, s = cos[:, None, :], sin[:, None, :]
        rot = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(1).to(bf)
        return torch.cat((rot, h[:, D + 1024:]), 1)
    return gemm, eager, dict(x=x, wqkv=w, pos=pos, freq=freq)


def w_qk_norm(m):
    """Qwen3-style Q projection: per-head RMSNorm (head 128) with a shared gamma, then RoPE on
    interleaved pairs (samples/qk_norm_rope.epi), at Llama-3-8B's 32 heads of 128."""
    x, w = rand(m, D), weight(D, D)
    gamma = (1 + 0.1 * torch.randn(128, device="cuda")).to(bf)
    pos = (torch.arange(m, device="cuda") % 4096).float()
    inv = 1.0 / (500000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
    freq = inv.repeat_interleave(2)
    cos, sin = (pos[:, None] * inv[None, :]).cos(), (pos[:, None] * inv[None, :]).sin()
    def gemm(): return x @ w
    def eager():
        h = (x @ w).unflatten(-1, (-1, 128)).float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.float()
        a, b = h[..., 0::2], h[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(1).to(bf)
    return gemm, eager, dict(x=x, wq=w, pos=pos, gamma=gamma, freq=freq)


def w_qk_parts(*names):
    """QK-norm + RoPE's operands (w_qk_norm), only those named."""
    def make(m):
        gemm, eager, inputs = w_qk_norm(m)
        return gemm, gemm, {k: v for k, v in inputs.items() if k in ("x", "wq") + names}
    return make


def w_prenorm_half(m):
    x, w0, w1, z, g = rand(m, D), weight(D, D), weight(D, 2 * DFF), rand(m, D), rand(D)
    n0 = rand(m, D)
    def gemm():   # the two bare GEMMs of the chain
        return x @ w0, n0 @ w1
    def eager():
        h = x @ w0 + z
        return h, F.rms_norm(h, (D,), g, 1e-6) @ w1
    return gemm, eager, dict(attn=x, wo=w0, z=z, gamma=g, wgu=w1)


def w_swiglu(m):
    """gate/up + SwiGLU on interleaved (gate, up) columns: N = 2 x 14336 -> 14336."""
    x, w = rand(m, D), weight(D, 2 * DFF)
    def gemm(): return x @ w
    def eager():
        h = x @ w
        return F.silu(h[:, 0::2]) * h[:, 1::2]
    return gemm, eager, dict(x=x, wgu=w)


def w_xent(m):
    """LM head + cross entropy (V = 128256); epic writes no logits."""
    x, w = rand(m, D), weight(D, VOCAB)
    y = torch.randint(0, VOCAB, (m,), device="cuda")
    y32 = y.to(torch.int32)
    def gemm(): return x @ w
    def eager(): return F.cross_entropy((x @ w).float(), y, reduction="none")
    return gemm, eager, dict(x=x, w=w, label=y32)


def w_xent_parts(*names):
    """LM head + cross entropy's operands (w_xent), only those named."""
    def make(m):
        gemm, eager, inputs = w_xent(m)
        return gemm, eager, {k: v for k, v in inputs.items() if k in ("x", "w") + names}
    return make


def w_fp8_quant(m):
    """1x128 block-scaled e4m3 write-back (DeepSeek-style) of x @ W, N = 4096."""
    x, w = rand(m, D), weight(D, D)
    def gemm(): return x @ w
    def eager():
        h = (x @ w).float().unflatten(-1, (-1, 128))
        s = h.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
        return (h / s).clamp(-448, 448).to(torch.float8_e4m3fn).flatten(1), s.squeeze(-1)
    return gemm, eager, dict(x=x, w=w)


def w_prenorm_mlp(m):
    """The whole pre-norm Llama MLP block: o_proj + residual -> RMSNorm -> gate/up -> SwiGLU -> down + residual."""
    a, wo, z, g = rand(m, D), weight(D, D), rand(m, D), rand(D)
    wgu, wd = weight(D, 2 * DFF), weight(DFF, D)
    n0, a0 = rand(m, D), rand(m, DFF)
    def gemm():   # the three bare GEMMs of the chain
        return a @ wo, n0 @ wgu, a0 @ wd
    def eager():
        h = a @ wo + z
        u = F.rms_norm(h, (D,), g, 1e-6) @ wgu
        return F.silu(u[:, 0::2]) * u[:, 1::2] @ wd + h
    return gemm, eager, dict(attn=a, wo=wo, z=z, gamma=g, wgu=wgu, wd=wd)


def w_plain(m, n=D, k=D):
    x, w = rand(m, k), weight(k, n)
    def gemm(): return x @ w
    def eager(): return x @ w
    return gemm, eager, dict(x=x, w=w)


WORK = {
    "resid_norm": ("samples/residual_rmsnorm.epi", w_resid_norm),
    "bias_gelu": ("samples/bias_gelu.epi", w_bias_gelu),
    # the same at N = 4096, where the heuristic's tile depends on the GPU (plan/gpus.py)
    "bias_gelu_4096": ("samples/bias_gelu.epi", lambda m: w_bias_gelu(m, D)),
    "rope": ("samples/rope.epi", w_rope),
    "qk_norm": ("samples/qk_norm_rope.epi", w_qk_norm),
    "prenorm_half": ("bench/programs/prenorm_half.epi", w_prenorm_half),
    "swiglu": ("samples/swiglu.epi", w_swiglu),
    "xent": ("samples/cross_entropy.epi", w_xent),
    "fp8_quant": ("samples/fp8_block_quant.epi", w_fp8_quant),
    "prenorm_mlp": ("samples/prenorm_mlp.epi", w_prenorm_mlp),
    "plain": ("bench/programs/plain.epi", w_plain),
    # the same identity epilogue at the other workloads' shapes: epic's mainloop alone, per shape
    "plain_qkv": ("bench/programs/plain.epi", lambda m: w_plain(m, DQKV)),
    "plain_ffn": ("bench/programs/plain.epi", lambda m: w_plain(m, DFF)),
    "plain_gate_up": ("bench/programs/plain.epi", lambda m: w_plain(m, 2 * DFF)),
    "plain_vocab": ("bench/programs/plain.epi", lambda m: w_plain(m, VOCAB)),
    # the MLP block's down gemm (K = F, N = D): on an H100 the default tile there loses most back to back
    "plain_down": ("bench/programs/plain.epi", lambda m: w_plain(m, D, DFF)),
    # N = 2048: another N whose default tile depends on the GPU (plan/gpus.py)
    "plain_n2048": ("bench/programs/plain.epi", lambda m: w_plain(m, D // 2)),
    # N = K = 4096's 32 MB of weights as K / 2 x 2 N and K / 4 x 4 N: a decode gemm's time with its
    # K split over 2 or 4 times the CTAs (what a split-K inside a cluster would read per CTA)
    "plain_k2048": ("bench/programs/plain.epi", lambda m: w_plain(m, 2 * D, D // 2)),
    "plain_k1024": ("bench/programs/plain.epi", lambda m: w_plain(m, 4 * D, D // 4)),
    # gate/up's N = 28672 with K / 4 and 4 K: 16 or 256 k-blocks per tile instead of 64. As a ratio, a gap
    # to a peer that is a fixed cost per tile shrinks as K grows; one in the k-loop does not
    "plain_gate_up_k1024": ("bench/programs/plain.epi", lambda m: w_plain(m, 2 * DFF, D // 4)),
    "plain_gate_up_k16384": ("bench/programs/plain.epi", lambda m: w_plain(m, 2 * DFF, 4 * D)),
    # residual + RMSNorm's parts one at a time: what each costs a decode epilogue
    "parts_z": ("bench/programs/parts_z.epi", w_resid_parts("z")),
    "parts_gamma": ("bench/programs/parts_gamma.epi", w_resid_parts("gamma")),
    "parts_two_outs": ("bench/programs/parts_two_outs.epi", w_resid_parts("z")),
    "parts_row_stat": ("bench/programs/parts_row_stat.epi", w_resid_parts()),
    "parts_no_stat": ("bench/programs/parts_no_stat.epi", w_resid_parts("z", "gamma")),
    # gamma read by the per-head node (one head of Dh = D columns) instead of CUTLASS's row broadcast
    "resid_norm_periodic": ("bench/programs/resid_norm_periodic.epi", w_resid_norm),
    "parts_gamma_periodic": ("bench/programs/parts_gamma_periodic.epi", w_resid_parts("gamma")),
    # QK-norm + RoPE's parts one at a time (beside `plain`, the same gemm): what each costs
    "qkparts_rope": ("bench/programs/qkparts_rope.epi", w_qk_parts("pos", "freq")),
    "qkparts_norm": ("bench/programs/qkparts_norm.epi", w_qk_parts("gamma")),
    # cross entropy's parts one at a time (beside plain_vocab with xent's configuration): what each costs
    "xent_lse_only": ("bench/programs/xent_lse_only.epi", w_xent_parts()),
    "xent_pick_only": ("bench/programs/xent_pick_only.epi", w_xent_parts("label")),
    # bias + GELU's inputs without the activation: what GELU itself costs
    "bias_only": ("bench/programs/bias_only.epi", w_bias_gelu),
}


# Each workload's sizes at M = m, as its program names them: what bench/prebuild.py builds for (the
# heuristic's tile width depends on each gemm's N).
DIMS = {
    "resid_norm": lambda m: dict(M=m, D=D),
    "bias_gelu": lambda m: dict(M=m, K=D, N=DFF),
    "bias_gelu_4096": lambda m: dict(M=m, K=D, N=D),
    "rope": lambda m: dict(M=m, D=D, N=DQKV),
    "qk_norm": lambda m: dict(M=m, D=D, H=D // 128, Dh=128),
    "prenorm_half": lambda m: dict(M=m, D=D, F=DFF),
    "swiglu": lambda m: dict(M=m, D=D, F=DFF),
    "xent": lambda m: dict(M=m, D=D, V=VOCAB),
    "fp8_quant": lambda m: dict(M=m, D=D, N=D),
    "prenorm_mlp": lambda m: dict(M=m, D=D, F=DFF),
    "plain": lambda m: dict(M=m, K=D, N=D),
    "plain_qkv": lambda m: dict(M=m, K=D, N=DQKV),
    "plain_ffn": lambda m: dict(M=m, K=D, N=DFF),
    "plain_gate_up": lambda m: dict(M=m, K=D, N=2 * DFF),
    "plain_vocab": lambda m: dict(M=m, K=D, N=VOCAB),
    "plain_down": lambda m: dict(M=m, K=DFF, N=D),
    "plain_n2048": lambda m: dict(M=m, K=D, N=D // 2),
    "xent_lse_only": lambda m: dict(M=m, D=D, V=VOCAB),
    "xent_pick_only": lambda m: dict(M=m, D=D, V=VOCAB),
    "plain_k2048": lambda m: dict(M=m, K=D // 2, N=2 * D),
    "plain_k1024": lambda m: dict(M=m, K=D // 4, N=4 * D),
    "plain_gate_up_k1024": lambda m: dict(M=m, K=D // 4, N=2 * DFF),
    "plain_gate_up_k16384": lambda m: dict(M=m, K=4 * D, N=2 * DFF),
}
DIMS["bias_only"] = DIMS["bias_gelu"]
for _w in ("resid_norm_periodic", "parts_gamma_periodic"):
    DIMS[_w] = lambda m: dict(M=m, D=D, H=1, Dh=D)
for _w in ("qkparts_rope", "qkparts_norm"):
    DIMS[_w] = DIMS["qk_norm"]
for _w in ("parts_z", "parts_gamma", "parts_two_outs", "parts_row_stat", "parts_no_stat"):
    DIMS[_w] = DIMS["resid_norm"]


SCHEDULES = {"coop": "cooperative", "ping": "pingpong", "pp": "pingpong"}


def allow_tile_widths(text: str) -> tuple[int, ...]:
    """Let this process configure tiles of these widths too ('32,176,208': multiples of 16 from 32 to 256), beside
    the ones epic accepts: to time widths whose tile count fits the 132 SMs' rounds better before epic
    takes them (a width epic does not list has not been checked on a GPU). Returns epic's widths now."""
    from epic.ir import options as vocab
    try:
        widths = {int(w) for w in text.split(",") if w}
    except ValueError:
        widths = {0}
    if any(w % 16 or not 32 <= w <= 256 for w in widths):
        raise SystemExit(f"--tile-widths takes multiples of 16 from 32 to 256, comma-separated (got {text!r})")
    vocab.TILE_N = tuple(sorted(set(vocab.TILE_N) | widths))
    return vocab.TILE_N


def gemm_overrides(program, cfg: dict) -> dict:
    """cfg on every gemm of the program, but combine=tail only on the gemms that can take it
    (epic/plan/tail.py: a gemm with a row statistic): a label like `tail` means the program's tails."""
    from epic.plan import tail
    out = {}
    for k in program.kernels:
        if k.kind == "gemm":
            out[k.name] = dict(cfg)
            if cfg.get("combine") == "tail" and tail.refusal(program, k):
                del out[k.name]["combine"]
    return out


def parse_config(key: str) -> dict:
    """'coop_128x256x64_c2x1[_direct][_e128x64][_s8][_rn][_k4][_fold|_tail|_kernel][_tiles][_serp|_dyn|_splitlast][_nohint][_a16]'
    -> {'schedule': 'cooperative', 'tile': (128, 256, 64), 'cluster': (2, 1), ...}: aux loads, epilogue tile,
    tile-scheduler swizzle, raster (m or n), split-K count, combine=fold, tail or kernel, trace=tiles,
    tile_order=serpentine, dynamic or split_last, load_hint=none and a_rows (a16: 16). Without the schedule, tile and cluster ('fold', 'rn',
    'rn_s4', 'tiles', 'serp', 'serp_nohint'): the default configuration with those changes ('rm', 'rn', 's4':
    the same built kernel)."""
    parts = key.split("_")
    cfg: dict = {}
    if parts[0] in SCHEDULES:
        sched, tile, cluster, *parts = parts
        cfg = {"schedule": SCHEDULES[sched], "tile": tuple(int(v) for v in tile.split("x")),
               "cluster": tuple(int(v) for v in cluster[1:].split("x"))}
    for extra in parts:
        if extra.startswith("e") and "x" in extra:
            cfg["epi_tile"] = tuple(int(v) for v in extra[1:].split("x"))
        elif extra[0] == "s" and extra[1:].isdigit():
            cfg["swizzle"] = int(extra[1:])
        elif extra[0] == "k" and extra[1:].isdigit():
            cfg["splits"] = int(extra[1:])
        elif extra in ("rm", "rn"):
            cfg["raster"] = extra[1]
        elif extra in ("fold", "tail", "kernel"):      # kernel: the combine kernel, where decode takes the tail
            cfg["combine"] = extra
        elif extra == "tiles":
            cfg["trace"] = "tiles"
        elif extra == "serp":
            cfg["tile_order"] = "serpentine"
        elif extra == "dyn":
            cfg["tile_order"] = "dynamic"
        elif extra == "splitlast":
            cfg["tile_order"] = "split_last"
        elif extra == "nohint":
            cfg["load_hint"] = "none"
        elif extra[0] == "a" and extra[1:].isdigit():
            cfg["a_rows"] = int(extra[1:])
        else:
            cfg["aux_load"] = extra
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="8192,64")
    ap.add_argument("--work", default=",".join(WORK))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="also time CUDA-graph replays (no host overhead)")
    ap.add_argument("--configs", default="", help="also time epic with these configurations (all gemms)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench.json"))
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    print(torch.__version__, torch.cuda.get_device_name(), time.strftime("%Y-%m-%d"), flush=True)
    results = []
    for name in args.work.split(","):
        path, make = WORK[name]
        for m in rows:
            gemm, eager, inputs = make(m)
            rec = {"work": name, "M": m, "gemm_ms": bench(gemm)}
            if args.graphs:
                rec["gemm_graph_ms"] = bench(graphed(gemm))
            if not name.startswith("plain"):
                rec["eager_ms"] = bench(eager)
                if not args.no_compile:
                    t0 = time.time()
                    cf = torch.compile(eager)
                    rec["compile_ms"] = bench(cf)
                    rec["compile_s"] = round(time.time() - t0, 1)
                    torch._dynamo.reset()
            variants = [("", None)] + [(c, parse_config(c)) for c in filter(None, args.configs.split(","))]
            for label, cfg in variants:
                try:
                    prog = epic.compile(os.path.join(ROOT, path))
                    if cfg:
                        prog = epic.compile(os.path.join(ROOT, path),
                                            {k.name: cfg for k in prog.program.kernels if k.kind == "gemm"})
                    plan = prog.plan({**_sizes(prog, inputs)})
                    rec[f"epic{'@' + label if label else ''}_ms"] = bench(lambda: prog(**inputs))
                    if label and args.graphs:
                        rec[f"epic@{label}_graph_ms"] = bench(graphed(lambda: prog(**inputs)))
                    if not label:
                        rec["epic_config"] = {k: str(c) for k, c in plan.configs.items()}
                        rec["epic_host_us"] = host_us(lambda: prog(**inputs))
                        if args.graphs:
                            rec["epic_graph_ms"] = bench(graphed(lambda: prog(**inputs)))
                except Exception as e:   # a configuration that does not build or launch: record why
                    rec[f"epic{'@' + label if label else ''}_error"] = str(e).splitlines()[0][:200]
            results.append(rec)
            print(json.dumps(rec), flush=True)
            inputs = None   # free the operands before the next workload
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print()
    print(f"{'work':<14}{'M':>6}{'gemm ms':>10}{'eager':>8}{'compile':>9}{'epic':>8}{'graphed':>9}{'host us':>9}"
          "   other epic configs")
    for r in results:
        g = r["gemm_ms"]
        ratio = lambda k, base=g: f"{r[k] / base:.3f}" if k in r else "-"  # noqa: E731
        graph = ratio("epic_graph_ms", r.get("gemm_graph_ms", g))
        gg = r.get("gemm_graph_ms", g)
        extra = "  ".join(f"{k[5:-9]}={r[k] / gg:.3f}(graphed)" if k.endswith("_graph_ms") else f"{k[5:-3]}={r[k] / g:.3f}"
                          for k in r if k.startswith("epic@") and k.endswith("_ms"))
        print(f"{r['work']:<14}{r['M']:>6}{g:>10.4f}{ratio('eager_ms'):>8}{ratio('compile_ms'):>9}"
              f"{ratio('epic_ms'):>8}{graph:>9}{r.get('epic_host_us', 0):>9.1f}   {extra}")
    return 0


def _sizes(prog, inputs):
    from epic import sizes as sizes_mod
    return sizes_mod.bind_from_tensors(prog.program, {k: tuple(v.shape) for k, v in inputs.items()
                                                      if isinstance(v, torch.Tensor)})


if __name__ == "__main__":
    sys.exit(main())
