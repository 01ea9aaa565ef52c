"""Code generation without a GPU: what each program lowers to, what is refused (E702), exact
literals, the build cache, and (marker `nvcc`) a real nvcc compile of generated kernels."""
import ctypes
import difflib
import math
import os
import stat
import struct
import subprocess
import sys
import textwrap

import pytest

import epic
from epic import dtypes, pipeline
from epic.codegen import cxx, emit, evt, functor
from epic.diagnostics import EpicError
from epic.plan import planner
from epic.runtime import build, cache, loader

from .conftest import ROOT, analyze
from .test_cache import tiny_elf

SUPPORTED = sorted(p.stem for p in (ROOT / "samples").glob("*.epi"))     # every sample
GEMM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n"
REFUSED = {   # what code generation refuses (E702): (program with `$` where the caret must point, message)
    "col_lse": (GEMM + "  out s: f32[N] = $col_lse(acc)\n}\n",
                "storing 'g__s_part0' (per-tile partials of col_lse 's', f32)"),
    "block_sum_store": (GEMM + "  $out s: f32[M, N/32] = block_sum(acc, 32)\n}\n",
                        "storing 's' (block_sum 's' (1x32 block reductions), f32)"),
    "half_width_e4m3": (GEMM + "  $out y: e4m3 = even(acc)\n}\n",
                        "storing 'y' (even 'y' (a tile, half as wide as the accumulator), e4m3)"),
    "double_width_i4": (GEMM + "  $out y: i4 = interleave(acc, acc)\n}\n",
                        "storing 'y' (interleave 'y' (a tile, 2 times as wide as the accumulator), i4)"),
    "block_scale_without_floor": (GEMM + "  s = $block_max(abs(acc), 64) / 448\n  out q: i4 = acc / s\n}\n",
                                  "block_max (1x64 block reductions) inside an epilogue expression"),
    "block_scale_zero_floor": (GEMM + "  $out q: i4 = acc / (max(block_max(abs(acc), 64), 0.0) / 448)\n}\n",
                               "block_max (1x64 block reductions) inside an epilogue expression"),
    "block_scale_negative_qmax": (GEMM + "  $out q: i4 = acc / (max(block_max(abs(acc), 64), 1e-12) / -448)\n}\n",
                                  "block_max (1x64 block reductions) inside an epilogue expression"),
    "double_width_f32_input": (GEMM + "  in z: f32[M, 2*N]\n  out y: f32 = acc + even($z)\n}\n",
                               "'z' (a f32 tile, 2 times as wide as the accumulator) inside an epilogue expression"),
}


def configs(program, m=8192):
    return emit.kernel_configs(program, m)


@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.parametrize("m", [64, 8192])
def test_supported_samples_generate(name, m):
    prog = pipeline.analyze(str(ROOT / "samples" / f"{name}.epi")).program
    pairs = emit.units(prog, configs(prog, m))
    assert len(pairs) == len(prog.kernels)
    for spec, unit in pairs:
        assert "{{ " not in unit.source and "{%" not in unit.source   # no Jinja left over
        assert unit.source.count("{") == unit.source.count("}")
        assert "EPIC_API int epic_launch" in unit.source
        if isinstance(spec, evt.KernelSpec):
            assert f"Shape<_{spec.config.tile[0]}, _{spec.config.tile[1]}, _{spec.config.tile[2]}>" in unit.source
            # the root (last node) computes D; with no D the last node is a sink
            assert spec.nodes[-1].type.startswith(("Sm90Compute", "epic_nodes::Sm90BlockScale",
                                                   "epic_nodes::Sm90BlockReduceScale")) \
                or spec.element_d == "void"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_features_are_refused_clearly(name):
    """Compiling checks, rewrites and plans (the reference runs); building refuses, at the line."""
    from .test_diagnostics import marked
    text, line, column = marked(REFUSED[name][0])
    prog = epic.compile(text)
    with pytest.raises(EpicError) as info:
        prog.units()
    assert info.value.codes == ["E702"]
    d = info.value.diagnostics[0]
    assert d.message == REFUSED[name][1] + " is not supported by code generation yet", d.message
    assert d.hint.startswith("supported: ") and "; " in d.hint
    assert d.span is not None and d.span.line == line, (d.span, line, column)


