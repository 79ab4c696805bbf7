"""A prefill made slow on purpose (12 s) does not lose a client that closes after 10 s of silence.

The server's prefill path is slowed by the `slow_prefill` fault (benchmarks/fakes/faulty_server.py); the clients are
`websockets` connections with an idle timer of 10 s, as Kyutai's web client has once it streams. A binary Moshi
client hears WebSocket pings (a control frame its library answers by itself) and nothing else until the `0x00`
handshake; a JSON-events client, modelled as a browser page that cannot see pings, hears `session.preparing`, and
the demo page shows it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import sphn
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.frames import Frame, Opcode

from benchmarks.harness import stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire import protocol as p

from .servers import RunningServer, start_server, stop_server

pytestmark = pytest.mark.slow

IDLE_S = 10.0
PREFILL_DELAY_S = 12.0


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The default ping interval, what a server does out of the box; a pong deadline shorter than the prefill, so
    that a socket that stops reading pongs during it is closed (1011) within it."""
    running = start_server(tmp_path_factory.mktemp("keepalive"), "--max-sessions", "1", "--no-asr",
                           "--keepalive-timeout-s", "3", faults=f"slow_prefill@{PREFILL_DELAY_S:g}")
    yield running
    stop_server(running)


@pytest.fixture(autouse=True)
def free_slot(slow_server: RunningServer) -> None:
    """One slot: the previous test's session frees it once its teardown has run (its own prefill included), which a
    slow host takes a while to do. Each test starts when /readyz says a slot is free, not refused 1013."""
    deadline = time.monotonic() + 60
    while httpx.get(f"{slow_server.http}/readyz", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "no slot came free within 60 s"
        time.sleep(0.1)


class IdleClosingConnection(ClientConnection):
    """A client connection that notes every frame the server sends; `hears_pings` False counts only messages, as
    a page's `onmessage` does (browsers answer pings without telling the page)."""

    hears_pings = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_heard = time.monotonic()
        self.pings = 0

    def process_event(self, event: Any) -> None:
        super().process_event(event)
        if not isinstance(event, Frame):
            return
        if event.opcode is Opcode.PING:
            self.pings += 1
        if event.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT) or (self.hears_pings and
                                                                        event.opcode is Opcode.PING):
            self.last_heard = time.monotonic()


class PageConnection(IdleClosingConnection):
    hears_pings = False


@dataclass
class Outcome:
    handshake_s: float | None = None
    longest_silence_s: float = 0.0
    before_handshake: list[str | bytes] = field(default_factory=list)
    after_handshake: list[str | bytes] = field(default_factory=list)
    pings: int = 0
    closed_idle: bool = False
    close_code: int | None = None


async def converse(url: str, connection: type[IdleClosingConnection], early: Sequence[str | bytes] = ()) -> Outcome:
    """Send `early` at once, wait for the handshake with a 10 s idle timer, then send 1 s of audio and read until
    agent audio comes."""
    outcome = Outcome()
    t0 = time.monotonic()
    # No pings of its own: their pongs would reset the idle timer without the server saying anything.
    async with websockets.connect(url, create_connection=connection, ping_interval=None, open_timeout=30) as ws:
        assert isinstance(ws, IdleClosingConnection)

        async def watch_idle() -> None:
            while True:
                await asyncio.sleep(0.1)
                silence = time.monotonic() - ws.last_heard
                outcome.longest_silence_s = max(outcome.longest_silence_s, silence)
                if silence > IDLE_S:
                    outcome.closed_idle = True
                    await ws.close(1000, "idle")
                    return

        watcher = asyncio.create_task(watch_idle())
        try:
            for message in early:
                await ws.send(message)
            while (message := await asyncio.wait_for(ws.recv(), 60)) != p.handshake():
                outcome.before_handshake.append(message)
            outcome.handshake_s = time.monotonic() - t0
            writer = sphn.OpusStreamWriter(SAMPLE_RATE)
            for _ in range(13):
                await ws.send(p.audio_message(writer.append_pcm(np.zeros(FRAME_SAMPLES, np.float32))))
            while not any(isinstance(m, bytes) and m[:1] == bytes([p.Kind.AUDIO]) for m in outcome.after_handshake):
                outcome.after_handshake.append(await asyncio.wait_for(ws.recv(), 60))
        except websockets.ConnectionClosed as exc:
            outcome.close_code = exc.rcvd.code if exc.rcvd else None
        finally:
            watcher.cancel()
        outcome.pings = ws.pings
    return outcome


