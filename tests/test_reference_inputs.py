"""CompiledProgram.reference refuses the inputs a call refuses for what they mean (dtype, shapes,
sizes against the layout rules), with the same diagnostic; memory layout and device do not matter."""
import pytest
import torch

import epic
from epic.diagnostics import EpicError

BF = torch.bfloat16
PROGRAM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in bias: bf16[N]\n  out y: bf16 = acc + bias\n}\n"


def good(m=4, k=16, n=8):
    return dict(x=torch.randn(m, k, dtype=BF), w=torch.randn(n, k, dtype=BF).t(), bias=torch.randn(n, dtype=BF))


def refusal(fn, **args) -> EpicError:
    with pytest.raises(EpicError) as info:
        fn(**args)
    return info.value


@pytest.mark.parametrize("bad,code", [
    (dict(x=torch.randn(4, 16)), "E603"),                                 # f32 where bf16 is declared
    (dict(bias=torch.randn(8, dtype=torch.float64)), "E603"),
    (dict(w=torch.randn(8, 12, dtype=BF).t()), "E602"),                   # K disagrees with x's
    (dict(x=torch.randn(4, 12, dtype=BF), w=torch.randn(8, 12, dtype=BF).t()), "E403"),   # 24-byte rows
])
def test_the_reference_refuses_what_a_call_refuses(bad, code):
    prog = epic.compile(PROGRAM)
    args = dict(good(), **bad)
    call = refusal(prog, **args)            # on CPU tensors a call stops at its first problem, before the device
    ref = refusal(prog.reference, **args)
    assert call.codes == ref.codes and set(ref.codes) == {code}
    assert str(ref) == str(call)


def test_the_reference_takes_any_layout():
    prog = epic.compile(PROGRAM)
    args = good()
    want = prog.reference(**args)["y"]
    args["x"] = args["x"].t().contiguous().t()                            # column-major: a call says E605
    assert refusal(prog, **args).codes == ["E605"]
    assert torch.equal(prog.reference(**args)["y"], want)
