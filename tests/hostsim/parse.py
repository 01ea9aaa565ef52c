"""Reading a generated kernel source (the rendered text of templates/gemm.cu.j2 or combine.cu.j2).

The harness runs what the source says, so it takes every fact from the text: the functors and the
device helpers printed before them, the node list, the edges, each node's initializer (which launch
pointer and scalar it reads, a reduction's identity), the tile shape, the operand element types and
layouts, which pointers the template feeds the mainloop as A and B and the collective as D, and the
self-description string (epic_info). Nothing is taken from the spec the source was rendered from.
A source that does not have the expected shape raises SourceFormatError (say what was not found).
"""
from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass


class SourceFormatError(AssertionError):
    """The generated source does not have a shape this parser knows."""


# ------------------------------------------------------------------------------------------ C++ text
def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside any (), [], {} or <> nesting; items stripped, empty text -> []."""
    items, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == sep and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    last = "".join(cur).strip()
    if last or items:
        items.append(last)
    return items


def matching(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at text[open_at] (comments must be gone)."""
    pairs = {"{": "}", "(": ")", "<": ">", "[": "]"}
    opener, closer = text[open_at], pairs[text[open_at]]
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == opener:
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return i
    raise SourceFormatError(f"unbalanced {opener!r} at offset {open_at}")


def braced_after(text: str, pattern: str, what: str) -> str:
    """The text inside the braces that follow the first match of `pattern`."""
    m = re.search(pattern, text)
    if not m:
        raise SourceFormatError(f"{what} not found (pattern {pattern!r})")
    start = text.index("{", m.end() - 1)
    return text[start + 1:matching(text, start)]


def one(pattern: str, text: str, what: str, flags: int = 0) -> re.Match:
    m = re.search(pattern, text, flags)
    if not m:
        raise SourceFormatError(f"{what} not found (pattern {pattern!r})")
    return m


def top_level_items(text: str) -> list[str]:
    """Top-level declarations of a region of C++: each ends with the `}` or `;` that returns to depth
    0; preprocessor lines are items of their own; comments are dropped."""
    text = strip_comments(text)
    items, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if depth == 0 and ch == "#" and text[start:i].strip() == "":
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            items.append(text[i:end].strip())
            i = start = end
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                # `struct X {...};` ends at the semicolon
                j = i + 1
                while j < len(text) and text[j] in " \t\r\n":
                    j += 1
                if j < len(text) and text[j] == ";":
                    i = j
                items.append(text[start:i + 1].strip())
                start = i + 1
        elif ch == ";" and depth == 0:
            items.append(text[start:i + 1].strip())
            start = i + 1
        i += 1
    return [x for x in items if x]


def c_string(literal: str) -> str:
    """The value of a C string literal as epic's cxx.string writes it (\\\\, \\", octal escapes)."""
    body = literal.strip()
    if not (body.startswith('"') and body.endswith('"')):
        raise SourceFormatError(f"not a string literal: {literal[:60]!r}")
    return codecs.decode(body[1:-1], "unicode_escape").encode("latin-1").decode("utf-8")


def epic_info(text: str) -> dict:
    body = braced_after(text, r"epic_info\s*\(\s*(void)?\s*\)\s*\{", "epic_info()")
    m = one(r"return\s+(\".*\")\s*;", body, "epic_info's return", re.S)
    return json.loads(c_string(m.group(1)))


def helpers(region: str) -> list[str]:
    """The device helper functions defined at top level of a region (custom node headers, which are
    namespaces, and preprocessor lines are not helpers)."""
    return [item for item in top_level_items(region)
            if "__device__" in item.split("(", 1)[0] and not item.startswith(("namespace", "#"))]


