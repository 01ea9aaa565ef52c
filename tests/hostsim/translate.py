"""Generated kernel sources -> host C++ (one namespace per kernel; hostsim.hpp supplies the rest).

gemm: the functors and device helpers are pasted as they are; each node becomes its host
emulation (nodes.py) constructed from its own initializer text; the DAG is evaluated per fragment
in node order along the parsed edges; the root's result is stored as D when D is not void.
combine (and tail, with its shared memory and barriers emulated): the whole source is pasted, with its includes removed (the TU includes them once), its PDL
launch helper removed and the call `return launch_after_previous(grid, block, stream, P);` turned into
hostsim::launch (a loop over threads, which runs warps of lanes, shuffles included)
and cudaGetLastError into the status of those launches. Either way the namespace defines epic_launch,
epic_workspace_size and epic_info with the C ABI's signatures; compiler.py exports them.
"""
from __future__ import annotations

import re

from epic.codegen import emit

from .nodes import emulation
from .parse import GemmSource, SourceFormatError, parse_combine, parse_gemm, kind

ROW, COL = "cutlass::layout::RowMajor", "cutlass::layout::ColumnMajor"
# the layouts the emulation reads: A K-major (RowMajor) or M-major, B K-major (ColumnMajor) or N-major; D row-major
LAYOUTS = {"A": (ROW, COL), "B": (COL, ROW), "D": (ROW,)}


def translate(source: str, namespace: str) -> str:
    """Host C++ for one generated source, inside `namespace`."""
    if kind(source) == "gemm":
        return gemm(parse_gemm(source), namespace)
    if kind(source) == "tail":
        return tail(source, namespace)
    parse_combine(source)          # fails early on a source of an unknown shape
    return combine(source, namespace)


# ------------------------------------------------------------------------------------------ gemm
ARITH = "epic_nodes/arith.hpp"


def arithmetic_problem(text: str) -> str | None:
    """Why the host cannot stand for this source's custom nodes: their emulations run the arithmetic of
    templates/nodes/epic_nodes/arith.hpp, so the source must print exactly that (None: it does)."""
    if "namespace epic_nodes" not in text or emit.node_headers([ARITH])[0] in text:
        return None
    return (f"the source's custom node arithmetic is not {ARITH} as code generation prints it, which the host "
            "emulations run")


