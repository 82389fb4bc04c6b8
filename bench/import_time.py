"""Wall time of ``python -c "import otel_agentloop"`` (median of N fresh interpreters) and whether that import
loads numpy. ``--vs PATH``: the same for the tree at PATH (e.g. a ``git worktree`` of the baseline), run in turn.

    python bench/import_time.py [-n 10] [--vs /tmp/base]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_PROBE = "import sys, otel_agentloop; print('numpy' in sys.modules)"


def import_wall(tree: Path) -> tuple[float, bool]:
    """One fresh interpreter importing the package of ``tree``: its wall time (s), and whether numpy came with it."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    cmd = [sys.executable, "-c", _PROBE]
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True)  # cwd: first on sys.path
    return time.perf_counter() - t0, out.stdout.strip() == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--vs", type=Path, help="another tree (a checkout's root) to time in turn")
    args = parser.parse_args()
    trees = [Path(__file__).resolve().parent.parent, *([args.vs.resolve()] if args.vs else [])]
    for tree in trees:
        import_wall(tree)  # warm the file cache
    walls: dict[Path, list[float]] = {tree: [] for tree in trees}
    numpy: dict[Path, bool] = {}
    for _ in range(args.n):
        for tree in trees:  # in turn: drift hits both alike
            wall, numpy[tree] = import_wall(tree)
            walls[tree].append(wall)
    for tree in trees:
        median_ms = statistics.median(walls[tree]) * 1e3
        print(f"{tree}: median {median_ms:.0f} ms over {args.n} runs, numpy loaded: {numpy[tree]}")


if __name__ == "__main__":
    main()
