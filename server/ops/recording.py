"""Per-session recordings that survive an abrupt end: a stereo WAV and a JSONL event transcript.

Both files are written as the session runs and flushed at least once a second; the WAV header's sizes are
rewritten at each flush, so a killed process leaves a valid file missing at most the last second.
"""

from __future__ import annotations

import json
import re
import struct
import time
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import numpy as np

from frontend_model.frame import SAMPLE_RATE

SESSION_ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$")
_HEADER_BYTES = 44


def wav_header(data_bytes: int, channels: int = 2, sample_rate: int = SAMPLE_RATE) -> bytes:
    """A 16-bit PCM RIFF header for `data_bytes` of samples."""
    block = channels * 2
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", 36 + data_bytes, b"WAVE", b"fmt ", 16, 1, channels, sample_rate,
        sample_rate * block, block, 16, b"data", data_bytes,
    )


def to_int16(pcm: np.ndarray) -> np.ndarray:
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2")


class StereoWavWriter:
    """Left channel the user, right channel the agent, one 80 ms frame pair at a time."""

    def __init__(self, path: Path, flush_interval_s: float = 1.0) -> None:
        self.path = path
        self._file: BinaryIO = path.open("wb")
        self._file.write(wav_header(0))
        self._file.flush()
        self._data_bytes = 0
        self._pending: list[bytes] = []
        self._flush_interval = flush_interval_s
        self._last_flush = time.monotonic()

    def write(self, user: np.ndarray, agent: np.ndarray) -> None:
        if user.shape != agent.shape:
            raise ValueError(f"user {user.shape} and agent {agent.shape} frames differ")
        frames = np.stack([to_int16(user), to_int16(agent)], axis=1)
        self._pending.append(frames.tobytes())
        if time.monotonic() - self._last_flush >= self._flush_interval:
            self.flush()

    def flush(self) -> None:
        if self._file.closed:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._file.seek(0, 2)
        self._file.write(data)
        self._data_bytes += len(data)
        self._file.seek(0)
        self._file.write(wav_header(self._data_bytes))
        self._file.flush()
        self._last_flush = time.monotonic()

    @property
    def seconds(self) -> float:
        return (self._data_bytes + sum(map(len, self._pending))) / (4 * SAMPLE_RATE)

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()


class TranscriptWriter:
    """One JSON object per line (event plus wall time), so a truncated file is still readable line by line."""

    def __init__(self, path: Path, flush_interval_s: float = 1.0) -> None:
        self.path = path
        self._file: TextIO = path.open("w", encoding="utf-8")
        self._flush_interval = flush_interval_s
        self._last_flush = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        if self._file.closed:
            return
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        if time.monotonic() - self._last_flush >= self._flush_interval:
            self.flush()

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class SessionRecording:
    """The pair of files for one session, named by its id inside the recordings directory."""

    def __init__(self, directory: Path, session_id: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.wav = StereoWavWriter(directory / f"{session_id}.wav")
        self.transcript = TranscriptWriter(directory / f"{session_id}.jsonl")

    def tick(self) -> None:
        """Called once a second so that quiet periods are flushed too."""
        self.wav.flush()
        self.transcript.flush()

    def close(self) -> None:
        self.wav.close()
        self.transcript.close()


def recording_path(directory: Path, session_id: str, suffix: str) -> Path | None:
    """The file for a download request, or None: ids are validated so no path can leave the directory."""
    if suffix not in (".wav", ".jsonl") or not SESSION_ID_RE.fullmatch(session_id):
        return None
    path = directory / f"{session_id}{suffix}"
    return path if path.is_file() else None
