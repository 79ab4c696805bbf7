"""Ogg Opus streams via sphn, with the failure handling a network-facing decoder needs."""

from __future__ import annotations

import numpy as np
import sphn

from frontend_model.loading import FRAME_SAMPLES, SAMPLE_RATE
from server.protocol import ProtocolError


def _whole_pages(data: bytes) -> bool:
    """True when `data` is a run of complete Ogg pages (capture pattern, version 0, lengths that add up)."""
    offset = 0
    while offset < len(data):
        header_end = offset + 27
        if data[offset : offset + 5] != b"OggS\x00" or header_end > len(data):
            return False
        lacing_end = header_end + data[header_end - 1]
        if lacing_end > len(data):
            return False
        offset = lacing_end + sum(data[header_end:lacing_end])
    return offset == len(data)


class OpusDecoder:
    """Client Ogg Opus bytes -> 24 kHz float32 PCM.

    A message must hold whole Ogg pages, as Moshi clients send them; other messages never reach the reader.
    sphn's reader keeps unparsable bytes in its buffer and then fails on every later call, so a bad message
    resets it; a fresh reader decodes later pages without the stream headers, and the session goes on.
    """

    def __init__(self) -> None:
        self._reader = sphn.OpusStreamReader(SAMPLE_RATE)

    def decode(self, ogg_bytes: bytes) -> np.ndarray:
        if not _whole_pages(ogg_bytes):
            # Fed to the reader, a bogus page header would make it swallow the next pages (up to 64 KiB) silently.
            raise ProtocolError("bad_audio", "an audio message must hold whole Ogg pages")
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
