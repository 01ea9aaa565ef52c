"""Tensor parallelism on 2 GPUs (the nvidia-h200-x2 machine; CI and one-GPU machines skip it):
tests/distributed_xent.py under torchrun, which asserts bit-identity with the single-GPU run."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from .conftest import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs 2 CUDA GPUs")]


def test_vocab_parallel_cross_entropy_is_bit_identical_to_one_gpu():
    torchrun = shutil.which("torchrun")
    cmd = [torchrun, "--nproc-per-node", "2"] if torchrun else [sys.executable, "-m", "torch.distributed.run",
                                                               "--nproc-per-node", "2"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(cmd + [str(ROOT / "tests" / "distributed_xent.py")], capture_output=True, text=True,
                       env=env, timeout=600, cwd=str(ROOT))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("bit-identical") == 6, r.stdout
