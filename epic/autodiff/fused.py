"""Policy "fused": a loss head's gradient computed in its forward, as one program.

The backward of a loss head (LM head + cross entropy) recomputes the logits gemm, because its
gradient softmax - onehot needs the row's log-sum-exp, known only after the forward: 4 gemms. When
the weight each output row will have in the loss is known at forward time (`d_loss`: 1/n for a mean
over n tokens, 0 for an ignored one), the forward can produce the gradients itself, as Liger's and
QuACK's fused linear cross entropy do: one program that computes the loss rows and the statistics in
the gemm, finishes dlogits in the row combine kernel (epic/checks/row_finish.py: a tile read
transposed cannot take a deferred row scale) and runs the dX and dW gemms on it. 3 gemms.

The gemm stores the accumulator rounded to its operands' dtype for the combine kernel to read back
(as an unfused framework stores its logits); the loss and the gradient are both computed from those
rounded logits, so they agree. The exact float64 interpreter does not round, so the program's
meaning is the exact gradient.

Only a program of one gemm qualifies: a chain's earlier gemms would need their backward after the
loss's weights are applied, which is the ordinary backward (policy "save").
"""
from __future__ import annotations

from ..diagnostics import error
from ..ir.core import Program, topo_order
from .finishing import finished_by_row_combine
from .text import type_text as _type


def derive_fused(program: Program, deriver) -> None:
    """Run the deriver over the program's one gemm with its statistics computed in place, and add the
    forward's outputs to that gemm (derive() then prints the program)."""
    gemms = [k for k in program.kernels if k.kind == "gemm"]
    if len(gemms) != 1:
        raise error("E903", f"policy 'fused' computes the gradient in the forward of a program of one gemm (a loss "
                    f"head); this one has {len(gemms)}", gemms[1].span if len(gemms) > 1 else None,
                    "use policy 'save' or 'recompute'")
    k = gemms[0]
    operand = program.tensors[k.a].dtype
    if operand.bits != 16:
        raise error("E903", f"policy 'fused' needs 16-bit gemm operands ({k.a} is {operand})", k.span)
    if k.a in deriver.needs and k.b not in deriver.needs and k.b in program.tensors:
        # dlogits is finished by the row combine kernel because dW's gemm reads it transposed; without
        # dW, dX's gemm alone would need its row statistic deferred into it, which it cannot take
        raise error("E903", f"policy 'fused' needs the gradient of the weight '{k.b}' too (it is left out of "
                    "--wrt)", k.span, "add it to --wrt, or use policy 'save' for the input's gradient alone")
    deriver.primal_inline = operand
    deriver.kernel(k)
    if not deriver.gemms:
        raise error("E902", "no gradient flows back through the gemm", k.span)
    head = [g for g in deriver.gemms if g.a == k.a and g.name.startswith(f"{k.name}_bwd")]
    if len(head) != 1:
        raise error("E903", f"policy 'fused' needs the gradient of gemm '{k.name}' in one epilogue; it needs a "
                    "backward row sum across tiles first (stages)", k.span, "use policy 'save' or 'recompute'")
    g = head[0]
    deriver.fused_head = g
    primal = deriver.last_primal
    stored = []
    for s in k.stores:
        t = program.tensors[s.tensor]
        if t.role == "out":
            stored.append(("out", t.name, _type(t.dtype, t.dims), primal(s.value)))
    g.stores[:0] = stored
    g.name = deriver.names.fresh(f"{k.name}_fused")
    g.comment = (f"gemm {k.name}'s forward and the gradient of its epilogue, with the loss weights "
                 + ", ".join(deriver.upstream.values()) + " given now")


def refuse_unfinishable(deriver, program: Program) -> None:
    """After the gradients are stored (derive's finish): everything the fused gemm stores after a row
    statistic must be finishable by the row combine kernel, else E903 (no program is handed out that
    epic's checks would refuse)."""
    g = deriver.fused_head
    computed = [(tensor, v) for _, tensor, _, v in g.stores]
    if not finished_by_row_combine(topo_order([v for _, v in computed]), computed):
        k = next(k for k in program.kernels if k.kind == "gemm")
        raise error("E903", f"policy 'fused': the gradients of gemm '{k.name}' need values after a row statistic "
                    "that the row combine kernel cannot finish (a pairwise map, a block statistic or a column "
                    "sum after it)", k.span, "use policy 'save' or 'recompute'")


def accumulate_sums(deriver, grads: dict[str, str], program: Program) -> dict[str, str]:
    """The program's variant for the second and later chunks of rows (autodiff/loss.py): each gradient
    that sums over the rows (dW, a bias's) adds the sum of the earlier chunks, an input NAME_sum, in
    its gemm's epilogue, where reading it hides under the mainloop. Returns gradient -> its input."""
    from ..ir.core import make
    from .epilogue import shape_in
    rows = next(k.rows for k in program.kernels if k.kind == "gemm")
    out = {}
    for name, grad in grads.items():
        dims = deriver._grad_dims(name)
        if dims and dims[0] == rows:
            continue                       # per row: each chunk writes its own rows
        for at, g in enumerate(deriver.gemms):
            for i, (role, tensor, type_text, v) in enumerate(g.stores):
                if tensor != grad:
                    continue
                total = deriver.names.fresh(f"{grad}_sum")
                deriver.top_inputs.append((total, type_text))
                deriver._remember_dims(total, dims)
                dtype = program.tensors[name].dtype
                load = make("load", (), {"tensor": total, "dtype": dtype,
                                         "shape": shape_in(dims, *deriver.kernel_dims[at])}, None, total)
                g.stores[i] = (role, tensor, type_text, make("add", (v, load), {}))
                out[grad] = total
    return out
