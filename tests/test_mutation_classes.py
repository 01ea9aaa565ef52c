"""Behaviour the mutation run (tests/mutation/README.md) found untested, class by class: each test
names what a planted change there broke without any other CPU test failing."""
import ctypes
import re

import pytest
import torch

import epic
from epic import pipeline, reference
from epic.codegen import cxx, emit, functor
from epic.diagnostics import EpicError
from epic.passes import block_quant, manager
from epic.plan import planner
from epic.runtime import binding, validate

from .conftest import ROOT, analyze
from .hostsim import harness
from .test_cli import run as run_cli
from .test_hostsim import prepare


# ---------------------------------------------------------------- block-scale recognition
def _quant_value(expr: str):
    a = pipeline.analyze(f"gemm g(x: bf16[M, K] @ w: bf16[K, N]) {{\n  out q: e4m3 = e4m3({expr})\n}}\n", name="t.epi",
                         stop_after="hoist-block-scale")      # before block-quant rewrites it
    v = a.program.kernels[0].stores[0].value
    while v.op == "cast":
        v = v.args[0]
    return v


@pytest.mark.parametrize("expr,want", [
    ("acc / (max(block_amax(acc, 128), 1e-12) / 448.0)", (128, 1e-12, 448.0)),
    ("acc / (max(1e-12, block_amax(acc, 64)) / 448.0)", (64, 1e-12, 448.0)),          # floor first
    ("acc / (max(block_max(abs(acc), 32), 0.5) / 127.0)", (32, 0.5, 127.0)),          # max of |x|
    ("acc / (max(block_max(acc, 128), 1e-12) / 448.0)", None),                        # no abs: not an amax
    ("acc / (max(block_sum(abs(acc), 128), 1e-12) / 448.0)", None),
    ("acc / (max(block_min(abs(acc), 128), 1e-12) / 448.0)", None),
    ("acc * (max(block_amax(acc, 128), 1e-12) / 448.0)", None),
    ("acc / (min(block_amax(acc, 128), 1e-12) / 448.0)", None),
    ("acc / (max(block_amax(acc, 128), 1e-12) * 448.0)", (128, 1e-12, 1 / 448.0)),     # qmax 1/448
    ("acc * (max(block_amax(acc, 128), 1e-12) * 448.0)", None),
])
def test_only_the_quantization_pattern_is_a_block_scale(expr, want):
    got = block_quant._scaled(_quant_value(expr), -1)
    assert (got[1:4] if got else None) == want


# ---------------------------------------------------------------- the plan as users read it
def test_plan_text_of_packed_int4_and_lse_partials(capsys):
    code, out, _ = run_cli(capsys, "plan", str(ROOT / "samples" / "int4_pack.epi"), "--shape", "M=77,D=200,N=512")
    assert code == 0
    line = next(l for l in out.splitlines() if l.startswith("  q "))
    # 77 rows of 512 int4 values: 256 bytes per row, 19,712 bytes, written by the gemm
    assert re.search(r"out\s+uint8\[77, 256\]\s+19,712 B  written by proj; read by -", line), line
    assert out.split(line, 1)[1].splitlines()[1].strip() == "int4 packed two per byte, low nibble = even column"
    code, out, _ = run_cli(capsys, "plan", str(ROOT / "samples" / "cross_entropy.epi"), "--shape", "M=77,D=200,V=392")
    lines = out.splitlines()
    i = next(i for i, l in enumerate(lines) if l.startswith("  lm_head__lse_part0"))
    # 7 tiles of 64 columns over V = 392; M padded to 128 (two 64-row tiles); one log-sum-exp per tile
    assert re.search(r"partial float32\[7, 128\]\s+3,584 B  written by lm_head; read by lm_head__row_combine", lines[i])
    assert lines[i + 1].strip() == "per-tile row partials, tile-major, padded to the tile"
    w = next(i for i, l in enumerate(lines) if l.startswith("  w "))
    assert lines[w + 1].strip() == "K-major (column-major [K, N])"
    assert "writes nothing else; per-tile partials (lse, sum)" in out


