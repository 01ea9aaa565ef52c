"""Patches that make HuggingFace models train with epic programs, forward and backward
(docs/TRAINING.md, "HuggingFace models"). transformers is imported only when a patch is applied."""
from .llama import apply_epic, apply_epic_to_llama
from .qwen3 import apply_epic_to_qwen3

__all__ = ["apply_epic", "apply_epic_to_llama", "apply_epic_to_qwen3"]