# ------------------------------------------------------------------------------------------ gemm
@dataclass
class NodeDecl:
    index: int
    type: str             # the C++ type as printed (comments removed)
    name: str             # the type's name: "Sm90AuxLoad", "epic_nodes::Sm90BlockScale"
    args: list[str]       # its template arguments
    comment: str          # what the generator says it does ("load tile z")
    init: str             # its initializer in dag_args, braces included
    inputs: list[int]     # from Edges

    @property
    def identity(self) -> str | None:
        """A reduction node's identity literal (the second field of its initializer)."""
        fields = self.fields
        return fields[1] if self.name.endswith("Reduction") and len(fields) > 1 else None

    @property
    def fields(self) -> list[str]:
        """The top-level fields of its initializer."""
        return split_top(self.init.strip()[1:-1])

    @property
    def pointer_fields(self) -> dict:
        """Initializer field -> the launch pointer p[i] it names; a field that is a braced list of
        pointers (a folded combine's) gives one entry per element, keyed "field.element"."""
        out: dict = {}
        for f, text in enumerate(self.fields):
            found = re.findall(r"\bp\[(\d+)\]", text)
            if len(found) > 1 and text.strip().startswith("{"):
                for j, item in enumerate(split_top(text.strip()[1:-1])):
                    one_ = re.findall(r"\bp\[(\d+)\]", item)
                    if len(one_) != 1:
                        raise SourceFormatError(f"node {self.index}: element {j} of field {f} is not one pointer: {item}")
                    out[f"{f}.{j}"] = int(one_[0])
            elif len(found) > 1:
                raise SourceFormatError(f"node {self.index}: field {f} names several pointers: {text}")
            elif found:
                out[f] = int(found[0])
        return out

    @property
    def scalars(self) -> list[int]:
        return [int(i) for i in re.findall(r"\bs\[(\d+)\]", self.init)]


@dataclass
class GemmSource:
    text: str
    info: dict
    helpers: list[str]
    functors: list[str]
    element_a: str
    element_b: str
    element_d: str
    layouts: dict[str, str]          # A, B, D -> cutlass::layout::...
    tile: tuple[int, int, int]
    nodes: list[NodeDecl]
    operands: dict[str, str]         # A, B, D -> the expression the template passes (D: "nullptr" when void)
    sizes_decl: str                  # the declaration of M, N, K from the launch's sizes
    problem: list[str]               # the problem shape's M, N, K expressions
    strides: dict[str, list[str]]    # sA, sB, sD, sAux -> the extents their packed strides are made for
    element_acc: str = "float"       # the mainloop's accumulator type (the epilogue builder's)

    def operand_index(self, role: str) -> int | None:
        m = re.search(r"\bp\[(\d+)\]", self.operands[role])
        return int(m.group(1)) if m else None


def _type_name_and_args(type_text: str) -> tuple[str, list[str]]:
    t = strip_comments(type_text).strip()
    if "<" not in t:
        return t, []
    lt = t.index("<")
    return t[:lt].strip(), split_top(t[lt + 1:matching(t, lt)])


def _functors(text: str) -> list[str]:
    out = []
    # element-wise functors (epic_fnN), block-statistic functors (epic_blockN), a folded combine (epic_fold_tail)
    for m in re.finditer(r"(?:template\s*<\s*class\s+T\s*>\s*)?struct\s+epic_(?:fn\d+|block\d+|fold_tail)\s*\{", text):
        end = matching(text, m.end() - 1)
        semi = text.index(";", end)
        out.append(text[m.start():semi + 1])
    return out


