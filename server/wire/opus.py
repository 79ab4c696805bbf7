"""Ogg Opus streams via sphn, with the failure handling a network-facing decoder needs."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import sphn

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire.protocol import ProtocolError

_HEADER = 27  # fixed part of an Ogg page header; byte 26 counts the lacing values that follow
_CONTINUED = 0x01  # header_type flag: the page's first packet continues one from the previous page
_REVERSED_BITS = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def ogg_crc(data: bytes) -> int:
    """Ogg's page checksum (CRC-32, polynomial 0x04C11DB7, MSB first, no pre or post inversion) at zlib's speed.

    zlib computes the bit-reflected CRC-32 with inversions; reflecting the input bytes and the result and
    cancelling the inversions (XOR with the CRC of as many zero bytes) gives Ogg's."""
    reflected = zlib.crc32(data.translate(_REVERSED_BITS)) ^ zlib.crc32(bytes(len(data)))
    return int(f"{reflected:032b}"[::-1], 2)


def lacing(packet_sizes: list[int]) -> bytes:
    """The segment table for whole packets of these sizes (255 means 'the packet goes on', so 255 needs a 0)."""
    return b"".join(bytes([255] * (size // 255) + [size % 255]) for size in packet_sizes)


def build_page(header: bytes, table: bytes, body: bytes) -> bytes:
    """A page from the first 26 header bytes (capture pattern to sequence number), its table and body, with its CRC."""
    page = header[:22] + bytes(4) + bytes([len(table)]) + table + body
    return page[:22] + struct.pack("<I", ogg_crc(page)) + page[26:]


def _relaced(page: bytes) -> bytes | None:
    """The page re-laced so that its last packet runs to the end of `page`, or None when that is not what its
    writer meant.

    Some writers (fujielab-moshi-client 0.1.2) put one lacing value min(size, 255) in front of a packet of any
    size and checksum the whole packet. Read as declared, such a page ends 255 bytes into the packet and the
    rest is junk; libogg drops it on the CRC. The CRC proves the writer meant the packet to end where the
    message ends, so the page is rebuilt with that packet's true lacing."""
    table = page[_HEADER : _HEADER + page[26]]
    if not table or table[-1] != 255 or struct.unpack_from("<I", page, 22)[0] != ogg_crc(
            page[:22] + bytes(4) + page[26:]):
        return None
    ended = len(table.rstrip(b"\xff"))  # lacing values up to the end of the last whole packet
    body = page[_HEADER + len(table) :]
    new_table = table[:ended] + lacing([len(body) - sum(table[:ended])])
    return build_page(page[:26], new_table, body) if len(new_table) <= 255 else None


def split_pages(data: bytes) -> list[bytes]:
    """The Ogg pages of one message, or a ProtocolError saying where and why the message is not made of pages."""
    pages = []
    offset = 0
    while offset < len(data):
        at = f"Ogg page at byte {offset}"
        if data[offset : offset + 4] != b"OggS":
            raise ProtocolError("bad_audio", f"{at}: no capture pattern 'OggS' (an audio message must hold "
                                "whole Ogg pages)")
        if len(data) < offset + _HEADER:
            raise ProtocolError("bad_audio", f"{at}: header cut short ({len(data) - offset} of {_HEADER} bytes)")
        if data[offset + 4] != 0:
            raise ProtocolError("bad_audio", f"{at}: stream structure version {data[offset + 4]} (only 0 exists)")
        table_end = offset + _HEADER + data[offset + 26]
        if table_end > len(data):
            raise ProtocolError("bad_audio", f"{at}: segment table cut short")
        end = table_end + sum(data[offset + _HEADER : table_end])
        if end > len(data):
            raise ProtocolError("bad_audio", f"{at}: its segment table declares {end - table_end} body bytes, "
                                f"the message holds {len(data) - table_end}")
        if end < len(data) and data[end : end + 4] != b"OggS":
            relaced = _relaced(data[offset:])
            if relaced is None:
                raise ProtocolError("bad_audio", f"{at}: {len(data) - end} bytes after it that are no page and "
                                    "that neither its segment table nor its CRC covers")
            pages.append(relaced)
            break
        pages.append(data[offset:end])
        offset = end
    return pages


def _terminated(page: bytes) -> bytes:
    """The page with its unfinished last packet ended at the page's end (a 0 lacing value added), when room."""
    table = page[_HEADER : _HEADER + page[26]]
    return build_page(page[:26], table + b"\x00", page[_HEADER + len(table) :]) if len(table) < 255 else page


class OpusDecoder:
    """Client Ogg Opus bytes -> 24 kHz float32 PCM.

    A message must hold whole Ogg pages, as Moshi clients send them; other messages never reach the reader, and
    the error says what is wrong where. sphn's reader keeps unparsable bytes in its buffer and then fails on every
    later call, so a bad message resets it; a fresh reader decodes later pages without the stream headers, and
    the session goes on. Like sphn (Kyutai's server), the decoder ignores CRCs, granule positions, sequence
    numbers and serial numbers of well-formed pages; it repairs two page quirks of a writer that libogg would
    turn into lost packets (see `_relaced`; and a page ending on a 255 lacing value that no continued page
    follows: its packet ends with the page), so a page whose last packet is unfinished waits for the next message.
    """

    def __init__(self) -> None:
        self._reader = sphn.OpusStreamReader(SAMPLE_RATE)
        self._unfinished = b""  # the last page received, when its last packet is unfinished

    def decode(self, ogg_bytes: bytes) -> np.ndarray:
        try:
            pages = split_pages(ogg_bytes)
        except ProtocolError:
            self._unfinished = b""
            raise
        if self._unfinished:
            held = self._unfinished if pages and pages[0][5] & _CONTINUED else _terminated(self._unfinished)
            pages.insert(0, held)
        self._unfinished = b""
        if pages and pages[-1][26] and pages[-1][_HEADER + pages[-1][26] - 1] == 255:
            self._unfinished = pages.pop()
        try:
            pcm = self._reader.append_bytes(b"".join(pages))
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
