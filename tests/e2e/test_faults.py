"""Fault injection in a real server on loopback: one session's step raises (before the batched step, or inside its
row of the batched forward), the ASR raises, the worker wedges.

The first two run the server in its own process with the fault installed (benchmarks/fakes/faulty_server.py), so
the healthy session's deadlines are measured as in production; the wedged worker runs in process, where a test can
hold the stuck call and release it. Clients are real WebSocket clients streaming Ogg Opus in real time.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from benchmarks.fakes.faulty_server import break_slot_frame
from benchmarks.harness import StreamResult, stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import load_model
from server.batching.batcher import Batcher
from server.settings import ServerSettings
from server.wire import protocol as p

from .pace import assert_kept_pace
from .servers import RunningServer, in_process_server, pinned_settings, start_server, stop_server

pytestmark = pytest.mark.slow


def settings_for(tmp: Path, **overrides: Any) -> ServerSettings:
    return pinned_settings(recordings_dir=tmp / "rec", max_sessions=2, **overrides)


async def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def two_sessions(ws: str, pcm: np.ndarray, sessions: Callable[[], int]) -> tuple[StreamResult, StreamResult]:
    async def run() -> tuple[StreamResult, StreamResult]:
        first = asyncio.create_task(stream(chat_url(ws, events=True), pcm))
        await wait_for(lambda: sessions() == 1)
        second = asyncio.create_task(stream(chat_url(ws, events=True), pcm))
        return await first, await second

    return asyncio.run(run())


def active_sessions(server: RunningServer) -> Callable[[], int]:
    return lambda: int(httpx.get(f"{server.http}/api/info", timeout=5).json()["sessions"])


def test_a_step_that_raises_closes_that_session_only(tmp_path: Path, speech: np.ndarray) -> None:
    # Resume off: with it, our client resumes a session closed 1011 by itself (tests/e2e/test_resume.py), and this
    # test watches the close.
    server = start_server(tmp_path, "--max-sessions", "2", "--no-asr", "--resume-store", "off",
                          faults="step_raise@20")
    try:
        broken, healthy = two_sessions(server.ws, speech, active_sessions(server))
        info = httpx.get(f"{server.http}/api/info", timeout=5).json()
    finally:
        stop_server(server)
    assert broken.close_code == p.CLOSE_INTERNAL and json.loads(broken.close_reason)["error"] == "internal"
    assert 15 <= broken.audio_messages <= 21
    assert healthy.close_code in (None, p.CLOSE_NORMAL)
    assert_kept_pace(healthy, min_frames=60)
    assert info["free_slots"] == 2, "both slots came back"


def seeded_pair(ws: str, pcm: np.ndarray, sessions: Callable[[], int]) -> tuple[StreamResult, StreamResult]:
    """Two sessions, each with its own seeds, the second joining once the first streams; each goes on with silence
    until it has the output of every frame of `pcm` (or is closed), however far behind this host runs."""
    frames = len(pcm) // FRAME_SAMPLES

    def session(seed: int) -> Any:
        return stream(chat_url(ws, events=True, text_seed=str(seed), audio_seed=str(seed + 1)), pcm,
                      until=lambda r: r.audio_messages >= frames, until_timeout_s=300)

    async def run() -> tuple[StreamResult, StreamResult]:
        first = asyncio.create_task(session(11))
        await wait_for(lambda: sessions() == 1)
        second = asyncio.create_task(session(21))
        return await first, await second

    return asyncio.run(run())


def agent_audio(server: RunningServer, result: StreamResult) -> np.ndarray:
    """The agent channel of the session's recording (16-bit stereo WAV: user left, agent right)."""
    session_id = result.of_type("session.ready")[0].session_id
    data = (server.recordings / f"{session_id}.wav").read_bytes()[44:]
    return np.frombuffer(data, "<i2").reshape(-1, 2)[:, 1]


def run_pair(tmp: Path, pcm: np.ndarray, faults: str) -> tuple[StreamResult, StreamResult, np.ndarray, dict]:
    # Phases not aligned and no input frame dropped however late the server runs: the second session's input must
    # not depend on when it joined or on this host's speed, so that runs compare. Resume off: the close is watched.
    tmp.mkdir()
    server = start_server(tmp, "--max-sessions", "2", "--no-asr", "--no-align-phases", "--input-backlog-frames",
                          "10000", "--resume-store", "off", faults=faults)
    try:
        first, second = seeded_pair(server.ws, pcm, active_sessions(server))
        info = httpx.get(f"{server.http}/api/info", timeout=5).json()
    finally:
        stop_server(server)
    return first, second, agent_audio(server, second), info


