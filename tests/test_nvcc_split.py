"""nvcc's host and device halves run concurrently (epic/runtime/nvcc_split.py): the dry run is read
only when it has the expected shape, and given nvcc's own module id the library is nvcc's, byte for
byte, in its code and device code."""
import re
import shutil
import subprocess

import pytest

from epic import pipeline
from epic.codegen import emit
from epic.runtime import build, nvcc_split

from .conftest import ROOT

DRY = """#$ _NVVM_BRANCH_=nvvm
#$ CICC_PATH=/cuda/nvvm/bin
#$ INCLUDES="-I/cuda/include"
#$ gcc -std=c++17 -E -x c++ -D__CUDACC__ k.cu -o "/t/x-5_k.cpp4.ii"
#$ cudafe++ --c++17 --gen_c_file_name "/t/x-6_k.cudafe1.cpp" --gen_module_id_file --module_id_file_name "/t/x-4_k.module_id" "/t/x-5_k.cpp4.ii"
#$ gcc -std=c++17 -D__CUDA_ARCH__=900 -E -x c++ k.cu -o "/t/x-9_k.cpp1.ii"
#$ "$CICC_PATH/cicc" --c++17 --module_id_file_name "/t/x-4_k.module_id" "/t/x-9_k.cpp1.ii" -o "/t/x-6_k.ptx"
#$ ptxas -arch=sm_90a -m64 "/t/x-6_k.ptx" -o "/t/x-10_k.cubin"
#$ fatbinary -64 "--image3=kind=elf,sm=90a,file=/t/x-10_k.cubin" --embedded-fatbin="/t/x-3_k.fatbin.c"
#$ rm /t/x-3_k.fatbin
#$ gcc -std=c++17 -c -x c++ "/t/x-6_k.cudafe1.cpp" -o "/t/x-11_k.o"
#$ g++ -shared "/t/x-11_k.o" -o "k.so"
"""


def test_the_dry_run_is_split_into_host_half_device_half_and_the_rest():
    env, (host, device, rest) = nvcc_split.steps(DRY.replace("#$ ptxas", "a line of nvcc's own\n#$ ptxas"))
    assert env == {"_NVVM_BRANCH_": "nvvm", "CICC_PATH": "/cuda/nvvm/bin"}     # quoted values are not taken
    assert [c.split()[0] for c in host] == ["gcc", "cudafe++"]
    assert [c.split()[0] for c in device] == ["gcc", '"$CICC_PATH/cicc"', "ptxas", "fatbinary", "rm"]
    assert [c.split()[0] for c in rest] == ["gcc", "g++"]
    _, (_, _, rest) = nvcc_split.steps(DRY.replace('#$ g++ -shared "/t/x-11_k.o" -o "k.so"\n', ""))
    assert [c.split()[0] for c in rest] == ["gcc"]                       # 8 steps: the least there can be


@pytest.mark.parametrize("change", [
    lambda d: d.replace("--gen_module_id_file ", ""),                      # cudafe++ does not write the id
    lambda d: d.replace('cicc" --c++17 --module_id_file_name "/t/x-4', 'cicc" --c++17 --module_id_file_name "/t/y-4'),
    lambda d: d.replace("#$ ptxas", "#$ ptxas-other"),                     # another order of steps
    lambda d: d.replace("-D__CUDA_ARCH__=900 ", ""),                       # the second preprocessing is not the device's
    lambda d: "\n".join(d.splitlines()[:8]),                               # too few steps
    lambda d: d.replace("#$ ", "## "),                                     # not a dry run at all
    lambda d: d.replace('cicc" --c++17 --module_id_file_name "/t/x-4_k.module_id"', 'cicc" --c++17'),  # no id read
    lambda d: d.replace('$CICC_PATH/cicc"', '$CICC_PATH/nvvm-other"'),     # not cicc
    lambda d: d.replace('#$ g++ -shared "/t/x-11_k.o" -o "k.so"\n', "").replace(
        '#$ gcc -std=c++17 -c -x c++ "/t/x-6_k.cudafe1.cpp" -o "/t/x-11_k.o"\n', ""),   # 7 steps: no rest
])
def test_a_dry_run_of_another_shape_means_plain_nvcc(change):
    assert nvcc_split.steps(change(DRY)) is None


def test_the_module_id_has_nvccs_format():
    mid = nvcc_split.module_id("/tmp/mk3/k.cu", "int x;\n")
    assert re.fullmatch(r"_3f1cb780_4_k_cu_[0-9a-f]{8}", mid), mid      # crc32 of the path, as nvcc writes it
    assert mid != nvcc_split.module_id("/tmp/mk3/k.cu", "int y;\n")
    assert nvcc_split.module_id("/t/Kernel-1.cu", "").split("_")[3:6] == ["Kernel", "1", "cu"]


