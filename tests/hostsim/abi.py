"""The C ABI of a generated library, checked by roles.

epic_info (in the source) lists the launch pointers as "role:tensor", in order; the runtime fills
the pointer array from the same list. These checks read the code that USES the pointers -- which
p[i] the template feeds the mainloop as A and B and the collective as D, which p[i] each node's
initializer names, which pointer a combine kernel reads partials from or stores to -- and hold each
use to the role and tensor that epic_info gives that index, and to what the node says it does (the
tensor its comment names). A pointer swapped in the template or in a node's arguments fails here
even where the list itself is consistent.
"""
from __future__ import annotations

import re

from epic.shapes import Kind

from .nodes import emulation
from .parse import CombineSource, GemmSource, PointerUse, TailSource

_OPERANDS = ("A", "B", "D")


def _entries(info: dict) -> list[tuple[str, str]]:
    return [tuple(e.split(":", 1)) if ":" in e else (e, "") for e in info["ptrs"]]


def _names(comment: str, tensor: str) -> bool:
    """Whether a node's comment ("load tile z", "per-tile row sum -> part0", "1x32 block scale -> q,
    scales q_scale") names the tensor, as a whole word."""
    return re.search(rf"(?<![\w]){re.escape(tensor)}(?![\w])", comment) is not None


def gemm_problems(src: GemmSource) -> list[str]:
    """What is wrong with a gemm source's use of its pointers and scalars (empty: nothing)."""
    entries = _entries(src.info)
    problems = []

    def entry(i: int) -> tuple[str, str]:
        return entries[i] if 0 <= i < len(entries) else ("<none>", "")

    for role in _OPERANDS:
        i = src.operand_index(role)
        if role == "D" and src.element_d == "void":
            if src.operands["D"] != "nullptr":
                problems.append(f"D is void but the template passes {src.operands['D']} as D")
            continue
        if i is None or entry(i)[0] != role:
            problems.append(f"the template passes {src.operands[role]} as {role}, but epic_info says p[{i}] is "
                            f"{':'.join(entry(i)) if i is not None else 'nothing'}")
    users: dict[int, list[int]] = {}
    for node in src.nodes:
        emu = emulation(node)
        roles = emu.pointers
        what = f"node {node.index} ({node.name}, '{node.comment}')"
        for f, i in node.pointer_fields.items():
            users.setdefault(i, []).append(node.index)
            got_role, got_tensor = entry(i)
            if isinstance(f, str):          # "field.element" of a braced list of pointers
                allowed = emu.pointer_lists.get(int(f.split(".")[0]), ())
                # roles only: the list is the folded combine's own pointer array, which its code (checked
                # against the reference by the harness) indexes; the comment may be cut short
                if got_role not in allowed:
                    problems.append(f"{what} names p[{i}] ({got_role}:{got_tensor}) in initializer field {f}, "
                                    f"which takes {' or '.join(allowed) or 'no pointer lists'}")
            elif f not in roles:
                problems.append(f"{what} names p[{i}] in initializer field {f}, which is not a pointer of its kind")
            elif got_role not in (roles[f] if isinstance(roles[f], tuple) else (roles[f],)):   # a tuple: any of them
                problems.append(f"{what} uses p[{i}], which epic_info says is {got_role}:{got_tensor}, not {roles[f]}")
            elif not _names(node.comment, got_tensor):
                problems.append(f"{what} uses p[{i}], which epic_info says is tensor '{got_tensor}', "
                                "a tensor the node is not about")
        for j in ([] if emu.pointer_lists else node.scalars):   # a folded combine's scalars: as its pointers
            names = src.info["scalars"]
            name = names[j] if 0 <= j < len(names) else "<none>"
            if not _names(node.comment, name):     # "scalar eps", "per-head vector g (every Dh columns)"
                problems.append(f"{what} reads s[{j}], which epic_info says is scalar '{name}'")
    for i, (role, tensor) in enumerate(entries):
        if role not in _OPERANDS and len(users.get(i, [])) != 1:
            problems.append(f"p[{i}] ({role}:{tensor}) is used by nodes {users.get(i, [])}, not by exactly one")
    return problems