def test_residual_rmsnorm_lowering():
    prog = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    spec = evt.lower_gemm(prog, prog.kernels[0], configs(prog)["o_proj"])
    assert [(p.role, p.tensor) for p in spec.pointers] == [
        ("A", "x"), ("B", "wo"), ("D", "resid"), ("aux_load", "z"), ("row", "gamma"), ("aux_store", "hg"),
        ("row_partial", "o_proj__row_mean_part0")]
    types = [n.type.split("<")[0] for n in spec.nodes]
    assert types == ["Sm90AccFetch", "Sm90AuxLoad", "Sm90RowBroadcast", "Sm90Compute", "Sm90AuxStore",
                     "Sm90Compute", "epic_nodes::Sm90OutsideAs", "Sm90ColReduction", "Sm90Compute"]
    # the row sum's elements outside the problem become its identity before an unchecked reduction
    assert spec.nodes[6].args == "{0.0f}"
    assert "FinalReduction=*/false, /*VisitCheckOOB=*/false>" in spec.nodes[7].type
    assert "cutlass::plus" in spec.nodes[7].type
    assert spec.nodes[-1].type == "Sm90Compute<epic_fn2, cutlass::bfloat16_t, float, RN>"   # D = resid, bf16
    assert spec.element_d == "cutlass::bfloat16_t"
    assert [n.inputs for n in spec.nodes] == [[], [], [], [0, 1, 2], [3], [0, 1], [5], [6], [0, 1]]


def test_launch_time_options_do_not_change_the_source():
    """Swizzle and raster order are launch arguments: the same built library serves them all."""
    prog = pipeline.analyze(str(ROOT / "samples" / "bias_gelu.epi")).program
    base = emit.units(prog, emit.kernel_configs(prog, 8192))
    other = emit.units(prog, emit.kernel_configs(prog, 8192, {"up": {"swizzle": 8, "raster": "n"}}))
    assert [u.source for _, u in base] == [u.source for _, u in other]
    assert [u.name for _, u in base] == [u.name for _, u in other]


def test_split_k_builds_the_stream_k_scheduler_and_the_split_count_is_a_launch_argument():
    prog = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    base = [u for _, u in emit.units(prog, emit.kernel_configs(prog, 64))]
    two = [u for _, u in emit.units(prog, emit.kernel_configs(prog, 64, {"o_proj": {"splits": 2}}))]
    four = [u for _, u in emit.units(prog, emit.kernel_configs(prog, 64, {"o_proj": {"splits": 4}}))]
    assert [u.source for u in two] == [u.source for u in four] and [u.name for u in two] == [u.name for u in four]
    assert two[0].name == "o_proj.coop_128x64x64_c1x1_splitk" and base[0].name == "o_proj.ping_64x64x64_c1x1"
    assert "cutlass::gemm::StreamKScheduler>" in two[0].source and "StreamKScheduler" not in base[0].source
    for line in ("args.scheduler.splits = int(sizes[5]);", "decomposition_mode)::SplitK;",
                 "reduction_mode)::Deterministic;"):
        assert line in two[0].source and line not in base[0].source
    assert two[1].source == base[1].source          # the combine kernel does not change
    # CUTLASS 4.2's stream-K scheduler does not compile with griddepcontrol (is_last_tile)
    assert "#define CUTLASS_ENABLE_GDC_FOR_SM90" in base[0].source
    assert "#define CUTLASS_ENABLE_GDC_FOR_SM90" not in two[0].source
    # so a split-K kernel, which would not wait, is never launched as a programmatic dependent
    assert "cudaLaunchAttributeProgrammaticStreamSerialization" in base[0].source
    assert "cudaLaunchAttributeProgrammaticStreamSerialization" not in two[0].source


def test_combine_kernels_are_programmatic_dependents_that_wait_before_reading():
    prog = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    source = [u for _, u in emit.units(prog, emit.kernel_configs(prog, 64))][1].source
    assert "programmaticStreamSerializationAllowed = 1;" in source and "<<<" not in source
    body = source[source.index("__global__ void combine_kernel"):]
    body = body[body.index("{") + 1:]
    assert body.lstrip().startswith("wait_for_the_previous_kernel();")     # before any global memory access
    assert 'asm volatile("griddepcontrol.wait;" ::: "memory");' in source


