"""`<ret>` -> span end to end on loopback: real server (tiny profile), real Opus stream of espeak-ng speech, real
Whisper, the built-in router or a fake OpenAI-compatible LLM; the frame clock never waits for the backend."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backend_agent.tools.numbers import replace_number_words
from benchmarks.fakes.fake_openai import HANG_S, Script, fake_openai
from benchmarks.harness import StreamResult, stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES
from tests.support.speech import silence, speak

from .pace import assert_kept_pace
from .servers import start_server, stop_server

pytestmark = pytest.mark.slow

# Span deadline: the outcome a test checks must not depend on how fast this host runs Whisper (with the host's other
# core busy and a soak beside it, Whisper and the router once took over 10 s to turn the question into a span; with a
# core busy on a slow host, Whisper once took 21 s over a 2.9 s question).
DEADLINE_S = 40.0


def question_audio(tmp: Path, text: str) -> tuple[np.ndarray, int]:
    """Speech then 3 s of silence; `<ret>` is forced 0.8 s after the speech ends."""
    speech = np.concatenate([silence(0.3), speak(text, tmp / "q.wav")])
    return np.concatenate([speech, silence(3.0)]), len(speech) // FRAME_SAMPLES + 10


def span_outcome(result: StreamResult) -> bool:
    return any(e.type in ("span.injected", "span.dropped") for e in result.events)


def run_session(tmp: Path, pcm: np.ndarray, ret_frame: int, *flags: str) -> StreamResult:
    """The client stays on the line until the span's fate is known: a slow host's Whisper must not end the test
    before the answer does."""
    server = start_server(tmp, "--force-ret-frame", str(ret_frame), *flags)
    try:
        return asyncio.run(stream(chat_url(server.ws, events=True), pcm, until=span_outcome,
                                  until_timeout_s=DEADLINE_S + 10))
    finally:
        stop_server(server)


def test_span_from_the_router_lands_inside_the_deadline(tmp_path: Path) -> None:
    pcm, ret_frame = question_audio(tmp_path, "What is twelve times seven?")
    # The final transcript, not a partial, must become the question: give a slow or loaded host's Whisper time to
    # finish the utterance (the default waits 1 s), and the span a deadline no host's speed reaches.
    result = run_session(tmp_path, pcm, ret_frame, "--question-wait-s", "5.0", "--span-deadline-s", str(DEADLINE_S))
    assert [e.frame for e in result.of_type("retrieval")] == [ret_frame]
    finals = [e for e in result.of_type("user.transcript") if e.final]
    # Whisper writes numbers either way ("12 times 7", "12 times seven") depending on where the utterance was cut.
    assert finals and "12 times 7" in replace_number_words(finals[0].text)
    questions = result.of_type("question")
    assert len(questions) == 1 and questions[0].text == finals[0].text
    spans = result.of_type("span.injected")
    assert len(spans) == 1, [e for e in result.events if e.type.startswith("span")]
    span = spans[0]
    assert span.tool == "arithmetic" and "eighty-four" in span.text and span.question == questions[0].text
    assert span.offset_after - span.offset_before == span.frames > 2, "the KV cache advanced by the span's frames"
    assert span.latency_ms <= DEADLINE_S * 1e3 and span.prefill_ms > 0
    assert {"question_ms", "tool_ms", "build_ms"} <= set(span.timings_ms)
    assert_kept_pace(result, min_frames=50)


@pytest.fixture
def llm() -> Iterator[tuple[str, Script]]:
    with fake_openai() as server:
        yield server


def test_span_from_an_llm_tool_call(tmp_path: Path, llm: tuple[str, Script]) -> None:
    url, script = llm
    script.mode, script.tool, script.arguments = "tool_call", "unit_conversion", {
        "value": 10, "from_unit": "miles", "to_unit": "kilometres"}
    # No built-in intent pattern matches the question (those are answered before any LLM is asked): the LLM picks.
    pcm, ret_frame = question_audio(tmp_path, "How far is ten miles in the metric system?")
    result = run_session(tmp_path, pcm, ret_frame, "--llm-base-url", url, "--llm-model", "fake",
                         "--span-deadline-s", str(DEADLINE_S))
    spans = result.of_type("span.injected")
    assert len(spans) == 1 and spans[0].tool == "unit_conversion" and "sixteen" in spans[0].text
    assert "llm_ms" in spans[0].timings_ms
    assert script.requests and "metric" in script.requests[0]["messages"][-1]["content"].lower()
    assert_kept_pace(result, min_frames=50)


@pytest.mark.parametrize(("mode", "reason"), [("hang", "timed out"), ("error500", "HTTP 500"),
                                              ("garbage", "malformed")])
def test_failing_llm_drops_the_span_and_keeps_every_frame(
    tmp_path: Path, llm: tuple[str, Script], mode: str, reason: str
) -> None:
    url, script = llm
    script.mode = mode
    pcm, ret_frame = question_audio(tmp_path, "What is the weather like in Paris?")
    # The LLM's failure, not a slow host's Whisper, must decide the outcome: the deadline is out of its reach.
    deadline_s = HANG_S - 2  # far from this host's Whisper, and the hung LLM outlasts it
    result = run_session(tmp_path, pcm, ret_frame, "--llm-base-url", url, "--span-deadline-s", str(deadline_s))
    assert not result.of_type("span.injected")
    dropped = result.of_type("span.dropped")
    assert len(dropped) == 1 and reason in dropped[0].reason, dropped
    # At the deadline, give or take the event loop's lateness on a loaded host (once 147 ms): a hung LLM with no
    # deadline would never be dropped, and httpx's own timeout is minutes.
    assert dropped[0].latency_ms <= deadline_s * 1e3 + 1000, "dropped at the deadline at the latest"
    assert_kept_pace(result, min_frames=50)
