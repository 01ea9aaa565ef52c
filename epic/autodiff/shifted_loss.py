"""The LM head + cross entropy with its gradients in the forward and no pass over dlogits.

    head = ShiftedCrossEntropy(chunk_rows=4096)            # epic.integrations' loss_policy="shifted"
    total, outs = head(x=x, w=W.t(), label=label, d_loss=weights)
    total.backward()

The program is epic.integrations' LM_HEAD_LOSS (a negative label: a row that adds 0). Policy "fused"
(autodiff/fused.py) stores the bf16 logits and has the row combine kernel rewrite them into
dlogits = d * (softmax - onehot) once the row's log-sum-exp is known: a read and a write of the
[rows, V] tile between the gemms. Here a shift per row known before the gemm removes that pass:

    t   = the row's label logit, x . W[label] (a dot product per row)
    e   = exp(z - t), z = bf16(acc)   stored by the logits gemm, with s = row_sum(e) and z[label]
    lse = t + log(s);  loss = lse - z[label];  v = d / s
    dlogits = d * (e / s - onehot) = v * e',  e' = e with e[label] - s at the label (one element a row)
    dX = v * (e' @ W)       a row scale in the dX gemm's epilogue
    dW = e'^T @ (v * x)     v applied to x (a [rows, D] pass) instead of to e'

t is any shift: the results hold for every t for which e and v are representable. With t the label's
logit, s >= e[label] ~ 1, so e cannot underflow to a zero row sum; it overflows only where a logit
exceeds the label's by ~44 (s > 2^64, a token the model gives probability < 1e-19). Each run checks,
on the device, s <= 2^64 and v >= 2^-96 on every weighted row; if any row fails, the whole call is
run again by policy "fused" (one host read of the check at the end, as `scaling` does for the
incoming gradient). Under torch.compile and CUDA graph capture, where the host cannot look, policy
"fused" runs.

As in policy "fused", the loss and the gradient are computed from the logits rounded to bf16, and dW
is carried from chunk to chunk in bf16 (the later chunks' dW gemm adds the sum so far in its
epilogue and writes over it).
"""
from __future__ import annotations

import torch

from ..diagnostics import error
from .chunks import _rows
from .loss import FusedLoss, scaled, scaling

# the logits gemm: e = exp(z - t), its row sums and the label's logit; a negative label picks 0
HEAD = """\
gemm lm_head(x: bf16[M, D] @ w: bf16[D, V]) {
  in label: i32[M]
  in t: f32[M]
  z = bf16(acc)
  e = exp(z - t)
  out e_out: bf16[M, V] = e
  out s: f32[M] = row_sum(e)
  out picked: f32[M] = row_pick(z, label)
}
"""

# dX = v * (e' @ W); W [V, D] passed as it is (the memory of w = W.t())
DX = """\
gemm lm_head_dx(e: bf16[M, V] @ wv: bf16[V, D]) with b_major=n {
  in v: f32[M]
  out d_x: bf16[M, D] = acc * v
}
"""

# dW = e'^T @ (v * x), [V, D] (the layout of W); the later chunks add the earlier chunks' sum
DW = """\
in e: bf16[M, V]
in xs: bf16[M, D]
gemm lm_head_dw(e.T @ xs) {
  out d_w: bf16[V, D] = acc
}
"""
DW_MORE = """\
in e: bf16[M, V]
in xs: bf16[M, D]
gemm lm_head_dw(e.T @ xs) {
  in d_w_sum: bf16[V, D]
  out d_w: bf16[V, D] = acc + d_w_sum
}
"""

IGNORED_SHIFT = 1e30        # a negative label's row: e = exp(z - 1e30) = 0, s = 0, loss 0
MAX_ROW_SUM = 2.0 ** 64     # s above it: a logit ~44 above the label's; policy "fused" runs instead
MIN_ROW_SCALE = 2.0 ** -96  # v = d / s below it: v * x would lose bits to bf16's subnormals


