"""The SDK path (``fast_path=False``) alone in a fresh process: per span, wall and training-thread CPU of the
calls, and process CPU until flushed; the median of rounds 2-4 of 20,000 phase calls in one sample, file export.
``--bench-queue``: ``bench/fast_path.py``'s export settings (queue 2^21, batch 512, delay 0.2 s) instead of the
defaults. Run it with each checkout's own venv, in turn, to compare two trees.

    .venv/bin/python bench/sdk_path.py [--bench-queue] [--path fast]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import otel_agentloop as oal

BENCH_QUEUE = {"max_queue_size": 1 << 21, "max_export_batch_size": 512, "schedule_delay_s": 0.2}


@oal.phase("tool_calls")
def tool() -> int:
    return 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-queue", action="store_true")
    ap.add_argument("--path", choices=("sdk", "fast"), default="sdk")
    ap.add_argument("--calls", type=int, default=20_000)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-sdk-")
    rows: list[tuple[float, float, float]] = []
    for r in range(4):
        path = os.path.join(tmp, f"t{r}.jsonl")
        extra = BENCH_QUEUE if args.bench_queue else {}
        h = oal.configure("bench-sdk", file=path, set_global=False, fast_path=args.path == "fast", **extra)
        p0, w0, t0 = time.process_time(), time.perf_counter(), time.thread_time()
        with oal.step(7), oal.sample(3):
            for _ in range(args.calls):
                tool()
        t1, w1 = time.thread_time(), time.perf_counter()
        h.force_flush(60)
        p1 = time.process_time()
        h.shutdown(5)
        os.remove(path)
        n = args.calls / 1e6
        rows.append(((w1 - w0) / n, (t1 - t0) / n, (p1 - p0) / n))
    os.rmdir(tmp)
    wall, thread, process = (statistics.median(r[i] for r in rows[1:]) for i in range(3))
    cpu = f"training-thread CPU {thread:.2f} us, process CPU {process:.2f} us"
    print(f"{args.path} path, per span: wall {wall:.2f} us, {cpu}")


if __name__ == "__main__":
    main()