def test_plan_text_of_column_partials_and_shared_readers():
    text = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out cs: f32[N] = col_sum(acc)\n}\n"
            "gemm h(x @ w2: bf16[K, N]) {\n  out y: bf16 = acc\n}\n")
    prog = epic.compile(text)
    plan = prog.plan(dict(M=77, K=16, N=200), device="cpu")
    from epic.plan import ledger
    out = ledger.render(plan, prog.analysis.source_program)
    x = next(l for l in out.splitlines() if l.startswith("  x "))
    assert x.endswith("read by g, h")
    lines = out.splitlines()
    i = next(i for i, l in enumerate(lines) if l.startswith("  g__cs_part0"))
    # 200 columns padded to 256 (pingpong 64x64 tiles); 2 row tiles over M = 77
    assert re.search(r"partial float32\[2, 256\]\s+2,048 B  written by g; read by g__col_combine", lines[i])
    assert lines[i + 1].strip() == "per-tile column partials, tile-major, padded to the tile"


# ---------------------------------------------------------------- the reference's inputs
def test_random_inputs_are_reproducible_scaled_and_in_range():
    a = pipeline.analyze(str(ROOT / "samples" / "cross_entropy.epi"))
    sizes = dict(M=300, D=1024, V=392)
    one, two = (reference.random_inputs(a.source_program, sizes, seed=5) for _ in range(2))
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert not torch.equal(one["x"], reference.random_inputs(a.source_program, sizes, seed=6)["x"])
    w = one["w"].double()                                      # the B operand: std 1/sqrt(K)
    assert 0.8 / 32 < w.std().item() < 1.2 / 32
    assert 0.8 < one["x"].double().std().item() < 1.2
    assert one["label"].min() >= 0 and one["label"].max() < 392
    q = pipeline.analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in i: i8[M]\n  out y: bf16 = acc + i\n}\n",
                         name="t.epi")
    i = reference.random_inputs(q.source_program, dict(M=4000, K=16, N=4096), seed=1)["i"]
    assert i.dtype == torch.int8 and i.min() >= 0 and i.max() == 127      # [0, 128): wraps nowhere


@pytest.mark.parametrize("make,what", [(lambda: torch.zeros(4, 8, dtype=torch.complex64), "complex"),
                                       (lambda: torch.zeros(4, 8, device="meta"), "meta"),
                                       (lambda: torch.zeros(4, 8).to_sparse(), "sparse_coo"),
                                       (lambda: torch.nested.nested_tensor([torch.zeros(8)] * 4), "nested")])
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_the_reference_names_what_kind_of_tensor_it_refuses(make, what):
    prog = epic.compile("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n")
    with pytest.raises(EpicError) as e:
        prog.reference(x=make(), w=torch.zeros(8, 8))
    assert e.value.codes == ["E603"] and f"is a {what} tensor" in str(e.value)


def test_an_odd_width_for_a_pairwise_map_is_refused_with_a_hint():
    prog = epic.compile("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = rotate(acc, 1.0, 0.0)\n}\n")
    with pytest.raises(EpicError) as e:
        reference.run(prog.analysis.source_program, dict(x=torch.zeros(2, 16), w=torch.zeros(16, 7)))
    assert "pairwise maps need an even number of columns" in str(e.value)


# ---------------------------------------------------------------- the runtime's bookkeeping
def test_a_signature_tells_shapes_strides_dtypes_apart():
    x = torch.zeros(4, 8)
    base = validate.signature(dict(x=x, s=1.0))
    assert validate.signature(dict(x=torch.zeros(4, 8), s=2.0)) == base           # scalars: per call
    for other in (torch.zeros(4, 9), torch.zeros(8, 4).t(), torch.zeros(4, 8, dtype=torch.float64)):
        assert validate.signature(dict(x=other, s=1.0)) != base


def test_a_k_major_operand_with_a_gap_between_columns_is_e605():
    prog = epic.compile("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n")
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    # stride(0) 2 where a K-major operand has 1, though stride(1) equals K as K-major strides do
    w = torch.zeros(2 * 15 + 16 * 31 + 1, dtype=torch.bfloat16).as_strided((16, 32), (2, 16))
    with pytest.raises(EpicError) as e:
        prog(x=x, w=w)
    assert e.value.codes == ["E605"]


class _FakeLibrary:
    def __init__(self, workspace=0):
        self.info, self.calls, self.workspace = {"kernel": "k"}, [], workspace

    def workspace_size(self, dims):
        return self.workspace

    def launch(self, ptrs, dims, scalars, stream, workspace=0, workspace_bytes=0):
        self.calls.append(dict(ptrs=list(ptrs), dims=list(dims), scalars=list(scalars), stream=stream,
                               workspace=workspace, workspace_bytes=workspace_bytes))


