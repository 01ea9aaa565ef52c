"""The GPUs whose measured tile choices differ from the heuristic's own (plan/config.py's ladders were
measured on an H200). A plan is made for one of these keys: None (an H200, and any GPU not listed here)
or H100. A call plans for the GPU it runs on; `epic plan` and `epic compile` for --gpu, else this
machine's (first) GPU; what is built to be shipped (`epic build` without a GPU, a bundle, the prebuild
scripts) for every key, so that a call on either finds its kernels built."""
from __future__ import annotations

import shutil
import subprocess

H100 = "h100"
KEYS = (None, H100)                               # every distinct heuristic
LABELS = {None: "an H200 or any other GPU", H100: "an H100 SXM"}
SPELLINGS = {"h200": None, "h100": H100}          # --gpu's values
# the CUDA names of the GPUs the H100 choices were measured on (bench/results/2026-12-06-h100-n4096-*.log,
# 2026-12-07-h100-n4096-coop.log): an H100 PCIe or NVL has other memory and SM counts, unmeasured
H100_NAMES = ("NVIDIA H100 80GB HBM3",)


def key(device_name: str | None) -> str | None:
    """The key of a GPU from its CUDA name (torch.cuda.get_device_name)."""
    return H100 if device_name in H100_NAMES else None


def local() -> tuple[bool, str | None]:
    """(whether this machine has a CUDA GPU, the key of its current one), as torch sees them."""
    import torch
    if not torch.cuda.is_available():
        return False, None
    return True, key(torch.cuda.get_device_name(torch.cuda.current_device()))


def local_without_torch() -> tuple[bool, str | None]:
    """The same, from the driver's nvidia-smi (its first GPU), for the front-end commands, which do not
    import torch (it takes seconds): (False, None) where nvidia-smi is missing, fails or hangs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False, None
    try:
        r = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False, None
    names = r.stdout.splitlines() if r.returncode == 0 else []
    return (True, key(names[0].strip())) if names else (False, None)


def build_keys() -> tuple:
    """The keys whose kernels a build on this machine makes: its GPU's, or every key without one."""
    present, here = local()
    return (here,) if present else KEYS
