"""Reductions whose combine spans the ranks of a process group (tensor parallelism).

A vocabulary-parallel LM head holds V / world columns of the weight on each rank. Each rank runs the
program's gemm over its columns, which writes per-tile partials (for cross entropy: the online
(max, sum-exp) pairs and the target logit's partial sums); the partials of all ranks are gathered in
rank order and the program's own combine kernel merges them. When every rank's columns are a whole
number of the gemm's column tiles, the gathered partials are exactly those one GPU holding the whole
vocabulary writes, in the same order, so the result is bit-identical to the single-GPU result.

    out = epic.distributed.run_sharded(prog, x=x, w=w_shard.t(), label=label, column_inputs=("label",))

`column_inputs` name inputs that hold global column indices (labels): each rank sees them shifted to
its own columns (a label outside them matches no column there).
"""
from __future__ import annotations

import torch

from . import sizes as sizes_mod
from .diagnostics import error
from .runtime import binding


def run_sharded(prog, *, group=None, column_inputs: tuple[str, ...] = (), **inputs) -> dict[str, torch.Tensor]:
    import torch.distributed as dist
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    program = prog.program
    gemms = [k for k in program.kernels if k.kind == "gemm"]
    combines = [k for k in program.kernels if k.kind == "combine"]
    if len(gemms) != 1 or not combines or any(c.axis != "row" for c in combines) or \
            any(t.producer == gemms[0].name for t in program.outputs()):
        raise error("E702", "run_sharded takes one gemm whose outputs all come from row combines (per-row "
                    "statistics such as cross entropy's loss); this program is not of that form", gemms[0].span)
    (gemm,) = gemms
    if len(gemm.n.names) != 1 or gemm.n.coef != 1:
        raise error("E607", f"run_sharded shards the gemm's columns {gemm.n}: it must be one dimension name")
    local = dict(inputs)
    local_sizes = sizes_mod.bind_from_tensors(program, {k: tuple(v.shape) for k, v in inputs.items()
                                                        if isinstance(v, torch.Tensor) and v.dim() > 0})
    n_local = local_sizes[gemm.n.names[0]]
    for name in column_inputs:
        local[name] = inputs[name] - rank * n_local
    out = prog(keep=True, **local)
    bound = next(b for b in prog._bound.values() if b.plan.sizes == local_sizes)
    tile_n = bound.plan.configs[gemm.name].tile_n
    if n_local % tile_n:
        raise error("E607", f"each rank's {n_local} columns must be a whole number of the gemm's {tile_n}-column "
                    "tiles, so that the ranks' partials are the single-GPU partials",
                    None, f"give each rank a multiple of {tile_n} columns (pad the vocabulary)")
    full_sizes = dict(local_sizes, **{gemm.n.names[0]: n_local * world})
    full = prog._bind(full_sizes, bound.device)
    buffers = {}
    for b in full.allocations:
        if b.role == "partial":
            parts = [torch.empty_like(out[b.name]) for _ in range(world)]
            dist.all_gather(parts, out[b.name].contiguous(), group=group)
            buffers[b.name] = torch.cat(parts, dim=0)           # tiles of rank 0, then rank 1, ...
        else:
            buffers[b.name] = binding.allocate(b, bound.device, poison=False)
    scalars = {t.name: float(inputs.get(t.name, t.default)) for t in prog.inputs if t.is_scalar}
    stream = torch.cuda.current_stream(bound.device).cuda_stream
    for launch, kernel in zip(full.launches, program.kernels):
        if kernel.kind == "combine":
            launch.run(buffers, scalars, stream, bound.device)
    return {name: buffers[name] for name in full.outputs}