def test_bind_and_launch_pass_stream_workspace_and_names():
    case = prepare("samples/residual_rmsnorm.epi", "small_m", (77, 392, 200))
    libs = [_FakeLibrary(workspace=256 if i == 0 else 0) for i in range(len(case.specs))]
    bound = binding.bind(case.plan, list(zip(case.specs, libs)), -1)
    assert bound.tensor_names == [t.name for t in case.program.inputs() if not t.is_scalar]
    assert bound.outputs == [t.name for t in case.program.outputs()]
    assert bound.launches[0].workspace == 256 and bound.launches[1].workspace == 0
    buffers = {n: torch.zeros(8) for n in bound.tensor_names}
    buffers.update({b.name: torch.zeros(8) for b in bound.allocations})
    for launch in bound.launches:
        launch.run(buffers, {"eps": 0.5}, 1234, "cpu")
    first, second = libs[0].calls[0], libs[1].calls[0]
    assert first["stream"] == 1234 and second["stream"] == 1234
    assert first["workspace"] and first["workspace_bytes"] == 256
    assert second["workspace"] == 0 and second["workspace_bytes"] == 0


def test_allocate_uses_the_device_and_poisons_bf16_with_nan():
    b = planner.Buffer("y", "out", None, (2, 3), "bfloat16", 12, "row-major")
    assert binding.allocate(b, "meta", poison=False).device.type == "meta"
    assert torch.isnan(binding.allocate(b, "cpu", poison=True).float()).all()
    i = planner.Buffer("q", "out", None, (2, 3), "int8", 6, "row-major")
    assert (binding.allocate(i, "cpu", poison=True) == 0x7F).all()


def test_the_fake_kernel_of_the_custom_op_gives_packed_int4_its_bytes():
    prog = epic.compile(str(ROOT / "samples" / "int4_pack.epi"))
    op = prog.torch_op().op
    ins = [t for t in prog.inputs if not t.is_scalar]
    shapes = {"x": (77, 200), "w": (200, 512)}
    metas = [torch.empty(shapes[t.name], dtype=getattr(torch, t.dtype.torch_name), device="meta") for t in ins]
    outs = op(metas, [float(t.default) for t in prog.inputs if t.is_scalar])
    got = {t.name: (tuple(o.shape), o.dtype) for t, o in zip(prog.outputs, outs)}
    assert got["q"] == ((77, 256), torch.uint8)


# ---------------------------------------------------------------- the row-scale pass
FORMS = ["f32(h * g * rsqrt(row_mean(h * h) + 1e-6))",                 # an explicit cast around the product
         "-(h * g) * rsqrt(row_mean(h * h) + 1e-6)",                   # a sign in front
         "g * (-(h * rsqrt(row_mean(h * h) + 1e-6))) ** 3 / (h * h)",  # a sign inside an odd power
         "-(g * (h * rsqrt(row_mean(h * h) + 1e-6)) ** 3) / (h * h)"]


@pytest.mark.parametrize("form", FORMS)
def test_row_scale_deferral_through_casts_and_signs(form):
    from epic.plan import verify
    a = analyze("gemm a(x: bf16[M, D] @ wo: bf16[D, D]) {\n  in z: bf16[M, D]\n  in g: bf16[D]\n  h = acc + z\n"
                f"  out resid: bf16 = h\n  tmp n: bf16 = {form}\n}}\n"
                "gemm b(n @ w2: bf16[D, E]) {\n  out y: bf16 = acc\n}\n")
    assert "n__rowscale" in [s.tensor for s in a.after("defer-row-scale").kernel("a").stores]
    sizes = dict(M=11, D=72, E=40)
    inputs = reference.random_inputs(a.source_program, sizes, 3)
    assert max(verify.equivalence(a, inputs, sizes).values()) <= 1e-12


# ---------------------------------------------------------------- passes: the manager and traces
def test_the_simplify_trace_says_which_rule_fired_where():
    a = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc * 1.0\n}\n")
    trace = a.stages[0].trace
    assert trace and any(re.search(r"g: .+ at 2:\d+", t) for t in trace), trace


def test_a_pass_order_that_breaks_requirements_is_caught(monkeypatch):
    monkeypatch.setattr(manager, "PASSES", list(reversed(manager.PASSES)))
    with pytest.raises(AssertionError, match="needs"):
        analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n")


