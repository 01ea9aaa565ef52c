"""epic: an epilogue-program compiler for Hopper GEMMs.

    prog = epic.compile("samples/residual_rmsnorm.epi")
    out = prog(x=x, wo=w.t(), z=z, gamma=gamma)
"""
from .version import __version__  # noqa: F401


def compile(path_or_source: str, config: dict | None = None, fallback: str = "never"):
    """Parse, check, rewrite and plan a program; returns a callable epic.runtime.compiled.CompiledProgram.
    fallback: "never" (the fused kernels), "auto" (the unfused torch form where `epic tune` measured it
    faster on this GPU), "eager" or "compiled" (always the unfused torch form; runs without a GPU)."""
    from .runtime.compiled import compile as _compile
    return _compile(path_or_source, config, fallback)
