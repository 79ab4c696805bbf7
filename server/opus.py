"""Ogg Opus streams via sphn, with the failure handling a network-facing decoder needs."""

from __future__ import annotations

import numpy as np
import sphn

from frontend_model.loading import FRAME_SAMPLES, SAMPLE_RATE
from server.protocol import ProtocolError


class OpusDecoder:
    """Client Ogg Opus bytes -> 24 kHz float32 PCM.

    sphn's reader keeps unparsable bytes in its buffer and then fails on every later call, so a bad message
    resets it; a fresh reader decodes later pages without the stream headers, and the session goes on.
    """

    def __init__(self) -> None:
        self._reader = sphn.OpusStreamReader(SAMPLE_RATE)

    def decode(self, ogg_bytes: bytes) -> np.ndarray:
        try:
            pcm = self._reader.append_bytes(ogg_bytes)
        except Exception as exc:  # sphn raises ValueError or RuntimeError from its Rust core
            self._reader = sphn.OpusStreamReader(SAMPLE_RATE)
            raise ProtocolError("bad_audio", f"could not decode Ogg Opus: {exc}") from None
        return np.asarray(pcm, dtype=np.float32).reshape(-1)


class OpusEncoder:
    """80 ms frames of 24 kHz PCM -> Ogg pages (the first call also carries the stream headers)."""

    def __init__(self) -> None:
        self._writer = sphn.OpusStreamWriter(SAMPLE_RATE)

    def encode(self, pcm: np.ndarray) -> bytes:
        if pcm.shape != (FRAME_SAMPLES,):
            raise ValueError(f"expected {FRAME_SAMPLES} samples, got {pcm.shape}")
        return bytes(self._writer.append_pcm(np.ascontiguousarray(pcm, dtype=np.float32)))
