"""Render kernel descriptions through the Jinja templates into CUDA sources (one per kernel).

A generated source depends only on what the kernel computes: not on the program's file name, so
the same program in two files builds once. Every piece of user text printed into it (names in
comments, the self-description string) goes through codegen/cxx.py."""
from __future__ import annotations

import functools
import json
import os
import re
from importlib import resources
from pathlib import Path

import jinja2

from ..diagnostics import EpicError
from ..version import __version__
from ..ir.core import Program
from ..plan import config as config_mod
from ..plan import gpus, planner, tail as tail_plan
from . import combine, cxx, evt, functor, tail, vendor
from .unit import Unit


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("epic", "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=False, lstrip_blocks=False)
    env.filters["comment"] = cxx.comment
    return env


_INCLUDE = re.compile(r'^#include "(epic_nodes/[A-Za-z0-9_]+\.hpp)"\s*$', re.M)


@functools.lru_cache(maxsize=None)
def _header_file(name: str) -> str:
    return resources.files("epic.templates").joinpath("nodes", *name.split("/")).read_text()


def node_headers(names: list[str]) -> list[str]:
    """The texts of custom node headers (templates/nodes/NAME), each after the epic headers it
    includes and each once, with those includes and `#pragma once` removed: printed into the kernel,
    so the generated source is self-contained and its cache key covers the nodes' code."""
    out: list[str] = []
    done: set[str] = set()

    def add(name: str) -> None:
        if name in done:
            return
        done.add(name)
        text = _header_file(name)
        for dep in _INCLUDE.findall(text):
            add(dep)
        out.append(_INCLUDE.sub("", text).replace("#pragma once\n", ""))

    for name in names:
        add(name)
    return out


def _info(spec, kind: str) -> str:
    data = {"abi": 1, "kind": kind, "kernel": spec.name,
            "ptrs": [f"{p.role}:{p.tensor}" for p in spec.pointers], "scalars": [s.name for s in spec.scalars]}
    if kind == "gemm":
        data["config"] = spec.config.key()     # what was built (swizzle/raster are launch arguments)
    return cxx.string(json.dumps(data, separators=(",", ":")))


def render_gemm(spec: evt.KernelSpec) -> str:
    return _env().get_template("gemm.cu.j2").render(
        k=spec, version=__version__, prelude=functor.helpers_for("\n".join(spec.functors)),
        info=_info(spec, "gemm"), headers=node_headers(spec.headers),
        scheduler_headers=node_headers(spec.scheduler_headers),
        epilogue_tile=(f"Shape<_{spec.config.epi_tile[0]}, _{spec.config.epi_tile[1]}>" if spec.config.epi_tile
                       else "cutlass::epilogue::collective::EpilogueTileAuto"))


def render_combine(spec: combine.CombineSpec) -> str:
    return _env().get_template("combine.cu.j2").render(
        c=spec, version=__version__, prelude=functor.helpers_for("\n".join(spec.merge + spec.body + spec.stores + spec.tile)),
        info=_info(spec, "combine"))


def render_tail(spec: tail.TailSpec) -> str:
    return _env().get_template("tail.cu.j2").render(
        t=spec, version=__version__,
        prelude=functor.helpers_for("\n".join(spec.head + spec.first + spec.reduce + spec.stores + spec.second)),
        info=_info(spec, "tail"))


def kernel_configs(program: Program, m: int, overrides: dict | None = None,
                   sizes: dict | None = None, gpu: str | None = None) -> dict[str, config_mod.KernelConfig]:
    """Each gemm's configuration when the program's row dimension is m (see kernel_rows); sizes (all
    of the program's, where known) give each gemm's N, on which the heuristic's tile width depends;
    gpu: the key of the GPU it is for (plan/gpus.py)."""
    rows = kernel_rows(program, m, sizes)
    ns = {k.name: _known(k.n, sizes) for k in program.kernels if k.kind == "gemm"}
    configs = {k.name: config_mod.choose(k, rows[k.name], (overrides or {}).get(k.name), program.tensors,
                                         ns[k.name], _known(k.k, sizes), gpu)
               for k in program.kernels if k.kind == "gemm"}
    return tail_plan.by_heuristic(program, configs, rows, ns, overrides, lambda k, override: config_mod.choose(
        k, rows[k.name], override, program.tensors, ns[k.name], _known(k.k, sizes), gpu))


def _known(dim, sizes: dict | None) -> int | None:
    """A gemm dimension's size where the sizes determine it, else None."""
    from .. import sizes as sizes_mod
    if not sizes:
        return None
    try:
        return sizes_mod.evaluate(dim, sizes)
    except (KeyError, EpicError):
        return None


def kernel_rows(program: Program, m: int, sizes: dict | None = None) -> dict[str, int]:
    """Each gemm's row count M when the program's row dimension (the first gemm's rows) is m: a gemm
    with other rows (a backward program's dW gemm has N) counts its own at sizes, with that dimension
    set to m; where sizes do not determine them (no --shape), m."""
    from .. import sizes as sizes_mod
    first = program.kernels[0].rows
    at = dict(sizes or {})
    if len(first.names) == 1 and first.coef.denominator == 1 and m % first.coef.numerator == 0:
        at[first.names[0]] = m // first.coef.numerator
    out = {}
    for k in program.kernels:
        if k.kind != "gemm":
            continue
        if k.rows == first:
            out[k.name] = m
            continue
        try:
            out[k.name] = sizes_mod.evaluate(k.rows, at)
        except (KeyError, EpicError):       # a dimension the sizes leave open: the row dimension's count
            out[k.name] = m
    return out


def specs(program: Program, configs: dict[str, config_mod.KernelConfig]) -> list:
    """The spec of every kernel that launches, in the program's order (a gemm with combine=tail: that
    gemm and its tail kernel, plan/tail.py)."""
    program = tail_plan.rewrite(program, configs)
    folded = planner.folds(program, configs)
    out = []
    for k in program.kernels:
        if k.kind == "tail":
            out.append(tail.lower_tail(program, k))
        elif k.kind == "gemm" and configs[k.name].vendor:
            out.append(vendor.lower(program, k, configs[k.name]))
        elif k.kind == "gemm":
            inside = next((c for c in program.kernels if folded.get(c.name) == k.name), None)
            out.append(evt.lower_gemm(program, k, configs[k.name],
                                      combine.lower_combine(program, inside, folded=True) if inside else None))
        elif k.name not in folded:
            out.append(combine.lower_combine(program, k))
    return out


def units(program: Program, configs: dict[str, config_mod.KernelConfig]) -> list[tuple[object, Unit]]:
    """(spec, translation unit) for every kernel of a rewritten program that epic builds (a folded
    combine kernel has none: it runs inside its gemm's unit; nor has a gemm on the vendor's library:
    specs() gives every launched kernel)."""
    out = []
    for spec in specs(program, configs):
        if isinstance(spec, vendor.VendorGemmSpec):
            continue                        # the vendor's library: nothing to build
        if isinstance(spec, evt.KernelSpec):
            out.append((spec, Unit(f"{spec.symbol}.{spec.config.key()}", render_gemm(spec))))
        elif isinstance(spec, tail.TailSpec):
            out.append((spec, Unit(spec.symbol, render_tail(spec), uses_cutlass=False)))
        else:
            out.append((spec, Unit(spec.symbol, render_combine(spec), uses_cutlass=False)))
    return out


def units_for_gpus(program: Program, m: int, overrides: dict | None = None, sizes: dict | None = None,
                   keys: tuple = gpus.KEYS) -> list[tuple[object, Unit]]:
    """units() of the configurations at row count m for each GPU key's heuristic (plan/gpus.py: an
    H100's differs from an H200's at some shapes), each kernel once: what a build for those GPUs makes."""
    out = {}
    for key in keys:
        for spec, unit in units(program, kernel_configs(program, m, overrides, sizes, key)):
            out.setdefault((unit.name, unit.source), (spec, unit))
    return list(out.values())


DEFAULT_M = 8192   # `epic compile/build` without --shape: the large-M (prefill) configuration


def write_sources(program: Program, out_dir: str, sizes: dict | None = None, gpu: str | None = None) -> list[str]:
    """Write each kernel's .cu (its configuration for GPU key `gpu`) into out_dir, named
    PROGRAM.KERNEL[.CONFIG].cu."""
    m = rows(program, sizes)
    stem = cxx.identifier(Path(program.name).stem) if program.name != "<string>" else "program"
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for _, unit in units(program, kernel_configs(program, m, sizes=sizes, gpu=gpu)):
        path = os.path.join(out_dir, f"{stem}.{unit.name}.cu")
        with open(path, "w") as f:
            f.write(unit.source)
        paths.append(path)
    return paths


def rows(program: Program, sizes: dict | None) -> int:
    """The program's row dimension (its first gemm's rows) at sizes; DEFAULT_M without them. Each
    gemm's own row count: kernel_rows."""
    if not sizes:
        return DEFAULT_M
    from .. import sizes as sizes_mod
    return sizes_mod.evaluate(program.kernels[0].rows, sizes)

