"""Programs and sizes the GPU tests (tests/test_gpu.py) and the prebuild script (tests/prebuild.py)
share: every kernel a GPU run needs can be built ahead on a CPU machine."""
import torch

from epic import reference

from .conftest import ROOT


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


# program -> function (M, N, K) -> sizes of its dimensions. N and K are rounded where the program's
# layout rules need it (16-byte rows for TMA: 8 bf16 or 16 one-byte elements; block sizes).
PROGRAMS = {
    "samples/bias_gelu.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    "samples/residual_rmsnorm.epi": lambda m, n, k: dict(M=m, D=n),
    "samples/rope.epi": lambda m, n, k: dict(M=m, D=k, N=n),
    "samples/fp8_gemm_scaled.epi": lambda m, n, k: dict(M=m, K=_up(k, 16), N=n),
    "samples/swiglu.epi": lambda m, n, k: dict(M=m, D=k, F=_up(n // 2, 8)),
    "samples/swiglu_bwd.epi": lambda m, n, k: dict(M=m, D=k, F=_up(n // 2, 8)),
    "samples/swiglu_mlp.epi": lambda m, n, k: dict(M=m, D=k, F=_up(n // 2, 8)),
    "samples/prenorm_mlp.epi": lambda m, n, k: dict(M=m, D=n, F=_up(k, 8)),
    "samples/cross_entropy.epi": lambda m, n, k: dict(M=m, D=k, V=n),
    "samples/fp8_block_quant.epi": lambda m, n, k: dict(M=m, D=k, N=_up(n, 128)),
    "samples/int4_pack.epi": lambda m, n, k: dict(M=m, D=k, N=_up(n, 256)),
    "samples/w8a8.epi": lambda m, n, k: dict(M=m, K=_up(k, 16), N=n),
    "bench/programs/prenorm_half.epi": lambda m, n, k: dict(M=m, D=n, F=k),
    "tests/programs/pair_swap.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    "tests/programs/col_stats.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    "tests/programs/out_types.epi": lambda m, n, k: dict(M=m, K=k, N=_up(n, 16)),
    "tests/programs/every_primitive.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    "tests/programs/quant_exposed.epi": lambda m, n, k: dict(M=m, K=k, N=_up(n, 256)),
    "tests/programs/more_stores.epi": lambda m, n, k: dict(M=m, K=k, N=_up(n, 16)),
    "tests/programs/whole_tensor.epi": lambda m, n, k: dict(M=m, K=k, N=n, P=_up(k, 8)),
    "tests/programs/combine_reads.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    "samples/fp8_delayed_scaling.epi": lambda m, n, k: dict(M=m, K=_up(k, 16), N=_up(n, 16)),
    "samples/q_proj_per_head.epi": lambda m, n, k: dict(M=m, D=k, H=4, Dh=_up(n // 4, 2)),
    # 16 heads: Dh = 16-36, narrower than most epilogue subtiles (the per-head node's per-element
    # division path); the sample above keeps Dh = 64-144 (its one-division-per-subtile path)
    "tests/programs/per_head.epi": lambda m, n, k: dict(M=m, D=k, H=16, Dh=_up(n // 16, 2)),
    "tests/programs/fp8_mixed.epi": lambda m, n, k: dict(M=m, K=_up(k, 16), N=_up(n, 16)),
    "tests/programs/coordinates.epi": lambda m, n, k: dict(M=m, D=k, N=n),
    "tests/programs/masked_lse.epi": lambda m, n, k: dict(M=m, D=k, N=n),
    "tests/programs/quant_no_scales.epi": lambda m, n, k: dict(M=m, K=k, N=_up(n, 64)),
    "samples/qk_norm_rope.epi": lambda m, n, k: dict(M=m, D=k, H=max(1, n // 128), Dh=128),
    "tests/programs/block_stats.epi": lambda m, n, k: dict(M=m, K=k, N=n, P=_up(n, 64)),
    "tests/programs/f16_accumulate.epi": lambda m, n, k: dict(M=m, K=_up(k, 16), N=_up(n, 16)),
    "samples/f16_accumulate.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    "samples/swiglu_fp8_quant.epi": lambda m, n, k: dict(M=m, D=k, F=_up(n // 2, 128)),
    "samples/qkv_qk_norm.epi": lambda m, n, k: dict(M=m, D=k, H=max(1, n // 768), Dh=128),
    # dynamic per-token quantization: the row combine kernel writes the quantized tile (row_finish.py)
    "tests/programs/per_token_i8.epi": lambda m, n, k: dict(M=m, K=k, N=_up(n, 16), P=_up(k, 8)),
    "tests/programs/per_token_fp8.epi": lambda m, n, k: dict(M=m, K=k, N=_up(n, 16), P=_up(k, 8)),
    "tests/programs/per_token_i4.epi": lambda m, n, k: dict(M=m, K=k, N=_up(n, 2)),
    # LayerNorm deferred into the next gemm: gamma @ wu and beta @ wu computed by the runtime
    "tests/programs/layernorm_chain.epi": lambda m, n, k: dict(M=m, D=n, F=_up(k, 8)),
    # RMSNorm's normalized rows returned: the row combine kernel finishes n (a training forward)
    "tests/programs/rmsnorm_out.epi": lambda m, n, k: dict(M=m, K=k, D=_up(n, 8), N=_up(k, 8)),
    # .T operands and a row-major B (a backward's dX and dW gemms)
    "tests/programs/backward_layouts.epi": lambda m, n, k: dict(M=m, K=_up(k, 8), N=_up(n, 8)),
    # tiles half as wide as the accumulator read in the epilogue (SwiGLU's derived backward reads d_y so)
    "tests/programs/half_width_load.epi": lambda m, n, k: dict(M=m, K=k, F=_up(n // 2, 8)),
    "tests/programs/half_width_swiglu_bwd.epi": lambda m, n, k: dict(M=m, D=k, F=_up(n // 2, 8)),
    "tests/programs/half_width_quant.epi": lambda m, n, k: dict(M=m, K=k, F=_up(n // 2, 128)),
    # a loss head's gradients in its forward: dlogits finished by the row combine, read transposed by dW's gemm
    "tests/programs/fused_cross_entropy.epi": lambda m, n, k: dict(M=m, D=_up(k, 8), V=_up(n, 8)),
    # a derived backward: RMSNorm's backward where dn is computed, dh finished by the row combine kernel
    "tests/programs/prenorm_mlp_backward.epi": lambda m, n, k: dict(M=m, D=_up(n, 8), F=_up(k, 8)),
}
# (M, N, K): tile multiples, then ragged (M = 1, 77, 8191; N, K not multiples of 128). M <= 256 gets
# the pingpong 64x64 configuration, larger M pingpong 128x128 cluster 2x1, and 128x192 where N is a
# multiple of 192 (N = 576: 333 x 576 runs the wide tile wherever the program's blocks allow it).
SIZES = [(128, 256, 128), (256, 512, 256), (1, 392, 200), (77, 392, 200), (8191, 392, 200), (300, 264, 136),
         (333, 576, 136)]
# over 4096 rows, then over 4096 columns: combine kernels merge several rows (columns) per warp
# (combine.py's grouped form), ragged; the configurations of 8191 x 392 and 300 x 264 (no new kernels)
MANY_ROWS_SIZES = [(4100, 392, 136), (300, 4104, 136)]
# Split-K: every gemm of every program split 3 ways (K = 200: 4 k-tiles split unevenly, 2 + 1 + 1) at a
# decode size (cooperative 128-row tiles, cluster 1x1); programs with row statistics, block stores and
# chains also at a large size (cooperative 128x128, cluster 2x1: the heuristic's tile, cooperative for split-K).
SPLIT_K = {"splits": 3}
# split-K's cooperative tile keeps a 1x256 block in one 128x256 epilogue subtile; with an f32 tile
# stored beside it that subtile's buffers leave the mainloop one stage: E217 at plan time
# (tests/test_void_d_smem.py)
NO_SPLIT = {"tests/programs/half_width_quant.epi"}
SPLIT_CASES = [(name, (77, 392, 200)) for name in PROGRAMS if name not in NO_SPLIT] + \
    [(name, (8191, 392, 200)) for name in ("samples/residual_rmsnorm.epi", "samples/fp8_block_quant.epi",
                                           "samples/qk_norm_rope.epi", "samples/prenorm_mlp.epi")]

# tile_order=serpentine (every odd group of the tile order walked backwards) on every gemm, at sizes
# with several groups: at 8191 x 392 (128x128 tiles, cluster 2x1, along N) eight groups of 8 rows of
# tiles each walk 4 columns; at 333 x 2304 (128x192, along M, swizzle 2) six groups of 2 columns each
# walk 2 clusters of rows;
# with extra options (combine=fold: the last CTA of a row block merges it, whichever finishes last)
SERPENTINE_CASES = [("samples/residual_rmsnorm.epi", (8191, 392, 200), {}),
                    ("samples/residual_rmsnorm.epi", (8191, 392, 200), {"combine": "fold"}),
                    ("samples/bias_gelu.epi", (8191, 392, 200), {}),
                    ("samples/bias_gelu.epi", (333, 2304, 136), {"swizzle": 2}),
                    ("samples/cross_entropy.epi", (8191, 392, 200), {}),
                    ("samples/fp8_block_quant.epi", (8191, 392, 200), {}),
                    ("samples/prenorm_mlp.epi", (8191, 392, 200), {})]
# tile_order=dynamic (each cluster takes its next tile from a counter): the schedules and clusters the
# scheduler serves (pingpong and cooperative, 2x1 along N, 1x2, one CTA per cluster at decode sizes),
# the raster along M, a row statistic with its combine kernel and folded, the pre-norm chain; a grid
# with fewer tiles than SMs (no counter increments beyond one per cluster)
DYNAMIC_CASES = [("samples/residual_rmsnorm.epi", (8191, 392, 200), {}),
                 ("samples/residual_rmsnorm.epi", (8191, 392, 200), {"combine": "fold"}),
                 ("samples/residual_rmsnorm.epi", (77, 392, 200), {}),
                 ("samples/residual_rmsnorm.epi", (1000, 1352, 200), {"cluster": (1, 2)}),
                 ("samples/bias_gelu.epi", (8191, 392, 200), {"schedule": "cooperative"}),
                 ("samples/bias_gelu.epi", (333, 2304, 136), {"swizzle": 2}),
                 ("samples/cross_entropy.epi", (8191, 392, 200), {}),
                 ("samples/fp8_block_quant.epi", (8191, 392, 200), {}),
                 ("samples/prenorm_mlp.epi", (8191, 392, 200), {}),
                 ("samples/swiglu.epi", (333, 392, 200), {})]

# tile_order=split_last (the last round's tiles split along K over every CTA): sizes with a last round
# of fewer tiles than CTAs and at least 32 k-blocks a tile, so that it splits on 132 SMs (and on 78);
# element-wise, a row statistic with its combine kernel, cross entropy's partials, 1x128 block
# quantization, SwiGLU's half-width store, a 1x2 cluster, M, N and K ragged
SPLIT_LAST_CASES = [("samples/bias_gelu.epi", (3001, 1096, 2056), {}),
                    ("samples/bias_gelu.epi", (3001, 1352, 2056), {"cluster": (1, 2)}),
                    ("samples/residual_rmsnorm.epi", (3000, 2048, 0), {}),
                    ("samples/cross_entropy.epi", (3000, 1096, 2048), {}),
                    ("samples/fp8_block_quant.epi", (3000, 1096, 2048), {}),
                    ("samples/swiglu.epi", (3000, 2192, 2048), {}),
                    ("samples/rope.epi", (3000, 1096, 2048), {})]

# The tile an H100's heuristic gives element-wise epilogues that store one tile, and 1xB block
# quantization (plan/config.py's H100_COOPERATIVE), set explicitly so that any GPU runs it: M and K
# ragged, N a multiple of 256; fp8 with 1x128 scales, int4 packed
H100_TILE = {"schedule": "cooperative", "tile": (128, 256, 64), "cluster": (2, 1)}
H100_TILE_CASES = [(name, size) for name in ("samples/bias_gelu.epi", "samples/fp8_block_quant.epi")
                   for size in ((4100, 768, 136), (77, 512, 200))] + [("samples/int4_pack.epi", (333, 768, 136))]

# load_hint=none (the mainloop's TMA loads without an L2 cache policy) on every gemm: a row statistic,
# a ragged element-wise epilogue along M, the pre-norm chain, and with the serpentine order beside it
LOAD_HINT_CASES = [("samples/residual_rmsnorm.epi", (8191, 392, 200), {}),
                   ("samples/bias_gelu.epi", (333, 2304, 136), {"swizzle": 2}),
                   ("samples/swiglu.epi", (8191, 392, 200), {"tile_order": "serpentine"}),
                   ("samples/prenorm_mlp.epi", (77, 392, 200), {})]

# a_rows (the mainloop's loads of A read 8, 16 or 32 rows): the plan's choice below 33 rows, with the tail
# (a row statistic) and in the gemm's epilogue (1xB blocks, on a 1x2 cluster), 64- and 128-wide tiles, a
# chain, cross entropy's partials, and a program whose dW gemm has an M-major A (which keeps the tile's rows)
SHORT_A_CASES = [("samples/residual_rmsnorm.epi", (7, 392, 200), {}),
                 ("samples/qk_norm_rope.epi", (13, 512, 200), {}),
                 ("samples/fp8_block_quant.epi", (30, 512, 200), {}),
                 ("samples/bias_gelu.epi", (20, 392, 200), {}),
                 ("samples/swiglu.epi", (5, 392, 200), {"tile": (64, 128, 128)}),
                 ("samples/prenorm_mlp.epi", (9, 392, 200), {}),
                 ("samples/cross_entropy.epi", (8, 392, 200), {}),
                 ("tests/programs/backward_layouts.epi", (3, 392, 200), {})]

# Sizes GPU tests use besides SIZES, as (program, sizes): tests/prebuild.py builds their kernels too
XENT_SIZES = [(64, 128256), (333, 50304), (8, 1000)]      # (M, V) of test_cross_entropy_without_logits, D = 256
XENT_D = 256
QUANT_SIZES = [(77, 512, 200), (300, 768, 136), (8191, 1024, 256)]    # (M, N, K) of the quantizer test
DETERMINISM_CASES = [("samples/residual_rmsnorm.epi", dict(M=333, D=392)),
                     ("samples/cross_entropy.epi", dict(M=333, D=200, V=392)),
                     ("samples/fp8_block_quant.epi", dict(M=333, D=200, N=512)),
                     ("tests/programs/whole_tensor.epi", dict(M=8191, K=200, N=392, P=200))]
MEMCHECK_CASES = [("samples/residual_rmsnorm.epi", dict(M=77, D=392)),
                  ("samples/cross_entropy.epi", dict(M=77, D=200, V=392)),
                  ("samples/fp8_block_quant.epi", dict(M=77, D=200, N=512)),
                  ("samples/int4_pack.epi", dict(M=77, D=200, N=512)),
                  ("samples/swiglu_bwd.epi", dict(M=77, D=200, F=200)),
                  ("samples/prenorm_mlp.epi", dict(M=77, D=392, F=200))]
TORCH_COMPILE_CASE = ("samples/bias_gelu.epi", dict(M=64, K=128, N=256))
HF_BLOCK_CASE = ("samples/prenorm_mlp.epi", dict(M=256, D=4096, F=14336))     # a Llama-3-8B block
MX_ROWS = [64, 77, 8192]
MX_K, MX_N = 64, 128          # x [M, K] @ w [K, N]: each program's name for K
MX_PROGRAMS = {"tests/programs/mx_formats.epi": "K", "samples/mxfp8_block_quant.epi": "D"}


# one-gemm programs at a decode size, their gemm launched as a dependent of the caller's last kernel
# (the default, EPIC_DEPENDENT_FIRST unset; tests/test_gpu.py)
DEPENDENT_FIRST_CASES = [(name, PROGRAMS[name](64, 392, 200)) for name in
                         ("samples/residual_rmsnorm.epi", "samples/qk_norm_rope.epi", "samples/bias_gelu.epi")]


def own_size_cases() -> list[tuple[str, dict]]:
    """Every (program, sizes) above."""
    return [("samples/cross_entropy.epi", dict(M=m, D=XENT_D, V=v)) for m, v in XENT_SIZES] + \
        [("tests/programs/quant_exposed.epi", dict(M=m, K=k, N=n)) for m, n, k in QUANT_SIZES] + \
        [(name, PROGRAMS[name](*size)) for name, size in BLOCK_EDGE_CASES] + \
        DETERMINISM_CASES + MEMCHECK_CASES + DEPENDENT_FIRST_CASES + [TORCH_COMPILE_CASE, HF_BLOCK_CASE] + \
        [(name, {"M": m, k: MX_K, "N": MX_N}) for name, k in MX_PROGRAMS.items() for m in MX_ROWS]


def split_k_config(program) -> dict:
    return {k.name: dict(SPLIT_K) for k in program.kernels if k.kind == "gemm"}


def groups_rows(program) -> bool:
    """Whether a combine kernel of the program merges rows (columns) in groups where there are many
    (epic/codegen/combine.py): test_gpu.py's many-rows cases run only those."""
    from epic.codegen.combine import lower_combine
    return any(lower_combine(program, k).grouped for k in program.kernels if k.kind == "combine")


def path(name: str) -> str:
    return str(ROOT / name)


def make_inputs(program, sizes: dict, seed: int) -> dict:
    """Random inputs (reference.random_inputs) with RoPE given realistic positions and frequencies."""
    inputs = reference.random_inputs(program, sizes, seed)
    if "pos" in inputs and "freq" in inputs:
        m, n = inputs["pos"].shape[0], inputs["freq"].shape[0]
        inputs["pos"] = torch.arange(m, dtype=torch.float32) * 3 % 8192
        inv = 1.0 / (500000 ** (torch.arange(0, 128, 2).float() / 128))
        freq = inv.repeat_interleave(2).repeat(-(-n // 128))[:n]
        freq[n // 2:] = 0           # the "V" half is left unrotated
        # bf16-representable frequencies: pos * freq (13 + 8 bits) is then exact in f32, so the kernel
        # and the float64 reference rotate by the same angle (at pos ~ 8000, an f32-rounded angle is
        # off by ~5e-4 rad, a few bf16 steps of the output)
        inputs["freq"] = freq.bfloat16().float()
    return inputs


def to_device(program, inputs: dict) -> dict:
    """Inputs on the GPU, B operands K-major (as W.t() of an nn.Linear weight W)."""
    out = {}
    for name, x in inputs.items():
        t = program.tensors[name]
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            out[name] = x
        elif t.layout == "kmajor":
            out[name] = x.t().contiguous().t().cuda()
        else:
            out[name] = x.cuda()
    return out


# combine=fold: every gemm's row combine kernel run inside the gemm (the last CTA of a row block
# merges); programs without one build the same kernels and are skipped
FOLD = {"combine": "fold"}


# test_a_1x2_clusters_swizzle_covers_every_tile: residual + RMSNorm with its gemm on a 1x2 cluster
CLUSTER_1X2_CASE = ("samples/residual_rmsnorm.epi", (1000, 1352, 200))
# 1x128 blocks split over a 1x2 cluster's two CTAs (64-wide tiles: detail::exchange_halves through each
# other's shared memory) with several tiles per CTA (1000 x 1280 and 1000 x 1408: over 300 tiles on at
# most 132 CTAs), so that consecutive tiles of a CTA reuse the exchange's words; M ragged on 64.
SPLIT_BLOCKS = {"tile": (64, 64, 64), "cluster": (1, 2)}
SPLIT_BLOCK_CASES = [("samples/qk_norm_rope.epi", (1000, 1352, 200)), ("samples/fp8_block_quant.epi", (1000, 1352, 200))]
# 64 rows, the most the plan keeps 1x128 blocks in the gemm's epilogue for (plan/tail.py's BLOCK_TAIL_ROWS),
# and one row more, where the tail kernel takes them; K ragged on the tile's 64.
BLOCK_EDGE_CASES = [(name, (m, 1024, 200)) for name in ("samples/qk_norm_rope.epi", "samples/fp8_block_quant.epi")
                    for m in (64, 65)]


def cluster_1x2_config(program) -> dict:
    return {k.name: {"cluster": (1, 2)} for k in program.kernels if k.kind == "gemm"}


def gemm_options(program, options: dict) -> dict:
    """A call's config with these kernel options on every gemm of the program."""
    return {k.name: dict(options) for k in program.kernels if k.kind == "gemm"}


def fold_config(program) -> dict:
    return {k.name: dict(FOLD) for k in program.kernels if k.kind == "gemm"}


def tail_config(program) -> dict:
    """combine=tail on every gemm the tail can run (epic/plan/tail.py), the default on the others."""
    from epic.plan import tail
    return {k.name: {"combine": "tail"} for k in program.kernels if k.kind == "gemm" and tail.refusal(program, k) is None}


# combine=tail: ragged and whole tiles at the small-M configuration, one large-M configuration, and
# decode's shape (one CTA per row over 4096 columns: the vector path; 4104: the column-by-column path)
TAIL_SIZES = [(1, 392, 200), (77, 392, 200), (256, 512, 256), (300, 264, 136), (64, 4096, 256), (7, 4104, 136)]


def folds(program) -> bool:
    """Whether combine=fold folds any of the program's combine kernels."""
    from epic.plan import config as config_mod, planner
    return bool(planner.folds(program, {k.name: config_mod.KernelConfig("pingpong", (64, 64, 64), combine="fold")
                                     for k in program.kernels if k.kind == "gemm"}))
