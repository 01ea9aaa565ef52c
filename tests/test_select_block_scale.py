"""A block statistic on one side of a `select`: QK-norm on the q and k heads of a fused QKV projection,
v passed through (samples/qkv_qk_norm.epi). hoist-block-scale moves the scale to its branch,
select(c, E[y * s], w) -> select(c, E[y] * s, w), and the kernel keeps one bit per element saying
whether the scale applies. Meaning checked against torch written here; the kernels run on the host
against the reference (and in tests/test_hostsim.py, tests/test_gpu.py through tests/gpu_cases.py)."""
import pytest
import torch

import epic
from epic import pipeline, reference
from epic.diagnostics import EpicError
from epic.passes import hoist_block_scale

from . import hostsim
from .conftest import ROOT, analyze
from .hostsim import harness
from .test_diagnostics import marked

SAMPLE = ROOT / "samples" / "qkv_qk_norm.epi"
D64 = torch.float64
GEMM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n"


def _qkv_by_hand(x, w, q_gamma, k_gamma, kv_heads, dh=128, eps=1e-6):
    """Qwen3's q_norm and k_norm on the q and k heads of a fused projection, v untouched (float64)."""
    h = x.to(D64) @ w.to(D64)
    m = h.shape[0]
    heads = h.reshape(m, 6 * kv_heads, dh)
    gamma = torch.cat([q_gamma.to(D64).expand(4 * kv_heads, dh), k_gamma.to(D64).expand(kv_heads, dh)])
    qk = heads[:, :5 * kv_heads]
    normed = qk * torch.rsqrt(qk.pow(2).mean(-1, keepdim=True) + eps) * gamma
    return torch.cat([normed, heads[:, 5 * kv_heads:]], 1).reshape(m, -1)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_the_sample_normalizes_q_and_k_heads_and_passes_v_through(kv_heads):
    program = pipeline.analyze(str(SAMPLE)).source_program
    sizes = dict(M=5, D=32, H=kv_heads, Dh=128)
    inputs = reference.random_inputs(program, sizes, seed=kv_heads)
    out = reference.run(program, inputs, sizes=sizes)["qkv"]
    want = _qkv_by_hand(inputs["x"], inputs["wqkv"], inputs["q_gamma"], inputs["k_gamma"], kv_heads)
    assert torch.allclose(out.to(D64), want, rtol=1e-12, atol=1e-12)


def test_the_scale_moves_into_the_selected_branch_and_the_meaning_stays():
    a = analyze(SAMPLE.read_text())
    k = a.program.kernels[0]
    form = hoist_block_scale.select_form(k.stores[0].value, hoist_block_scale.block_dependent(k))
    assert form is not None and form[1] == 1           # the first branch carries y * s
    sizes = dict(M=4, D=32, H=1, Dh=128)
    inputs = reference.random_inputs(a.source_program, sizes, seed=9)
    before = reference.run(a.source_program, inputs, sizes=sizes)["qkv"]
    after = reference.run(a.program, inputs, sizes=sizes)["qkv"]
    assert torch.allclose(before, after, rtol=1e-12, atol=1e-12)


S = "block_sum(acc, 32)"


@pytest.mark.parametrize("expr, moved", [
    (f"select(col < 64, -(acc * {S} * 2), acc)", True),                   # the scale on the true side
    (f"select(col >= 64, acc + 1, interleave(even(acc), odd(acc)) * {S})", False),   # already y * s there
    (f"select(col >= 64, acc + 1, interleave(even(acc * {S}), odd(acc * {S})))", True),   # the false side
    (f"select(col < 64, acc * {S}, acc * 2 * {S})", True),                # both sides: select(...) * s
    (f"select(acc * {S} > 0, acc * {S}, acc)", False),                    # the condition reads the scale
    (f"select(col < 64, acc * {S} + acc, acc)", False),                   # the branch cannot move it
    (f"select(col < 64, acc * {S}, acc * block_max(acc, 32))", False),    # two different scales
])
def test_which_selects_are_rewritten(expr, moved):
    a = analyze(GEMM + f"  out y: f32 = {expr}\n}}\n", stop_after="split-reductions")
    k = a.program.kernels[0]
    dep = hoist_block_scale.block_dependent(k)
    new = hoist_block_scale.hoisted(k.stores[0].value, dep)
    assert (new is not None) == moved
    if moved:
        assert new.name == "y"
        assert (hoist_block_scale.root_form(new, dep) or hoist_block_scale.select_form(
            new, hoist_block_scale.block_dependent_of(new))) is not None
        full = analyze(GEMM + f"  out y: f32 = {expr}\n}}\n")
        inputs = reference.random_inputs(full.source_program, dict(M=3, K=16, N=128), seed=5)
        want = reference.run(full.source_program, inputs)["y"]
        got = reference.run(full.program, inputs)["y"]
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-10)


def test_the_trace_says_where_the_scale_went(capsys):
    from cli.main import main
    assert main(["ir", str(SAMPLE), "--after", "hoist-block-scale", "--rules"]) == 0
    assert ("// hoist-block-scale: qkv_proj: 'qkv' = (its element-wise math) * its 1x128 block scale where the "
            "selection takes it") in capsys.readouterr().out


def test_the_node_takes_the_mask_as_a_third_child():
    spec, _ = epic.compile(str(SAMPLE)).units()[0]
    root = spec.nodes[-1]
    assert root.type.startswith("epic_nodes::Sm90BlockReduceScale<128, ") and root.type.endswith(", false, float, true>")
    assert len(root.inputs) == 3
    # without a select the node is the one it was (no mask, the same type)
    plain, _ = epic.compile(str(ROOT / "samples" / "qk_norm_rope.epi")).units()[0]
    assert plain.nodes[-1].type.endswith(", false, float>") and len(plain.nodes[-1].inputs) == 2


def test_a_condition_that_reads_the_statistic_is_refused_at_it():
    text, line, _ = marked(GEMM + f"  out y: f32 = select($block_sum(acc, 32) > 0, acc * {S}, acc)\n}}\n")
    prog = epic.compile(text)
    with pytest.raises(EpicError) as info:
        prog.units()
    assert info.value.codes == ["E702"]
    d = info.value.diagnostics[0]
    assert "1xB block reduction" in d.hint and d.span.line == line


@pytest.fixture(scope="module")
def toolchain():
    hostsim.require_toolchain()


# (program, sizes, config M): the sample with real 128-column heads; a flag that is not constant per
# block (a random per-column vector) with the scale on the false side, divided, and stored
FLAG = (GEMM + "  in flag: f32[N]\n  s = block_max(abs(acc), 64) + 1\n"
        "  out y: f32 = select(flag > 0, acc + 1, acc * 3 / s)\n  out s_out: f32[M, N/64] = s\n}\n")
CASES = [(str(SAMPLE), dict(M=77, D=200, H=1, Dh=128), 64), (str(SAMPLE), dict(M=300, D=136, H=2, Dh=128), 8192),
         (FLAG, dict(M=77, K=136, N=320), 64), (FLAG, dict(M=300, K=136, N=320), 8192)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernels_on_the_host_match_the_reference(toolchain, tmp_path, case):
    text, sizes, config_m = CASES[case]
    path = text
    if not text.endswith(".epi"):
        path = str(tmp_path / "flag.epi")
        (tmp_path / "flag.epi").write_text(text)
    harness.check(harness.prepare(path, sizes, config_m), seed=case + 21)
