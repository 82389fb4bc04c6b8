"""The same benchmarks on two checkouts, side by side: what a change that must not move a figure is checked with.

Each checkout runs its own ``bench/`` scripts with its own ``.venv`` (``make install`` in each), in turn (base,
this tree, base, this tree, ...), so a drift in the shared machine's speed falls on both. Three measures:

- ``import``: a fresh interpreter's ``python -c "import otel_agentloop"`` (``bench/import_time.py``), and
  whether it loaded numpy;
- ``fast_path``: ``bench/fast_path.py``'s per-call table (no step part), every row;
- ``step``: ``bench/step_overhead.py --path both``: the step wall, tracing off, fast and SDK path.

Run: .venv/bin/python bench/trees.py --base ../base [--runs 2] [--rounds 5] [--pairs 2] [--imports 15]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from import_time import import_wall

HERE = Path(__file__).resolve().parents[1]
_ROW = re.compile(r"^\| (?P<measure>[^|]+?) \| (?P<cells>.*) \|$")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")
_STEP = re.compile(r"(?:steps: off (?P<off>[\d.]+) s)|(?:path (?P<path>\w+) \(ran: [^)]*\): (?P<wall>[\d.]+) s)")


def _python(tree: Path) -> str:
    return str(tree / ".venv" / "bin" / "python")


def _run(tree: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    out = subprocess.run([_python(tree), *args], cwd=tree, env=env, capture_output=True, text=True, check=True)
    return out.stdout


def fast_path_rows(tree: Path, rounds: int) -> dict[str, list[float]]:
    """``bench/fast_path.py``'s table rows that hold numbers: measure -> the numbers of its cells, in order."""
    text = _run(tree, "bench/fast_path.py", "--rounds", str(rounds), "--step-pairs", "0")
    rows: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = _ROW.match(line)
        if not m or m["measure"].startswith(("measure", "---")):
            continue
        cells = m["cells"].split(" | ")[:3]
        numbers = [float(n.replace(",", "")) for c in cells for n in _NUMBER.findall(c.split("/")[0])[:1]]
        if len(numbers) == 3:
            rows[m["measure"].strip("* ")] = numbers
    return rows


def step_walls(tree: Path, pairs: int) -> dict[str, float]:
    """``bench/step_overhead.py --path both``: the median step wall (s) off, fast and SDK."""
    text = _run(tree, "bench/step_overhead.py", "--path", "both", "--pairs", str(pairs))
    walls: dict[str, float] = {}
    for m in _STEP.finditer(text):
        if m["off"]:
            walls["off"] = float(m["off"])
        else:
            walls[m["path"]] = float(m["wall"])
    return walls


def _median_rows(runs: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    return {k: [statistics.median(r[k][i] for r in runs if k in r) for i in range(3)] for k in runs[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (with its own .venv)")
    ap.add_argument("--runs", type=int, default=2, help="fast_path.py runs per tree")
    ap.add_argument("--rounds", type=int, default=5, help="fast_path.py rounds per run")
    ap.add_argument("--pairs", type=int, default=2, help="step_overhead.py pairs per tree (0: skip)")
    ap.add_argument("--imports", type=int, default=15, help="fresh imports per tree")
    args = ap.parse_args()
    trees = {"base": args.base.resolve(), "this": HERE}
    sha = {
        n: subprocess.run(
            ["git", "-C", str(t), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        for n, t in trees.items()
    }
    print(f"base {sha['base']} ({trees['base']}), this {sha['this']}; load {os.getloadavg()[0]:.1f}")

    imports: dict[str, list[float]] = {n: [] for n in trees}
    numpy: dict[str, bool] = {}
    for _ in range(args.imports):
        for n, t in trees.items():
            s, numpy[n] = import_wall(t)
            imports[n].append(s)
    print("\n| import otel_agentloop | base | this | this / base |\n|---|---|---|---|")
    b, a = statistics.median(imports["base"]), statistics.median(imports["this"])
    print(f"| wall, median of {args.imports} fresh interpreters | {b * 1e3:.0f} ms | {a * 1e3:.0f} ms | {a / b:.2f}x |")
    print(f"| numpy loaded | {numpy['base']} | {numpy['this']} | |")

    if args.runs:
        rows: dict[str, list[dict[str, list[float]]]] = {n: [] for n in trees}
        for _ in range(args.runs):
            for n, t in trees.items():
                rows[n].append(fast_path_rows(t, args.rounds))
        base, this = _median_rows(rows["base"]), _median_rows(rows["this"])
        print(f"\n`bench/fast_path.py --rounds {args.rounds} --step-pairs 0`, {args.runs} runs a tree in turn, median;")
        print("cells: sync / async / generator.\n\n| measure | base | this | this / base |\n|---|---|---|---|")
        for k, bv in base.items():
            av = this.get(k)
            if av is None or k.startswith("calls per round"):
                continue
            ratio = " / ".join(f"{x / y:.2f}x" if y else "-" for x, y in zip(av, bv, strict=True))
            print(f"| {k} | {' / '.join(f'{x:g}' for x in bv)} | {' / '.join(f'{x:g}' for x in av)} | {ratio} |")

    if args.pairs:
        runs: dict[str, list[dict[str, float]]] = {n: [] for n in trees}
        for _ in range(args.pairs):
            for n, t in trees.items():
                runs[n].append(step_walls(t, 1))
        walls = {n: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for n, rs in runs.items()}
        print(
            f"\n`bench/step_overhead.py --path both --pairs 1`, {args.pairs} runs a tree in turn, 1,024 samples a step:"
        )
        print("\n| step | base | this | this / base |\n|---|---|---|---|")
        for mode in ("off", "fast", "sdk"):
            bw, aw = walls["base"].get(mode), walls["this"].get(mode)
            if bw and aw:
                print(f"| {mode} | {bw:.3f} s | {aw:.3f} s | {aw / bw:.3f}x |")
        for n in trees:
            off = walls[n].get("off")
            if off:
                over = ", ".join(
                    f"{m} {(walls[n][m] - off) / off * 100:+.2f}%" for m in ("fast", "sdk") if m in walls[n]
                )
                print(f"\n{n}: overhead vs. off: {over}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
