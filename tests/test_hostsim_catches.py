"""The host simulator can fail: bugs planted in code generation make the check of tests/test_hostsim.py
fail (each next to a control: the same case without the bug passes).

Bugs are planted by monkeypatching epic or by editing a rendered source before the harness parses
it; nothing in the repository changes. All variants are generated first and compiled together (one
g++ run per core), then each test runs its own. A bug in the custom nodes' own arithmetic (arith_bug)
is planted in a copy of their headers, which code generation prints and the host compiles: those
variants are compiled under their own patch.
"""
import dataclasses
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from epic.codegen import emit, functor
from epic.ir import primitives as P

from . import hostsim
from .conftest import ROOT
from .hostsim import compiler, harness

SEED = 20251130


# ------------------------------------------------------------------------------------------ the bugs
@contextmanager
def no_bug():
    yield


@contextmanager
def even_odd_swapped():
    """The functor writer takes odd columns for even(x) and even ones for odd(x)."""
    original = functor.ExprWriter._pair

    def swapped(self, v, p):
        if p.pair_part is not None:
            p = dataclasses.replace(p, pair_part=1 - p.pair_part)
        return original(self, v, p)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(functor.ExprWriter, "_pair", swapped)
        yield


def combine_edited(edit, what: str, renderer: str = "render_combine"):
    """A planted bug in the rendered combine kernel (or, renderer="render_tail", tail kernel): edit(text)
    -> text; `what` names the code it changes, for the message when a change to the template leaves
    nothing to edit."""
    @contextmanager
    def planted():
        original = getattr(emit, renderer)

        def render(spec):
            text = original(spec)
            changed = edit(text)
            assert changed != text, f"{what} was not found: update the planted bug"
            return changed

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(emit, renderer, render)
            yield
    return planted


# the rendered combine kernel merges the partials from tile 1 on
combine_skips_first_tile = combine_edited(
    lambda text: re.sub(r"for \(int t = (\w+); t < tiles_", r"for (int t = \1 + 1; t < tiles_", text), "the combine loop")
# its threads stop one row early: the last row is never written
combine_skips_last_row = combine_edited(
    lambda text: text.replace("const bool live = m < P.M;", "const bool live = m < P.M - 1;"),
    "the combine kernel's row guard")
# a tail kernel merges the warps' states but the last one's (plan/tail.py; rows of 4104 columns: every warp has some)
tail_skips_last_warp = combine_edited(
    lambda text: text.replace("for (int w = 0; w < kWarps; ++w)", "for (int w = 0; w < kWarps - 1; ++w)"),
    "the tail's merge of the warps", "render_tail")
# a tail kernel's 1x128 block butterfly over 8 of its 16 lanes: each half of a head gets its own statistic
tail_block_half_butterfly = combine_edited(
    lambda text: text.replace("for (int o = 8; o > 0; o >>= 1) { float x = __shfl_xor_sync(group, blk",
                              "for (int o = 4; o > 0; o >>= 1) { float x = __shfl_xor_sync(group, blk"),
    "the tail's block butterfly", "render_tail")
# a tail kernel's whole-vector read of a per-head vector starts a step (8 entries) late
tail_periodic_step_late = combine_edited(
    lambda text: text.replace("+ (j % per_", "+ ((j + 8) % per_"), "the tail's per-head vector read", "render_tail")
# with several rows per warp (many rows), each lane skips its first tile
grouped_combine_skips_tiles = combine_edited(
    lambda text: text.replace("for (int t0 = tile_lane;", "for (int t0 = tile_lane + tile_lanes;"),
    "the grouped combine loop")