def test_an_ill_typed_value_built_by_a_pass_is_e599():
    from epic.passes import rewrite
    a = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in v: f32[M]\n  out y: bf16 = acc + v\n}\n")
    k = a.program.kernels[0]
    acc = next(v for v in k.values if v.op == "acc")
    with pytest.raises(EpicError) as e:
        rewrite.make("row_pick", (acc,), {})
    assert e.value.codes == ["E599"] and "a pass built an ill-typed row_pick" in str(e.value)


# ---------------------------------------------------------------- C++ text
def test_identifiers_are_kept_escaped_or_hashed_exactly_as_documented():
    assert cxx.identifier("o_proj") == "o_proj"
    assert cxx.identifier("a" * 48) == "a" * 48
    assert cxx.identifier("a" * 49).startswith("epic_" + "a" * 34 + "_") and len(cxx.identifier("a" * 49)) == 48
    for name in ("int", "main", "a-b", "1x", "epic_x", "x_0123abcd"):
        out = cxx.identifier(name)
        assert out != name and re.fullmatch(r"epic_[A-Za-z0-9_]+_[0-9a-f]{8}", out), (name, out)
    assert cxx.identifier("a-b").startswith("epic_a_b_")


def test_comments_and_strings_keep_text_safe():
    assert cxx.comment("a~b\\c\x01d") == "a~b/c?d"
    assert cxx.comment("x" * 200, limit=20) == "x" * 17 + "..."
    assert cxx.string("a\x01\"?") == '"a\\001\\"\\077"'
    assert cxx.literal(-0.0) == "(-0.0f)" and cxx.literal(0.0) == "0.0f"


@pytest.mark.parametrize("alias,needs", [("epic_from_bits", "epic_bits"), ("epic_half_word", "epic_byte"),
                                         ("epic_bf16_hi", "epic_bf16_lo"), ("epic_sat_int", "epic_sat")])
def test_a_helper_called_by_its_second_name_brings_its_definition(alias, needs):
    text = functor.helpers_for(f"y = {alias}(x, 0);")
    assert f" {alias}(" in text and f" {needs}(" in text


def test_combine_kernels_spell_cuda_types_and_gemm_functors_cutlass_ones():
    src = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = bf16(acc) * 2\n  out r: f32[M] = bf16(row_sum(acc))\n}\n"
    units = epic.compile(src).units()
    gemm, comb = units[0][1].source, units[1][1].source
    assert "cutlass::bfloat16_t(" in gemm and "__nv_bfloat16(" in comb


def test_node_headers_come_once_each_after_what_they_include():
    texts = emit.node_headers(["epic_nodes/block_scale.hpp", "epic_nodes/packed_int4_store.hpp",
                               "epic_nodes/block_scale.hpp"])
    shared = emit.node_headers(["epic_nodes/detail.hpp"])             # arith.hpp, then detail.hpp
    assert len(shared) == 2 and texts[:2] == shared                    # the shared includes first, once
    # then block_scale.hpp's other include (pair_exchange.hpp), block_scale.hpp, packed_int4_store.hpp
    assert texts[2] == emit.node_headers(["epic_nodes/pair_exchange.hpp"])[2]
    assert len(texts) == 5 and not any("#include \"epic_nodes" in t or "#pragma once" in t for t in texts)


def test_epic_compile_writes_one_file_per_kernel_named_after_the_program(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "compile", str(ROOT / "samples" / "residual_rmsnorm.epi"), "-o", str(tmp_path))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert code == 0 and len(files) == 2 and all(f.startswith("residual_rmsnorm.") for f in files)
    for f in files:
        assert str(tmp_path / f) in out
    prog = epic.compile("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n")
    paths = emit.write_sources(prog.program, str(tmp_path / "s"))
    assert [p.split("/")[-1].split(".")[0] for p in paths] == ["program"]


