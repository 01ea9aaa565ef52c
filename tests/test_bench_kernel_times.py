"""bench/kernel_times.py's per-kernel summary over calls: a PDL dependent's duration includes its wait for
the kernel before it, so "after" (its end past the previous kernel's end) is what it adds to a call."""
from .conftest import bench_module


def test_after_is_the_time_past_the_previous_kernels_end():
    kt = bench_module("kernel_times")
    # (name, start, end) in us: a gemm, then a combine launched early as its dependent (starts at 60,
    # waits, ends 30 us after the gemm), then a kernel that starts 5 us after the combine ends
    calls = [[("gemm", 0.0, 100.0), ("combine", 60.0, 130.0), ("tail", 135.0, 145.0)],
             [("gemm", 0.0, 102.0), ("combine", 61.0, 134.0), ("tail", 139.0, 150.0)],
             [("gemm", 0.0, 98.0), ("combine", 58.0, 126.0), ("tail", 131.0, 140.0)]]
    rows, span = kt.summary(calls)
    assert [r["kernel"] for r in rows] == ["gemm", "combine", "tail"]
    assert [r["us"] for r in rows] == [100.0, 70.0, 10.0]
    assert [r["gap_us"] for r in rows] == [0.0, -40.0, 5.0]
    assert [r["after_us"] for r in rows] == [100.0, 30.0, 10.0]
    assert span == 145.0
