"""Synthetic speech: espeak-ng says a sentence in a given voice and rate, sox makes it 24 kHz mono float (undithered:
the same samples every time).

Product code because `contextspan train` speaks its training questions with it; tests and benchmarks speak
held-out questions with the same helper (other sentences, another voice).
"""

from __future__ import annotations

import io
import subprocess
import wave
from dataclasses import dataclass

import numpy as np

from frontend_model.frame import SAMPLE_RATE


@dataclass(frozen=True)
class Voice:
    """An espeak-ng voice (`en-us`, `en-gb+f3`, ...), its speaking rate in words a minute and its pitch (0-99)."""

    name: str
    words_per_minute: int = 150
    pitch: int = 50

    def label(self) -> str:
        return f"{self.name}@{self.words_per_minute}wpm/p{self.pitch}"


class SpeechError(RuntimeError):
    """espeak-ng or sox is missing or failed; the message says which and how to install it."""


def speak(text: str, voice: Voice, rate: int = SAMPLE_RATE) -> np.ndarray:
    """float32 mono PCM in [-1, 1] at `rate`."""
    espeak = ["espeak-ng", "-v", voice.name, "-s", str(voice.words_per_minute), "-p", str(voice.pitch), "--stdout",
              text]
    # No dither (-D): sox's is random, and an Opus round trip turns a one-bit difference into other codes.
    sox = ["sox", "-D", "-t", "wav", "-", "-r", str(rate), "-c", "1", "-b", "16", "-t", "wav", "-"]
    try:
        raw = subprocess.run(espeak, check=True, capture_output=True).stdout
        wav = subprocess.run(sox, input=raw, check=True, capture_output=True).stdout
    except FileNotFoundError as exc:
        raise SpeechError(f"{exc.filename} is not installed (apt-get install espeak-ng sox)") from exc
    except subprocess.CalledProcessError as exc:
        raise SpeechError(f"{exc.cmd[0]} failed on {text!r}: {exc.stderr.decode(errors='replace')[-300:]}") from exc
    return wav_pcm(wav)


def wav_pcm(data: bytes) -> np.ndarray:
    """16-bit WAV bytes -> float32 mono."""
    with wave.open(io.BytesIO(data), "rb") as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        channels = w.getnchannels()
    pcm = samples.astype(np.float32) / 32768.0
    return pcm.reshape(-1, channels)[:, 0] if channels > 1 else pcm


def level(pcm: np.ndarray, rms: float) -> np.ndarray:
    """Scaled to a target RMS (clipped to [-1, 1]): training speech at the loudness the server feeds its model."""
    current = float(np.sqrt(np.mean(np.square(pcm)))) if pcm.size else 0.0
    if current < 1e-6:
        return pcm
    return np.clip(pcm * (rms / current), -1.0, 1.0).astype(np.float32)
