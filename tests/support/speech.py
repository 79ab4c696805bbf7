"""Test speech: the product's synthesiser (espeak-ng, then sox to 24 kHz mono), also written to a WAV file."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from frontend_model.frame import SAMPLE_RATE
from frontend_model.training.speech import Voice, wav_pcm
from frontend_model.training.speech import speak as synthesise


def speak(text: str, path: Path, rate: int = SAMPLE_RATE, words_per_minute: int = 150) -> np.ndarray:
    pcm = synthesise(text, Voice("en-us", words_per_minute), rate)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((pcm * 32768.0).round().astype("<i2").tobytes())
    return wav_pcm(path.read_bytes())  # exactly what the file holds


def silence(seconds: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    return np.zeros(int(seconds * rate), dtype=np.float32)
