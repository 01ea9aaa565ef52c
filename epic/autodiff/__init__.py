"""Reverse-mode differentiation of epic programs (the background article's pattern D): the backward
of a "GEMM + tile-local epilogue" program is again such a program. `derive.derive` returns the
forward program with what the backward needs stored, and the backward program, both as .epi text
that goes through the same checks, passes and code generation as a hand-written one."""
