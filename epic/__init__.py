"""epic: an epilogue-program compiler for Hopper GEMMs.

    prog = epic.compile("samples/residual_rmsnorm.epi")
    out = prog(x=x, wo=w.t(), z=z, gamma=gamma)
"""
__version__ = "0.1.0"


def compile(path_or_source: str, config: dict | None = None):
    """Parse, check and rewrite a program; returns a callable epic.runtime.program.Program."""
    from .runtime.program import compile as _compile
    return _compile(path_or_source, config)