def gemm(src: GemmSource, namespace: str) -> str:
    if (why := arithmetic_problem(src.text)) is not None:
        raise SourceFormatError(why)
    for role, layouts in LAYOUTS.items():
        if src.layouts[role] not in layouts:
            raise SourceFormatError(f"Layout{role} is {src.layouts[role]}; the host simulator emulates "
                                    f"{' or '.join(layouts)}")
    mn_major = f"{str(src.layouts['A'] == COL).lower()}, {str(src.layouts['B'] == ROW).lower()}"
    m, n, k = src.problem
    for stride, extents in (("sA", [m, k, "1"]), ("sB", [n, k, "1"]), ("sD", [m, n, "1"]), ("sAux", [m, n, "1"])):
        if src.strides.get(stride) != extents:   # what the emulation assumes: packed A [M, K], B [N, K], ...
            raise SourceFormatError(f"{stride} is made for extents {src.strides.get(stride)}; the host simulator "
                                    f"emulates packed {stride} of {extents}")
    types = [emulation(n).host_type(n) for n in src.nodes]
    root = len(src.nodes) - 1
    info = re.search(r"epic_info\s*\(\s*(?:void)?\s*\)\s*\{\s*return\s+(\".*\")\s*;", src.text, re.S).group(1)
    out = [f"namespace {namespace} {{",
           "using _0 = hostsim::Int<0>;",
           "using _1 = hostsim::Int<1>;",
           "// ---- device helpers and element-wise functors, as generated",
           *src.helpers, *src.functors,
           f"using ElementA = {src.element_a};",
           f"using ElementB = {src.element_b};",
           f"using ElementD = {src.element_d};",
           f"using TileShape = hostsim::Shape<{', '.join(map(str, src.tile))}>;",
           "// ---- the nodes (host emulations of the generated node types)"]
    out += [f"using Node{n.index} = {t};  // {n.name}: {n.comment}" + (f" (identity {n.identity})" if n.identity else "")
            for n, t in zip(src.nodes, types)]
    out += ["",
            "int epic_launch(void* const* ptrs, const long long* sizes, const float* scalars, void* stream,",
            "                void* workspace, size_t workspace_bytes) {",
            "  (void)stream; (void)workspace; (void)workspace_bytes;",
            "  if (!ptrs || !sizes || !scalars) return -1;",
            "  void* const* p = ptrs;",
            "  const float* s = scalars;",
            "  (void)s;",
            f"  {src.sizes_decl}",
            f"  const hostsim::Problem problem{{{', '.join(src.problem)}}};",
            "  hostsim::AnyStride sAux;",
            "  (void)sAux;",
            "  const int acc_rows = hostsim::ceil_div(problem.M, TileShape::M) * TileShape::M;",
            "  const int acc_cols = hostsim::ceil_div(problem.N, TileShape::N) * TileShape::N;",
            f"  const std::vector<float> acc = hostsim::as_accumulator<{src.element_acc}>(hostsim::accumulate<{mn_major}>("
            f"{src.operands['A']}, {src.operands['B']}, problem, acc_rows, acc_cols));"]
    out += [f"  Node{n.index} node{n.index}(Node{n.index}::Arguments{n.init}, problem);" for n in src.nodes]
    if src.element_d != "void":
        out.append(f"  ElementD* d = {src.operands['D']};")
    visits = []
    for n in src.nodes:
        args = "".join(f", v{i}" for i in n.inputs)
        visits.append(f"      auto v{n.index} = node{n.index}.visit(f{args});")
        visits.append(f"      (void)v{n.index};")
    each = [f"    node{n.index}" for n in src.nodes]
    out += ["  // every tile: visit each fragment along the edges; the nodes' reduce hooks see the root's",
            "  // results of the tile (and may rewrite them) before the collective stores them as D",
            f"  constexpr int passes = std::max({{{', '.join(f'Node{n.index}::passes' for n in src.nodes)}}});",
            "  for (int pass = 0; pass < passes; ++pass)",
            "  hostsim::for_each_tile(problem, TileShape::M, TileShape::N, [&](hostsim::Tile const& tile) {",
            *[f"{e}.begin(tile);" for e in each],
            "    auto visit = [&](hostsim::Fragment const& f) {",
            *visits,
            f"      return v{root};",
            "    };",
            "    std::vector<hostsim::Fragment> fragments;",
            "    std::vector<decltype(visit(std::declval<hostsim::Fragment const&>()))> results;",
            "    hostsim::for_each_fragment(tile, acc, acc_cols, [&](hostsim::Fragment const& f) {",
            "      fragments.push_back(f);",
            "      results.push_back(visit(f));",
            "    });",
            *[f"{e}.reduce<ElementD>(tile, fragments, results);" for e in each]]
    if src.element_d != "void":
        out.append("    for (size_t i = 0; i < fragments.size(); ++i) hostsim::store_d(d, fragments[i], problem, results[i]);")
    out += [*[f"{e}.end(tile);" for e in each],
            "  });",
            "  return 0;",
            "}",
            "",
            "size_t epic_workspace_size(const long long* sizes) { (void)sizes; return 0; }",
            f"const char* epic_info(void) {{ return {info}; }}",
            f"}}  // namespace {namespace}"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ tail
def tail(source: str, namespace: str) -> str:
    """A tail kernel (codegen/tail.py): a combine kernel's launch, with a CTA's shared memory (one
    array for all its threads: `static`) and __syncthreads. The host runs each CTA twice (hostsim.hpp):
    the first run's warps leave their states in shared memory, the second's read every warp's."""
    if source.count("__syncthreads();") != source.count("red_smem[") // 2:
        raise SourceFormatError("expected one __syncthreads per reduction's exchange in shared memory (a write "
                                "and a read of red_smem each); the host runs a CTA twice, which covers that")
    text = source.replace("__shared__ ", "static ").replace("__syncthreads();", "((void)0);")
    text = re.sub(r"__launch_bounds__\(\w+\) ", "", text)
    return combine(text, namespace, "tail_kernel", cta_runs=2)


# ------------------------------------------------------------------------------------------ combine
# the PDL launch helper (cudaLaunchKernelEx: no host emulation) and its one call
_HELPER = re.compile(r"^int launch_after_previous\(.*?^\}\n", re.S | re.M)
_LAUNCH = re.compile(r"return launch_after_previous\((\w+), (\w+), ([^;]*?), (\w+)\);")


def combine(source: str, namespace: str, kernel: str = "combine_kernel", cta_runs: int = 1) -> str:
    text = "\n".join(line for line in source.splitlines()
                     if not line.lstrip().startswith("#include") and not line.lstrip().startswith("#define EPIC_API"))
    text, helpers = _HELPER.subn("", text)
    text, launches = _LAUNCH.subn(lambda m: f"hostsim::launch({m.group(1)}, {m.group(2)}, 0, {m.group(3)}, "
                                            f"[&] {{ {kernel}({m.group(4)}); }}, {cta_runs}); "
                                            "return int(cudaGetLastError());", text)
    if helpers != 1 or launches != 1:
        raise SourceFormatError(f"expected the launch helper and one call of it in the {kernel} source, found "
                                f"{helpers} and {launches}")
    return "\n".join([
        f"namespace {namespace} {{",
        "using namespace hostsim::cuda_builtins;",
        "#define cudaGetLastError hostsim::last_launch_status",
        text,
        "#undef cudaGetLastError",
        f"}}  // namespace {namespace}",
    ]) + "\n"
