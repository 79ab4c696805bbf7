"""A session that ends leaves nothing behind without the garbage collector: with `gc` disabled, its Session, its
Retrieval (and ASR stream), its recording and its per-slot objects (frames, span requests, outputs) are freed by
reference counting alone as soon as it is released, whether it ends normally, drops mid-span, is closed by a fault in
its slot, or is refused at capacity. A reference cycle anywhere in that graph keeps it all until a full collection:
the sawtooth RSS of issue 14.

In process, with speech recognition (the bundled Whisper in its subprocess) and recordings on, `<ret>` forced early.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sphn
import websockets
from starlette.websockets import WebSocket

from benchmarks.fakes.faulty_server import break_slot_frame, injected_step_fault
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.loader import load_model
from server.batching.batcher import Batcher, _Pending
from server.ops.recording import SessionRecording
from server.session.retrieval import Retrieval
from server.session.session import Session
from server.session.spans import FrameOutput, SpanRequest
from server.wire import protocol as p
from server.wire.frame_clock import InputFrame

from .servers import InProcessServer, app_answer, in_process_server, pinned_settings

pytestmark = pytest.mark.slow
TRACKED = (Session, Retrieval, SessionRecording, SpanRequest, FrameOutput, _Pending, InputFrame, WebSocket)
SPAN_TEXT = "The museum opens at nine in the morning and closes at six in the evening, every day but Tuesday."
FAULT_FRAME = 12
# A session's teardown waits on its tasks (the recording, a retrieval under way): 3 s was once too short in a full run
# with a core kept busy. What a cycle holds stays without gc however long one waits: a longer wait only slows a failure.
RELEASE_TIMEOUT_S = 20.0
Tracked = list[tuple[str, weakref.ref[Any]]]


@pytest.fixture
def alive(monkeypatch: pytest.MonkeyPatch) -> Tracked:
    """The class name of, and a weak reference to, every tracked object created from now on."""
    refs: Tracked = []
    for cls in TRACKED:
        def tracking_init(self: Any, *args: Any, _init: Callable[..., None] = cls.__init__, **kwargs: Any) -> None:
            _init(self, *args, **kwargs)
            refs.append((type(self).__name__, weakref.ref(self)))
        monkeypatch.setattr(cls, "__init__", tracking_init)
    return refs


@pytest.fixture
def no_gc() -> Iterator[None]:
    """`gc` off, and the server's logs too: pytest's log capture keeps every record, and a logged exception's
    traceback holds the failing session's frames."""
    server_logs = logging.getLogger("server")
    level = server_logs.level
    server_logs.setLevel(logging.CRITICAL)
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        server_logs.setLevel(level)


def left_behind(refs: Tracked) -> list[str]:
    return sorted(name for name, ref in refs if ref() is not None)


def holders(refs: Tracked) -> dict[str, list[str]]:
    """What refers to each object left behind (and, for a `__dict__`, cell, tuple or list among those, what holds that):
    a failure under load, which runs alone do not reproduce, names the holder rather than only the held."""
    def described(referrer: object) -> str:
        if isinstance(referrer, types.FrameType):
            return f"frame {referrer.f_code.co_qualname} line {referrer.f_lineno}"
        if isinstance(referrer, types.CoroutineType):
            return f"coroutine {referrer.cr_code.co_qualname}"
        return type(referrer).__qualname__

    found: dict[str, list[str]] = {}
    for name, ref in refs:
        held = ref()
        if held is None:
            continue
        described_referrers = []
        referrers = gc.get_referrers(held)
        for referrer in referrers:
            if isinstance(referrer, (dict, types.CellType, tuple, list)):
                owners = [described(owner) for owner in gc.get_referrers(referrer)
                          if owner is not held and owner is not referrers][:4]
                described_referrers.append(f"{described(referrer)} of {owners}")
            else:
                described_referrers.append(described(referrer))
        found[f"{name} {id(held):x}"] = described_referrers
    return found


