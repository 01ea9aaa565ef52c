"""Render kernel descriptions through the Jinja templates into CUDA sources (one per kernel)."""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import jinja2

from .. import __version__
from ..ir.core import Program
from ..plan import config as config_mod
from ..runtime.build import Unit
from . import combine, evt, functor


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("epic", "templates"), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=False, lstrip_blocks=False)


def _info(spec, kind: str) -> str:
    data = {"abi": 1, "kind": kind, "kernel": spec.name,
            "ptrs": [f"{p.role}:{p.tensor}" for p in spec.pointers], "scalars": [s.name for s in spec.scalars]}
    if kind == "gemm":
        data["config"] = spec.config.key()     # what was built (swizzle/raster are launch arguments)
    return json.dumps(data, separators=(",", ":")).replace('"', '\\"')


def render_gemm(program: Program, spec: evt.KernelSpec) -> str:
    return _env().get_template("gemm.cu.j2").render(
        k=spec, program=os.path.basename(program.name), version=__version__,
        prelude=functor.helpers_for("\n".join(spec.functors)), info=_info(spec, "gemm"),
        epilogue_tile=(f"Shape<_{spec.config.epi_tile[0]}, _{spec.config.epi_tile[1]}>" if spec.config.epi_tile
                       else "cutlass::epilogue::collective::EpilogueTileAuto"))


def render_combine(program: Program, spec: combine.CombineSpec) -> str:
    return _env().get_template("combine.cu.j2").render(
        c=spec, program=os.path.basename(program.name), version=__version__,
        prelude=functor.helpers_for("\n".join(spec.body)), info=_info(spec, "combine"))


def kernel_configs(program: Program, m: int, overrides: dict | None = None) -> dict[str, config_mod.KernelConfig]:
    return {k.name: config_mod.choose(k, m, (overrides or {}).get(k.name))
            for k in program.kernels if k.kind == "gemm"}


def specs(program: Program, configs: dict[str, config_mod.KernelConfig]) -> list:
    out = []
    for k in program.kernels:
        if k.kind == "gemm":
            out.append(evt.lower_gemm(program, k, configs[k.name]))
        else:
            out.append(combine.lower_combine(program, k))
    return out


def units(program: Program, configs: dict[str, config_mod.KernelConfig]) -> list[tuple[object, Unit]]:
    """(spec, translation unit) for every kernel of a rewritten program."""
    stem = Path(program.name).stem if program.name != "<string>" else "program"
    out = []
    for spec in specs(program, configs):
        if isinstance(spec, evt.KernelSpec):
            out.append((spec, Unit(f"{stem}.{spec.symbol}.{spec.config.key()}", render_gemm(program, spec))))
        else:
            out.append((spec, Unit(f"{stem}.{spec.symbol}", render_combine(program, spec), uses_cutlass=False)))
    return out


DEFAULT_M = 8192   # `epic compile/build` without --shape: the large-M (prefill) configuration


def write_sources(program: Program, out_dir: str, sizes: dict | None = None) -> list[str]:
    m = _rows(program, sizes)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for spec, unit in units(program, kernel_configs(program, m)):
        path = os.path.join(out_dir, unit.name + ".cu")
        with open(path, "w") as f:
            f.write(unit.source)
        paths.append(path)
    return paths


def _rows(program: Program, sizes: dict | None) -> int:
    if not sizes:
        return DEFAULT_M
    from .. import sizes as sizes_mod
    return sizes_mod.evaluate(program.kernels[0].rows, sizes)