@pytest.mark.nvcc
def test_with_nvccs_module_id_the_library_is_nvccs(tmp_path):
    """A combine kernel (seconds to build) both ways: the code and device code sections are equal."""
    if not shutil.which("nvcc") or not shutil.which("objcopy"):
        pytest.skip("nvcc or objcopy not installed")
    prog = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    unit = [u for _, u in emit.units(prog, emit.kernel_configs(prog, 64))][1]
    src = tmp_path / "k.cu"
    src.write_text(unit.source)
    exe = build.nvcc_path()
    keep = tmp_path / "keep"
    keep.mkdir()
    flags = build.flags_for(unit)
    plain = subprocess.run([exe, *flags, str(src), "-o", str(tmp_path / "plain.so"), "-keep", "-keep-dir", str(keep)],
                           capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr
    the_id = next(keep.glob("*.module_id")).read_text()
    tmp = tmp_path / "t"
    tmp.mkdir()
    env = dict(build.os.environ, TMPDIR=str(tmp))
    r = nvcc_split.build([exe, *flags, str(src), "-o", str(tmp_path / "split.so")], env, 300, build._run,
                           str(src), unit.source, the_id)
    assert r is not None and r.returncode == 0, r and r.stderr
    for section in (".text", ".nv_fatbin", ".rodata", ".data"):
        a, b = (tmp_path / f"{n}{section}" for n in ("plain", "split"))
        for lib, out in ((tmp_path / "plain.so", a), (tmp_path / "split.so", b)):
            subprocess.run(["objcopy", "-O", "binary", f"--only-section={section}", str(lib), str(out)], check=True)
        assert a.read_bytes() == b.read_bytes(), section
    exported = [subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / f"{n}.so")], capture_output=True,
                               text=True).stdout for n in ("plain", "split")]
    assert exported[0] == exported[1] and "epic_launch" in exported[0]
    # (the files differ only in the names of nvcc's temporaries, which -keep leaves unprefixed)


@pytest.mark.nvcc
def test_a_lone_build_runs_the_halves_in_parallel_and_loads(tmp_path, monkeypatch):
    """build_all with a core free per build takes the split path (build.txt says so); the library
    passes the cache's checks and loads; with EPIC_NVCC_SPLIT=0 it is plain nvcc."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    from dataclasses import replace
    from epic.runtime import loader
    prog = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi")).program
    spec, unit = emit.units(prog, emit.kernel_configs(prog, 64))[1]
    unit = replace(unit, uses_cutlass=True)          # a combine kernel: seconds, not a minute
    monkeypatch.setattr(build.os, "cpu_count", lambda: 2)
    for setting, how in (("1", "host and device halves in parallel"), ("0", "plain nvcc")):
        monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / setting))
        monkeypatch.setenv("EPIC_NVCC_SPLIT", setting)
        path = build.build_all([unit], jobs=1, quiet=True)[0]
        assert how in (path.parent / "build.txt").read_text()
        assert loader.load(path, [f"{p.role}:{p.tensor}" for p in spec.pointers]).info["kernel"] == spec.name


@pytest.mark.parametrize("cpus, units, split", [
    (2, [True, False], True),           # one CUTLASS kernel and a combine kernel on 2 cores (./dev.sh setup)
    (2, [True, True, False], False),    # two CUTLASS kernels on 2 cores: both cores busy already
    (16, [True] * 40, False),           # the device machine's prebuild
    (16, [True] * 5, True),
    (1, [True], False),
])
def test_builds_split_only_where_a_core_is_free(monkeypatch, tmp_path, cpus, units, split):
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(build, "default_jobs", lambda n: min(n, cpus))
    seen = []
    monkeypatch.setattr(build, "build_one", lambda unit, s: seen.append(s) or tmp_path / unit.name)
    build.build_all([build.Unit(f"k{i}", f"// {i}\n", heavy) for i, heavy in enumerate(units)], quiet=True)
    assert set(seen) == {split}


SPLIT_FAILS = r"""#!{python}
import os, sys
if "--version" in sys.argv:
    print("Cuda compilation tools, release 13.0, V13.0.88"); sys.exit(0)
