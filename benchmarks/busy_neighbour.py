"""A busy neighbour: float32 matrix products on N torch threads for S seconds, to time something
else (the test suite) on a machine shared with a job that keeps its cores busy.

    python benchmarks/busy_neighbour.py --threads 2 --seconds 1500 &
    time make test
    kill %1

It prints, when it ends, how many products it ran per second: run it once alone to see what the
neighbour gets from the machine, and compare.
"""

from __future__ import annotations

import argparse
import time

import torch


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--seconds", type=float, default=1500.0, help="how long (default 1500)")
    p.add_argument("--size", type=int, default=1024, help="matrix side (default 1024)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.seconds <= 0 or args.size < 1:
        p.error("--threads and --size must be ≥ 1 and --seconds positive")
    torch.set_num_threads(args.threads)
    a = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    done = 0
    while time.perf_counter() - start < args.seconds:
        a = (a @ a).clamp_(-1, 1)
        done += 1
    rate = done / (time.perf_counter() - start)
    print(f"{done} products of {args.size}² in {args.seconds:g} s on {args.threads} thread(s): "
          f"{rate:.1f}/s", flush=True)
    return rate


if __name__ == "__main__":
    main()
