"""What a call costs on this host before epic does anything: torch's own host time for an
allocation and for small element-wise launches, and the compiled launcher's run() with nothing to
launch (matching the signature; matching and allocating one buffer). Timed like bench/host_path.py.

  python bench/host_baseline.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from host_path import host_us  # noqa: E402
from epic.runtime import fastcall  # noqa: E402


def main() -> None:
    x = torch.zeros(64, 4096, device="cuda", dtype=torch.bfloat16)
    bf = torch.empty(0, dtype=torch.bfloat16)
    print(f"torch.empty [64, 4096] bf16     {host_us(lambda: torch.empty((64, 4096), dtype=torch.bfloat16, device='cuda'), 100):6.1f} us")
    print(f"x.zero_()                       {host_us(lambda: x.zero_(), 100):6.1f} us")
    print(f"x + x                           {host_us(lambda: x + x, 100):6.1f} us")
    module = fastcall._module()
    if module is None:
        print(f"no compiled launcher: {fastcall.why_not()}")
        return
    idle = module.Launcher()
    print(f"launcher run(), no plan          {host_us(lambda: idle.run([x], [], 0, False), 100):6.1f} us")
    match = module.Launcher()
    match.add(1, x.get_device(), [bf], [[64, 4096]], [[4096, 1]], [], [], [], [], [], [], [], [], [0], [0])
    print(f"launcher run(), match only       {host_us(lambda: match.run([x], [], 0, False), 100):6.1f} us")
    alloc = module.Launcher()
    alloc.add(1, x.get_device(), [bf], [[64, 4096]], [[4096, 1]], [bf], [[64, 4096]], [], [], [], [], [], [], [1], [1])
    print(f"launcher run(), match + 1 buffer {host_us(lambda: alloc.run([x], [], 0, False), 100):6.1f} us")


if __name__ == "__main__":
    main()
