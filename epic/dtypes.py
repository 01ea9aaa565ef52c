"""Element types of the language and what each means numerically.

Arithmetic in an epilogue runs in the compute type (f32 in kernels, float64 in the reference);
a dtype matters where a value is loaded, cast or stored. Casts to fp8 and integer types saturate
(clamp to the finite range) and integers round half to even: that is what quantized write-back
wants, and it is documented in docs/LANGUAGE.md.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    is_float: bool
    torch_name: str | None      # torch dtype attribute used to hold it (int4 is held as int8)
    cutlass: str | None         # C++ element type in CUTLASS kernels
    cuda: str | None            # C++ element type in plain CUDA kernels (combine kernels, cuda_*.h headers)
    max_finite: float | None    # saturation bound for fp8/int casts (None: IEEE overflow rules)
    min_finite: float | None = None

    def __str__(self) -> str:
        return self.name

    @property
    def is_int(self) -> bool:
        return not self.is_float and self.name != "bool"

    @property
    def nbytes(self) -> float:
        return self.bits / 8


F32 = DType("f32", 32, True, "float32", "float", "float", None)
BF16 = DType("bf16", 16, True, "bfloat16", "cutlass::bfloat16_t", "__nv_bfloat16", None)
F16 = DType("f16", 16, True, "float16", "cutlass::half_t", "__half", None)
E4M3 = DType("e4m3", 8, True, "float8_e4m3fn", "cutlass::float_e4m3_t", "__nv_fp8_e4m3", 448.0, -448.0)
E5M2 = DType("e5m2", 8, True, "float8_e5m2", "cutlass::float_e5m2_t", "__nv_fp8_e5m2", 57344.0, -57344.0)
I32 = DType("i32", 32, False, "int32", "int32_t", "int32_t", 2**31 - 1, -(2**31))
I8 = DType("i8", 8, False, "int8", "int8_t", "int8_t", 127, -128)
# i4 is stored packed two per byte (low nibble = even column): callers get a uint8 tensor [M, N/2]
I4 = DType("i4", 4, False, "uint8", None, None, 7, -8)
# MX formats, storage only (what a cast or a store rounds to; see docs/LANGUAGE.md, "Types"):
# e8m0: an unsigned power of two 2**(e - 127), e = 0..254 (0xFF = NaN; no zero, no sign). A cast
#   rounds |x| up to a power of two and saturates to [2**-127, 2**127], as CUDA's __nv_fp8_e8m0
#   (cvt.rp.satfinite) does; NaN stays NaN.
# e2m1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (no inf or NaN). A cast rounds to nearest
#   even and saturates to +-6; NaN becomes +6 (as __nv_cvt_float_to_fp4). Stored packed two per
#   byte like i4 (low nibble = even column; code = sign << 3 | exponent << 1 | mantissa).
# e8m0 has no CUTLASS element for tiles and vectors: CUTLASS 4.2's Sm90AuxLoad does not compile with
# cutlass::float_ue8m0_t (so loads are E702), and tile stores write exponent bytes (codegen/nodes/
# stores.py). Block values (MX scales) a block-scale node stores use E8M0_CUTLASS.
E8M0 = DType("e8m0", 8, True, "float8_e8m0fnu", None, "__nv_fp8_e8m0", 2.0**127, 2.0**-127)
E8M0_CUTLASS = "cutlass::float_ue8m0_t"
E2M1 = DType("e2m1", 4, True, "uint8", None, None, 6.0, -6.0)
BOOL = DType("bool", 8, False, "bool", "bool", "bool", None)

ALL = {d.name: d for d in (F32, BF16, F16, E4M3, E5M2, I32, I8, I4, E8M0, E2M1, BOOL)}
# Spellings users reach for; each maps to one canonical dtype.
ALIASES = {"float32": F32, "fp32": F32, "bfloat16": BF16, "float16": F16, "fp16": F16,
           "fp8e4m3": E4M3, "float8_e4m3": E4M3, "fp8e5m2": E5M2, "float8_e5m2": E5M2,
           "int32": I32, "int8": I8, "int4": I4}

GEMM_OPERAND = (BF16, F16, E4M3, E5M2, I8)   # what the sm90 mainloop multiplies
STORABLE = (F32, BF16, F16, E4M3, E5M2, I32, I8, I4, E8M0, E2M1)
PACKED = (I4, E2M1)   # 4-bit types: stored two per byte as uint8 [M, N/2], low nibble = even column


def lookup(name: str) -> DType | None:
    return ALL.get(name) or ALIASES.get(name)


def promote(a: DType, b: DType) -> DType:
    """Result type of arithmetic: integers stay integers only when both are; else f32."""
    if a.is_int and b.is_int:
        return I32
    return F32