async def released(refs: Tracked) -> list[str]:
    """What is still alive once the server has had `RELEASE_TIMEOUT_S` to finish its teardown (empty at once if
    nothing is held by a cycle)."""
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while left_behind(refs) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return left_behind(refs)


async def session(server: InProcessServer, pcm: np.ndarray, frames: int, span_at: int | None,
                  abort: bool) -> websockets.ClientConnection:
    """Stream `frames` frames of speech (a span requested once `span_at` have been sent), then leave: without a
    close handshake if `abort`, right after the span request."""
    writer = sphn.OpusStreamWriter(SAMPLE_RATE)
    ws = await websockets.connect(chat_url(server.ws, events=True), open_timeout=60)
    assert await asyncio.wait_for(ws.recv(), timeout=60) == p.handshake()
    for i in range(frames):
        if i == span_at:
            server.loop.call_soon_threadsafe(lambda: [s.request_span(app_answer(SPAN_TEXT))
                                                      for s in server.state.sessions.values()])
            if abort:
                await asyncio.sleep(0.05)
                ws.transport.abort()
                return ws
        try:
            await ws.send(p.audio_message(writer.append_pcm(pcm[i * FRAME_SAMPLES:][: FRAME_SAMPLES])))
        except websockets.ConnectionClosed:  # closed by the server (a fault)
            return ws
        await asyncio.sleep(FRAME_SAMPLES / SAMPLE_RATE)
    with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
        while True:  # the outputs of the frames sent, until the server falls quiet or closes
            await asyncio.wait_for(ws.recv(), timeout=1.0)
    await ws.close()
    return ws


def test_sessions_leave_nothing_behind_without_gc(tmp_path: Path, speech: np.ndarray, alive: Tracked,
                                                  monkeypatch: pytest.MonkeyPatch, no_gc: None) -> None:
    settings = pinned_settings(max_sessions=1, recordings=True, recordings_dir=tmp_path, asr=True,
                               force_ret_frame=5)
    with in_process_server(settings, load_model("tiny")) as server:
        assert server.state.backend is not None and server.state.backend.asr_process is not None, \
            server.state.backend.asr_error if server.state.backend else "no backend"

        async def scenarios() -> None:
            await session(server, speech, 30, span_at=15, abort=False)
            created = {name for name, _ in alive}
            assert {"Session", "Retrieval", "SessionRecording", "SpanRequest", "FrameOutput"} <= created, created
            assert await released(alive) == [], f"normal end: {holders(alive)}"
            alive.clear()

            await session(server, speech, 30, span_at=15, abort=True)
            assert await released(alive) == [], f"dropped mid-span: {holders(alive)}"
            alive.clear()

            # One slot: a second client is refused 1013 while the first streams; then both end.
            holder = await websockets.connect(chat_url(server.ws), open_timeout=60)
            assert await asyncio.wait_for(holder.recv(), timeout=60) == p.handshake()
            deadline = time.monotonic() + 30  # the holder's retrieval starts just after its handshake
            while not any(s.retrieval is not None for s in server.state.sessions.values()):
                assert time.monotonic() < deadline, "the holder's retrieval never started"
                await asyncio.sleep(0.02)
            held = len(alive)
            refused = await websockets.connect(chat_url(server.ws), open_timeout=60)
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(refused.recv(), timeout=30)
            assert refused.close_code == p.CLOSE_TRY_AGAIN, refused.close_reason
            assert await released(alive[held:]) == [], f"refused at capacity: {holders(alive[held:])}"
            await holder.close()
            assert await released(alive) == [], f"the session that held the slot: {holders(alive)}"
            alive.clear()

            monkeypatch.setattr(Batcher, "_slot_frame", break_slot_frame(FAULT_FRAME, injected_step_fault))
            faulted = await session(server, speech, FAULT_FRAME + 10, span_at=None, abort=False)
            assert faulted.close_code == p.CLOSE_INTERNAL, faulted.close_reason
            assert await released(alive) == [], f"closed by a fault: {holders(alive)}"

        asyncio.run(scenarios())
