"""A long call on the trained tiny model: questions throughout one session of minutes, past many windows (issue 37).

The tiny model attends to 96 frames (7.7 s), so two minutes are fifteen windows: unless the window keeps the persona
prefix (`--window keep-prefix`, the default for its family) the prefix has long scrolled out when the last question
comes. One session streams questions every `every_s` seconds; each is scored in its own stretch (until the next
starts) as a development-set question is (`behaviour.score`), and the server's RSS is sampled as the call goes. The
question is whether one asked in the call's last windows is answered as one asked in its first, with memory flat.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from benchmarks.behaviour_scoring import SAID_RECALL, SERVER_FLAGS, Turn, score, stream_when_free
from benchmarks.harness import StreamResult, start_server, stop_server
from contextspan_client import chat_url
from frontend_model.frame import SAMPLE_RATE
from frontend_model.span.contract import CONTRACTS
from frontend_model.training.speech import Voice, speak

FIRST_S = 1.0  # the first question starts this far into the call
TAIL_S = 8.0  # the call goes on this long after the last question: its answer is said in it
RSS_EVERY_S = 5.0
EDGE_S = 35.0  # the call's first and last stretches (about five questions each), whose answers are compared


@dataclass(frozen=True)
class Placed:
    """A question at its place in the call (stream seconds)."""

    question: str
    start_s: float
    end_s: float


def call_audio(questions: Sequence[str], voice: Voice, duration_s: float,
               every_s: float) -> tuple[np.ndarray, list[Placed]]:
    """`duration_s` of silence with a question every `every_s` seconds (cycling through `questions`), the last one
    ending at least `TAIL_S` before the end."""
    pcm = np.zeros(int(duration_s * SAMPLE_RATE), np.float32)
    placed: list[Placed] = []
    start = FIRST_S
    while True:
        question = questions[len(placed) % len(questions)]
        speech = speak(question, voice)
        end = start + len(speech) / SAMPLE_RATE
        if end > duration_s - TAIL_S:
            break
        at = int(start * SAMPLE_RATE)
        pcm[at:at + len(speech)] = speech
        placed.append(Placed(question, start, end))
        start += every_s
    if not placed:
        raise ValueError(f"a call of {duration_s} s has no room for a question")
    return pcm, placed


def said_the_answer(turn: Turn) -> bool:
    """The model asked, a tool's answer (not the abstain span) went in, and `SAID_RECALL` of its words were said."""
    return bool(turn.asked and turn.span and turn.span != CONTRACTS["contextspan"].abstain_text
                and turn.recall >= SAID_RECALL)


@dataclass
class LongCall:
    placed: list[Placed]
    turns: list[Turn]
    rss: list[tuple[float, int]]  # (seconds into the call, server RSS bytes)
    result: StreamResult

    def answered_between(self, lo_s: float, hi_s: float) -> tuple[int, int]:
        """(answered, asked in [lo_s, hi_s)): questions by their start."""
        inside = [t for p, t in zip(self.placed, self.turns, strict=True) if lo_s <= p.start_s < hi_s]
        return sum(map(said_the_answer, inside)), len(inside)

    def rss_growth(self, after_s: float) -> int:
        """RSS at the end minus the first sample from `after_s` on (warm-up excluded)."""
        settled = [rss for t, rss in self.rss if t >= after_s]
        return settled[-1] - settled[0] if len(settled) > 1 else 0


async def long_call(ws: str, pcm: np.ndarray, placed: list[Placed], server_rss: Callable[[], int]) -> LongCall:
    """One session streaming `pcm` in real time, the server's RSS sampled every `RSS_EVERY_S`."""
    rss: list[tuple[float, int]] = []
    began = time.monotonic()

    async def sample() -> None:
        while True:
            rss.append((time.monotonic() - began, server_rss()))
            await asyncio.sleep(RSS_EVERY_S)

    sampler = asyncio.create_task(sample())
    try:
        result = await stream_when_free(chat_url(ws, events=True), pcm)
    finally:
        sampler.cancel()
    rss.append((time.monotonic() - began, server_rss()))
    ends = [p.start_s for p in placed[1:]] + [float("inf")]
    turns = [score(p.question, p.end_s, result, p.start_s, until) for p, until in zip(placed, ends, strict=True)]
    return LongCall(placed, turns, rss, result)


def rolls(http: str) -> int:
    """Window rolls the server has done (its /metrics)."""
    text = httpx.get(f"{http}/metrics", timeout=10).text
    found = re.search(r"^contextspan_window_roll_seconds_count (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else 0


def report(call: LongCall, duration_s: float, window_rolls: int) -> dict[str, Any]:
    first, first_of = call.answered_between(0.0, EDGE_S)
    last, last_of = call.answered_between(duration_s - TAIL_S - EDGE_S, duration_s)
    growth = call.rss_growth(EDGE_S)
    return {
        "duration_s": duration_s,
        "questions": len(call.turns),
        "window_rolls": window_rolls,
        "ret_recall": round(sum(t.asked for t in call.turns) / len(call.turns), 3),
        "answered": sum(map(said_the_answer, call.turns)),
        "answered_first": f"{first} of {first_of}",
        "answered_last": f"{last} of {last_of}",
        "rss_start_mb": round(call.rss[0][1] / 2**20, 1),
        "rss_growth_after_warmup_mb": round(growth / 2**20, 1),
        "turns": [{"start_s": round(p.start_s, 2), **asdict(t)} for p, t in zip(call.placed, call.turns, strict=True)],
        "rss": [(round(t, 1), round(b / 2**20, 1)) for t, b in call.rss],
    }


def long_table(rows: Sequence[dict[str, Any]]) -> str:
    edge = f"{EDGE_S:.0f} s"
    lines = [f"| call | questions | window rolls | `<ret>` recall | answered | answered, first {edge} "
             f"| answered, last {edge} | RSS growth after {edge} |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['duration_s'] / 60:.0f} min | {r['questions']} | {r['window_rolls']} | "
                     f"{r['ret_recall']:.0%} | {r['answered']} | {r['answered_first']} | {r['answered_last']} | "
                     f"{r['rss_growth_after_warmup_mb']} MB |")
    return "\n".join(lines)


def run_long(checkpoint: Path, duration_s: float, every_s: float, questions: Sequence[str], voice: Voice,
             serve_with: Sequence[str] = ()) -> dict[str, Any]:
    """A server of one session (its defaults but `serve_with`) and one call of `duration_s`."""
    pcm, placed = call_audio(questions, voice, duration_s, every_s)
    with tempfile.TemporaryDirectory() as tmp:
        process, http = start_server(Path(tmp), "--profile", "contextspan", "--checkpoint", str(checkpoint),
                                     "--max-sessions", "1", *SERVER_FLAGS, *serve_with)
        try:
            server = psutil.Process(process.pid)
            call = asyncio.run(long_call("ws" + http.removeprefix("http"), pcm, placed,
                                         lambda: server.memory_info().rss))
            return {**report(call, duration_s, rolls(http)), "serve_with": list(serve_with)}
        finally:
            stop_server(process)