# ---------------------------------------------------------------- code generation's refusals
@pytest.mark.parametrize("text,message,where", [
    ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out c: f32[N] = col_lse(acc)\n}\n", "col_lse", (2, None)),
    ("gemm g(x: bf16[M, K] @ w: bf16[K, H*Dh]) {\n  in gam: f32[Dh]\n  out c: f32[H*Dh] = col_sum(acc) * gam\n}\n",
     "a per-head vector ('gam') in the vector math after a column reduction is not supported by code "
     "generation yet", (3, 37)),
    ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = rotate(even(acc), 1.0, 0.0)\n}\n",
     "a pairwise map of a value narrower than the accumulator's column pairs is not supported by code "
     "generation yet", (2, 17)),
])
def test_refusals_say_what_is_not_supported(text, message, where):
    with pytest.raises(EpicError) as e:
        epic.compile(text).units()
    d = e.value.diagnostics[0]
    assert d.code == "E702" and message in d.message and "not supported by code generation yet" in d.message
    assert d.span is not None and d.span.line == where[0] and where[1] in (None, d.span.column)


# ---------------------------------------------------------------- the shared-memory model of the plan
def _kernel(text):
    a = analyze(text)
    return a.program, a.program.kernels[0]


def test_shared_memory_of_an_epilogue_by_hand():
    from epic.plan import config as C
    program, k = _kernel("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in z: bf16[M, N]\n  out y: bf16 = acc + z\n}\n")
    coop = C.KernelConfig("cooperative", (128, 256, 64), (2, 1))
    # epilogue tile 128x32 (CUTLASS's auto): 8 subtiles; D takes 2 of them, the aux load z 4, 2 bytes each
    assert C.smem_estimate(k, program.tensors, coop) == (128 * 32 * (2 * 2 + 4 * 2), (128 + 256) * 64 * 2)
    ping = C.KernelConfig("pingpong", (64, 128, 64))
    assert C.smem_estimate(k, program.tensors, ping) == (64 * 32 * (2 * 2 + 4 * 2), (64 + 128) * 64 * 2)


def test_narrow_and_packed_stores_in_the_model():
    from epic import dtypes
    from epic.plan.epilogue import tile_bytes
    from epic.plan import config as C
    program, k = _kernel("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out q: e4m3 = acc\n  out p: i4 = acc\n}\n")
    v = k.stores[0].value
    assert tile_bytes(dtypes.E4M3, v) == 1.0 and tile_bytes(dtypes.I4, v) == 0.0
    assert tile_bytes(dtypes.BF16, v) == 2.0
    # a 1-byte first store gets the 64-column epilogue tile where the tile width allows
    assert C._epilogue_tile(C.KernelConfig("pingpong", (64, 128, 64)), True) == (64, 64)
    assert C._epilogue_tile(C.KernelConfig("pingpong", (64, 128, 64)), False) == (64, 32)
    assert C._epilogue_tile(C.KernelConfig("cooperative", (128, 128, 64)), True) == (128, 64)


def test_fits_is_inclusive_at_the_limit(monkeypatch):
    from epic.plan import config as C
    program, k = _kernel("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n")
    cfg = C.KernelConfig("cooperative", (128, 256, 64), (2, 1))
    epi, stage = C.smem_estimate(k, program.tensors, cfg)
    monkeypatch.setattr(C, "SMEM_BYTES", epi + 2 * stage + C.SMEM_RESERVE)
    assert C.fits(k, program.tensors, cfg)
    monkeypatch.setattr(C, "SMEM_BYTES", epi + 2 * stage + C.SMEM_RESERVE - 1)
    assert not C.fits(k, program.tensors, cfg)


@pytest.mark.parametrize("cfg,words", [
    (dict(schedule="coop", tile=(128, 128, 64)), "unknown schedule 'coop' (use cooperative or pingpong)"),
    (dict(schedule="pingpong", tile=(64, 128, 64), raster="diagonal"), "raster must be one of heuristic, m, n"),
    (dict(schedule="pingpong", tile=(64, 128, 64), epi_tile=(100, 64)), "the epilogue tile must be 64, 128 or 256 rows"),
])
def test_a_configuration_built_in_python_is_checked_too(cfg, words):
    from epic.plan import config as C
    with pytest.raises(EpicError) as e:
        C.validate(C.KernelConfig(**cfg), "gemm 'g'")
    d = e.value.diagnostics[0]
    assert d.code == "E216" and words in d.message and "pingpong: tile M 64/128" in d.hint


def test_a_bad_combination_in_the_file_is_e216_at_the_gemm():
    with pytest.raises(EpicError) as e:
        epic.compile("# a comment\ngemm g(x: bf16[M, K] @ w: bf16[K, N]) with tile=64x128x64, schedule=cooperative {\n"
                     "  out y: bf16 = acc\n}\n").plan(dict(M=64, K=64, N=128), device="cpu")
    d = e.value.diagnostics[0]
    assert d.code == "E216" and d.span is not None and d.span.line == 2


