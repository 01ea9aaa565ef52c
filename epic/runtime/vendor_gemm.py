"""A gemm on the vendor's library (plan/backend.py): the launch "library" of a VendorGemmSpec
(codegen/vendor.py). Its launch is torch.mm, or torch.addmm for d = a @ b + c, on the call's tensors
(cuBLAS on a CUDA device, torch's own gemm on the host, where the tests' simulator runs it), on
torch's current stream: a call whose stream is another is refused, since torch would launch there.
The compiled call path runs the same two calls in C++ (templates/launcher.cpp, Launch::vendor)."""
from __future__ import annotations

import torch

from ..diagnostics import Diagnostic, EpicError
from ..ir import operands

# statuses of a vendor launch (templates/launcher.cpp returns the same)
WRONG_STREAM = -101
FAILED = -102
_STATUS = {WRONG_STREAM: "the call's stream is not torch's current stream (torch.mm launches there)",
           FAILED: "torch.mm failed"}


class VendorGemm:
    """The KernelLibrary interface (runtime/loader.py) for one vendor gemm, launched with tensors."""
    launch_function = None             # no C entry: both launch paths call torch (fastcall.register)

    def __init__(self, spec):
        self.spec = spec
        self.info = {"kind": "vendor", "kernel": spec.name, "backend": spec.config.backend,
                     "ptrs": [f"{p.role}:{p.tensor}" for p in spec.pointers]}

    def workspace_size(self, dims) -> int:
        return 0                       # torch's cuBLAS handle has its own

    def run(self, tensors: list[torch.Tensor], stream: int) -> None:
        """tensors: per pointer (A, B, [C,] D), as the table holds them."""
        spec = self.spec
        d = tensors[-1]
        if d.is_cuda and torch.cuda.current_stream(d.device).cuda_stream != stream:
            raise self.launch_error(WRONG_STREAM)
        a = operands.logical(tensors[0], spec.a_t)
        b = operands.logical(tensors[1], spec.b_t)
        try:
            if spec.has_c:
                torch.addmm(tensors[2], a, b, out=d)
            else:
                torch.mm(a, b, out=d)
        except RuntimeError as e:
            raise EpicError(Diagnostic("E703", f"gemm '{spec.name}' (backend {spec.config.backend}) failed: {e}")) from None

    def launch_error(self, rc: int) -> EpicError:
        return EpicError(Diagnostic("E703", f"gemm '{self.spec.name}' (backend {self.spec.config.backend}) did not "
                                    f"launch: {_STATUS.get(rc, f'status {rc}')}"))
