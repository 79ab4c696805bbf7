"""Recordings: a valid stereo WAV and a line-per-event transcript at every flush, even after a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from server.ops.recording import SessionRecording, StereoWavWriter, TranscriptWriter, recording_path

FRAME = 1920


def read_wav(path: Path) -> tuple[int, np.ndarray]:
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, 24000)
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    return len(data), data


def test_stereo_layout_and_header_at_each_flush(tmp_path: Path) -> None:
    writer = StereoWavWriter(tmp_path / "a.wav", flush_interval_s=3600)
    user, agent = np.full(FRAME, 0.5, np.float32), np.full(FRAME, -0.25, np.float32)
    writer.write(user, agent)
    assert read_wav(tmp_path / "a.wav")[0] == 0  # nothing flushed yet, but already a valid file
    writer.write(user, agent)
    writer.flush()
    frames, data = read_wav(tmp_path / "a.wav")
    assert frames == 2 * FRAME and writer.seconds == 0.16
    assert data[0, 0] == 16383 and data[0, 1] == -8191  # left user, right agent
    writer.close()
    writer.close()


def test_transcript_lines_and_download_paths(tmp_path: Path) -> None:
    rec = SessionRecording(tmp_path, "20261130T000000Z-0123abcd")
    rec.transcript.write({"type": "session.ready", "t": 0.0})
    rec.tick()
    assert json.loads((tmp_path / "20261130T000000Z-0123abcd.jsonl").read_text())["type"] == "session.ready"
    rec.close()
    assert recording_path(tmp_path, "20261130T000000Z-0123abcd", ".wav") is not None
    assert recording_path(tmp_path, "../etc/passwd", ".wav") is None
    assert recording_path(tmp_path, "20261130T000000Z-0123abcd", ".py") is None


@pytest.mark.slow
def test_killed_process_loses_at_most_a_second(tmp_path: Path) -> None:
    """A writer fed frame by frame in real time, then SIGKILLed: the WAV is valid and nearly complete."""
    script = textwrap.dedent(f"""
        import sys, time
        import numpy as np
        from pathlib import Path
        from server.ops.recording import StereoWavWriter, TranscriptWriter
        wav = StereoWavWriter(Path({str(tmp_path / 'k.wav')!r}))
        log = TranscriptWriter(Path({str(tmp_path / 'k.jsonl')!r}))
        start = time.perf_counter()
        for i in range(1000):
            time.sleep(max(0.0, start + i * 0.08 - time.perf_counter()))
            wav.write(np.zeros({FRAME}, np.float32), np.zeros({FRAME}, np.float32))
            log.write({{"frame": i}})
            if i == 3:
                print("started", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"started"
    started = time.perf_counter() - 4 * 0.08
    time.sleep(2.5)
    os.kill(proc.pid, signal.SIGKILL)
    elapsed = time.perf_counter() - started
    proc.wait()
    frames, _ = read_wav(tmp_path / "k.wav")
    assert elapsed - 1.0 - 0.1 <= frames / 24000 <= elapsed + 0.1
    lines = (tmp_path / "k.jsonl").read_text().splitlines()
    assert len(lines) * 0.08 >= elapsed - 1.1
    json.loads(lines[-1])


def test_transcript_writer_after_close_is_a_no_op(tmp_path: Path) -> None:
    writer = TranscriptWriter(tmp_path / "t.jsonl")
    writer.close()
    writer.write({"late": True})
    assert (tmp_path / "t.jsonl").read_text() == ""
