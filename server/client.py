"""A small Python client of the /api/chat protocol, streaming PCM as Ogg Opus in real time.

The e2e tests and the benchmarks use it; it speaks exactly what a Moshi client speaks, plus the opt-in JSON events
when asked. The benchmarks also start their server and make their speech with the helpers at the end.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import sphn
import websockets

from server import protocol as p
from server.protocol import FRAME_SAMPLES, SAMPLE_RATE

DRAIN_LIMIT_S = 60.0


@dataclass
class StreamResult:
    handshake_s: float | None = None  # seconds from connect to the handshake
    frames_sent: int = 0
    audio_messages: int = 0
    output_samples: int = 0
    text_pieces: list[str] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""

    @property
    def output_seconds(self) -> float:
        return self.output_samples / SAMPLE_RATE

    def of_type(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]


def free_port() -> int:
    """A loopback port free right now, for servers started by tests and benchmarks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chat_url(base: str, events: bool = False, **query: str) -> str:
    params = dict(query, **({"events": "1"} if events else {}))
    suffix = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{base}/api/chat" + (f"?{suffix}" if suffix else "")


async def stream(
    url: str,
    pcm: np.ndarray,
    tail_s: float = 0.6,
    pause_reading_s: tuple[float, float] | None = None,
    token: str | None = None,
    page_samples: int = FRAME_SAMPLES,
    start_at: float | None = None,
    until: Callable[[StreamResult], bool] | None = None,
    until_timeout_s: float = 30.0,
    texts: Sequence[tuple[float, str]] = (),
) -> StreamResult:
    """Send `pcm` (24 kHz float32) as Ogg Opus, `page_samples` at a time (default one 80 ms frame; a divisor of
    it, at least 960, for shorter pages), paced by an absolute schedule, and collect everything the server sends
    until its audio has been quiet for `tail_s` after the last frame (a server behind real time on a slow host is
    still answering: at most DRAIN_LIMIT_S more), or until the server closes.

    `pause_reading_s=(start, length)` stops reading for `length` seconds from `start`, as a stalled client.
    `token` is a session token from POST /api/token, sent as an app does: `Authorization: Bearer`.
    `start_at` (a `time.perf_counter()` value) starts sending then instead of right after the handshake.
    `until`: after `pcm`, keep the session going with silence until `until(result)` holds (at most
    `until_timeout_s`), e.g. until an answer the client waits for has come, however long this host takes.
    `texts` are (seconds into the audio, JSON text message) pairs, e.g. a `span.inject`, sent at those times.
    """
    if FRAME_SAMPLES % page_samples or page_samples < 960:
        raise ValueError(f"page_samples must divide {FRAME_SAMPLES} and be at least 960 (sphn's Opus page)")
    pages_per_frame = FRAME_SAMPLES // page_samples
    result = StreamResult()
    writer, reader = sphn.OpusStreamWriter(SAMPLE_RATE), sphn.OpusStreamReader(SAMPLE_RATE)
    frames = len(pcm) // FRAME_SAMPLES
    t0 = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with websockets.connect(url, max_size=2**22, open_timeout=30, additional_headers=headers) as ws:
        first = await asyncio.wait_for(ws.recv(), timeout=120)
        while isinstance(first, str) and isinstance(preparing := p.decode_event(first), p.SessionPreparing):
            result.events.append(preparing)  # a long prefill, with events on
            first = await asyncio.wait_for(ws.recv(), timeout=120)
        if first != p.handshake():
            raise AssertionError(f"expected the handshake first, got {first[:20]!r}")
        result.handshake_s = time.perf_counter() - t0

        async def send() -> None:
            start = time.perf_counter() if start_at is None else start_at
            silence = np.zeros(page_samples, np.float32)
            pending = sorted(texts)
            give_up = math.inf
            i = 0
            while True:
                if i < frames * pages_per_frame:
                    page = pcm[i * page_samples : (i + 1) * page_samples].astype(np.float32)
                elif until is not None and not until(result) and time.perf_counter() < give_up:
                    give_up = min(give_up, time.perf_counter() + until_timeout_s)
                    page = silence
                else:
                    return
                await asyncio.sleep(max(0.0, start + i * page_samples / SAMPLE_RATE - time.perf_counter()))
                try:
                    while pending and pending[0][0] <= i * page_samples / SAMPLE_RATE:
                        await ws.send(pending.pop(0)[1])
                    await ws.send(p.audio_message(writer.append_pcm(page)))
                except websockets.ConnectionClosed:
                    return  # the server ended the session: what it sent, and its close code, are the result
                i += 1
                if i % pages_per_frame == 0:
                    result.frames_sent += 1

        last_audio = time.perf_counter()

        async def receive() -> None:
            nonlocal last_audio
            start = time.perf_counter()
            paused = False
            async for message in ws:
                if pause_reading_s and not paused and time.perf_counter() - start >= pause_reading_s[0]:
                    paused = True
                    await asyncio.sleep(pause_reading_s[1])
                if isinstance(message, str):
                    result.events.append(p.decode_event(message))
                    continue
                kind, payload = p.decode_binary(message)
                if kind == p.Kind.AUDIO:
                    last_audio = time.perf_counter()
                    result.audio_messages += 1
                    result.output_samples += int(np.asarray(reader.append_bytes(payload)).size)
                elif kind == p.Kind.TEXT:
                    result.text_pieces.append(payload.decode("utf-8"))

        receiver = asyncio.create_task(receive())
        try:
            await send()
            sent = time.perf_counter()
            while ws.close_code is None and time.perf_counter() - sent < DRAIN_LIMIT_S:
                quiet_until = max(last_audio, sent) + tail_s
                if time.perf_counter() >= quiet_until:
                    break
                await asyncio.sleep(quiet_until - time.perf_counter())
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    result.close_code = ws.close_code
    result.close_reason = ws.close_reason or ""
    return result


def load_wav(path: str) -> np.ndarray:
    """Any audio file -> 24 kHz mono float32."""
    data, _ = sphn.read(path, sample_rate=SAMPLE_RATE)
    return np.asarray(data, dtype=np.float32).mean(axis=0)


def speak(text: str, wav: Path) -> np.ndarray:
    """espeak-ng says `text` into `wav`; returns it as 24 kHz mono float32."""
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True)
    return load_wav(str(wav))


def start_server(workdir: Path, *flags: str, ready_timeout: float = 300.0, module: str = "server.cli",
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m module serve *flags` (`contextspan serve`) on a free loopback port, from the repository root,
    logging to workdir/server.log; returns the process and its http:// URL once /readyz says ready.
    Fails as soon as the process exits or /readyz reports a model load error."""
    port = free_port()
    cmd = [sys.executable, "-m", module, "serve", "--port", str(port), *flags]
    log = workdir / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1],
                                   env=dict(os.environ, NO_TORCH_COMPILE="1", **(env or {})))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            ready = httpx.get(f"{url}/readyz", timeout=1)
        except httpx.HTTPError:
            ready = None
        if ready is not None and ready.status_code == 200:
            return process, url
        if ready is not None and ready.json().get("load_error"):  # the model will not load: waiting cannot help
            stop_server(process)
            raise RuntimeError(f"server could not load its model: {ready.json()['load_error']}")
        time.sleep(0.3)
    stop_server(process)
    raise RuntimeError(f"server not ready within {ready_timeout:.0f} s: {log.read_text()[-2000:]}")


def stop_server(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM lets uvicorn close the sessions and the ASR process; SIGKILL only if that hangs."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
