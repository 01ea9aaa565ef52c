"""bench/ncu_diff.py on small Nsight Compute CSV exports written here by hand (both pages it reads):
which metrics it reports as differing between two kernels, and the labels it refuses."""
import subprocess
import sys

from .conftest import ROOT, bench_module

DETAILS = """==PROF== Disconnected from process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python3","h","nvjet_a","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Elapsed Cycles","cycle","1,931,350"
"0","1","python3","h","nvjet_a","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Memory Workload Analysis","L2 Hit Rate","%","71.59"
"0","1","python3","h","nvjet_a","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Launch Statistics","Block Size","","384"
"1","1","python3","h","cutlass_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Elapsed Cycles","cycle","1,886,045"
"1","1","python3","h","cutlass_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Memory Workload Analysis","L2 Hit Rate","%","78.56"
"1","1","python3","h","cutlass_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Launch Statistics","Block Size","","384"
"2","1","python3","h","quack_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Elapsed Cycles","cycle","1,871,243"
"2","1","python3","h","quack_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Memory Workload Analysis","L2 Hit Rate","%","77.48"
"2","1","python3","h","quack_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Launch Statistics","Block Size","","384"
"""

RAW = """"ID","Kernel Name","smsp__pcsamp_warps_issue_stalled_barrier","smsp__pcsamp_warps_issue_stalled_wait","sm__cycles_active.avg"
"","","","","cycle"
"0","nvjet_a","100","2,000","1,878,441.67"
"1","cutlass_kernel","4,000","2,010","1,809,543.02"
"2","quack_kernel","1,000","2,000","1,795,885.84"
"""


def test_the_details_page_reports_what_differs_between_the_two_kernels_compared():
    nd = bench_module("ncu_diff")
    names, table = nd.metrics(DETAILS)
    assert names == ["nvjet_a", "cutlass_kernel", "quack_kernel"]
    assert table["GPU Speed Of Light Throughput / Elapsed Cycles"] == ("cycle", ["1,931,350", "1,886,045", "1,871,243"])
    # epic against QuACK: cycles 0.78% apart, L2 hit rate 1.4%, block size equal
    assert [m for m, _, _ in nd.differing(table, 1, 2, 0.005)] == [
        "GPU Speed Of Light Throughput / Elapsed Cycles", "Memory Workload Analysis / L2 Hit Rate"]
    assert [m for m, _, _ in nd.differing(table, 1, 2, 0.01)] == ["Memory Workload Analysis / L2 Hit Rate"]
    assert [m for m, _, _ in nd.differing(table, 1, 2, 0.005, "cycles")] == [
        "GPU Speed Of Light Throughput / Elapsed Cycles"]


def test_the_raw_page_reads_units_under_the_names(tmp_path):
    nd = bench_module("ncu_diff")
    names, table = nd.metrics(RAW)
    assert names == ["nvjet_a", "cutlass_kernel", "quack_kernel"]
    assert table["sm__cycles_active.avg"][0] == "cycle"
    assert [m for m, _, _ in nd.differing(table, 1, 2, 0.01)] == [
        "smsp__pcsamp_warps_issue_stalled_barrier"]
    f = tmp_path / "raw.csv"
    f.write_text(RAW)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "ncu_diff.py"), str(f), "--labels",
                          "cublas,epic,quack", "--compare", "epic,quack", "--min", "0.005", "--match", "stalled"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == ["cublas: nvjet_a", "epic: cutlass_kernel", "quack: quack_kernel"]
    assert len(lines) == 5 and lines[4].startswith("smsp__pcsamp_warps_issue_stalled_barrier")
    assert lines[4].endswith("100 | 4,000 | 1,000")


def test_labels_that_do_not_fit_the_file_are_refused(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text(DETAILS)
    script = str(ROOT / "bench" / "ncu_diff.py")
    two = subprocess.run([sys.executable, script, str(f), "--labels", "epic,quack"], capture_output=True, text=True)
    assert two.returncode == 2 and "3 kernels in the file, 2 labels given" in two.stderr
    bad = subprocess.run([sys.executable, script, str(f), "--labels", "a,b,c", "--compare", "a,z"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--compare takes two of a, b, c" in bad.stderr
    for pair in ("2,5", "0,1", "k2,k2"):     # out of range, 1-based, the same kernel twice
        out = subprocess.run([sys.executable, script, str(f), "--compare", pair], capture_output=True, text=True)
        assert out.returncode == 2 and "--compare takes two of k1, k2, k3" in out.stderr and "Traceback" not in out.stderr
    empty = tmp_path / "e.csv"
    empty.write_text("==PROF== nothing profiled\n")
    none = subprocess.run([sys.executable, script, str(empty)], capture_output=True, text=True)
    assert none.returncode != 0 and "no Nsight Compute CSV header" in none.stderr
