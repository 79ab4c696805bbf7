"""Test speech: espeak-ng says it, sox makes it 24 kHz mono float."""

from __future__ import annotations

import subprocess
import wave
from pathlib import Path

import numpy as np


def speak(text: str, path: Path, rate: int = 24000, words_per_minute: int = 150) -> np.ndarray:
    raw = path.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(words_per_minute), "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", str(rate), "-c", "1", "-b", "16", str(path)], check=True)
    raw.unlink()
    return read_wav(path)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        channels = w.getnchannels()
    pcm = data.astype(np.float32) / 32768.0
    return pcm.reshape(-1, channels)[:, 0] if channels > 1 else pcm


def silence(seconds: float, rate: int = 24000) -> np.ndarray:
    return np.zeros(int(seconds * rate), dtype=np.float32)
