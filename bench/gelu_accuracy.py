"""How far each bias + GELU program's kernel lands from exact GELU (tanh form, float64) on the H200:
    python3 bench/gelu_accuracy.py [PROGRAM.epi ...]     (default: samples/bias_gelu.epi)
Per program: the largest and mean absolute error, and the fraction of elements off by more than 2^-8 of
the exact value (between half and one bf16 ulp) (the figure that tells a one-instruction tanh from an accurate one)."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402


def main() -> int:
    paths = sys.argv[1:] or ["samples/bias_gelu.epi"]
    torch.manual_seed(0)
    M, K, N = 8192, 4096, 14336
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64).t()
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    exact = F.gelu(x.double() @ w.double() + bias.double(), approximate="tanh")
    bound = exact.abs().clamp_min(2.0 ** -126) * 2.0 ** -8          # 2^-8 of the exact value: half to one bf16 ulp
    for path in paths:
        y = epic.compile(path)(x=x, w=w, bias=bias, poison=True)["y"].double()
        err = (y - exact).abs()
        print(f"{path:<44} max abs {err.max().item():.3e}  mean abs {err.mean().item():.3e}  "
              f"frac > 2^-8 rel {(err > bound).double().mean().item():.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
