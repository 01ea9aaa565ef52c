"""epic: an epilogue-program compiler for Hopper GEMMs."""
__version__ = "0.1.0"
