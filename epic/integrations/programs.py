"""The epic programs a patched HuggingFace model runs, as .epi text. Only numbers (RMSNorm's eps) are
substituted into them, never user strings; each distinct program is derived and compiled once."""
from __future__ import annotations

import functools

# A decoder layer's second half: o_proj + residual -> RMSNorm -> gate/up -> SwiGLU -> down + residual
# (samples/prenorm_mlp.epi with the attention width E apart from the model width D: Qwen3's heads
# may not add up to hidden_size).
DECODER_MLP = """\
gemm o_proj(attn: bf16[M, E] @ wo: bf16[E, D]) {{
  in z: bf16[M, D]
  in gamma: bf16[D]
  h = acc + z
  out resid: bf16 = h
  tmp n: bf16 = rmsnorm(h, gamma, {eps})
}}

# wgu holds gate and up interleaved: columns (2k, 2k+1) = (gate_k, up_k)
gemm gate_up(n @ wgu: bf16[D, 2*F]) {{
  tmp a: bf16 = swiglu(acc)
}}

gemm down(a @ wd: bf16[F, D]) {{
  out y: bf16 = acc + resid
}}
"""

# LM head + cross entropy without logits (samples/cross_entropy.epi); a row whose label is negative
# (HF's ignore_index -100, and the shifted-out last position) adds 0 to the loss and to every gradient.
LM_HEAD_LOSS = """\
gemm lm_head(x: bf16[M, D] @ w: bf16[D, V]) {
  in label: i32[M]
  out loss: f32[M] = select(label >= 0, row_lse(acc) - row_pick(acc, label), 0)
}
"""


def decoder_mlp_text(eps: float) -> str:
    return DECODER_MLP.format(eps=repr(float(eps)))


@functools.lru_cache(maxsize=None)
def decoder_mlp(eps: float, fallback: str):
    return _differentiable(decoder_mlp_text(eps), fallback)


@functools.lru_cache(maxsize=None)
def lm_head_loss(fallback: str, chunk_rows: int | None = None, policy: str = "fused"):
    """chunk_rows: the [tokens, vocab] logit gradient exists for that many tokens at a time. policy
    "fused": the gradients are computed in the forward (3 gemms, autodiff/fused.py); "save": by a
    backward program that recomputes the logits (4 gemms)."""
    return _differentiable(LM_HEAD_LOSS, fallback, chunk_rows, policy)


def _differentiable(text: str, fallback: str, chunk_rows: int | None = None, policy: str = "save"):
    from .. import autograd
    return autograd(text, fallback=fallback, chunk_rows=chunk_rows, policy=policy)