def test_the_launch_sets_the_cluster_only_where_there_is_one():
    prog = pipeline.analyze(str(ROOT / "samples" / "bias_gelu.epi")).program
    small, large = (next(u for _, u in emit.units(prog, emit.kernel_configs(prog, m))) for m in (64, 8192))
    assert "cudaLaunchAttributeClusterDimension" not in small.source
    assert "cudaLaunchAttributeClusterDimension" in large.source and "clusterDim.x = 2;" in large.source
    assert "Gemm::run" not in large.source and "cudaFuncAttributeNonPortableClusterSizeAllowed" not in large.source


def test_costly_shared_values_get_one_node():
    prog = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  t = tanh(acc)\n"
                   "  out a: bf16 = t * 2\n  out b: bf16 = t + 1\n}\n").program
    spec = evt.lower_gemm(prog, prog.kernels[0], configs(prog)["g"])
    assert sum("epic_tanh" in f for f in spec.functors) == 1
    cheap = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  t = acc * 3\n"
                    "  out a: bf16 = t * 2\n  out b: bf16 = t + 1\n}\n").program
    spec = evt.lower_gemm(cheap, cheap.kernels[0], configs(cheap)["g"])
    assert len(spec.functors) == 2 and all("* 3.0f" in f for f in spec.functors)   # recomputed, no node


def test_d_is_void_when_only_partials_are_stored():
    prog = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out s: f32[M] = row_sum(acc)\n}\n").program
    spec = evt.lower_gemm(prog, prog.kernels[0], configs(prog)["g"])
    assert spec.element_d == "void"
    source = emit.render_gemm(spec)
    assert "struct DAG : DAGBase" in source and "using ElementAux = cutlass::bfloat16_t" in source


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _parse_literal(text: str) -> float:
    """The value a C++ float literal as epic prints it denotes (hex or decimal, f suffix, optional sign
    in parentheses, INFINITY/NAN): written from the C grammar, not from epic's printer."""
    t = text.strip()
    if t.startswith("(") and t.endswith(")"):
        t = t[1:-1]
    sign = -1.0 if t.startswith("-") else 1.0
    t = t.lstrip("-")
    if t in ("INFINITY", "NAN"):
        return sign * float(t.lower().replace("infinity", "inf"))
    assert t.endswith("f"), text
    return sign * (float.fromhex(t[:-1]) if t.startswith("0x") else float(t[:-1]))


@pytest.mark.parametrize("x", [0.1, 1e-6, 448.0, -3.5, 0.7978845608028654, 2.0**30, 1 / 3, 0.0, -0.0,
                               math.inf, -math.inf, 1e300, -1e300, 1e-40, -1e-50, 2.0**-149, 3.0e38, 16777217.0])
def test_literals_are_exact(x):
    """A literal denotes exactly the float32 the kernel computes with: sign of zero kept, values beyond
    float32 are infinities, subnormals survive."""
    value = _parse_literal(cxx.literal(x))
    want = math.copysign(math.inf, x) if abs(x) > 3.4028235e38 else _f32(x)
    assert value == want and math.copysign(1, value) == math.copysign(1, want), (x, cxx.literal(x))


def test_nan_literal():
    assert math.isnan(_parse_literal(cxx.literal(math.nan)))


def test_literals_compose_with_operators():
    """`-` applied to a negative literal must not form `--` (a decrement)."""
    assert "--" not in "(-{0})".format(cxx.literal(-3.5)) and "--" not in "(-{0})".format(cxx.literal(-0.0))


def test_store_and_cast_semantics_in_cpp():
    assert functor.store_expr("v", dtypes.E4M3) == "epic_sat(v, (-448.0f), 448.0f)"
    assert functor.store_expr("v", dtypes.I8) == "epic_sat_int(v, (-128.0f), 127.0f)"
    assert functor.store_expr("v", dtypes.BF16) == "v"
    assert functor.cast_expr("v", dtypes.BF16, "cuda") == "float(__nv_bfloat16(v))"


