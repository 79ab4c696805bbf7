"""`contextspan bench levelling`: what levelling the user's audio costs per 80 ms frame, and where it brings it.

Per input level (speech-like noise: syllable-rate bursts with pauses): the time of `UserLeveller.process` per frame
(CPU time of the thread and its share of the 80 ms frame; wall time mean, P50, P99, max, whose tail on a busy host is
the scheduler's), and the loudness in and out once the gain has settled (after the first 4 s). The leveller runs on
the event loop once per frame per session.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import machine_info, percentile, save_json
from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE
from server.wire.leveller import UserLeveller, loudness_lufs

SETTLE_S = 4.0


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise in syllable-rate bursts with pauses: what the meter's gates see in speech, without a speech engine."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    x = rng.standard_normal(n) * np.clip(np.sin(2 * np.pi * 3.0 * np.arange(n) / SAMPLE_RATE), 0, None)
    return (x / np.sqrt(np.mean(x * x))).astype(np.float32)


def at_loudness(pcm: np.ndarray, lufs: float) -> np.ndarray:
    measured = loudness_lufs(pcm)
    assert measured is not None
    return (pcm * 10 ** ((lufs - measured) / 20)).astype(np.float32)


def measure(pcm: np.ndarray) -> dict[str, Any]:
    leveller = UserLeveller()
    frames = [pcm[i: i + FRAME_SAMPLES] for i in range(0, pcm.size - FRAME_SAMPLES + 1, FRAME_SAMPLES)]
    costs_us, out = [], []
    cpu_start = time.thread_time()
    for frame in frames:
        start = time.perf_counter()
        out.append(leveller.process(frame))
        costs_us.append((time.perf_counter() - start) * 1e6)
    cpu_us = (time.thread_time() - cpu_start) * 1e6 / len(frames)
    levelled = np.concatenate(out)
    settled = int(SETTLE_S * SAMPLE_RATE)
    return {
        "frames": len(frames),
        "mean_us": round(float(np.mean(costs_us)), 1), "p50_us": percentile(costs_us, 50),
        "p99_us": percentile(costs_us, 99), "max_us": round(float(np.max(costs_us)), 1),
        "cpu_us": round(cpu_us, 1), "frame_share_pct": round(cpu_us / (FRAME_S * 1e6) * 100, 4),
        "lufs_in": round(loudness_lufs(pcm[settled:]) or float("nan"), 2),
        "lufs_out": round(loudness_lufs(levelled[settled:]) or float("nan"), 2),
        "peak_out": round(float(np.max(np.abs(levelled))), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="-50,-36,-24,-12",
                        help="input loudness in LUFS, comma-separated (--levels=-40,-12)")
    parser.add_argument("--seconds", type=float, default=30.0, help="audio per level")
    parser.add_argument("--json", type=Path, help="write the result here (benchmarks/results/...)")
    args = parser.parse_args(argv)
    source = speech_like(args.seconds)
    rows = []
    print(f"{'in LUFS':>8} {'out LUFS':>9} {'peak':>6} {'cpu us':>7} {'mean us':>8} {'p50 us':>7} {'p99 us':>7} "
          f"{'max us':>8} {'% of frame':>10}")
    for level in (float(v) for v in args.levels.split(",")):
        row = {"target_in_lufs": level, **measure(at_loudness(source, level))}
        rows.append(row)
        print(f"{row['lufs_in']:>8} {row['lufs_out']:>9} {row['peak_out']:>6} {row['cpu_us']:>7} {row['mean_us']:>8} "
              f"{row['p50_us']:>7} {row['p99_us']:>7} {row['max_us']:>8} {row['frame_share_pct']:>10}")
    # The tail (P99, max) is the host's scheduling, not the leveller: the load average says how busy the host was.
    save_json(args.json, {"bench": "levelling", "machine": machine_info(), "load_average": os.getloadavg(),
                          "seconds": args.seconds, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