@contextmanager
def max_identity_zero():
    """The max reduction's identity is 0 instead of -inf (in code generation and, as shared state,
    in the reference's padding too: only the kernels' own use of the identity can show it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(P.REDUCTIONS, "max", dataclasses.replace(P.REDUCTIONS["max"], identity=0.0))
        yield


ARITH = "epic_nodes/arith.hpp"


def arith_bug(old: str, new: str):
    """A wrong line in the custom nodes' arithmetic (templates/nodes/epic_nodes/arith.hpp), in a copy of
    the node headers that code generation reads and the host simulator compiles."""
    @contextmanager
    def planted():
        text = (compiler.NODES / ARITH).read_text()
        assert text.count(old) == 1, f"{old!r} is not in {ARITH}: update the planted bug"
        with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
            nodes = Path(d)
            shutil.copytree(compiler.NODES / "epic_nodes", nodes / "epic_nodes")
            (nodes / ARITH).write_text(text.replace(old, new))
            mp.setattr(compiler, "NODES", nodes)
            mp.setattr(emit, "_header_file", lambda name: (nodes / name).read_text())
            yield
    return planted


def swap_operands(source: str) -> str:
    """The gemm template passes B's pointer as A and A's as B."""
    if "ElementA const*>(p[0])" not in source:
        return source
    return (source.replace("ElementA const*>(p[0])", "ElementA const*>(p[@1])")
            .replace("ElementB const*>(p[1])", "ElementB const*>(p[0])").replace("p[@1]", "p[1]"))


def swap_node_pointers(source: str) -> str:
    """Two nodes' pointer indices exchanged in dag_args (p[3] <-> p[4])."""
    start = source.find("dag_args{")
    if start < 0:
        return source
    end = source.index("};", start)
    block = re.sub(r"p\[(3|4)\]", lambda m: "p[4]" if m.group(1) == "3" else "p[3]", source[start:end])
    return source[:start] + block + source[end:]


def fold_skips_last_tile(source: str) -> str:
    """A folded combine (combine=fold) merges every row's partials but the last column tile's."""
    return source.replace("if (t0 + u * kLanes < tiles_n) {", "if (t0 + u * kLanes < tiles_n - 1) {")


def tail_reads_gamma_from_z(source: str) -> str:
    """A tail kernel reads RMSNorm's gamma (p2, a row vector) through z's pointer (p1, a tile): row 0
    of z stands in for gamma, whose pointer goes unused."""
    return source.replace("static_cast<const __nv_bfloat16*>(p2) + (j)", "static_cast<const __nv_bfloat16*>(p1) + (j)")


def rename_node_type(source: str) -> str:
    """A node type the simulator has never heard of."""
    return source.replace("Sm90RowBroadcast<", "Sm90FancyBroadcast<")


def outside_not_neutral(source: str) -> str:
    """The value that replaces a reduction's elements outside the problem is not its identity."""
    return re.sub(r"\{0\.0f\},(\s*// \d+ outside the problem)", r"{1.0f},\1", source)


