"""Jinja templates that print CUDA/C++ (shipped as package data)."""
