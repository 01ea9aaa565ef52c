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
    env, (host, device, rest) = nvcc_split.steps(DRY)
    assert env == {"_NVVM_BRANCH_": "nvvm", "CICC_PATH": "/cuda/nvvm/bin"}     # quoted values are not taken
    assert [c.split()[0] for c in host] == ["gcc", "cudafe++"]
    assert [c.split()[0] for c in device] == ["gcc", '"$CICC_PATH/cicc"', "ptxas", "fatbinary", "rm"]
    assert [c.split()[0] for c in rest] == ["gcc", "g++"]


@pytest.mark.parametrize("change", [
    lambda d: d.replace("--gen_module_id_file ", ""),                      # cudafe++ does not write the id
    lambda d: d.replace('cicc" --c++17 --module_id_file_name "/t/x-4', 'cicc" --c++17 --module_id_file_name "/t/y-4'),
    lambda d: d.replace("#$ ptxas", "#$ ptxas-other"),                     # another order of steps
    lambda d: d.replace("-D__CUDA_ARCH__=900 ", ""),                       # the second preprocessing is not the device's
    lambda d: "\n".join(d.splitlines()[:8]),                               # too few steps
    lambda d: d.replace("#$ ", "## "),                                     # not a dry run at all
])
def test_a_dry_run_of_another_shape_means_plain_nvcc(change):
    assert nvcc_split.steps(change(DRY)) is None


def test_the_module_id_has_nvccs_format():
    mid = nvcc_split.module_id("/tmp/mk3/k.cu", "int x;\n")
    assert re.fullmatch(r"_3f1cb780_4_k_cu_[0-9a-f]{8}", mid), mid      # crc32 of the path, as nvcc writes it
    assert mid != nvcc_split.module_id("/tmp/mk3/k.cu", "int y;\n")


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