# program, sizes, configuration M, how the bug is planted (patch during generation and check,
# or an edit of the rendered sources), what the failure must say
PLANTED = {
    "swapped_operands": ("samples/bias_gelu.epi", dict(M=77, K=200, N=392), 64, no_bug, swap_operands,
                         r"passes static_cast<ElementA const\*>\(p\[1\]\) as A"),
    "swapped_node_pointers": ("samples/residual_rmsnorm.epi", dict(M=77, D=392), 64, no_bug, swap_node_pointers,
                              r"uses p\[4\], which epic_info says is row:gamma, not aux_load"),
    "even_odd_swapped_small_m": ("tests/programs/pair_swap.epi", dict(M=77, K=200, N=392), 64, even_odd_swapped,
                                 None, r"y \(f32\): \d+ of"),
    "even_odd_swapped_large_m": ("samples/swiglu.epi", dict(M=300, D=200, F=200), 8192, even_odd_swapped,
                                 None, r"y \(bf16\): \d+ of"),
    "combine_skips_first_tile": ("samples/residual_rmsnorm.epi", dict(M=77, D=392), 64, combine_skips_first_tile,
                                 None, r"r \(f32\): \d+ of 77 elements off"),
    "combine_skips_last_row": ("samples/residual_rmsnorm.epi", dict(M=77, D=392), 8192, combine_skips_last_row,
                               None, r"r: 1 of 77 elements depend on the buffer's initial contents"),
    "grouped_combine_skips_tiles": ("samples/residual_rmsnorm.epi", dict(M=4100, D=392), 8192,
                                    grouped_combine_skips_tiles, None, r"r \(f32\): \d+ of 4100 elements off"),
    "outside_not_neutral": ("samples/residual_rmsnorm.epi", dict(M=77, D=392), 8192, no_bug, outside_not_neutral,
                            r"o_proj__row_mean_part0 \(f32\): \d+ of"),
    "max_identity_zero": ("tests/programs/col_stats.epi", dict(M=300, K=200, N=392), 8192, max_identity_zero,
                          None, r"g__rmax_part0 \(f32\)"),
    "fold_skips_last_tile": ("samples/residual_rmsnorm.epi", dict(M=77, D=392), 64, no_bug, fold_skips_last_tile,
                             r"r \(f32\): \d+ of 77 elements off"),
    "tail_skips_last_warp": ("samples/residual_rmsnorm.epi", dict(M=5, D=4104), 64, tail_skips_last_warp, None,
                             r"r \(f32\): \d+ of 5 elements off"),
    "tail_reads_gamma_from_z": ("samples/residual_rmsnorm.epi", dict(M=5, D=392), 64, no_bug, tail_reads_gamma_from_z,
                                r"reads p1 as vector, but epic_info says it is tile:z"),
    "tail_block_half_butterfly": ("samples/qk_norm_rope.epi", dict(M=5, D=200, H=2, Dh=128), 128,
                                  tail_block_half_butterfly, None, r"q \(bf16\): \d+ of"),
    "tail_periodic_step_late": ("bench/programs/resid_norm_periodic.epi", dict(M=5, D=40, H=4, Dh=64), 64,
                                tail_periodic_step_late, None, r"hg \(bf16\): \d+ of"),
    # the nodes' own arithmetic: online log-sum-exp, block quantization, block statistic scaling, per-head index
    "lse_rescale_inverted": ("samples/cross_entropy.epi", dict(M=77, D=200, V=392), 64,
                             arith_bug("__expf(old_max - new_max)", "__expf(new_max - old_max)"), None,
                             r"lm_head__lse_part0 \(f32\): \d+ of"),
    "lse_pivot_dropped": ("tests/programs/masked_lse.epi", dict(M=77, D=200, N=392), 64,
                          arith_bug("(max == -INFINITY) ? 0.f : max", "max"), None,
                          r"scores__r_part0 \(f32\): \d+ of"),
    "block_amax_signed": ("samples/fp8_block_quant.epi", dict(M=77, D=256, N=512), 64,
                          arith_bug("valid ? fabsf(x) : 0.f", "valid ? x : 0.f"), None, r"q_scale \(f32\): \d+ of"),
    "block_statistic_divides": ("samples/qk_norm_rope.epi", dict(M=77, D=200, H=2, Dh=128), 64,
                                arith_bug("return Divide ? __fdiv_rn(y, s) : y * s;",
                                          "return Divide ? y * s : __fdiv_rn(y, s);"), None, r"q \(bf16\): \d+ of"),
    "periodic_index_unwrapped": ("samples/qk_norm_rope.epi", dict(M=77, D=200, H=4, Dh=98), 64,   # heads of 98
                                 arith_bug("at -= at >= period ? period : 0;", "at -= at > period ? period : 0;"),
                                 None, r"q \(bf16\): \d+ of"),
    # heads of 128 on 64-wide tiles: every tile inside one head; the bug reads the head's first half twice
    "periodic_tile_start_zero": ("samples/qk_norm_rope.epi", dict(M=77, D=200, H=2, Dh=128), 64,
                                 arith_bug("return start + tile_n <= period ? start : -1;",
                                           "return start + tile_n <= period ? 0 : -1;"),
                                 None, r"q \(bf16\): \d+ of"),
}
ARITH_BUGS = {"lse_rescale_inverted", "lse_pivot_dropped", "block_amax_signed", "block_statistic_divides",
              "periodic_index_unwrapped", "periodic_tile_start_zero"}
