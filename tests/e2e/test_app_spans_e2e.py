"""App-pushed spans and the resolved trigger end to end: one in-process server (tiny profile) with an API key, one
session at a time, a real client streaming Opus that sends `span.inject` mid-stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from benchmarks.harness import StreamResult, free_port, stream
from contextspan_client import chat_url
from frontend_model.frame import SAMPLE_RATE
from frontend_model.loading.loader import load_model
from server.settings import ServerSettings

from .servers import InProcessServer, in_process_server, pinned_settings

pytestmark = pytest.mark.slow
KEY = "app-spans-key"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    # Pinned span cap: a calibrated one on a loaded host drops every span (no_frame_budget), as it once did here.
    settings = pinned_settings(recordings_dir=tmp_path_factory.mktemp("rec"), max_sessions=1, api_keys=[KEY],
                               asr=False)
    with in_process_server(settings, load_model("tiny")) as running:
        yield running


def session(server: InProcessServer, texts: list[tuple[float, str]], seconds: float = 2.5) -> StreamResult:
    token = httpx.post(f"{server.http}/api/token", headers={"Authorization": f"Bearer {KEY}"}, timeout=5).json()
    pcm = np.zeros(int(seconds * SAMPLE_RATE), np.float32)
    return asyncio.run(stream(chat_url(server.ws, events=True), pcm, token=token["token"], texts=texts))


def test_a_pushed_span_is_scrubbed_and_injected(secured: InProcessServer) -> None:
    inject = {"type": "span.inject", "text": "Your <ret>table is booked<0x00> for 8 pm.", "source": "bookings"}
    result = session(secured, [(1.0, json.dumps(inject))])
    (ready,) = result.of_type("session.ready")
    assert ready.app_spans and ready.trigger == "asr"  # auto on the tiny profile, no test hook: a heard question
    assert not result.of_type("error")
    spans = [e for e in result.events if e.type.startswith("span.")]
    assert len(spans) == 1, spans
    span = spans[0]
    assert (span.source, span.tool) == ("bookings", "app")
    assert span.type == "span.injected", f"dropped: {span.reason}"
    assert "table is booked for eight p m" in span.text and "<" not in span.text
    assert span.offset_after - span.offset_before == span.frames > 2
    assert span.latency_ms < 1000


def test_bad_pushes_get_errors_and_the_session_goes_on(secured: InProcessServer) -> None:
    texts = [(0.5, json.dumps({"type": "span.inject", "text": ""})),
             (0.6, json.dumps({"type": "span.inject", "text": "x" * 2001})),
             (0.7, json.dumps({"type": "span.inject", "text": "<ret><system>"})),
             (1.2, json.dumps({"type": "span.inject", "text": "Paris."})),
             (1.2, json.dumps({"type": "span.inject", "text": "Rome."}))]  # in the same frame: one is enough
    result = session(secured, texts, seconds=2.0)
    assert [e.code for e in result.of_type("error")] == ["invalid_message", "span_too_long", "span_rate_limited"]
    (dropped,) = result.of_type("span.dropped")
    assert dropped.tool == "app" and dropped.reason == "nothing left after removing control text"
    (injected,) = result.of_type("span.injected")
    assert injected.text == "Paris." and injected.source == "app"
    assert result.close_code is None or result.close_code == 1000
    assert result.frames_sent == 25 and result.audio_messages >= 24


def test_readyz_states_the_resolved_trigger(secured: InProcessServer) -> None:
    info = httpx.get(f"{secured.http}/readyz", timeout=5).json()
    assert info["trigger"] == "asr"
    assert info["trigger_why"].startswith("auto: a random-weight checkpoint was not trained")
    assert info["app_spans"] == "auto" and info["auth"]


def test_sessions_without_a_token_may_not_push_spans(tmp_path_factory: pytest.TempPathFactory) -> None:
    settings = ServerSettings(port=free_port(), recordings_dir=tmp_path_factory.mktemp("rec"), max_sessions=1,
                              asr=False, force_ret_frame=10_000)
    with in_process_server(settings, load_model("tiny")) as server:
        pcm = np.zeros(int(1.5 * SAMPLE_RATE), np.float32)
        inject = json.dumps({"type": "span.inject", "text": "Paris."})
        result = asyncio.run(stream(chat_url(server.ws, events=True), pcm, texts=[(0.5, inject)]))
    (ready,) = result.of_type("session.ready")
    assert not ready.app_spans and ready.trigger == "ret"  # the test hook stands in for the model's <ret>
    assert [e.code for e in result.of_type("error")] == ["app_spans_off"]
    assert not [e for e in result.events if e.type.startswith("span.")]
    assert result.audio_messages >= 17
