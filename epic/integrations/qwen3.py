"""Qwen3 with epic programs: its decoder layer and MLP are Llama's (QK-norm lives inside attention,
which stays HuggingFace's), so Llama's patch applies to its classes unchanged."""
from __future__ import annotations

from .llama import apply_epic


def apply_epic_to_qwen3(model=None, *, mlp: bool = True, cross_entropy: bool = True, fallback: str = "never",
                        chunk_rows: int | None = None, loss_policy: str = "fused"):
    """Patch a Qwen3ForCausalLM instance (or the classes when model is None); see apply_epic_to_llama."""
    from transformers.models.qwen3 import modeling_qwen3 as m
    return apply_epic(m.Qwen3ForCausalLM, m.Qwen3DecoderLayer, model, mlp=mlp, cross_entropy=cross_entropy,
                      fallback=fallback, chunk_rows=chunk_rows, loss_policy=loss_policy)