# configuration changes of a case: at small M a gemm with a row or block statistic takes the tail by
# default (plan/tail.py); the bugs planted in the gemm's epilogue nodes or the combine kernel need it off
IN_GEMM = {"combine": "kernel"}
OPTIONS = {"fold_skips_last_tile": {"combine": "fold"}, "swapped_node_pointers": IN_GEMM,
           "combine_skips_first_tile": IN_GEMM, "block_amax_signed": IN_GEMM, "block_statistic_divides": IN_GEMM,
           "periodic_index_unwrapped": IN_GEMM, "periodic_tile_start_zero": IN_GEMM}


def negative_inputs(case: harness.Case) -> dict:
    """Inputs whose every accumulator and every h = acc + z is negative (x >= 0, w <= 0, z < 0):
    a max reduction that starts from 0 instead of -inf gives 0 on every row and column."""
    inputs = harness.make_inputs(case, SEED)
    inputs["x"] = inputs["x"].abs()
    inputs["w"] = -inputs["w"].abs()
    if "z" in inputs:
        inputs["z"] = -(inputs["z"].abs() + 1)
    return inputs


def inputs_for(name: str, case: harness.Case) -> dict:
    return negative_inputs(case) if name == "max_identity_zero" else harness.make_inputs(case, SEED)


@pytest.fixture(scope="module")
def cases():
    """name -> (the case with the bug, the same case without it), all compiled up front."""
    hostsim.require_toolchain()
    out = {}
    for name, (program, sizes, config_m, patch, edit, _) in PLANTED.items():
        path = str(ROOT / program)
        control = harness.prepare(path, sizes, config_m, OPTIONS.get(name))
        with patch():
            buggy = harness.prepare(path, sizes, config_m, OPTIONS.get(name))
            if name in ARITH_BUGS:      # compiled against the planted header, not the repository's
                hostsim.compiler.prebuild(buggy.sources)
        if edit is not None:
            buggy = buggy.with_sources(edit)
        assert buggy.sources != control.sources, f"{name}: planting the bug changed no generated source"
        out[name] = buggy, control
    hostsim.compiler.prebuild([s for pair in out.values() for case in pair for s in case.sources
                               if not hostsim.harness.abi_problems(case)])
    return out


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bug_fails_the_check(cases, name):
    buggy, control = cases[name]
    _, _, _, patch, _, message = PLANTED[name]
    harness.check(control, SEED, inputs_for(name, control))          # the control passes ...
    with patch(), pytest.raises(AssertionError, match=message) as info:   # ... the planted bug does not
        harness.check(buggy, SEED, inputs_for(name, buggy))
    assert buggy.path in str(info.value) and f"seed {SEED}" in str(info.value)


def test_node_without_emulation_fails_loudly(cases):
    _, control = cases["swapped_node_pointers"]
    renamed = control.with_sources(rename_node_type)
    with pytest.raises(hostsim.NoHostEmulation, match="no host emulation for node type Sm90FancyBroadcast"):
        harness.check(renamed, SEED)


def test_a_source_printing_other_node_arithmetic_is_refused(cases):
    """The host runs arith.hpp as the repository has it: a source that prints something else (edited
    after generation) cannot be simulated with it, and says so."""
    _, control = cases["lse_rescale_inverted"]
    edited = control.with_sources(lambda s: s.replace("__expf(x - pivot)", "__expf(pivot - x)"))
    assert edited.sources != control.sources
    with pytest.raises(AssertionError, match="custom node arithmetic is not epic_nodes/arith.hpp"):
        harness.check(edited, SEED)
