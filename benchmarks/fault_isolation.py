"""`contextspan bench faults`: do faults cost the sessions that keep running any deadlines?

For each scenario a real server (tiny profile, its own process) serves two real-time clients streaming a spoken
question with `<ret>` forced after it: no fault (the LLM answers; run first and last, to bracket the host's noise),
the LLM hanging, answering HTTP 500 or garbage (a fake that speaks the OpenAI wire format), Whisper raising on
every call, one session's step raising at frame 20 before the batched step, and one session's row raising, or
turning NaN, inside the batched step's transformer forward from frame 20 on (the other session's row is in the
same forward: BatchEngine undoes the step, finds the row and steps the other again). It reports, for the sessions
that were not closed, frame latency and deadline misses next to what the fault did (spans dropped and why,
`asr_failed` errors, sessions closed 1011), so the cost of a fault is the difference from the no-fault rows of the
same run.

The fakes live beside it (benchmarks/fakes/: the OpenAI-compatible LLM, the faulty server), shared with the tests, so it
runs from an installed package as from a checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fakes.fake_openai import fake_openai
from benchmarks.harness import StreamResult, speak, start_server, stop_server, stream
from benchmarks.load_test import CONNECT_S, JOIN_FRAMES
from benchmarks.report import latency_summary, machine_info, save_json
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE

QUESTION = "What is the weather like in Paris today?"


@dataclass(frozen=True)
class Scenario:
    name: str
    faults: str = ""  # FAULTS for benchmarks.fakes.faulty_server
    llm: str | None = None  # the fake LLM's mode (`content` answers); None: no LLM, the built-in router alone


SCENARIOS = [
    Scenario("no fault", llm="content"),
    Scenario("LLM hangs", llm="hang"),
    Scenario("LLM HTTP 500", llm="error500"),
    Scenario("LLM garbage", llm="garbage"),
    Scenario("ASR raises", faults="asr_raise"),
    Scenario("step raises in one session", faults="step_raise@20"),
    Scenario("forward raises in one row", faults="forward_raise@20"),
    Scenario("NaN in one row", faults="forward_nan@20"),
    Scenario("no fault (again)", llm="content"),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="contextspan bench faults", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each client's stream")
    parser.add_argument("--scenarios", type=lambda s: s.split(","), default=[s.name for s in SCENARIOS],
                        help="comma-separated names, default: all of " + ", ".join(s.name for s in SCENARIOS))
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    unknown = set(args.scenarios) - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    return args


def question_pcm(workdir: Path, seconds: float) -> tuple[np.ndarray, int]:
    """The question, then silence up to `seconds`; `<ret>` 2 s after the question, when Whisper has had time to
    finish it on a slow machine, so that the backend (and its fault) is reached well inside the span deadline."""
    speech = speak(QUESTION, workdir / "question.wav")
    frames = int(seconds * SAMPLE_RATE / FRAME_SAMPLES)
    pcm = np.zeros(frames * FRAME_SAMPLES, np.float32)
    pcm[: min(len(speech), len(pcm))] = speech[: len(pcm)]
    return pcm, min(len(speech) // FRAME_SAMPLES + 25, frames - 1)


async def two_clients(ws: str, pcm: np.ndarray) -> list[StreamResult]:
    """Both connect, then stream on a schedule: the second 13 frames (1.04 s) after the first, so their frames
    end at the same moment and the two questions do not reach the one Whisper process at once."""
    url = chat_url(ws, events=True)
    start = time.perf_counter() + CONNECT_S
    second = start + JOIN_FRAMES * FRAME_SAMPLES / SAMPLE_RATE
    return list(await asyncio.gather(stream(url, pcm, start_at=start, every_stats=True),
                                     stream(url, pcm, start_at=second, every_stats=True)))


def run_scenario(scenario: Scenario, workdir: Path, pcm: np.ndarray, ret_frame: int) -> dict[str, Any]:
    # Both sessions and their spans whatever this host's calibration says: the faults are what is measured.
    flags = ["--profile", "tiny", "--max-sessions", "2", "--admission", "fixed", "--span-cap", "fixed",
             "--force-ret-frame", str(ret_frame),
             "--recordings-dir", str(workdir / "recordings"), "--log-level", "warning"]
    module = "benchmarks.fakes.faulty_server" if scenario.faults else "server.cli"
    with fake_openai() as (llm_url, script):
        if scenario.llm is not None:
            script.mode = scenario.llm
            flags += ["--llm-base-url", llm_url, "--llm-model", "fake"]
        process, url = start_server(workdir, *flags, module=module, env={"FAULTS": scenario.faults})
        try:
            results = asyncio.run(two_clients(url.replace("http", "ws", 1), pcm))
        finally:
            stop_server(process)
    kept = [r for r in results if r.close_code in (None, 1000)]
    latencies = np.array([ms for r in kept for s in r.of_type("stats") for ms in s.latency_ms])
    every = [e for r in results for e in r.events]
    return {
        "scenario": scenario.name,
        "sessions_kept": len(kept),
        "sessions_closed_1011": sum(r.close_code == 1011 for r in results),
        "frames": int(latencies.size),
        "latency_ms": latency_summary(latencies),
        "deadline_misses": sum(s.deadline_misses for r in kept for s in r.of_type("stats")),
        "spans_injected": sum(e.type == "span.injected" for e in every),
        "spans_dropped": dict(Counter(e.reason for e in every if e.type == "span.dropped")),
        "errors": dict(Counter(e.code for e in every if e.type == "error")),
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    print(f"{'scenario':<28} | kept | frames | P50 (ms) | P99 (ms) | misses | what the fault did")
    with tempfile.TemporaryDirectory(prefix="contextspan-faults-") as tmp:
        pcm, ret_frame = question_pcm(Path(tmp), args.seconds)
        for scenario in (s for s in SCENARIOS if s.name in args.scenarios):
            row = run_scenario(scenario, Path(tmp), pcm, ret_frame)
            rows.append(row)
            effects = ", ".join([f"{row['spans_injected']} injected"] * bool(row["spans_injected"])
                                + [f"{n} dropped: {why}" for why, n in row["spans_dropped"].items()]
                                + [f"{n} {code}" for code, n in row["errors"].items()]
                                + [f"{row['sessions_closed_1011']} closed 1011"] * bool(row["sessions_closed_1011"]))
            lat = row["latency_ms"]
            print(f"{row['scenario']:<28} | {row['sessions_kept']:>4} | {row['frames']:>6} | {lat['p50']:>8} | "
                  f"{lat['p99']:>8} | {row['deadline_misses']:>6} | {effects or '-'}", flush=True)
    save_json(args.json, {"benchmark": "faults", "profile": "tiny", "seconds": args.seconds,
                          "machine": machine_info(), "rows": rows})
    return 0