def test_combine_kernel_lowering():
    prog = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    (spec, unit), = [(s, u) for s, u in emit.units(prog, configs(prog)) if u.name.endswith("combine")]
    assert not unit.uses_cutlass
    assert [(p.role, p.tensor) for p in spec.pointers] == [("row_partial", "o_proj__row_mean_part0"), ("out", "r")]
    assert [s.name for s in spec.scalars] == ["D", "eps"]
    merge, body = "\n".join(spec.merge), "\n".join(spec.body)
    assert "for (int t = lane; t < tiles_n; t += 32)" in merge and "t * rows_padded + m" in merge
    assert "__shfl_xor_sync" in merge and "/ s[0]" in merge and "rsqrtf" in body


def _fold(prog, m=64):
    return emit.kernel_configs(prog, m, {k.name: {"combine": "fold"} for k in prog.kernels if k.kind == "gemm"})


def test_a_folded_row_combine_runs_inside_its_gemm():
    prog = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    (spec, unit), = emit.units(prog, _fold(prog))        # one launch: the combine kernel has no unit
    assert spec.config.combine == "fold" and unit.name.endswith("_fold")
    node = spec.nodes[-1]                                 # last: its hooks run after the partials' stores
    assert node.type == "epic_nodes::Sm90RowFold<TileShape, epic_fold_tail>"
    assert node.inputs == [len(spec.nodes) - 2]           # a pass-through around the old root
    roles = [(p.role, p.tensor) for p in spec.pointers]
    counters = roles.index(("counters", ""))              # passed as null: the library's own counters
    assert roles[counters + 1:] == [("row_partial", "o_proj__row_mean_part0"), ("out", "r")]
    assert [p.dtype.name for p in spec.pointers[counters:]] == ["i32", "f32", "f32"]     # the ABI comment's types
    assert spec.pointers[counters].note == "null: the library's own per-stream row block counters"
    assert node.comment == "folded combine: o_proj__row_mean_part0 -> r (D, eps)"
    assert {p.note for p in spec.pointers[counters + 1:]} == {"folded combine 'o_proj__row_combine'"}
    every = pipeline.analyze(str(ROOT / "tests" / "programs" / "every_primitive.epi")).program
    assert emit.units(every, _fold(every))[0][0].nodes[-1].comment == (
        "folded combine: every__row_sum_part0, every__row_max_part1, every__row_min_part2, every__row_mean_part3 "
        "-> rows (N)")
    assert "// the combine kernel 'o_proj__row_combine', folded: run by the last CTA" in unit.source
    assert [s.name for s in spec.scalars][-2:] == ["D", "eps"]
    assert spec.scratch == [(counters, "(sizes[0] + 64 - 1) / 64 * 4")]
    assert f"with_scratch[{counters}] = epic_nodes::stream_scratch(dev, st, {counters}," in unit.source
    tail = next(f for f in spec.functors if "struct epic_fold_tail" in f)
    assert "__ldcg(part_0 + ((long long)t * rows_padded + m))" in tail      # through L2: other CTAs wrote them
    assert "t0 += kLanes * FOLD_IN_FLIGHT" in tail and "for (int o = kLanes / 2; o > 0; o >>= 1)" in tail
    assert "if (lane != 0 || m >= M) return;" in tail and "rsqrtf" in tail
    from epic.plan import ledger
    source = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).source_program
    text = ledger.render(planner.make_plan(prog, {"M": 64, "D": 392}, {"o_proj": {"combine": "fold"}}), source)
    assert "o_proj__row_combine: combine of o_proj's per-tile partials (rows), folded into o_proj" in text
    # the combine kernel's own source is untouched by folding elsewhere: 32 lanes, plain loads
    kernel = emit.units(prog, configs(prog, 64))[1][0]
    assert "for (int t = lane; t < tiles_n; t += 32)" in "\n".join(kernel.merge)


def test_only_a_row_combine_right_after_its_gemm_folds():
    whole = pipeline.analyze(str(ROOT / "tests" / "programs" / "whole_tensor.epi")).program
    cols = pipeline.analyze(str(ROOT / "tests" / "programs" / "col_stats.epi")).program
    for prog in (whole, cols):
        folded = planner.folds(prog, _fold(prog))
        for k in prog.kernels:
            if k.kind == "combine":
                assert (k.name in folded) == (k.axis == "row"), (prog.name, k.name, k.axis)
        names = {s.name for s, _ in emit.units(prog, _fold(prog))}
        assert names == {k.name for k in prog.kernels if k.name not in folded}
    mlp = pipeline.analyze(str(ROOT / "samples" / "prenorm_mlp.epi")).program
    assert planner.folds(mlp, configs(mlp, 64)) == {}        # combine=kernel, the default: nothing folds


