"""epic: an epilogue-program compiler for Hopper GEMMs.

    prog = epic.compile("samples/residual_rmsnorm.epi")
    out = prog(x=x, wo=w.t(), z=z, gamma=gamma)
"""
import importlib

from .version import __version__  # noqa: F401

# Submodules reachable as `epic.weights` etc. after a plain `import epic`, imported on first use
# (they import torch, which `epic check` and the other front-end commands never need).
_LAZY_SUBMODULES = ("weights", "distributed", "reference", "integrations")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'epic' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


def compile(path_or_source: str, config: dict | None = None, fallback: str = "never"):
    """Parse, check, rewrite and plan a program; returns a callable epic.runtime.compiled.CompiledProgram.
    fallback: "never" (the fused kernels), "auto" (the unfused torch form where `epic tune` measured it
    faster on this GPU), "eager" or "compiled" (always the unfused torch form; runs without a GPU)."""
    from .runtime.compiled import compile as _compile
    return _compile(path_or_source, config, fallback)


def grad(path_or_source, wrt: list[str] | None = None, straight_through: bool = False, policy: str = "save"):
    """The program's backward, derived by reverse mode: an epic.autodiff.derive.Derivation with the
    forward program (also storing what the backward reads) and the backward program as .epi text
    (`epic grad` prints them). policy: "save" or "recompute" (docs/TRAINING.md)."""
    from .autodiff.derive import derive_source
    return derive_source(path_or_source, wrt, straight_through, policy=policy)


def autograd(path_or_source, wrt: list[str] | None = None, straight_through: bool = False,
             config: dict | None = None, fallback: str = "never", chunk_rows: int | None = None,
             policy: str = "save"):
    """The program as a differentiable function: f(**inputs) returns its outputs by name, and
    loss.backward() runs the derived backward program (docs/TRAINING.md); chunk_rows=N runs that
    backward on N rows at a time; policy: "save" or "recompute" (what the forward keeps), or "fused"
    (a loss head of one gemm whose forward computes the gradients: f(**inputs, d_loss=weights) returns
    (total, outputs), docs/TRAINING.md)."""
    from .autodiff.function import autograd as _autograd
    return _autograd(path_or_source, wrt, straight_through, config, fallback, chunk_rows=chunk_rows, policy=policy)
