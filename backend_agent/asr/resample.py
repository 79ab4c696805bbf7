"""24 kHz model audio -> 16 kHz ASR audio, without a resampling dependency."""

from __future__ import annotations

import numpy as np

_TAPS = 48


def _lowpass() -> np.ndarray:
    """Windowed-sinc low-pass at 8 kHz for the 48 kHz upsampled signal (gain 2 restores the zero-stuffed level)."""
    n = np.arange(-_TAPS, _TAPS + 1)
    cutoff = 7600 / 48000
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(len(n))
    return (2 * h / h.sum()).astype(np.float32)


_FILTER = _lowpass()


def resample_24k_to_16k(pcm: np.ndarray) -> np.ndarray:
    """Upsample by 2, low-pass, keep every third sample. Each call is independent (utterance-sized input)."""
    up = np.zeros(len(pcm) * 2, dtype=np.float32)
    up[::2] = pcm
    filtered = np.convolve(up, _FILTER, mode="same")
    return filtered[::3].astype(np.float32)


def to_int16_bytes(pcm: np.ndarray) -> bytes:
    return (np.clip(pcm, -1.0, 1.0) * 32767).astype("<i2").tobytes()