class ShiftedCrossEntropy:
    """LM_HEAD_LOSS with policy "fused"'s interface (x, w = W.t(), label, d_loss) and no dlogits pass."""

    def __init__(self, fallback: str = "never", chunk_rows: int | None = None, config: dict | None = None):
        from ..integrations.programs import LM_HEAD_LOSS
        from ..runtime.compiled import compile as _compile
        if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1):
            raise error("E903", f"chunk_rows must be a positive integer, got {chunk_rows!r}")
        self.rows = chunk_rows
        self.fused = FusedLoss(LM_HEAD_LOSS, config=config, fallback=fallback, chunk_rows=chunk_rows)
        self.head, self.dx = _compile(HEAD, config, fallback), _compile(DX, config, fallback)
        self.dw, self.dw_more = _compile(DW, config, fallback), _compile(DW_MORE, config, fallback)
        self._overwrite: bool | None = None
        self.runs = {"shifted": 0, "fused": 0}     # which path each call took (the check's outcome)

    def __call__(self, x: torch.Tensor, w: torch.Tensor, label: torch.Tensor,
                 d_loss: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(total, {"loss": rows}): total = sum(d_loss * loss), differentiable in x and w."""
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.runs["fused"] += 1
            return self.fused(x=x, w=w, label=label, d_loss=d_loss)
        total, loss = _Shifted.apply(self, x, w, label, d_loss)
        return total, {"loss": loss}

    def run(self, x, w, label, d_loss) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss rows, dX, dW [V, D]) for weights d_loss: the shifted path, or policy "fused" where
        the check fails."""
        got = self._shifted(x, w, label, d_loss)
        if got is not None:
            self.runs["shifted"] += 1
            return got
        self.runs["fused"] += 1
        out = self.fused.run({"x": x, "w": w, "label": label, "d_loss": d_loss})
        grads = self.fused.derivation.grads
        return out["loss"], out[grads["x"]], out[grads["w"]]

    def _shifted(self, x, w, label, d_loss):
        m, wv = x.shape[0], w.t()
        rows = self.rows or m
        loss = torch.empty(m, dtype=torch.float32, device=x.device)
        d_x = torch.empty_like(x)
        d_w = None
        ok = torch.ones((), dtype=torch.bool, device=x.device)
        for a in range(0, m, rows):
            b = min(a + rows, m)
            xc, lab, d = _rows(x, a, b), _rows(label, a, b), _rows(d_loss, a, b).to(torch.float32)
            counted = lab >= 0
            t = self._shift(xc, wv, lab, counted)
            got = self.head(x=xc, w=w, label=lab, t=t)
            e, s = got["e_out"], got["s"]
            loss[a:b] = torch.where(counted, t + torch.log(s) - got["picked"], 0.0)
            weighted = counted & (d != 0)
            v = torch.where(weighted, d / torch.where(weighted, s, 1.0), 0.0)
            ok &= ~(weighted & ~((s <= MAX_ROW_SUM) & (v >= MIN_ROW_SCALE))).any()
            # e' = e - s at the label: v * e' = d * (softmax - onehot)
            at = lab.clamp(min=0).to(torch.int64).unsqueeze(1)
            label_e = e.gather(1, at).squeeze(1).float()
            e.scatter_(1, at, torch.where(counted, label_e - s, label_e).to(e.dtype).unsqueeze(1))
            if d_x[a:b].data_ptr() % 16:        # a kernel stores 16-byte aligned rows
                d_x[a:b] = self.dx(e=e, wv=wv, v=v)["d_x"]
            else:
                self.dx(e=e, wv=wv, v=v, out={"d_x": d_x[a:b]})
            xs = (xc.float() * v.unsqueeze(1)).to(x.dtype)
            if d_w is None:
                d_w = self.dw(e=e, xs=xs)["d_w"]
            elif self._in_place(e, xs, d_w):
                self.dw_more(e=e, xs=xs, d_w_sum=d_w, out={"d_w": d_w})
            else:
                d_w = self.dw_more(e=e, xs=xs, d_w_sum=d_w)["d_w"]
            del got, e
        if not bool(ok):                  # the one host read: every chunk is queued by now
            return None
        return loss, d_x, d_w

    def _in_place(self, e, xs, d_w) -> bool:
        """Whether the later chunks' dW gemm may write over the sum it adds (it reads it only in its
        epilogue, at the position it stores: planner.overwrite_problem)."""
        if self._overwrite is None:
            from ..plan import planner
            from ..runtime.validate import solve
            prog = self.dw_more.program
            sizes = solve(prog, {"e": tuple(e.shape), "xs": tuple(xs.shape), "d_w_sum": tuple(d_w.shape)},
                          indexable=False)
            self._overwrite = planner.overwrite_problem(self.dw_more.plan(sizes), "d_w", "d_w_sum") is None
        return self._overwrite

    @staticmethod
    def _shift(xc, wv, lab, counted) -> torch.Tensor:
        """t: the label's logit x . W[label] in f32 (any shift keeps the results exact; this one keeps
        s >= ~1), IGNORED_SHIFT for a negative label."""
        picked = wv.index_select(0, lab.clamp(min=0).to(torch.int64))
        dot = (xc * picked).sum(dim=1, dtype=torch.float32)
        return torch.where(counted, dot, IGNORED_SHIFT)


class _Shifted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: ShiftedCrossEntropy, x, w, label, d_loss):
        loss, d_x, d_w = fn.run(x, w, label, d_loss)
        ctx.save_for_backward(d_x, d_w)
        ctx.mark_non_differentiable(loss)
        total = (loss * d_loss.to(torch.float32)).sum()
        return total, loss

    @staticmethod
    def backward(ctx, g_total, _):
        d_x, d_w = ctx.saved_tensors
        scale = scaling(g_total)
        return None, scaled(d_x, scale), scaled(d_w, scale).t(), None, None