@pytest.fixture(scope="module")
def without_fault(tmp_path_factory: pytest.TempPathFactory, speech: np.ndarray) -> tuple[StreamResult, np.ndarray]:
    """The second session of a seeded pair run without a fault, and its recorded agent audio."""
    _, second, audio, _ = run_pair(tmp_path_factory.mktemp("no-fault") / "run", speech, "")
    return second, audio


@pytest.mark.parametrize("fault", ["forward_raise", "forward_nan"])
def test_a_fault_inside_the_batched_forward_closes_that_session_only(
        tmp_path: Path, speech: np.ndarray, without_fault: tuple[StreamResult, np.ndarray], fault: str) -> None:
    """The first session's row raises (or turns NaN) inside the transformer forward of the batched step from its
    frame 20 on: it closes 1011 model_fault; the other session loses no frame and its output (same seeds, same
    audio) is exactly that of a run without the fault. (Its pace is the step_raise test's: here the host's speed
    must not matter.)"""
    clean, clean_audio = without_fault
    broken, healthy, healthy_audio, info = run_pair(tmp_path / "fault", speech, f"{fault}@20")
    assert broken.close_code == p.CLOSE_INTERNAL, broken.close_reason
    reason = json.loads(broken.close_reason)
    assert reason["error"] == "model_fault"
    assert ("InjectedFault" if fault == "forward_raise" else "NaN") in reason["message"]
    assert 15 <= broken.audio_messages <= 21
    assert healthy.close_code in (None, p.CLOSE_NORMAL)
    assert info["free_slots"] == 2, "both slots came back"
    shared = min(len(healthy.text_pieces), len(clean.text_pieces))  # what came before each client stopped reading
    assert healthy.text_pieces[:shared] == clean.text_pieces[:shared]
    samples = len(speech) // FRAME_SAMPLES * FRAME_SAMPLES
    assert len(healthy_audio) >= samples and len(clean_audio) >= samples
    # The same codes decoded in a batch of one row (the other session gone) or two differ by float rounding only:
    # a few LSB of 16-bit audio, where one code sampled otherwise would change whole frames.
    diff = np.abs(healthy_audio[:samples].astype(np.int32) - clean_audio[:samples])
    print(f"agent audio: max difference {diff.max()} LSB, {np.count_nonzero(diff)} samples of {samples} differ")
    assert diff.max() <= 4


def test_an_asr_that_raises_is_reported_and_every_session_keeps_pace(tmp_path: Path, speech: np.ndarray) -> None:
    server = start_server(tmp_path, "--max-sessions", "2", faults="asr_raise")
    try:
        results = two_sessions(server.ws, speech, active_sessions(server))
    finally:
        stop_server(server)
    for result in results:
        errors = [e for e in result.of_type("error") if e.code == "asr_failed"]
        assert errors and "injected ASR fault" in errors[0].message
        assert_kept_pace(result, min_frames=60)


def test_a_wedged_worker_is_restarted_and_its_slots_come_back(tmp_path: Path, speech: np.ndarray,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    # Resume off, as above: with it, our client resumes the sessions the restart closed (1011) once their slots are
    # free again, and this test watches the close.
    settings = settings_for(tmp_path, asr=False, worker_stall_s=1.0, resume_store="off")
    with in_process_server(settings, load_model("tiny")) as server:
        monkeypatch.setattr(Batcher, "_slot_frame", break_slot_frame(20, lambda: release.wait(60)))
        try:
            results = two_sessions(server.ws, speech, lambda: len(server.state.sessions))
            for result in results:
                assert result.close_code == p.CLOSE_INTERNAL, result.close_reason
                assert json.loads(result.close_reason)["error"] in ("worker_restarted", "internal")
            asyncio.run(wait_for(lambda: server.state.batcher is not None and server.state.batcher.free == 2,
                                 timeout=60))
            assert "contextspan_worker_restarts_total 1.0" in server.state.metrics.render().decode()
            after = asyncio.run(stream(chat_url(server.ws, events=True), speech[: 24000 * 2]))
            assert after.close_code in (None, p.CLOSE_NORMAL) and after.audio_messages >= 20
        finally:
            release.set()