tmp = os.environ["TMPDIR"]
if "-dryrun" in sys.argv:     # the expected shape; the tools are stubs, FAKE_FAIL says which step fails
    steps = ["stub -E host" + (" || (echo 'Stages set to value 2 or more' >&2; exit 1)"
                               if os.environ.get("FAKE_STAGES") else ""),
             f'cudafe++ --gen_module_id_file --module_id_file_name "{{tmp}}/m.id" x.ii',
             "stub -D__CUDA_ARCH__=900 -E device",
             f'"$CICC_PATH/cicc" --module_id_file_name "{{tmp}}/m.id" x', "ptxas x", "fatbinary x", "rm x",
             "stub -c rest", "stub link"]
    env = [f"PATH={{os.environ['FAKE_BIN']}}:/usr/bin:/bin", f"CICC_PATH={{os.environ['FAKE_BIN']}}"]
    print("\n".join("#$ " + s for s in env + steps), file=sys.stderr)
    sys.exit(0)
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write("plain\n")
out = sys.argv[sys.argv.index("-o") + 1]
open(out, "wb").write(open(os.environ["FAKE_SO"], "rb").read())
"""
# the tools a fake dry run calls: each fails where FAKE_FAIL names its step
STUBS = {"stub": 'case "$*" in *host*|*device*) [ "$FAKE_FAIL" != halves ];; *rest*) [ "$FAKE_FAIL" != rest ];; esac',
         "cudafe++": "true", "cicc": '[ "$FAKE_FAIL" != device ]', "ptxas": "true", "fatbinary": "true"}


def fake_split_nvcc(tmp_path, monkeypatch, fail: str):
    """SPLIT_FAILS as EPIC_NVCC, its stub tools, a library for its plain run; returns its call log."""
    import stat
    import sys
    from .test_cache import tiny_elf
    exe = tmp_path / "nvcc"
    exe.write_text(SPLIT_FAILS.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "fake.so").write_bytes(tiny_elf())
    log = tmp_path / "log"
    log.write_text("")
    for k, v in {"EPIC_NVCC": str(exe), "FAKE_SO": str(tmp_path / "fake.so"), "FAKE_LOG": str(log),
                 "EPIC_CACHE_DIR": str(tmp_path / "cache"), "FAKE_BIN": str(bin_dir), "FAKE_FAIL": fail}.items():
        monkeypatch.setenv(k, v)
    build.nvcc_version.cache_clear()
    monkeypatch.setattr(build.os, "cpu_count", lambda: 2)
    return log


@pytest.mark.parametrize("fail", ["halves", "device", "rest"])
def test_a_failed_split_build_is_redone_by_plain_nvcc(tmp_path, monkeypatch, fail):
    """Whatever fails in a split build (both halves, one of them, or the last steps), plain nvcc builds
    it (and its log would be the one reported)."""
    log = fake_split_nvcc(tmp_path, monkeypatch, fail)
    path = build.build_all([build.Unit("k", "// a kernel\n")], jobs=1, quiet=True)[0]
    assert "plain nvcc" in (path.parent / "build.txt").read_text() and log.read_text() == "plain\n"
    monkeypatch.setenv("FAKE_FAIL", "halves")
    monkeypatch.setenv("FAKE_STAGES", "1")       # but a shared-memory refusal (E217) is not built twice
    with pytest.raises(build.EpicError) as info:
        build.build_all([build.Unit("k2", "// another kernel\n")], jobs=1, quiet=True)
    assert info.value.codes == ["E217"] and log.read_text() == "plain\n"


def test_with_every_step_passing_the_split_build_is_used(tmp_path, monkeypatch):
    """The control for the test above: the stubs pass, so the split build's (empty) output stands, and
    the cache refuses it (E705: not a library), with plain nvcc never called."""
    log = fake_split_nvcc(tmp_path, monkeypatch, "none")
    with pytest.raises(build.EpicError) as info:
        build.build_all([build.Unit("k", "// a kernel\n")], jobs=1, quiet=True)
    assert info.value.codes == ["E705"] and log.read_text() == ""


@pytest.mark.nvcc
def test_both_halves_use_the_module_id_epic_writes(tmp_path):
    """An internal-linkage device variable is named after the module id on both sides: the host's
    registration and the device code must carry the same one (epic's, not one cudafe++ generates)."""
    if not shutil.which("nvcc") or not shutil.which("objcopy"):
        pytest.skip("nvcc or objcopy not installed")
    source = ("namespace { __device__ int counter; }\n"
              "__global__ void k(int* p) { *p = counter; }\n"
              'extern "C" void launch(int* p) { k<<<1, 1>>>(p); }\n')
    src = tmp_path / "k.cu"
    src.write_text(source)
    tmp = tmp_path / "t"
    tmp.mkdir()
    exe = build.nvcc_path()
    cmd = [exe, *build.BASE_FLAGS, str(src), "-o", str(tmp_path / "k.so")]
    r = nvcc_split.build(cmd, dict(build.os.environ, TMPDIR=str(tmp)), 300, build._run, str(src), source)
    assert r is not None and r.returncode == 0, r and r.stderr
    the_id = nvcc_split.module_id(str(src), source)[1:]          # mangled names drop the leading "_"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(tmp_path / "k.so"),
                    str(tmp_path / "fb")], check=True)
    assert the_id.encode() in (tmp_path / "fb").read_bytes()      # the device code
    host = (tmp_path / "k.so").read_bytes().replace((tmp_path / "fb").read_bytes(), b"")
    assert the_id.encode() in host                                # the host's registration