def test_trace_tiles_wraps_the_collectives_and_leaves_the_untraced_kernel_as_it_was():
    """trace=tiles wraps the mainloop and epilogue collectives in the recording ones and prints the trace
    buffer's header (with its exported readers) outside the kernel's namespace; its kernel has a name of
    its own; the default kernel's text names none of it. Split-K's kernel is not traced."""
    prog = pipeline.analyze(str(ROOT / "bench" / "programs" / "plain.epi")).program
    sizes = dict(M=8192, K=1024, N=28672)
    [(_, base)] = emit.units(prog, emit.kernel_configs(prog, 8192, None, sizes))
    [(_, traced)] = emit.units(prog, emit.kernel_configs(prog, 8192, {"plain": {"trace": "tiles"}}, sizes))
    assert base.name == "plain.ping_128x192x64_c2x1" and traced.name == base.name + "_tiles"
    assert "epic_trace" not in base.source
    assert ("using CollectiveMainloop = epic_trace::TracedMainloop<epic_mainloop::L2PrefetchMainloop<BuiltMainloop, "
            "192, 64>>;") in traced.source
    assert "using CollectiveEpilogue = epic_trace::TracedEpilogue<typename cutlass::epilogue::collective" in traced.source
    header = traced.source.index("struct TracedMainloop : Base {")
    assert header < traced.source.index("namespace epic_kernel {")
    assert "EPIC_API int epic_trace_read(void* dst, size_t bytes)" in traced.source
    # the trace adds lines; of the default kernel's, it changes only the two collectives', the comment
    # naming the configuration and the library's description of itself (which names it too)
    removed = [d[2:] for d in difflib.ndiff(base.source.splitlines(), traced.source.splitlines()) if d[:2] == "- "]
    assert [r.split()[:2] for r in removed[:4]] == [["//", "ping_128x192x64_c2x1;"], ["using", "CollectiveEpilogue"],
                                                    ["float,", "float,"], ["using", "CollectiveMainloop"]]
    assert len(removed) == 5 and removed[4].startswith('  return "{\\"abi\\":1,')
    with pytest.raises(EpicError) as info:
        emit.kernel_configs(prog, 8192, {"plain": {"trace": "tiles", "splits": 2}}, sizes)
    assert info.value.codes == ["E216"] and "the split-K kernel (splits=2) is not traced" in str(info.value)


def test_combine_fold_with_split_k_is_refused():
    prog = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    with pytest.raises(EpicError) as info:
        emit.kernel_configs(prog, 64, {"o_proj": {"combine": "fold", "splits": 2}})
    assert info.value.codes == ["E216"] and "combine=fold does not work with splits=2" in str(info.value)
    with pytest.raises(EpicError) as info:
        emit.kernel_configs(prog, 64, {"o_proj": {"combine": "later"}})
    assert "combine must be one of kernel, fold" in str(info.value)


def test_decode_shares_a_block_between_a_clusters_two_ctas():
    prog = pipeline.analyze(str(ROOT / "samples" / "qk_norm_rope.epi")).program
    (spec, unit), = emit.units(prog, configs(prog, 64))
    assert str(spec.config) == "pingpong 64x64x64 cluster 1x2 epilogue 64x64"
    # the halves go through each other's shared memory: two words per tile row, kept by the pipeline
    assert spec.pair_words == 128 and spec.scratch == [] and "pair_slots" not in [p.role for p in spec.pointers]
    assert spec.mainloop.startswith("epic_mainloop::PairSlots<") and spec.mainloop.endswith(", 128>")
    assert "epic_nodes/pair_slots_mainloop.hpp" in spec.scheduler_headers
    assert spec.mainloop_carveout.endswith(" + 1024")        # the words are not the stages'
    assert "StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage)) + 1024>" \
        in unit.source
    assert "offsetof(typename GemmKernel::SharedStorage, pipelines) == 0" in unit.source
    (big, big_unit), = emit.units(prog, configs(prog, 8192))      # prefill: 128-wide tiles hold whole blocks
    assert big.pair_words == 0 and "PairSlots" not in big.mainloop and "offsetof" not in big_unit.source
    quant = pipeline.analyze(str(ROOT / "samples" / "fp8_block_quant.epi")).program
    (q, _), = emit.units(quant, configs(quant, 64))
    assert q.nodes[-1].type.startswith("epic_nodes::Sm90BlockScale<128,") and q.pair_words == 128
    (h, _), = emit.units(quant, configs(quant, 8192))
    assert h.pair_words == 0


