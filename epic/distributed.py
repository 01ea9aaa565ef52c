"""Reductions whose combine spans the ranks of a process group (tensor parallelism).

A vocabulary-parallel LM head holds V / world columns of the weight on each rank. Each rank runs the
program's gemm over its columns, which writes per-tile partials (for cross entropy: the online
each tile's log-sum-exp and the target logit's partial sums); the partials of all ranks are gathered in
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


def shard_columns(program, inputs: dict, column_inputs: tuple[str, ...], rank: int, n_local: int) -> dict:
    """The inputs as rank `rank` sees them when it holds columns [rank * n_local, (rank + 1) * n_local)
    of the gemm: each column input (global column indices, e.g. labels) shifted to the rank's own
    columns; an index outside them matches no column of the rank."""
    local = dict(inputs)
    for name in column_inputs:
        t = program.tensors.get(name)
        if t is None or t.is_scalar or not isinstance(inputs.get(name), torch.Tensor):
            raise error("E601", f"column input '{name}' is not a tensor input of this call", None,
                        "name in column_inputs the inputs that hold global column indices (e.g. label)")
        local[name] = inputs[name] - rank * n_local
    return local


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
    local_sizes = sizes_mod.bind_from_tensors(program, {k: tuple(v.shape) for k, v in inputs.items()
                                                        if isinstance(v, torch.Tensor) and v.dim() > 0})
    n_local = local_sizes[gemm.n.names[0]]
    out = prog(keep=True, **shard_columns(program, inputs, column_inputs, rank, n_local))
    bound = next(b for b in prog._bound.values() if b.plan.sizes == local_sizes)
    if bound.plan.configs[gemm.name].combine == "tail":
        raise error("E216", f"run_sharded merges the ranks' per-tile partials, and gemm '{gemm.name}' has "
                    "combine=tail, which computes none (its tail kernel reduces each rank's rows alone)", gemm.span,
                    "use combine=kernel (the default) for a sharded call")
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
    for launch, kernel in zip(full.launches, program.kernels):    # inputs a combine reads (the labels
        if kernel.kind == "combine":                                # whose logits it picks): global ones
            for name in launch.pointer_tensors:
                if name and name not in buffers and isinstance(inputs.get(name), torch.Tensor):
                    buffers[name] = inputs[name].contiguous()
    scalars = binding.scalar_values([t for t in prog.inputs if t.is_scalar], inputs)
    stream = torch.cuda.current_stream(bound.device).cuda_stream if bound.device.type == "cuda" else 0
    for launch, kernel in zip(full.launches, program.kernels):
        if kernel.kind == "combine":
            launch.run(buffers, scalars, stream, bound.device)
    return {name: buffers[name] for name in full.outputs}
