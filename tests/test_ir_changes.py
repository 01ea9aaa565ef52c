"""epic.ir.dump.changes: what `epic ir --rules` says for a pass that keeps no trace of its own."""
from dataclasses import replace

from epic.ir import dump

from .conftest import analyze

PROGRAM = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in eps: f32 = 1e-6\n"
           "  out y: bf16 = acc\n  out r: f32[M] = rsqrt(row_mean(acc * acc) + eps)\n}\n")


def test_an_unchanged_program_has_no_changes():
    p = analyze(PROGRAM).program
    assert dump.changes(p, p) == []


def test_a_change_outside_kernels_and_tensor_names_is_still_reported():
    p = analyze(PROGRAM).program
    q = replace(p, tensors={**p.tensors, "eps": replace(p.tensors["eps"], default=1e-5)})
    assert dump.changes(p, q) == ["changed the program"]


def test_a_removed_kernel_and_tensor():
    a = analyze(PROGRAM)
    before, after = a.program, a.after("dce")
    assert dump.changes(before, after) == ["tensors removed: g__row_mean_part0", "g: 3 -> 6 values "
                                           "(removed partial; added add, load, reduce, rsqrt)",
                                           "kernel g__row_combine removed"]
