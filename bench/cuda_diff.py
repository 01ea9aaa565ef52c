"""The generated CUDA of every sample and tests/programs/*.epi at M=64 and M=8192, written one .cu per
kernel, to compare two trees: python bench/cuda_diff.py TREE OUTDIR (then cmp the two OUTDIRs)."""
import sys, os, glob, hashlib
root = sys.argv[1]; out = sys.argv[2]
sys.path.insert(0, root)
os.chdir(root)
import epic
from epic.codegen import emit
os.makedirs(out, exist_ok=True)
for f in sorted(glob.glob("samples/*.epi") + glob.glob("tests/programs/*.epi")):
    try:
        prog = epic.compile(f)
        for m in (64, 8192):
            configs = emit.kernel_configs(prog.program, m)
            for _, u in emit.units(prog.program, configs):
                name = f.replace("/", "_") + f".{m}.{u.name}.cu"
                open(os.path.join(out, name), "w").write(u.source)
    except Exception as e:
        print("skip", f, type(e).__name__, str(e)[:80])