def combine_problems(src: CombineSource, program=None) -> list[str]:
    """What is wrong with a combine source's use of its pointers (empty: nothing). With the program,
    element types and tensor kinds are checked too."""
    entries = _entries(src.info)
    problems = [f"pointer variable {v} holds P.p[{i}]" for v, i in src.pointer_vars.items() if v != f"p{i}"]
    var = {"row": "m", "col": "n", "all": "0"}[src.axis]
    expect = {"partial": "lanes" if src.axis == "all" else f"{src.axis}_partial",
              "vector": "col" if src.axis == "row" else "row", "store": "out", "scalar": "scalar",
              "tile": "tile", "tile_store": "out"}
    count: dict[int, int] = {}
    for use in src.uses:
        count[use.index] = count.get(use.index, 0) + 1
        role, tensor = entries[use.index] if use.index < len(entries) else ("<none>", "")
        if use.use == "vector" and src.axis == "row" and use.at == "n":     # a row vector in a finished tile store
            use = PointerUse(use.index, use.use, use.element, "m")
            want = "row"
        else:
            want = expect[use.use]
        if use.use in ("tile", "tile_store"):
            use = PointerUse(use.index, use.use, use.element, var)
        if program is not None and tensor in program.tensors and program.tensors[tensor].dtype.cuda is None:
            use = PointerUse(use.index, "packed", use.element, use.at)      # int4 bytes: no element type to compare
        if role != want:
            problems.append(f"the kernel uses p{use.index} as {use.use} ({want}), but epic_info says "
                            f"it is {role}:{tensor}")
            continue
        if use.at != var:
            problems.append(f"{role}:{tensor} is indexed by {use.at}, not by the thread's {var}")
        if program is not None and tensor in program.tensors:
            t = program.tensors[tensor]
            if use.use not in ("partial", "packed") and t.dtype.cuda != use.element:
                problems.append(f"{role}:{tensor} is accessed as {use.element}, but it is {t.dtype} ({t.dtype.cuda})")
            made = "buffer" if src.axis == "all" else "partial"
            if use.use == "partial" and t.role != made:
                problems.append(f"partials are read from '{tensor}', a {t.role} tensor")
            if use.use == "scalar" and not (t.producer and not t.dims):
                problems.append(f"'{tensor}' is read as a device scalar, but it is not a stored statistic")
    for i, (role, tensor) in enumerate(entries):
        if count.get(i, 0) != 1:
            problems.append(f"p{i} ({role}:{tensor}) is used {count.get(i, 0)} times, not once")
    return problems


def tail_problems(src: TailSource, program) -> list[str]:
    """What is wrong with a tail source's use of its pointers (empty: nothing): each pointer read
    or written as its epic_info role says (a tile by row m's columns, a vector or a per-head vector
    without them, an output written, nothing else written), as its tensor's element type, and each
    used; a written tensor is one the tail kernel stores, a read one it loads."""
    entries = _entries(src.info)
    problems = [f"pointer variable {v} holds P.p[{i}]" for v, i in src.pointer_vars.items() if v != f"p{i}"]
    tail = next(k for k in program.kernels if k.name == src.info["kernel"])
    as_use = {Kind.TILE: "tile", Kind.BLOCK: "block", Kind.COL: "vector"}
    stored = {s.tensor: as_use.get(s.value.kind) for s in tail.stores}
    loaded = {v.attrs["tensor"] for v in tail.values if v.attrs.get("tensor")}
    used: set[int] = set()
    for writes, uses in ((False, src.reads), (True, src.writes)):
        for use in uses:
            used.add(use.index)
            role, tensor = entries[use.index] if use.index < len(entries) else ("<none>", "")
            what = f"the kernel {'writes' if writes else 'reads'} p{use.index} as {use.use}"
            if writes and (role != "out" or tensor not in stored):
                problems.append(f"{what}, but epic_info says it is {role}:{tensor}, not a tensor the tail stores")
            elif writes and stored[tensor] != use.use:
                problems.append(f"{what}, but the tail stores '{tensor}' as a {stored[tensor]}")
            elif not writes and (role not in ("tile", "row", "col", "scalar") or tensor not in loaded):
                problems.append(f"{what}, but epic_info says it is {role}:{tensor}, not a tensor the tail loads")
            elif not writes and (use.use == "tile") != (role == "tile"):
                problems.append(f"{what}, but epic_info says it is {role}:{tensor}")
            elif tensor in program.tensors and program.tensors[tensor].dtype.cuda not in (use.element, None) \
                    and not (role == "scalar" and use.element == "float"):
                problems.append(f"{what} of {use.element}, but '{tensor}' is {program.tensors[tensor].dtype}")
    for i, (role, tensor) in enumerate(entries):
        if i not in used:
            problems.append(f"p{i} ({role}:{tensor}) is never used")
    return problems
