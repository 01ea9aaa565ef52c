"""Programs and sizes the GPU tests (tests/test_gpu.py) and the prebuild script (tests/prebuild.py)
share: every kernel a GPU run needs can be built ahead on a CPU machine."""
import torch

from epic import reference

from .conftest import ROOT

# program -> function (M, N, K) -> sizes of its dimensions
PROGRAMS = {
    "samples/bias_gelu.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    "samples/residual_rmsnorm.epi": lambda m, n, k: dict(M=m, D=n),
    "samples/rope.epi": lambda m, n, k: dict(M=m, D=k, N=n),
    # fp8 rows are 1 byte per element: K must be a multiple of 16 for TMA (still not of 128)
    "samples/fp8_gemm_scaled.epi": lambda m, n, k: dict(M=m, K=-(-k // 16) * 16, N=n),
    "bench/programs/prenorm_half.epi": lambda m, n, k: dict(M=m, D=n, F=k),
    "tests/programs/pair_swap.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    "tests/programs/col_stats.epi": lambda m, n, k: dict(M=m, K=k, N=n),
    # 1-byte outputs: N must be a multiple of 16 for TMA
    "tests/programs/out_types.epi": lambda m, n, k: dict(M=m, K=k, N=-(-n // 16) * 16),
}
# (M, N, K): tile multiples, then ragged (M = 1, 77, 8191; N, K not multiples of 128)
SIZES = [(128, 256, 128), (256, 512, 256), (1, 392, 200), (77, 392, 200), (8191, 392, 200), (300, 264, 136)]


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
        inputs["freq"] = freq
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