def test_a_second_split_block_node_in_one_epilogue_is_refused():
    """The exchange's words carry one node's halves, tagged by tile: a second node would overwrite them
    under the same tag. No program reaches this today (one block node per gemm), so the guard is called
    as the two block nodes would call it."""
    from types import SimpleNamespace
    from epic.codegen.nodes import custom
    b = SimpleNamespace(cfg=SimpleNamespace(tile_m=64, tile_n=64), pair_words=0)
    custom._split_blocks(b, 64)                   # a block the tile holds whole: no exchange
    assert b.pair_words == 0
    custom._split_blocks(b, 128)
    assert b.pair_words == 128
    with pytest.raises(EpicError) as info:
        custom._split_blocks(b, 128)
    assert info.value.codes == ["E702"] and "share the exchange's words" in str(info.value)


def test_compile_command_writes_sources(tmp_path, capsys):
    from epic_cli.main import main
    assert main(["compile", str(ROOT / "samples" / "residual_rmsnorm.epi"), "-o", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["residual_rmsnorm.o_proj.ping_128x128x64_c2x1.cu", "residual_rmsnorm.o_proj__row_combine.cu"]


# ---------------------------------------------------------------- the build cache, with a fake nvcc
FAKE_NVCC = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    if "--version" in sys.argv:
        print("Cuda compilation tools, release 13.0, V13.0.88"); sys.exit(0)
    if "-dryrun" in sys.argv:     # no steps to split (epic/runtime/nvcc_split.py): epic runs plain nvcc
        sys.exit(0)
    with open(os.environ["FAKE_NVCC_LOG"], "a") as f:
        f.write("called\\n")
    src = next(a for a in sys.argv if a.endswith(".cu"))
    if "FAIL" in open(src).read():
        print(src + "(3): error: this is a planted failure", file=sys.stderr); sys.exit(1)
    time.sleep(float(os.environ.get("FAKE_NVCC_SLEEP", "0")))
    out = sys.argv[sys.argv.index("-o") + 1]
    open(out, "wb").write(open(os.environ["FAKE_NVCC_SO"], "rb").read())   # a minimal valid ELF
""")


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    exe = tmp_path / "nvcc"
    exe.write_text(FAKE_NVCC.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    log.write_text("")
    so = tmp_path / "fake.so"
    so.write_bytes(tiny_elf())
    monkeypatch.setenv("FAKE_NVCC_SO", str(so))
    monkeypatch.setenv("EPIC_NVCC", str(exe))
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "cache"))
    build.nvcc_version.cache_clear()
    return log


def test_cache_hit_does_not_call_nvcc(fake_nvcc):
    unit = build.Unit("k", "// kernel A\n")
    first = build.build_all([unit], quiet=True)[0]
    again = build.build_all([unit], quiet=True)[0]
    assert first == again and cache.problem(first) is None
    assert fake_nvcc.read_text().count("called") == 1
    other = build.build_all([build.Unit("k", "// kernel B\n")], quiet=True)[0]
    assert other != first and fake_nvcc.read_text().count("called") == 2


def test_two_processes_building_the_same_kernel(fake_nvcc, tmp_path):
    code = ("from epic.runtime import build\n"
            "print(build.build_one(build.Unit('k', '// same kernel\\n')))\n")
    env = dict(os.environ, FAKE_NVCC_SLEEP="1.5", PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    assert fake_nvcc.read_text().count("called") == 1     # the second waited on the lock, then reused


def test_build_and_compile_commands(fake_nvcc, tmp_path, capsys):
    from epic_cli.main import main
    sample = str(ROOT / "samples" / "residual_rmsnorm.epi")
    assert main(["build", sample, "--shape", "M=64,D=256"]) == 0
    out = capsys.readouterr().out
    # decode: the gemm stores its accumulator, a tail kernel runs the epilogue (plan/tail.py's heuristic)
    assert out.count("built ") == 2 and "ping_64x64x64_c1x1_tail.so" in out and "o_proj__tail.so" in out
    assert fake_nvcc.read_text().count("called") == 2
    assert main(["compile", sample, "-o", str(tmp_path / "out"), "--build"]) == 0
    out = capsys.readouterr().out
    assert "ping_128x128x64_c2x1.so" in out and "o_proj__row_combine.so" in out and (tmp_path / "out").is_dir()
    assert fake_nvcc.read_text().count("called") == 4
    assert main(["build", sample, "--shape", "M=64,D=256"]) == 0
    assert fake_nvcc.read_text().count("called") == 4      # the decode kernels came from the cache


def test_nvcc_failure_is_E701_and_keeps_the_source(fake_nvcc):
    with pytest.raises(EpicError) as info:
        build.build_all([build.Unit("bad", "// FAIL\n")], quiet=True)
    assert info.value.codes == ["E701"]
    msg = str(info.value)
    assert "bug in epic" in msg and "planted failure" in msg
    kept = msg.split("the source is kept at ")[1].split(";")[0]
    assert open(kept).read() == "// FAIL\n"


# ---------------------------------------------------------------- a real nvcc compile (slow)
@pytest.mark.nvcc
def test_nvcc_builds_generated_kernels(tmp_path, monkeypatch):
    """Gemm kernels (a per-tile reduction; the same with its combine folded in; QK-norm's blocks
    shared by a 1x2 cluster's two CTAs, both with per-stream scratch) and a combine kernel, compiled by
    nvcc in parallel into a fresh cache, then loaded: their C ABI must match what the runtime expects."""
    if not build.shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    resid = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    qk = pipeline.analyze(str(ROOT / "samples" / "qk_norm_rope.epi")).program
    pairs = emit.units(resid, configs(resid, 64)) + emit.units(resid, _fold(resid)) + emit.units(qk, configs(qk, 64))
    paths = build.build_all([u for _, u in pairs], quiet=True)
    assert len(paths) == 4 and all(p.exists() and p.stat().st_size > 100_000 for p in paths)
    for (spec, _), p in zip(pairs, paths):
        lib = loader.load(p, [f"{x.role}:{x.tensor}" for x in spec.pointers])
        assert lib.info["kernel"] == spec.name
        syms = subprocess.run(["nm", "-D", "--defined-only", str(p)], capture_output=True, text=True).stdout
        assert "epic_launch" in syms and "epic_workspace_size" in syms
    gemm = next(loader.load(p, [f"{x.role}:{x.tensor}" for x in s.pointers]) for (s, _), p in zip(pairs, paths)
                if isinstance(s, evt.KernelSpec))
    if not _has_gpu():
        with pytest.raises(EpicError) as info:      # no GPU: the library says so instead of crashing
            gemm.workspace_size([64, 256, 256, 1, 0])
        assert info.value.codes == ["E703"]
        rc = gemm.lib.epic_launch(None, None, None, None, None, 0)
        assert rc == -1


@pytest.mark.nvcc
def test_nvcc_builds_a_traced_kernel_whose_buffer_layout_the_bench_reads(tmp_path, monkeypatch):
    """trace=tiles compiles with CUTLASS's pingpong kernel, exports its buffer's readers, and says the
    buffer's shape that bench/tile_trace.py slices it by (the layout call needs no GPU)."""
    _, lib = _build_plain(tmp_path, monkeypatch, {"trace": "tiles"}, dict(M=8192, K=1024, N=28672))
    layout = (ctypes.c_int * 6)()
    assert lib.function("epic_trace_layout")(layout) == 0
    ctas, tiles, events, load_events, words, size = list(layout)
    assert (ctas, tiles, events, load_events, words) == (264, 128, 7, 3, 8)
    assert size == 8 * (ctas * 2 * tiles * events + ctas * 2 * tiles * load_events + ctas * words)
    assert lib.function("epic_trace_read") is not None and lib.function("epic_trace_clear") is not None
    assert lib.function("epic_trace_nothing") is None


@pytest.mark.nvcc
def test_nvcc_builds_a_serpentine_kernel(tmp_path, monkeypatch):
    """tile_order=serpentine's scheduler compiles with CUTLASS's pingpong kernel (it hides the base
    scheduler's tile getters) and the library loads with the default kernel's C ABI."""
    spec, lib = _build_plain(tmp_path, monkeypatch, {"tile_order": "serpentine"}, dict(M=8192, K=4096, N=14336))
    assert lib.info["kernel"] == spec.name and lib.info["config"] == "ping_128x192x64_c2x1_serp"


@pytest.mark.nvcc
def test_nvcc_builds_a_dynamic_kernel(tmp_path, monkeypatch):
    """tile_order=dynamic's scheduler (its response and throttle pipelines, remote st.shared::cluster
    stores and release arrives, the counter's atom.inc) compiles on CUTLASS's pingpong scheduler-warp
    path, and the library takes the counter as one more pointer that the caller passes as null."""
    spec, lib = _build_plain(tmp_path, monkeypatch, {"tile_order": "dynamic"}, dict(M=8192, K=4096, N=4096))
    assert lib.info["kernel"] == spec.name and lib.info["config"] == "ping_128x128x64_c2x1_dyn"
    assert [(p.role, p.tensor) for p in spec.pointers][-1] == ("tile_counter", "")
    assert spec.scratch == [(len(spec.pointers) - 1, "4")]


@pytest.mark.nvcc
def test_nvcc_builds_a_split_last_kernel(tmp_path, monkeypatch):
    """tile_order=split_last's kernel body (epic_nodes/split_last_round.hpp over CUTLASS's pingpong
    GemmUniversal: its pipelines, order barriers and collectives driven per work unit) compiles, and the
    library takes the partial slots and counters as two more pointers that the caller passes as null."""
    spec, lib = _build_plain(tmp_path, monkeypatch, {"tile_order": "split_last"}, dict(M=8192, K=4096, N=4096))
    assert lib.info["kernel"] == spec.name and lib.info["config"] == "ping_128x128x64_c2x1_splitlast"
    assert [(p.role, p.tensor) for p in spec.pointers][-2:] == [("split_partials", ""), ("split_counts", "")]
    n = len(spec.pointers)
    assert spec.scratch == [(n - 2, str(144 * 128 * 128 * 4)), (n - 1, str(144 * 4))]


@pytest.mark.nvcc
def test_nvcc_builds_a_kernel_whose_loads_carry_no_cache_policy(tmp_path, monkeypatch):
    """load_hint=none's producer (epic_nodes/unhinted_loads_mainloop.hpp) compiles in place of CUTLASS's
    with the pingpong kernel and the library loads with the default kernel's C ABI."""
    spec, lib = _build_plain(tmp_path, monkeypatch, {"load_hint": "none"}, dict(M=8192, K=4096, N=28672))
    assert lib.info["kernel"] == spec.name and lib.info["config"] == "ping_128x192x64_c2x1_nohint"


@pytest.mark.nvcc
def test_nvcc_builds_a_kernel_that_loads_a_short_a_box(tmp_path, monkeypatch):
    """a_rows=8's producer (epic_nodes/short_a_mainloop.hpp: its own TMA descriptor of an 8-row box of A,
    B as CUTLASS loads it) compiles with the pingpong kernel, on the plan's 64x32x128 tile and 1x2 cluster
    at one row (config.SHORT_ACC), and loads with the default kernel's C ABI."""
    spec, lib = _build_plain(tmp_path, monkeypatch, {"a_rows": 8}, dict(M=1, K=4096, N=4096))
    assert lib.info["kernel"] == spec.name and lib.info["config"] == "ping_64x32x128_c1x2_a8"


def _build_plain(tmp_path, monkeypatch, options: dict, sizes: dict):
    """The identity-epilogue gemm (bench/programs/plain.epi) with these kernel options, built by nvcc
    into a fresh cache and loaded: (its spec, its library). Skips where nvcc is missing."""
    if not build.shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    prog = pipeline.analyze(str(ROOT / "bench" / "programs" / "plain.epi")).program
    [(spec, unit)] = emit.units(prog, emit.kernel_configs(prog, sizes["M"], {"plain": options}, sizes))
    [path] = build.build_all([unit], quiet=True)
    return spec, loader.load(path, [f"{x.role}:{x.tensor}" for x in spec.pointers])


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False
