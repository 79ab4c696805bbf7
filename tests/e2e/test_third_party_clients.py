"""Third-party Moshi clients, unmodified, against a real server on loopback.

fujielab-moshi-client 0.1.2 (PyPI) is a headless Python client: its `MoshiClient` takes PCM and hands back PCM
and text, with no sound device. It builds its own Ogg pages (opuslib packets of 80 ms, one page a message, the
headers in their own messages after the handshake, a lacing value capped at 255) and sends Kyutai's sampling
query parameters with seeds fixed at 42.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE

from .servers import RunningServer
from .test_server_stream import wait_for_wav

pytestmark = pytest.mark.slow
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
SAMPLING = {"text_temperature": 0.5, "text_topk": 10, "audio_temperature": 0.6, "audio_topk": 100}


def test_fujielab_moshi_client(server: RunningServer, speech: np.ndarray) -> None:
    # Imported here, not at collection: its module calls logging.basicConfig, which would set up the root logger
    # of the whole test process.
    from fujielab.moshi.moshi_client_lib import MoshiClient

    client = MoshiClient(**SAMPLING)
    client.connect(f"{server.ws}/api/chat")
    frames = len(speech) // FRAME_SAMPLES
    received, texts = 0, []

    def drain() -> None:
        nonlocal received
        while (chunk := client.get_audio_output(timeout=0)) is not None:
            received += chunk.size
        while (text := client.get_text_output(timeout=0)) is not None:
            texts.append(text)

    try:
        start = time.perf_counter()
        for i in range(frames):  # real time, on an absolute schedule, as a microphone would deliver it
            time.sleep(max(0.0, start + i * FRAME_S - time.perf_counter()))
            client.add_audio_input(speech[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES])
            drain()
        deadline = time.monotonic() + 60  # a hang guard; a loaded host answers late, not less
        while received < (frames - 2) * FRAME_SAMPLES and client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.2)
            drain()
        assert client.is_connected(), "the server closed the session"
    finally:
        client.disconnect()

    transcripts = list(server.recordings.glob("*.jsonl"))
    assert len(transcripts) == 1, transcripts
    events = [json.loads(line) for line in transcripts[0].read_text().splitlines()]
    assert [e for e in events if e["type"] == "error"] == []  # no bad_audio, no too_many_errors
    ready = next(e for e in events if e["type"] == "session.ready")
    assert ready["sampling"] == {**SAMPLING, "text_seed": 42, "audio_seed": 42}
    assert ready["unsupported"] == {"pad_mult": 0.0, "repetition_penalty": 1.0, "repetition_penalty_context": 64.0}
    # What the server decoded: the recording's user channel, a frame for each frame it stepped.
    wav_frames = wait_for_wav(transcripts[0].with_suffix(".wav"), frames * FRAME_S) / FRAME_S
    stats = [e for e in events if e["type"] == "stats"]
    dropped = {k: stats[-1][k] for k in ("input_dropped", "audio_dropped")} if stats else {}  # running totals
    # One frame out for each frame in; the client's last page may wait in its encoder's buffer or be in flight.
    assert frames - 2 <= wav_frames <= frames, (wav_frames, frames, dropped)
    assert frames - 2 <= received / FRAME_SAMPLES <= frames, (received / FRAME_SAMPLES, wav_frames, frames, dropped)
    assert texts, "no agent text reached the client"
