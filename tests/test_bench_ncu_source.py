"""bench/ncu_source.py on a small Nsight Compute source-page export written here by hand: two kernels'
sampled stalls per SASS instruction, grouped by opcode, and the inputs it refuses."""
import subprocess
import sys

from .conftest import ROOT, bench_module

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_barrier","stall_long_sb","stall_wait","stall_barrier (Not Issued)"')

SOURCE = f"""==PROF== Disconnected from process 1
"Kernel Name","cutlass_kernel"
{HEADER}
"0x7f0000001000","SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9+-0x8], R15 ;","600","590","100","0","0","580","9"
"0x7f0000001010","HGMMA.64x192x16.F32.BF16 R120, gdesc[UR16], RZ, !UPT ;","300","100","400","0","0","40","0"
"0x7f0000001020","@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR11], R15 ;","90","90","50","0","60","30","0"
"0x7f0000001030","BAR.SYNC.DEFER_BLOCKING 0x1, 0x80 ;","10","10","20","10","0","0","5"
"Kernel Name","quack_kernel"
{HEADER}
"0x7f0000009000","BAR.SYNC.DEFER_BLOCKING R5, 0x100 ;","500","500","100","500","0","0","0"
"0x7f0000009010","HGMMA.64x192x16.F32.BF16 R120, gdesc[UR12], RZ, !UPT ;","400","100","400","0","0","0","0"
"0x7f0000009020","EXIT ;","0","0","8","0","0","0","0"
"""


def test_each_kernels_samples_are_read_per_instruction_with_offsets_from_its_first():
    ns = bench_module("ncu_source")
    epic, quack = ns.kernels(SOURCE)
    assert (epic.name, quack.name) == ("cutlass_kernel", "quack_kernel")
    assert [r[0] for r in epic.rows] == [0x0, 0x10, 0x20, 0x30]
    assert [r[0] for r in quack.rows] == [0x0, 0x10, 0x20]
    assert (epic.samples, quack.samples) == (1000, 900)
    # a predicated wait counts under its opcode; the "(Not Issued)" column is not a reason of its own
    assert epic.rows[2][3] == {"long_sb": 60, "wait": 30}
    assert ns.by_opcode(epic) == {"SYNCS.PHASECHK": 690, "HGMMA.64x192x16": 300, "BAR.SYNC": 10}
    assert ns.by_opcode(quack) == {"BAR.SYNC": 500, "HGMMA.64x192x16": 400, "EXIT": 0}


def test_the_report_lists_top_instructions_then_opcodes_side_by_side(tmp_path):
    f = tmp_path / "sass.csv"
    f.write_text(SOURCE)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "ncu_source.py"), str(f), "--labels", "epic,quack",
                          "--top", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "== epic: cutlass_kernel (1000 samples)"
    assert lines[1].startswith("  000000  60.0%  SYNCS.PHASECHK.TRANS64.TRYWAIT") and lines[1].endswith("wait 97%")
    assert lines[2].startswith("  000010  30.0%  HGMMA")
    assert lines[3] == "== quack: quack_kernel (900 samples)"
    assert lines[4].endswith("barrier 100%")
    table = lines[lines.index("== samples by opcode: epic | quack") + 1:]
    assert [t.split()[0] for t in table] == ["SYNCS.PHASECHK", "BAR.SYNC", "HGMMA.64x192x16"]
    assert table[1].split() == ["BAR.SYNC", "10", "1.0%", "|", "500", "55.6%"]


def test_wrong_labels_and_a_file_without_source_rows_get_an_error_not_a_traceback(tmp_path):
    f = tmp_path / "sass.csv"
    f.write_text(SOURCE)
    script = str(ROOT / "bench" / "ncu_source.py")
    out = subprocess.run([sys.executable, script, str(f), "--labels", "a,b,c"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip() == "error: 2 kernels in the file, 3 labels given"
    g = tmp_path / "details.csv"
    g.write_text('"ID","Kernel Name","Metric Name"\n"0","k","x"\n')
    out = subprocess.run([sys.executable, script, str(g)], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("error: no source-page rows")
    out = subprocess.run([sys.executable, script, str(tmp_path / "missing.csv")], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr

