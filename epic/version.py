"""The version of epic (a base module: code generation and the cache key read it)."""
__version__ = "0.2.0"
