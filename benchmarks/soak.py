"""`contextspan bench soak`: clients connecting, streaming and hanging up for many minutes against one server.

Leaks and drift (RSS growth, latency creeping up, a slot or a retrieval left behind by a client that hung up) only
show after hundreds of sessions. Each client streams espeak-ng speech holding a question in real time, hangs up at a
seeded random point (some right after `<ret>`, before its span lands) and reconnects at once; the server forces
`<ret>` once per session, so spans are injected, dropped and abandoned all through the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from benchmarks.harness import StreamResult, speak, start_server, stop_server, stream
from benchmarks.report import machine_info, percentile, save_json
from contextspan_client import SessionClosed, chat_url
from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE
from server.wire.protocol import CLOSE_NORMAL, CLOSE_TRY_AGAIN

QUESTION = "What is twelve times seven?"
CLOSING = ("Thank you. This was a soak test of the real time voice agent server, and that is all I wanted to know "
           "for now. Goodbye.")
MIN_FRAMES = 12  # the shortest session, about a second
PROFILE = "tiny"
DEFAULT_OUT = Path(__file__).parent / "results" / f"soak-{PROFILE}-cpu.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="contextspan bench soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sessions", type=int, default=3, help="clients cycling at once (= the server's slots)")
    parser.add_argument("--asr", action=argparse.BooleanOptionalAction, default=True,
                        help="run the server's speech recognition (its default)")
    parser.add_argument("--force-ret-frame", type=int, default=None,
                        help="frame of each session at which the server acts as <ret>; default 1.6 s after the "
                        "question")
    parser.add_argument("--seed", type=int, default=0, help="seeds where each client hangs up")
    parser.add_argument("--sample-s", type=float, default=10.0, help="server RSS sampling period")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def speech(workdir: Path) -> tuple[np.ndarray, int]:
    """The question (the session's only final utterance at `<ret>`, so the built-in router answers it), 3 s of
    silence for the answer and a closing remark; and the frame 1.6 s after the question, by when it is final."""
    pause = np.zeros(SAMPLE_RATE, np.float32)
    question = np.concatenate([pause[: SAMPLE_RATE * 3 // 10], speak(QUESTION, workdir / "q.wav")])
    pcm = np.concatenate([question, pause, pause, pause, speak(CLOSING, workdir / "c.wav"), pause])
    return pcm, len(question) // FRAME_SAMPLES + 20


def session_frames(rng: random.Random, total: int, ret_frame: int) -> int:
    """Half the sessions run to the end, a quarter hang up anywhere, a quarter within 4 frames of `<ret>`: while
    the answer is fetched or waits for a frame boundary that never comes."""
    roll = rng.random()
    if roll < 0.5:
        return total
    if roll < 0.75:
        return rng.randint(MIN_FRAMES, total)
    return min(total, ret_frame + rng.randint(1, 4))


@dataclass
class Minute:
    sessions: int = 0  # completed with a normal close
    latencies_ms: list[float] = field(default_factory=list)
    deadline_misses: int = 0
    retrievals: int = 0
    spans_injected: int = 0
    spans_dropped: int = 0
    unresolved: int = 0  # sessions that ended with a `<ret>` neither injected nor dropped
    refused: int = 0  # connects refused with 1013 (try again), mostly the slot the client just left not yet free
    error_events: int = 0
    closes: Counter[int] = field(default_factory=Counter)  # close codes other than normal
    exceptions: Counter[str] = field(default_factory=Counter)
    rss_mb: float | None = None  # the server process at the minute's last sample

    def row(self, index: int) -> dict[str, Any]:
        return {
            "minute": index + 1, "sessions": self.sessions, "frames": len(self.latencies_ms),
            "deadline_misses": self.deadline_misses, "latency_p50_ms": percentile(self.latencies_ms, 50),
            "latency_p99_ms": percentile(self.latencies_ms, 99), "retrievals": self.retrievals,
            "spans_injected": self.spans_injected, "spans_dropped": self.spans_dropped,
            "retrievals_unresolved": self.unresolved, "refused": self.refused, "error_events": self.error_events,
            "abnormal_closes": dict(self.closes), "client_exceptions": dict(self.exceptions), "rss_mb": self.rss_mb,
        }


class Soak:
    """Tallies events by the minute of the run they happened in; a session's outcome goes to the minute it ended."""

    def __init__(self, minutes: float) -> None:
        self.start = time.monotonic()
        self.minutes = [Minute() for _ in range(math.ceil(minutes))]
        self.rss: list[dict[str, float]] = []
        self.failures: list[dict[str, Any]] = []
        self.frames_sent = 0  # by sessions that ended normally; the stats of their last second may be missing
        self.server_exit: int | None = None
        self.after: dict[str, Any] = {}

    def minute(self, at: float) -> Minute:
        return self.minutes[min(int((at - self.start) // 60), len(self.minutes) - 1)]

    def record(self, result: StreamResult, started: float) -> None:
        stream_start = started + (result.handshake_s or 0.0)
        outcomes = 0
        for event in result.events:
            row = self.minute(stream_start + event.t)
            if event.type == "stats":
                row.latencies_ms += event.latency_ms
                row.deadline_misses += event.deadline_misses
            elif event.type == "retrieval":
                row.retrievals += 1
            elif event.type == "span.injected":
                row.spans_injected += 1
                outcomes += 1
            elif event.type == "span.dropped":
                row.spans_dropped += 1
                outcomes += 1
            elif event.type == "error":
                row.error_events += 1
        row = self.minute(time.monotonic())
        row.unresolved += int(len(result.of_type("retrieval")) > outcomes)
        if result.close_code == CLOSE_NORMAL:
            row.sessions += 1
            self.frames_sent += result.frames_sent
        else:
            self.fail(row.closes, result.close_code or 1006, f"close {result.close_code} {result.close_reason}")

    def fail(self, counter: Counter[Any], key: Any, what: str) -> None:
        elapsed = time.monotonic() - self.start
        counter[key] += 1
        self.failures.append({"t_s": round(elapsed, 1), "what": what})
        print(f"[{elapsed:7.1f} s] client failure: {what}", file=sys.stderr)

    async def client(self, ws_url: str, pcm: np.ndarray, ret_frame: int, rng: random.Random, stop_at: float) -> None:
        total = len(pcm) // FRAME_SAMPLES
        while (left := int((stop_at - time.monotonic()) / FRAME_S)) >= MIN_FRAMES:
            frames = min(session_frames(rng, total, ret_frame), left)
            started = time.monotonic()
            try:
                result = await stream(chat_url(ws_url, events=True), pcm[: frames * FRAME_SAMPLES],
                                      tail_s=rng.uniform(0.0, 0.6))
            except SessionClosed as exc:  # before the handshake
                code = exc.code
                if code == CLOSE_TRY_AGAIN:
                    self.minute(time.monotonic()).refused += 1
                    await asyncio.sleep(0.2)
                    continue
                self.fail(self.minute(time.monotonic()).closes, code, f"close {code} {exc}")
                await asyncio.sleep(1.0)
            except Exception as exc:
                self.fail(self.minute(time.monotonic()).exceptions, type(exc).__name__, repr(exc))
                await asyncio.sleep(1.0)  # no busy loop against a server that is gone
            else:
                self.record(result, started)

    def sample(self, proc: psutil.Process) -> None:
        now = time.monotonic()
        children = 0
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):  # an ASR process being replaced
                children += child.memory_info().rss
        server_mb = round(proc.memory_info().rss / 2**20, 1)
        self.rss.append({"t_s": round(now - self.start, 1), "server_mb": server_mb,
                         "children_mb": round(children / 2**20, 1)})
        self.minute(now).rss_mb = server_mb

    async def watch(self, process: subprocess.Popen[bytes], period_s: float) -> None:
        """Samples RSS, prints progress each minute, and returns within a second if the server exits."""
        proc = psutil.Process(process.pid)
        shown, next_sample = 0, time.monotonic()
        while process.poll() is None:
            if time.monotonic() >= next_sample:
                next_sample += period_s
                with contextlib.suppress(psutil.NoSuchProcess):  # exited since the poll: the loop ends
                    self.sample(proc)
            done = int((time.monotonic() - self.start) // 60)
            if done > shown:
                shown = done
                print(f"{done} min: {sum(m.sessions for m in self.minutes)} sessions, {len(self.failures)} "
                      f"failures, server RSS {self.rss[-1]['server_mb']} MB", file=sys.stderr)
            await asyncio.sleep(1.0)
        self.server_exit = process.returncode
        print(f"server exited with {process.returncode}: stopping", file=sys.stderr)

    async def run(self, args: argparse.Namespace, url: str, process: subprocess.Popen[bytes], pcm: np.ndarray,
                  ret_frame: int) -> None:
        stop_at = self.start + args.minutes * 60
        ws_url = url.replace("http", "ws", 1)
        clients = asyncio.gather(*[self.client(ws_url, pcm, ret_frame, random.Random(f"{args.seed}/{i}"), stop_at)
                                   for i in range(args.sessions)])
        watcher = asyncio.create_task(self.watch(process, args.sample_s))
        try:
            await asyncio.wait([clients, watcher], return_when=asyncio.FIRST_COMPLETED)
        finally:  # also on Ctrl-C
            for task in (clients, watcher):
                task.cancel()
            await asyncio.gather(clients, watcher, return_exceptions=True)
        if self.server_exit is None:
            self.sample(psutil.Process(process.pid))
            await asyncio.sleep(1.0)  # the server frees the last slots after the clients' close handshakes
            try:
                async with httpx.AsyncClient() as http:
                    info = (await http.get(f"{url}/api/info", timeout=5)).json()
            except httpx.HTTPError as exc:
                self.after = {"error": repr(exc)}
                return
            self.after = {"sessions_open": info["sessions"], "free_slots": info["free_slots"],
                          "max_sessions": info["max_sessions"]}


def rss_summary(values: list[float]) -> dict[str, float]:
    return {"start": values[0], "end": values[-1], "max": max(values), "growth": round(values[-1] - values[0], 1)}


def rss_trend(samples: list[dict[str, float]], key: str = "server_mb") -> dict[str, float] | None:
    """Whether memory still climbs once warm: the least-squares slope over the run's second half (MB per minute)
    and that half's maximum against the first half's (a sawtooth whose peaks rise is growth too)."""
    half = samples[-1]["t_s"] / 2 if samples else 0.0
    first = [s[key] for s in samples if s["t_s"] <= half]
    later = [(s["t_s"] / 60, s[key]) for s in samples if s["t_s"] > half]
    if len(later) < 2 or not first:
        return None
    slope = float(np.polyfit([t for t, _ in later], [v for _, v in later], 1)[0])
    first_max, later_max = max(first), max(v for _, v in later)
    return {"half_min": round(half / 60, 1), "later_slope_mb_per_min": round(slope, 3), "first_max_mb": first_max,
            "later_max_mb": later_max, "later_max_vs_first_pct": round(100 * (later_max / first_max - 1), 1)}


def summarise(soak: Soak, interrupted: bool, recordings_mb: float) -> dict[str, Any]:
    minutes = soak.minutes
    latencies = [ms for m in minutes for ms in m.latencies_ms]
    misses = sum(m.deadline_misses for m in minutes)
    closes = sum((m.closes for m in minutes), Counter())
    exceptions = sum((m.exceptions for m in minutes), Counter())
    return {
        "interrupted": interrupted,
        "server_exit_code": soak.server_exit,
        "sessions_completed": sum(m.sessions for m in minutes),
        "failures": sum(closes.values()) + sum(exceptions.values()),
        "abnormal_closes": dict(closes),
        "client_exceptions": dict(exceptions),
        "error_events": sum(m.error_events for m in minutes),
        "frames_sent": soak.frames_sent,
        "frames": len(latencies),
        "deadline_misses": misses,
        "miss_rate": round(misses / len(latencies), 5) if latencies else None,
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p99_ms": percentile(latencies, 99),
        "latency_max_ms": max(latencies, default=None),
        "retrievals": sum(m.retrievals for m in minutes),
        "spans_injected": sum(m.spans_injected for m in minutes),
        "spans_dropped": sum(m.spans_dropped for m in minutes),
        "retrievals_unresolved": sum(m.unresolved for m in minutes),
        "refused": sum(m.refused for m in minutes),
        "server_rss_mb": rss_summary([s["server_mb"] for s in soak.rss]) if soak.rss else None,
        "server_rss_trend": rss_trend(soak.rss),
        "server_and_children_rss_mb": rss_summary([round(s["server_mb"] + s["children_mb"], 1) for s in soak.rss])
        if soak.rss else None,
        "after_run": soak.after,
        "recordings_mb": recordings_mb,
    }


COLUMNS = [("min", "minute"), ("sessions", "sessions"), ("frames", "frames"), ("misses", "deadline_misses"),
           ("P50 ms", "latency_p50_ms"), ("P99 ms", "latency_p99_ms"), ("<ret>", "retrievals"),
           ("injected", "spans_injected"), ("dropped", "spans_dropped"), ("unresolved", "retrievals_unresolved"),
           ("refused", "refused"), ("errors", "error_events"), ("closes", "abnormal_closes"),
           ("exceptions", "client_exceptions"), ("RSS MB", "rss_mb")]


def print_report(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    widths = [max(len(title), 6) for title, _ in COLUMNS]
    print(" | ".join(f"{title:>{w}}" for (title, _), w in zip(COLUMNS, widths, strict=True)))
    for row in rows:
        cells = [sum(v.values()) if isinstance(v, dict) else "-" if v is None else v
                 for v in (row[key] for _, key in COLUMNS)]
        print(" | ".join(f"{cell:>{w}}" for cell, w in zip(cells, widths, strict=True)))
    s = summary
    rss, total = s["server_rss_mb"] or {}, s["server_and_children_rss_mb"] or {}
    print(f"\n{s['sessions_completed']} sessions completed, {s['failures']} failures {s['abnormal_closes']} "
          f"{s['client_exceptions']}, {s['refused']} reconnects refused (1013), {s['error_events']} error events"
          + (" (interrupted)" if s["interrupted"] else "")
          + (f"; server exited with {s['server_exit_code']}" if s["server_exit_code"] is not None else ""))
    print(f"{s['frames']} frames measured ({s['frames_sent']} sent), {s['deadline_misses']} deadline misses "
          f"(rate {s['miss_rate']}); frame latency P50 {s['latency_p50_ms']} ms, P99 {s['latency_p99_ms']} ms, "
          f"max {s['latency_max_ms']} ms")
    print(f"{s['retrievals']} <ret>: {s['spans_injected']} spans injected, {s['spans_dropped']} dropped, "
          f"{s['retrievals_unresolved']} unresolved when the session ended")
    print(f"server RSS start {rss.get('start')} MB, end {rss.get('end')} MB, max {rss.get('max')} MB, growth "
          f"{rss.get('growth')} MB; with the ASR process: start {total.get('start')} MB, end {total.get('end')} MB, "
          f"growth {total.get('growth')} MB")
    if trend := s["server_rss_trend"]:
        print(f"server RSS over the last {trend['half_min']} min: slope {trend['later_slope_mb_per_min']} MB/min, "
              f"max {trend['later_max_mb']} MB ({trend['later_max_vs_first_pct']:+} % against the first half's "
              f"{trend['first_max_mb']} MB)")
    print(f"after the run: {s['after_run'] or 'not checked'}; recordings {s['recordings_mb']} MB")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="contextspan-soak-") as tmp:
        workdir = Path(tmp)
        pcm, ret_frame = speech(workdir)
        ret_frame = ret_frame if args.force_ret_frame is None else args.force_ret_frame
        recordings = workdir / "recordings"
        process, url = start_server(
            workdir, "--profile", PROFILE, "--max-sessions", str(args.sessions), "--admission", "fixed",
            "--span-cap", "fixed", "--recordings-dir", str(recordings),
            "--log-level", "warning", "--force-ret-frame", str(ret_frame), "--asr" if args.asr else "--no-asr")
        soak = Soak(args.minutes)
        interrupted = False
        try:
            asyncio.run(soak.run(args, url, process, pcm, ret_frame))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            stop_server(process)
        recordings_mb = round(sum(f.stat().st_size for f in recordings.rglob("*") if f.is_file()) / 2**20, 1)
    rows = [m.row(i) for i, m in enumerate(soak.minutes)]
    summary = summarise(soak, interrupted, recordings_mb)
    print_report(rows, summary)
    save_json(args.out, {
        "benchmark": "soak",
        "machine": machine_info(),
        "settings": {"profile": PROFILE, "minutes": args.minutes, "sessions": args.sessions, "asr": args.asr,
                     "force_ret_frame": ret_frame, "seed": args.seed, "sample_s": args.sample_s,
                     "speech_s": round(len(pcm) / SAMPLE_RATE, 2)},
        "minutes": rows,
        "rss_samples": soak.rss,
        "failures": soak.failures,
        "summary": summary,
    })
    return 0
