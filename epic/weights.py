"""Laying out weights for programs that pair columns (epic's pairwise maps read columns 2k, 2k+1 of
one accumulator row together)."""
from __future__ import annotations

import torch


def interleave_gate_up(gate_weight: torch.Tensor, up_weight: torch.Tensor) -> torch.Tensor:
    """The B operand `wgu: [D, 2*F]` of a SwiGLU gemm (samples/swiglu.epi, prenorm_mlp.epi) from two
    torch.nn.Linear weights gate_proj.weight and up_proj.weight, each [F, D]: column 2k is gate row k
    and column 2k+1 is up row k, laid out K-major as the gemm reads it. Build it once per model (it
    copies the two weights into one [2F, D] tensor); the result is a [D, 2F] view of it."""
    if gate_weight.shape != up_weight.shape or gate_weight.dim() != 2:
        raise ValueError(f"gate and up weights must both be [F, D], got {tuple(gate_weight.shape)} and "
                         f"{tuple(up_weight.shape)}")
    return torch.stack((gate_weight, up_weight), dim=1).reshape(-1, gate_weight.shape[1]).t()