def parse_gemm(text: str) -> GemmSource:
    info = epic_info(text)
    if info.get("kind") != "gemm":
        raise SourceFormatError(f"not a gemm source (epic_info kind {info.get('kind')!r})")

    def alias(name: str) -> str:
        return one(rf"^using {name}\s*=\s*(.+?);", text, f"using {name}", re.M).group(1).strip()

    prelude = one(r"constexpr auto RN = [^;]*;(.*?)// ---- element-wise functors", text, "the helper region", re.S)
    tile = one(r"using TileShape\s*=\s*Shape<\s*_(\d+)\s*,\s*_(\d+)\s*,\s*_(\d+)\s*>\s*;", text, "TileShape")

    decls = re.findall(r"^using Node(\d+)\s*=\s*(.+?);[ \t]*//[ \t]*(.*)$", text, re.M)
    if not decls or [int(i) for i, _, _ in decls] != list(range(len(decls))):
        raise SourceFormatError("node list `using NodeN = ...;  // comment` not found in order")
    edges_text = strip_comments(text[one(r"using Edges\s*=\s*cute::tuple", text, "Edges").end():])
    edges_text = edges_text[1:matching(edges_text, 0)]          # inside cute::tuple< ... >
    edges = [[int(x) for x in split_top(seq)] for seq in re.findall(r"cute::seq<([^>]*)>", edges_text)]
    inits = split_top(strip_comments(braced_after(text, r"typename DAG::Arguments dag_args\s*\{", "dag_args")))
    if not (len(decls) == len(edges) == len(inits)):
        raise SourceFormatError(f"{len(decls)} nodes, {len(edges)} edge lists, {len(inits)} initializers")
    nodes = []
    for (i, type_text, comment), inputs, init in zip(decls, edges, inits):
        name, args = _type_name_and_args(type_text)
        nodes.append(NodeDecl(int(i), strip_comments(type_text).strip(), name, args, comment.strip(), init, inputs))

    gemm_args = strip_comments(braced_after(text, r"typename GemmKernel::Arguments args\s*\{", "GemmKernel::Arguments"))
    a = one(r"static_cast<ElementA const\*>\(p\[\d+\]\)", gemm_args, "the A operand").group(0)
    b = one(r"static_cast<ElementB const\*>\(p\[\d+\]\)", gemm_args, "the B operand").group(0)
    epi = one(r"\{\s*dag_args\s*,([^}]*)\}", gemm_args, "the epilogue arguments").group(1)
    d = split_top(epi)[2]          # {dag_args, C, stride C, D, stride D}
    problem = split_top(one(r"\{([^{}]*)\}", gemm_args, "the problem shape").group(1))
    sizes_decl = one(r"^\s*(int M = [^;]*;)", text, "the declaration of M, N, K", re.M).group(1)
    strides = {name: split_top(extents) for name, extents in
               re.findall(r"(s\w+) = cutlass::make_cute_packed_stride\([^,]*,\s*\{([^}]*)\}\)", text)}
    return GemmSource(
        text=text, info=info, helpers=helpers(prelude.group(1)), functors=_functors(text),
        element_a=alias("ElementA"), element_b=alias("ElementB"), element_d=alias("ElementD"),
        layouts={r: alias(f"Layout{r}") for r in "ABD"},
        tile=tuple(int(x) for x in tile.groups()), nodes=nodes, operands={"A": a, "B": b, "D": d},
        sizes_decl=sizes_decl, problem=problem[:3], strides=strides,
        element_acc=one(r"EpilogueTileType,\s*([\w:]+),\s*float,\s*ElementC", text, "the accumulator type").group(1))


# ------------------------------------------------------------------------------------------ combine
@dataclass
class PointerUse:
    index: int          # launch pointer index
    use: str            # "partial" (merged per-tile partials or, whole-tensor, per-row values), "vector"
                        # (read per row/column), "store", "scalar" (a whole-tensor statistic), "tile" (a
                        # finished tile store's unquantized value read back), "tile_store"
    element: str        # C++ element type it is cast to
    at: str             # the index expression ("m"/"n"; partial: the row/column variable of the entry)


@dataclass
class CombineSource:
    text: str
    info: dict
    axis: str           # "row": one warp per row (index m), "col": per column (index n), "all": one warp
    pointer_vars: dict[str, int]   # pN -> P.p[index]
    uses: list[PointerUse]