def test_binary_client_hears_only_pings_until_the_handshake(slow_server: RunningServer) -> None:
    outcome = asyncio.run(converse(f"{slow_server.ws}/api/chat", IdleClosingConnection))
    assert not outcome.closed_idle, outcome
    assert outcome.handshake_s is not None and outcome.handshake_s >= PREFILL_DELAY_S, outcome
    assert outcome.before_handshake == [], "a binary client must hear nothing but pings before 0x00"
    assert outcome.pings >= 2, outcome
    assert outcome.longest_silence_s < IDLE_S, outcome
    kinds = {m[0] for m in outcome.after_handshake if isinstance(m, bytes)}
    assert p.Kind.AUDIO in kinds, outcome
    assert all(isinstance(m, bytes) for m in outcome.after_handshake), "no JSON for a client that did not ask"


def test_events_client_hears_session_preparing(slow_server: RunningServer) -> None:
    outcome = asyncio.run(converse(f"{slow_server.ws}/api/chat?events=1", PageConnection))
    assert not outcome.closed_idle, outcome
    assert outcome.handshake_s is not None and outcome.handshake_s >= PREFILL_DELAY_S, outcome
    events = [p.decode_event(m) for m in outcome.before_handshake if isinstance(m, str)]
    assert len(events) == len(outcome.before_handshake) >= 2, outcome
    assert all(isinstance(e, p.SessionPreparing) and e.stage == "prefill" and e.prefix_frames is not None
               for e in events), events
    elapsed = [e.elapsed_s for e in events if isinstance(e, p.SessionPreparing)]
    assert elapsed == sorted(elapsed), elapsed
    ready = [p.decode_event(m) for m in outcome.after_handshake if isinstance(m, str)]
    assert isinstance(ready[0], p.SessionReady), ready



def test_messages_sent_before_the_handshake_keep_the_pongs_flowing(slow_server: RunningServer) -> None:
    """uvicorn stops reading a socket while a message waits unread, pongs included: the session reads what comes
    before its handshake, so the pong deadline (3 s here) does not close it, and handles it first once streaming."""
    page = p.audio_message(sphn.OpusStreamWriter(SAMPLE_RATE).append_pcm(np.zeros(FRAME_SAMPLES, np.float32)))
    outcome = asyncio.run(converse(f"{slow_server.ws}/api/chat?events=1", PageConnection, [page, "not json"]))
    assert outcome.close_code is None and not outcome.closed_idle, outcome
    assert outcome.handshake_s is not None and outcome.handshake_s >= PREFILL_DELAY_S, outcome
    events = [p.decode_event(m) for m in outcome.after_handshake if isinstance(m, str)]
    assert isinstance(events[0], p.SessionReady), events
    assert [e.code for e in events if isinstance(e, p.ErrorEvent)] == ["invalid_json"], events


def test_web_client_shows_preparing_then_goes_live(slow_server: RunningServer, browser: object) -> None:
    """The demo page (events on) shows `session.preparing` in its state and goes live at the handshake."""
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(slow_server.http + "/")  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20  # hang guards, here and below
    while "random weights" not in driver.find_element(By.ID, "model").text:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the page never showed the model"
        time.sleep(0.2)
    driver.find_element(By.ID, "start").click()  # type: ignore[attr-defined]
    states: list[str] = []
    deadline = time.monotonic() + PREFILL_DELAY_S + 60
    while not states or states[-1] not in ("live", "error", "stopped"):
        assert time.monotonic() < deadline, states
        state = driver.execute_script("return window.csStats.state")  # type: ignore[attr-defined]
        if not states or states[-1] != state:
            states.append(state)
        time.sleep(0.2)
    stats = driver.execute_script("return window.csStats")  # type: ignore[attr-defined]
    assert states[-1] == "live" and stats["handshake"] and not stats["error"], (states, stats)
    assert any(state.startswith("preparing: prefill") for state in states), states
    driver.find_element(By.ID, "stop").click()  # type: ignore[attr-defined]


def test_python_client_waits_through_session_preparing(slow_server: RunningServer) -> None:
    result = asyncio.run(stream(chat_url(slow_server.ws, events=True), np.zeros(SAMPLE_RATE, np.float32)))
    assert len(result.of_type("session.preparing")) >= 2 and result.of_type("session.ready"), result.events[:4]
    assert result.audio_messages > 0 and result.close_code in (None, p.CLOSE_NORMAL), result
