"""A GPU optimisation that fails as the server starts costs that optimisation, not the server: it still converses
(spans included), the cause is in one log line and on /readyz, and /metrics shows the optimisation off.

On CPU the graphs do not run, so each failure is injected (`fail_optimisations`) where the optimisation starts,
after it has run there: the fallback must undo all a start can leave behind."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.harness import StreamResult, stream
from contextspan_client import chat_url
from frontend_model.engine import optimisations
from frontend_model.engine.optimisations import OPTIMISATIONS, Optimisation
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from tests.e2e.servers import in_process_server, pinned_settings

SECONDS = 2.0
SPAN = {"type": "span.inject", "text": "Your table is booked for 8 pm.", "source": "bookings"}


def converse(ws: str) -> StreamResult:
    """Two seconds of a spoken-level tone with a span pushed half way, as a client app would."""
    t = np.arange(int(SECONDS * SAMPLE_RATE)) / SAMPLE_RATE
    pcm = (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return asyncio.run(stream(chat_url(ws, events=True), pcm, texts=[(0.5, json.dumps(SPAN))]))


@pytest.mark.parametrize("name", OPTIMISATIONS)
def test_a_server_whose_optimisation_fails_to_start_converses_and_says_why(
        name: Optimisation, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Chunked spans: the served engine tries the chunks too, not only calibration; windows that keep the prefix: the
    # batch tries the shadow row that builds them ahead.
    settings = pinned_settings(recordings_dir=tmp_path, max_sessions=1, asr=False, app_spans="on",
                               span_prefill="chunked", max_span_frames=16, window="keep-prefix",
                               fail_optimisations=[name])
    with caplog.at_level(logging.INFO, logger=optimisations.__name__), in_process_server(settings) as server:
        result = converse(server.ws)
        ready = httpx.get(f"{server.http}/readyz", timeout=10)
        metrics = httpx.get(f"{server.http}/metrics", timeout=10).text

    cause = f"InjectedFailure: {name} failed as injected"
    assert [r.getMessage() for r in caplog.records if "disabled" in r.getMessage()] == [
        f"optimisation {name} disabled: {cause}"]
    assert ready.status_code == 200
    status = ready.json()["optimisations"]
    assert status[name] == f"off: {cause}"
    assert not [other for other, state in status.items() if other != name and state.startswith("off")], status
    assert f'contextspan_optimisation_active{{name="{name}"}} 0.0' in metrics

    assert result.close_code in (None, 1000)
    assert result.audio_messages >= int(SECONDS * SAMPLE_RATE) // FRAME_SAMPLES - 1
    (injected,) = result.of_type("span.injected")
    assert injected.frames > 2


def test_a_server_whose_optimisations_all_start_reports_them(tmp_path: Path) -> None:
    settings = pinned_settings(recordings_dir=tmp_path, max_sessions=1, asr=False, span_prefill="chunked",
                               max_span_frames=16)
    with in_process_server(settings) as server:
        status = httpx.get(f"{server.http}/readyz", timeout=10).json()["optimisations"]
        metrics = httpx.get(f"{server.http}/metrics", timeout=10).text
    assert status == {"step_graphs": "not applicable (cpu)", "prefill_graphs": "not applicable (cpu)",
                      "scratch_row": "active", "calibration": "active", "window_ahead": "unused"}
    assert 'contextspan_optimisation_active{name="scratch_row"} 1.0' in metrics
    assert 'contextspan_optimisation_active{name="step_graphs"} 0.0' in metrics