def test_a_call_config_that_breaks_the_files_tile_is_e216_at_the_gemm():
    prog = epic.compile("# a comment\ngemm g(x: bf16[M, K] @ w: bf16[K, N]) with tile=64x128x64 {\n"
                        "  out y: bf16 = acc\n}\n", {"g": {"schedule": "cooperative"}})
    with pytest.raises(EpicError) as e:
        prog.plan(dict(M=64, K=64, N=128), device="cpu")
    d = e.value.diagnostics[0]
    assert d.code == "E216" and "cooperative schedule needs tile M = 128 or 256" in d.message
    assert d.span is not None and d.span.line == 2


def test_an_epilogue_too_big_for_shared_memory_says_how_big():
    from epic.plan import config as C
    program, k = _kernel("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in z: bf16[M, N]\n  out y: bf16 = acc + z\n}\n")
    with pytest.raises(EpicError) as e:
        C.choose(k, 8192, {"tile": (256, 128, 128), "schedule": "cooperative", "epi_tile": (256, 128)}, program.tensors)
    d = e.value.diagnostics[0]
    assert d.code == "E217" and re.search(r"needs about \d+ KiB of shared memory", d.message)


# ---------------------------------------------------------------- no Python None in generated C++
def _all_programs():
    return sorted([*ROOT.glob("samples/*.epi"), *ROOT.glob("tests/programs/*.epi"), *ROOT.glob("bench/programs/*.epi")])


@pytest.mark.parametrize("path", _all_programs(), ids=lambda p: p.stem)
def test_no_python_value_leaks_into_generated_sources(path):
    prog = epic.compile(str(path))
    for m in (64, 8192):
        try:
            units = emit.units(prog.program, emit.kernel_configs(prog.program, m))
        except EpicError:
            continue                                   # E702: not generated yet
        for _, unit in units:
            for bad in (r"\bNone\b", r"\bTrue\b", r"\bFalse\b", r"<function ", r" at 0x[0-9a-f]+>"):
                m_ = re.search(bad, unit.source)
                assert m_ is None, (unit.name, bad, unit.source[max(0, m_.start() - 80):m_.end() + 40])


# ---------------------------------------------------------------- row-scale refusals, word for word
def _defer(form):
    return analyze("gemm a(x: bf16[M, D] @ wo: bf16[D, D]) {\n  in z: bf16[M, D]\n  in g: bf16[D]\n  h = acc + z\n"
                   f"  out resid: bf16 = h\n  tmp n: bf16 = {form}\n}}\n"
                   "gemm b(n @ w2: bf16[D, E]) {\n  out y: bf16 = acc\n}\n")


def test_a_cast_to_another_float_stays_around_the_deferred_value():
    from epic.plan import verify
    a = _defer("f16(h * g * rsqrt(row_mean(h * h) + 1e-6))")
    stored = next(s.value for s in a.after("defer-row-scale").kernel("a").stores if s.tensor == "n")
    assert stored.op == "cast" and stored.attrs["to"].name == "f16" and stored.args[0].op == "mul"
    sizes = dict(M=11, D=72, E=40)
    assert max(verify.equivalence(a, reference.random_inputs(a.source_program, sizes, 3), sizes).values()) <= 1e-12


@pytest.mark.parametrize("form,words,column", [
    ("rsqrt(row_mean(h * h) + 1e-6) * g",
     "'n' needs row_mean (mean over all D columns of each row), and no tile-shaped factor is left to store "
     "once the row scale is removed", 17),
    ("h * col_sum(h * rsqrt(row_mean(h * h) + 1e-6))",
     "the value at 6:21 needs col_sum (sum over all M rows of each column), and it is a per-column statistic; "
     "only a per-row scale commutes with the right matrix product ((x * c[col]) @ W != c * (x @ W))", 21),
])
def test_row_scale_refusals_word_for_word(form, words, column):
    with pytest.raises(EpicError) as e:
        _defer(form)
    d = e.value.diagnostics[0]
    assert d.code == "E501" and d.message == "cannot move the row scale of 'n' into gemm 'b': " + words
    assert (d.span.line, d.span.column) == (6, column)
