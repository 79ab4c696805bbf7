"""`contextspan serve --profile tiny-contextspan` with no query parameters serves the Context Spanning model as it was
trained: its persona and a voice of its own prefilled (the user named when the context store knows them), a tool's
answer read behind `(tool result) `, and a question nothing answers met with the abstain span. Real server on
loopback, real Opus stream of espeak-ng speech, real Whisper and the built-in router; `<ret>` forced."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.harness import StreamResult, stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.loader import load_model
from frontend_model.span.build import non_text_ids, tokenize_data_text
from frontend_model.span.contract import ABSTAIN_TEXT, CONTEXT_SPANNING_PERSONA
from server.wire.protocol import SessionReady
from tests.support.speech import silence, speak

from .servers import RunningServer, start_server, stop_server

pytestmark = pytest.mark.slow

QUESTION_S = 5.0  # every question is padded to this, so that one forced `<ret>` frame serves them all
RET_FRAME = int(QUESTION_S * SAMPLE_RATE) // FRAME_SAMPLES + 10
DEADLINE_S = 60.0  # out of reach of a slow, loaded host's Whisper: the answer, not the host, decides the outcome


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("contract")
    # A host too slow for the 16-codebook model in real time falls behind rather than drop the forced frame.
    running = start_server(tmp, "--profile", "tiny-contextspan", "--force-ret-frame", str(RET_FRAME),
                           "--question-wait-s", "5.0", "--span-deadline-s", str(DEADLINE_S),
                           "--input-backlog-frames", "5000")
    try:
        yield running
    finally:
        stop_server(running)


def ready_of(result: StreamResult) -> SessionReady:
    ready = result.of_type("session.ready")
    assert len(ready) == 1, result.events
    return ready[0]


def test_a_session_with_no_parameters_gets_the_trained_persona_and_a_voice(server: RunningServer) -> None:
    result = asyncio.run(stream(chat_url(server.ws, events=True), silence(0.5)))
    ready = ready_of(result)
    assert ready.persona == CONTEXT_SPANNING_PERSONA and ready.voice == "tiny-codes"
    model = load_model("tiny-contextspan", device="cpu")
    voice = model.voice_prompts["tiny-codes"]
    marker = model.tokenizer.encode("<system>")
    forbidden = non_text_ids(model.tokenizer, model.span)
    _, persona = tokenize_data_text(CONTEXT_SPANNING_PERSONA, model.tokenizer, forbidden)
    system = 2 * len(marker) + len(persona)
    assert ready.prefix_frames == 1 + voice.frames + 1 + system + 1, (
        "the initial column, the voice, one silence, the persona, one silence")


def test_the_persona_names_the_user_the_context_store_knows(server: RunningServer) -> None:
    update = json.dumps({"type": "session.update", "profile": {"name": "Ada", "location": "Lisbon"}})
    first = asyncio.run(stream(chat_url(server.ws, events=True, user="ada"), silence(1.0), texts=[(0.2, update)],
                               until=lambda r: bool(r.of_type("session.updated"))))
    assert first.of_type("session.updated")
    again = ready_of(asyncio.run(stream(chat_url(server.ws, events=True, user="ada"), silence(0.5))))
    assert again.persona == f"{CONTEXT_SPANNING_PERSONA} The user's name is Ada. The user is in Lisbon."
    chosen = ready_of(asyncio.run(stream(chat_url(server.ws, events=True, user="ada", persona="You are Bo.",
                                                  voice="tiny-embeddings"), silence(0.5))))
    assert chosen.persona == "You are Bo. The user's name is Ada. The user is in Lisbon."
    assert chosen.voice == "tiny-embeddings"


def ask(server: RunningServer, tmp: Path, question: str) -> StreamResult:
    speech = np.concatenate([silence(0.3), speak(question, tmp / "q.wav")])
    assert speech.size < QUESTION_S * SAMPLE_RATE
    pcm = np.concatenate([speech, silence(QUESTION_S - speech.size / SAMPLE_RATE + 3.0)])
    return asyncio.run(stream(chat_url(server.ws, events=True), pcm, until_timeout_s=DEADLINE_S + 60,
                              until=lambda r: any(e.type in ("span.injected", "span.dropped") for e in r.events)))


def test_a_tool_answer_is_injected_as_a_tool_result(server: RunningServer, tmp_path: Path) -> None:
    result = ask(server, tmp_path, "What is twelve times seven?")
    assert [e.frame for e in result.of_type("retrieval")] == [RET_FRAME]
    spans = result.of_type("span.injected")
    assert len(spans) == 1, [e for e in result.events if e.type.startswith("span")]
    assert spans[0].tool == "arithmetic" and spans[0].text.startswith("(tool result) ")
    assert "eighty-four" in spans[0].text


def test_a_question_no_tool_answers_gets_the_abstain_span(server: RunningServer, tmp_path: Path) -> None:
    result = ask(server, tmp_path, "Who wrote the novel about the white whale?")
    assert result.of_type("question"), result.events
    spans = result.of_type("span.injected")
    assert len(spans) == 1, [e for e in result.events if e.type.startswith("span")]
    assert spans[0].text == ABSTAIN_TEXT and spans[0].tool == "abstain"
    assert spans[0].offset_after - spans[0].offset_before == spans[0].frames > 2
