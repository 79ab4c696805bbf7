"""Sessions on one batched model over real WebSockets: they share ticks, and admission follows the tick budget."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
import websockets
from prometheus_client import Histogram

from benchmarks.harness import stream
from contextspan_client import chat_url
from frontend_model.engine.costs import PrefillCost, TickCost
from frontend_model.loading.loader import load_model
from server.app import routes as app_module
from server.wire import protocol as p

from .pace import assert_kept_pace
from .servers import in_process_server, pinned_settings

pytestmark = pytest.mark.slow


def count_and_sum(histogram: Histogram) -> tuple[float, float]:
    values = {s.name.rsplit("_", 1)[1]: s.value for s in histogram.collect()[0].samples if "le" not in s.labels}
    return values["count"], values["sum"]


def test_three_sessions_share_ticks_and_none_stalls(tmp_path: Path, speech: np.ndarray) -> None:
    settings = pinned_settings(recordings_dir=tmp_path / "rec", max_sessions=3, asr=False)
    with in_process_server(settings, load_model("tiny")) as server:
        assert server.state.batcher is not None and server.state.batcher.size == 3

        async def run() -> list:
            return list(await asyncio.gather(*(stream(chat_url(server.ws, events=True), speech) for _ in range(3))))

        results = asyncio.run(run())
        ticks, frames_in_ticks = count_and_sum(server.state.metrics.batch_size)
    for result in results:
        assert result.close_code in (None, p.CLOSE_NORMAL)
        assert_kept_pace(result, min_frames=50)
    frames_reported = sum(len(s.latency_ms) for r in results for s in r.of_type("stats"))
    assert frames_in_ticks >= frames_reported > 0
    assert ticks < 0.9 * frames_in_ticks, f"{ticks:.0f} ticks for {frames_in_ticks:.0f} frames: few were shared"


def test_admission_refuses_with_1013_when_the_tick_would_not_fit(tmp_path: Path, speech: np.ndarray,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Calibrated admission and span cap with injected costs (a tick of 2 takes 70 ms, over 75 % of the 80 ms frame;
    a span prefill takes 500 ms): one slot, the second session refused with the reason, and the startup log says
    both. The host's own speed plays no part."""
    injected = TickCost({1: 0.030, 2: 0.070, 4: 0.120, 5: 0.140}, PrefillCost(0.020, {1: 0.5, 640: 5.0}))

    async def calibrate(*_: object) -> TickCost:
        return injected

    monkeypatch.setattr(app_module, "calibrate", calibrate)
    settings = pinned_settings(recordings=False, max_sessions=4, asr=False, admission="calibrated",
                               span_cap="calibrated")
    with (caplog.at_level(logging.INFO, logger="server.app.routes"),
          in_process_server(settings, load_model("tiny")) as server):
        assert server.state.batcher is not None and server.state.batcher.size == 1

        async def run() -> tuple[int | None, str]:
            first = asyncio.create_task(stream(chat_url(server.ws), speech[: 24000 * 3]))
            await asyncio.sleep(1.0)
            async with websockets.connect(chat_url(server.ws)) as ws:
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), timeout=5)
            await first
            return ws.close_code, ws.close_reason or ""

        code, reason = asyncio.run(run())
    assert code == p.CLOSE_TRY_AGAIN
    refusal = json.loads(reason)
    assert refusal["error"] == "at_capacity"
    assert refusal["message"] == "all 1 slots busy; a tick of 2 would take 70 ms > 75% of the 80 ms frame"
    assert any(r.getMessage().endswith(
        ": 1 session(s) in one batch, tick 30.0 ms (a tick of 2 would take 70 ms > 75% of the 80 ms frame)")
        for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert any(r.levelno == logging.WARNING and r.getMessage().startswith(
        "no span fits the frame: a 3-frame span and the next step were measured at 514.1 ms, over the 70.0 ms left")
        for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("align", [True, False])
def test_a_joining_session_ends_its_frames_with_the_others(tmp_path: Path, speech: np.ndarray, align: bool) -> None:
    """Two clients sending 40 ms pages, the second 20 ms out of phase: with alignment the server puts 40 ms of
    silence ahead of the second one's audio, so its frames end 20 ms before the first's instead of 20 ms after."""
    settings = pinned_settings(recordings_dir=tmp_path / "rec", max_sessions=2, asr=False,
                              align_phases=align)
    with in_process_server(settings, load_model("tiny")) as server:
        batcher = server.state.batcher
        assert batcher is not None
        arrivals: dict[int, list[float]] = {0: [], 1: []}
        step = batcher.step

        async def recording_step(slot: int, frame):  # type: ignore[no-untyped-def]
            arrivals[slot].append(frame.arrived)
            return await step(slot, frame)

        batcher.step = recording_step  # type: ignore[method-assign]
        pcm = speech[: 3 * 24000]

        async def run() -> list:
            start = time.perf_counter() + 2.0  # both connected and through the handshake by then
            first = stream(chat_url(server.ws), pcm, page_samples=960, start_at=start)
            second = stream(chat_url(server.ws), pcm, page_samples=960, start_at=start + 0.4 + 0.02)
            return list(await asyncio.gather(first, second))

        results = asyncio.run(run())
    assert all(r.frames_sent == 37 for r in results)
    # The first session took slot 1 or 0 depending on which connected first: tell them apart by their first frame.
    first, second = sorted(arrivals.values(), key=lambda times: times[0])
    offsets_ms = [1e3 * (t - min(first, key=lambda u: abs(u - t))) for t in second[2:]]
    offset = float(np.median(offsets_ms))
    if align:
        assert -35.0 < offset < -5.0, offsets_ms
    else:
        assert 5.0 < offset < 35.0, offsets_ms
