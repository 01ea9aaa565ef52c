"""Each reduction's C++ merge (epic/ir/primitives.py's cxx_merge, which the combine kernels and the
folded combine run), compiled with g++ and run on partials with edge values, against the
reference's merge of the same partials: the identity changes nothing, the order of two sides changes
no bit (lanes merge each other's values in a butterfly and must end with the same bits), and for
log-sum-exp an empty tile (-inf), +inf and NaN come out as torch.logsumexp has them."""
import ctypes
import math
import shutil
import struct
import subprocess

import pytest
import torch

from epic.ir import primitives as P

EDGES = [0.0, -0.0, 1.5, -2.25, 30.0, -30.0, 2.0 ** -100, math.inf, -math.inf]    # all exact in float32
FINITE = [0.0, 1.5, -2.25, 30.0, -30.0, 7.0, 7.0, 2.0 ** -100, -88.0]


@pytest.fixture(scope="module")
def merges(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    lines = ["#include <cmath>", "#define __expf(x) std::exp(x)   // the device intrinsic, as the host has it"]
    for name, r in P.REDUCTIONS.items():
        step = r.cxx_merge.format(a="acc", x="x")
        lines += [f'extern "C" float fold_{name}(const float* v, int n, float acc) {{',
                  f"  for (int i = 0; i < n; ++i) {{ float x = v[i]; {step} }}",
                  f"  return {r.cxx_finalize.format(a='acc')};", "}",
                  f'extern "C" float pair_{name}(float acc, float x) {{ {step} return acc; }}']
    d = tmp_path_factory.mktemp("merges")
    (d / "merges.cpp").write_text("\n".join(lines) + "\n")
    subprocess.run([gxx, "-std=c++17", "-O1", "-fno-fast-math", "-shared", "-fPIC", "-o", str(d / "merges.so"),
                    str(d / "merges.cpp")], check=True)
    lib = ctypes.CDLL(str(d / "merges.so"))
    for name in P.REDUCTIONS:
        getattr(lib, f"fold_{name}").restype = ctypes.c_float
        getattr(lib, f"fold_{name}").argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_float]
        getattr(lib, f"pair_{name}").restype = ctypes.c_float
        getattr(lib, f"pair_{name}").argtypes = [ctypes.c_float, ctypes.c_float]
    return lib


def _fold(lib, name, values, start):
    arr = (ctypes.c_float * len(values))(*values)
    return getattr(lib, f"fold_{name}")(arr, len(values), start)


def _bits(x: float) -> bytes:
    return struct.pack("<f", x)


def _same(got: float, want: float, rel: float) -> bool:
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    if math.isinf(want) or math.isinf(got):
        return got == want
    return abs(got - want) <= rel * max(1.0, abs(want))


@pytest.mark.parametrize("name", list(P.REDUCTIONS))
def test_merge_from_the_identity_is_the_references_merge(merges, name):
    r = P.REDUCTIONS[name]
    values = [abs(x) for x in FINITE] if r.pre == "abs" else FINITE     # amax's partials are of abs(x)
    want = float(r.ref_merge(torch.tensor(values, dtype=torch.float64), 0))
    got = _fold(merges, name, values, r.identity)
    assert _same(got, want, 1e-6), (name, got, want)
    for x in values:        # the identity merged into a value, or a value into it, leaves the value
        assert _fold(merges, name, [r.identity], x) == x
        assert _fold(merges, name, [x], r.identity) == x


@pytest.mark.parametrize("name", list(P.REDUCTIONS))
def test_merge_is_symmetric(merges, name):
    """Bit for bit, except the sign of a zero from max/min (fmaxf(0, -0) may be either)."""
    pair = getattr(merges, f"pair_{name}")
    for a in EDGES + [math.nan]:
        for b in EDGES + [math.nan]:
            ab, ba = pair(a, b), pair(b, a)
            if math.isnan(ab) or math.isnan(ba):
                assert math.isnan(ab) and math.isnan(ba), (name, a, b, ab, ba)
            elif name in ("max", "min", "amax"):
                assert ab == ba, (name, a, b, ab, ba)
            else:
                assert _bits(ab) == _bits(ba), (name, a, b, ab, ba)


@pytest.mark.parametrize("values", [
    [-math.inf, -math.inf],                 # every tile empty: -inf
    [-math.inf, 2.0, -math.inf],            # empty tiles add nothing
    [math.inf, 3.0], [3.0, math.inf], [math.inf, math.inf],
    [math.nan, 3.0], [3.0, math.nan], [-math.inf, math.nan], [math.nan, math.inf], [math.inf, math.nan],
    [5.0, 5.0, 5.0, 5.0],                   # equal sides: 5 + log 4
])
def test_log_sum_exp_merge_keeps_empty_infinite_and_nan_partials(merges, values):
    want = float(torch.logsumexp(torch.tensor(values, dtype=torch.float64), 0))
    got = _fold(merges, "lse", values, -math.inf)
    assert _same(got, want, 1e-6), (values, got, want)
