"""Limits against a real server: duration cap with warning, connections per address, message rate, abuse."""

from __future__ import annotations

import asyncio
import json
import time
import wave
from collections.abc import Iterator

import numpy as np
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from benchmarks.harness import stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES
from server.wire import protocol as p

from .servers import RunningServer, start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("limited"), "--max-sessions", "2", "--max-session-s", "3",
                           "--session-end-warning-s", "1", "--max-connections-per-ip", "2",
                           "--max-messages-per-s", "25", "--max-protocol-errors", "5", "--no-asr")
    yield running
    stop_server(running)


def test_duration_cap_warns_then_closes_and_keeps_the_recording(limited: RunningServer, speech: np.ndarray) -> None:
    result = asyncio.run(stream(chat_url(limited.ws, events=True), speech))  # 5.7 s of speech, 3 s allowed
    ending = result.of_type("session.ending")
    assert len(ending) == 1 and ending[0].reason == "max_duration" and ending[0].in_s == pytest.approx(1.0)
    assert 1.5 < ending[0].t < 2.6, ending[0].t
    assert result.close_code == p.CLOSE_NORMAL and json.loads(result.close_reason)["error"] == "max_duration"
    assert result.frames_sent < len(speech) // FRAME_SAMPLES
    session_id = result.of_type("session.ready")[0].session_id
    wav_path = limited.recordings / f"{session_id}.wav"
    deadline = time.monotonic() + 10
    while not (limited.recordings / f"{session_id}.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    with wave.open(str(wav_path)) as wav:
        seconds = wav.getnframes() / wav.getframerate()
    assert 2.5 < seconds < 3.5, seconds
    lines = [json.loads(line) for line in (limited.recordings / f"{session_id}.jsonl").read_text().splitlines()]
    assert any(line.get("type") == "session.ending" for line in lines)


def test_connections_per_address(limited: RunningServer) -> None:
    async def run() -> int:
        url = chat_url(limited.ws)
        async with websockets.connect(url) as first, websockets.connect(url) as second:
            assert await first.recv() == p.handshake() and await second.recv() == p.handshake()
            with pytest.raises(InvalidStatus) as info:
                async with websockets.connect(url):
                    pass
            assert json.loads(info.value.response.body or b"{}")["error"] == "too_many_connections"
            return info.value.response.status_code

    assert asyncio.run(run()) == 429
    time.sleep(0.5)
    assert asyncio.run(closes_with(limited, [])) is None, "the count went down when they left"


async def closes_with(server: RunningServer, messages: list[bytes | str], wait_s: float = 1.0) -> int | None:
    """Sends `messages` as fast as possible after the handshake; the close code, or None if still open."""
    async with websockets.connect(chat_url(server.ws)) as ws:
        assert await asyncio.wait_for(ws.recv(), timeout=30) == p.handshake()
        try:
            for message in messages:
                await ws.send(message)
            await asyncio.wait_for(drain(ws), timeout=wait_s)
        except (websockets.ConnectionClosed, TimeoutError):
            pass
        return ws.close_code


async def drain(ws: websockets.ClientConnection) -> None:
    async for _ in ws:
        pass


def test_message_flood_closes_1008(limited: RunningServer) -> None:
    assert asyncio.run(closes_with(limited, [p.audio_message(b"")] * 200)) == p.CLOSE_POLICY


def test_a_few_bad_messages_are_reported_and_the_session_goes_on(limited: RunningServer) -> None:
    bad: list[bytes | str] = [b"\x07junk", "{not json", json.dumps({"type": "nope"})]
    assert asyncio.run(closes_with(limited, bad)) is None


@pytest.mark.parametrize(("message", "code"), [(b"\x07junk", p.CLOSE_UNSUPPORTED), (b"", p.CLOSE_UNSUPPORTED),
                                               ("{not json", p.CLOSE_BAD_DATA),
                                               (p.audio_message(b"OggS" + bytes(60)), p.CLOSE_BAD_DATA)])
def test_repeated_bad_messages_close(limited: RunningServer, message: bytes | str, code: int) -> None:
    assert asyncio.run(closes_with(limited, [message] * 6)) == code