def parse_combine(text: str) -> CombineSource:
    info = epic_info(text)
    if info.get("kind") != "combine":
        raise SourceFormatError(f"not a combine source (epic_info kind {info.get('kind')!r})")
    body = strip_comments(braced_after(text, r"__global__ void \w+\([^)]*\)\s*\{", "the combine kernel"))
    found = re.search(r"const int (m|n) = [^;]*blockIdx\.x[^;]*;", body)
    if found:
        var = found.group(1)
    elif re.search(r"const dim3 grid\(1\), block\(32\);", text):   # the whole-tensor combine: one warp
        var = "0"
    else:
        raise SourceFormatError("the thread's (or warp's) row/column not found, and the launch is not one warp")
    pointer_vars = {v: int(i) for v, i in re.findall(r"void\* (p\d+) = P\.p\[(\d+)\];", body)}

    def index(v: str) -> int:
        if v not in pointer_vars:
            raise SourceFormatError(f"pointer variable {v} is not one of P.p[...]")
        return pointer_vars[v]

    uses = []
    for v in re.findall(r"static_cast<const float\*>\((p\d+)\)\s*;", body):
        uses.append(PointerUse(index(v), "partial", "float", var))
    for el, v, at in re.findall(r"static_cast<const ([\w:]+)\*>\((p\d+)\)\[(\w+)\]", body):
        uses.append(PointerUse(index(v), "vector", el, at))
    for el, v, at in re.findall(r"static_cast<([\w:]+)\*>\((p\d+)\)\[(\w+)\]\s*=", body):
        uses.append(PointerUse(index(v), "store", el, at))
    for v in re.findall(r"\(\*static_cast<const float\*>\((p\d+)\)\)", body):
        uses.append(PointerUse(index(v), "scalar", "float", var))
    # a row combine kernel that finishes quantized tile stores: per column n of row m (combine.py)
    for el, v in re.findall(r"static_cast<const ([\w:]+)\*>\((p\d+)\)\[\(long long\)m \* W \+ n\]", body):
        uses.append(PointerUse(index(v), "tile", el, "m, n"))
    for el, v, at in re.findall(r"static_cast<([\w:]+)\*>\((p\d+)\)\[\(long long\)m \* (W|\(\(W \+ 1\) / 2\)) \+ [nj]\]\s*=",
                                body):
        uses.append(PointerUse(index(v), "tile_store", el, "m, n"))
    # the same, VEC columns at a time (combine.py's vector loop: 8- or 16-byte moves from row m, column j)
    for el, v in re.findall(r"reinterpret_cast<const uint[24]\*>\(static_cast<const ([\w:]+)\*>\((p\d+)\) \+ "
                            r"\(long long\)m \* W \+ j\)", body):
        uses.append(PointerUse(index(v), "tile", el, "m, n"))
    for el, v in re.findall(r"reinterpret_cast<uint[24]\*>\(static_cast<([\w:]+)\*>\((p\d+)\) \+ "
                            r"\(long long\)m \* W \+ j\)\[\d\]\s*=", body):
        uses.append(PointerUse(index(v), "tile_store", el, "m, n"))
    # a use is a role: one pointer read the same way in the vector loop and its one-column fallback is one use
    distinct = list({(u.index, u.use, u.element, u.at): u for u in uses}.values())
    return CombineSource(text, info, {"m": "row", "n": "col", "0": "all"}[var], pointer_vars, distinct)


@dataclass
class TailSource:
    text: str
    info: dict
    pointer_vars: dict[str, int]   # pN -> P.p[index]
    reads: list[PointerUse]        # use: "tile" (row m's columns), "vector" (columns, or a column vector's m)
    writes: list[PointerUse]       # use: "tile", "block" (a 1xB block's value of row m), "vector" (column m)


def parse_tail(text: str) -> TailSource:
    """A tail kernel's pointer uses (codegen/tail.py): every cast of a launch pointer, read-only or
    written, with its element type and whether it is indexed by row m's columns (a tile), by block
    (a 1xB block value), or neither (a row or column vector, a per-head vector)."""
    info = epic_info(text)
    if info.get("kind") != "tail":
        raise SourceFormatError(f"not a tail source (epic_info kind {info.get('kind')!r})")
    body = strip_comments(braced_after(text, r"\btail_kernel\(const Params P\)\s*\{", "the tail kernel"))
    pointer_vars = {v: int(i) for v, i in re.findall(r"void\* (p\d+) = P\.p\[(\d+)\];", body)}
    reads, writes = [], []
    for const, el, v, after in re.findall(r"static_cast<(const )?([\w:]+)\*>\((p\d+)\)(.{0,40})", body):
        if v not in pointer_vars:
            raise SourceFormatError(f"pointer variable {v} is not one of P.p[...]")
        at = "tile" if re.match(r"\s*(\+ \(?|\[)\(long long\)m \* W", after) else \
            "block" if re.match(r"\[\(long long\)m \* \(\(W \+", after) else "vector"
        (reads if const else writes).append(PointerUse(pointer_vars[v], at, el, at))
    distinct = lambda uses: list({(u.index, u.use, u.element): u for u in uses}.values())   # noqa: E731
    return TailSource(text, info, pointer_vars, distinct(reads), distinct(writes))


def kind(text: str) -> str:
    return epic_info(text)["kind"]
