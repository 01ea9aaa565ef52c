"""CompiledProgram.capture (epic/runtime/graphs.py) without a GPU: what a replay refuses (E609) before
the graph runs, and that a refused replay changes no recorded input. Recording and replaying on the
GPU, against direct calls, is in tests/test_gpu.py (test_a_captured_program_replays_like_calls)."""
import pytest
import torch

import epic
from epic.diagnostics import EpicError
from epic.runtime import graphs

from .conftest import ROOT

SCALED = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in a: f32 = 2.0\n  out y: bf16 = acc * a\n}\n"


class Replays:
    def __init__(self):
        self.count = 0

    def replay(self):
        self.count += 1


def recorded(text: str, inputs: dict, scalars: dict) -> graphs.Captured:
    """A Captured as if it had recorded a call on these tensors (the graph is a counter)."""
    prog = epic.compile(text)
    g = graphs.Captured.__new__(graphs.Captured)
    g.inputs = dict(inputs)
    g._scalars = dict(scalars)
    g._declared = {t.name: t for t in prog.program.inputs() if t.is_scalar}
    g.graph = Replays()
    g.outputs = {"y": torch.zeros(2, 2)}
    return g


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_replay_copies_new_inputs_and_refuses_what_the_graph_cannot_take():
    x, w = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 16, dtype=torch.bfloat16).t().contiguous().t()
    g = recorded(SCALED, {"x": x, "w": w}, {"a": 2.0})
    out = g(x=torch.ones(4, 8, dtype=torch.bfloat16), a=2.0)
    assert out is g.outputs and g.graph.count == 1 and bool((x == 1).all())      # copied into the recorded x
    assert g(x=x) is g.outputs and g.graph.count == 2                             # the recorded tensor itself
    assert g(a=2.0, x=torch.full((4, 8), 3.0, dtype=torch.bfloat16)) is g.outputs  # a scalar first, then x
    assert bool((x == 3).all()) and g.graph.count == 3
    for args, words in [({"x": torch.ones(5, 8, dtype=torch.bfloat16)}, "'x' was recorded as bfloat16[4, 8]"),
                        ({"x": torch.ones(4, 8, dtype=torch.float16)}, "got float16[4, 8]"),
                        ({"x": torch.ones(8, 4, dtype=torch.bfloat16).t()}, "strides [1, 4]"),
                        ({"w": torch.zeros(8, 16, dtype=torch.bfloat16)}, "'w' was recorded as"),
                        ({"a": 3.0}, "scalar 'a' was 2.0 when the graph was recorded, got 3.0"),
                        ({"q": x}, "no input tensor named 'q'"),
                        ({"x": [[1.0]]}, "'x' must be a tensor, got list"),
                        ({"x": torch.ones(4, 8, dtype=torch.bfloat16).to_sparse()}, "'x' is a sparse_coo tensor"),
                        ({"x": torch.nested.nested_tensor([torch.ones(8, dtype=torch.bfloat16)] * 4)},
                         "'x' is a nested tensor")]:
        before = x.clone()
        with pytest.raises(EpicError) as info:
            g(x=torch.full((4, 8), 7.0, dtype=torch.bfloat16), **args) if "x" not in args else g(**args)
        assert info.value.codes == ["E609"] and words in str(info.value), str(info.value)
        assert ("capture again" if "named" not in words else "its inputs are a, w, x") in info.value.diagnostics[0].hint
        assert torch.equal(x, before) and g.graph.count == 3        # refused before any copy or replay


def test_capture_validates_the_call_first():
    prog = epic.compile(str(ROOT / "samples" / "bias_gelu.epi"))
    with pytest.raises(EpicError) as info:        # CPU tensors: refused (E604) before anything is recorded
        prog.capture(x=torch.zeros(64, 64, dtype=torch.bfloat16), w=torch.zeros(64, 64, dtype=torch.bfloat16).t(),
                     bias=torch.zeros(64, dtype=torch.bfloat16))
    assert info.value.codes == ["E604"]
    with pytest.raises(EpicError) as info:
        prog.capture(x=torch.zeros(64, 64, dtype=torch.float32))
    assert info.value.codes[0] in ("E601", "E603")
