"""Ogg page quirks of real clients, built around real Opus packets from sphn: what the decoder plays, repairs and
refuses (with the reason in the error)."""

from __future__ import annotations

import functools
import struct

import numpy as np
import pytest
import sphn

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire.opus import OpusDecoder, build_page, lacing, ogg_crc, split_pages
from server.wire.protocol import ProtocolError

SERIAL = 42
CONTINUED, BOS = 0x01, 0x02


def _packets(page: bytes) -> list[bytes]:
    """The whole packets of one page (no page of sphn's spans two)."""
    table = page[27 : 27 + page[26]]
    body = memoryview(page)[27 + len(table) :]
    packets, start, size = [], 0, 0
    for value in table:
        size += value
        if value < 255:
            packets.append(bytes(body[start : start + size]))
            start, size = start + size, 0
    return packets


@functools.cache
def _sphn_stream() -> tuple[list[bytes], list[bytes], int]:
    """(OpusHead, OpusTags), the Opus packets of one second of noisy tone, and samples per packet, from sphn."""
    writer = sphn.OpusStreamWriter(SAMPLE_RATE)
    rng = np.random.default_rng(0)
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    data = b"".join(bytes(writer.append_pcm(pcm[i : i + FRAME_SAMPLES])) for i in range(0, pcm.size, FRAME_SAMPLES))
    packets = [packet for page in split_pages(data) for packet in _packets(page)]
    assert packets[0].startswith(b"OpusHead") and packets[1].startswith(b"OpusTags")
    reader = sphn.OpusStreamReader(SAMPLE_RATE)
    per_packet = np.asarray(reader.append_bytes(data)).size // (len(packets) - 2)
    return packets[:2], packets[2:], per_packet


def _padded(packet: bytes, size: int) -> bytes:
    """The same Opus audio as a code 3 packet of exactly `size` bytes (RFC 6716 3.2.5 padding): bigger packets
    than sphn's encoder makes at its bitrate, as other encoders (opuslib's defaults) do."""
    toc, code = packet[0], packet[0] & 3
    count = {0: 0x41, 1: 0x42, 2: 0xC2}[code]  # padding flag, frame count, VBR for code 2 (its length stays)
    for pad in range(size):
        pad_lengths = bytes([255] * (pad // 254) + [pad % 254])
        if 2 + len(pad_lengths) + len(packet) - 1 + pad == size:
            return bytes([toc | 3, count]) + pad_lengths + packet[1:] + bytes(pad)
    raise ValueError(f"cannot pad {len(packet)} bytes to {size}")


def _page(table: bytes, body: bytes, sequence: int, flags: int = 0, granule: int = 0, serial: int = SERIAL) -> bytes:
    return build_page(struct.pack("<4sBBqII", b"OggS", 0, flags, granule, serial, sequence), table, body)


def _pages(packets: list[bytes], first_sequence: int = 2, **fields: int) -> list[bytes]:
    return [_page(lacing([len(p)]), p, first_sequence + i, **fields) for i, p in enumerate(packets)]


def _headers() -> list[bytes]:
    (head, tags), _, _ = _sphn_stream()
    return [_page(lacing([len(head)]), head, 0, BOS), _page(lacing([len(tags)]), tags, 1)]


def _fujielab_page(packet: bytes, sequence: int) -> bytes:
    """A page as fujielab-moshi-client 0.1.2 writes one: a single lacing value min(size, 255) in front of the whole
    packet, the CRC over all of it."""
    page = struct.pack("<4sBBqIIIB", b"OggS", 0, 0, 960 * sequence, SERIAL, sequence, 0, 1)
    page += bytes([min(len(packet), 255)]) + packet
    return page[:22] + struct.pack("<I", ogg_crc(page)) + page[26:]


def _decode_all(messages: list[bytes]) -> list[int]:
    decoder = OpusDecoder()
    return [decoder.decode(message).size for message in messages]


def test_ogg_crc_matches_the_pages_sphn_writes() -> None:
    writer = sphn.OpusStreamWriter(SAMPLE_RATE)
    pages = split_pages(bytes(writer.append_pcm(np.zeros(FRAME_SAMPLES, np.float32))))
    assert len(pages) >= 3
    for page in pages:
        assert ogg_crc(page[:22] + bytes(4) + page[26:]) == struct.unpack_from("<I", page, 22)[0]


def test_a_packet_longer_than_its_one_lacing_value_is_played_when_the_crc_covers_it() -> None:
    """fujielab's pages for packets over 255 bytes: read as declared, the page ends inside the packet."""
    _, packets, per_packet = _sphn_stream()
    big = [_padded(packets[i], 300 + 20 * i) for i in range(4)]
    messages = _headers() + [_fujielab_page(packet, 2 + i) for i, packet in enumerate(big)]
    assert _decode_all(messages) == [0, 0] + [per_packet] * 4


def test_a_page_ending_on_255_with_no_continuation_ends_its_packet_there() -> None:
    """fujielab's page for a packet of exactly 255 bytes has no terminating 0 lacing value; libogg and sphn would
    glue the next page's packet to it and lose both. The packet is played, one message later."""
    _, packets, per_packet = _sphn_stream()
    messages = [*_headers(), _fujielab_page(_padded(packets[0], 255), 2), *_pages(packets[1:3], 3)]
    assert _decode_all(messages) == [0, 0, 0, 2 * per_packet, per_packet]


def test_a_packet_continued_on_the_next_page_is_joined_as_ogg_says() -> None:
    _, packets, per_packet = _sphn_stream()
    big = _padded(packets[0], 400)
    first, rest = _page(b"\xff", big[:255], 2), _page(lacing([145]), big[255:], 3, CONTINUED)
    assert _decode_all([*_headers(), first, rest, *_pages(packets[1:2], 4)]) == [0, 0, 0, per_packet, per_packet]
    assert _decode_all([*_headers(), first + rest]) == [0, 0, per_packet]


@pytest.mark.parametrize("quirk", ["headers_in_one_message", "no_headers", "granule_at_24khz", "sequence_gaps",
                                   "serial_change", "bad_crc", "two_packets_a_page", "empty_page", "eos_then_more",
                                   "headers_again"])
def test_well_formed_pages_play_whatever_their_header_fields(quirk: str) -> None:
    """As sphn (Kyutai's server) does: it reads lacing and packets and nothing else of a page's header."""
    _, packets, per_packet = _sphn_stream()
    audio = packets[:3]
    messages = {
        "headers_in_one_message": [_headers()[0] + _headers()[1], *_pages(audio)],
        "no_headers": _pages(audio),
        "granule_at_24khz": _headers() + [_page(lacing([len(p)]), p, 2 + i, granule=1920 * (i + 1))
                                          for i, p in enumerate(audio)],
        "sequence_gaps": _headers() + [_page(lacing([len(p)]), p, 5 * i) for i, p in enumerate(audio)],
        "serial_change": _headers() + _pages(audio, serial=7),
        "bad_crc": _headers() + [page[:22] + bytes(4) + page[26:] for page in _pages(audio)],
        "two_packets_a_page": [*_headers(), _page(lacing([len(p) for p in audio[:2]]), b"".join(audio[:2]), 2),
                               *_pages(audio[2:], 3)],
        "empty_page": [*_headers(), _page(b"", b"", 2), *_pages(audio, 3)],
        "eos_then_more": _headers() + _pages(audio[:1], flags=0x04) + _pages(audio[1:], 3),
        "headers_again": _headers() + _pages(audio[:1]) + _headers() + _pages(audio[1:]),  # a restarted encoder
    }[quirk]
    assert sum(_decode_all(messages)) == len(audio) * per_packet


@pytest.mark.parametrize(("message", "reason"), [
    (b"OpuS" + bytes(40), "Ogg page at byte 0: no capture pattern 'OggS'"),
    (b"OggS\x00" + bytes(10), "Ogg page at byte 0: header cut short (15 of 27 bytes)"),
    (b"OggS\x01" + bytes(22), "Ogg page at byte 0: stream structure version 1 (only 0 exists)"),
    (b"OggS\x00" + bytes(21) + b"\x03\x10", "Ogg page at byte 0: segment table cut short"),
    (b"OggS\x00" + bytes(21) + b"\x02\x10\x20" + bytes(40), "Ogg page at byte 0: its segment table declares 48 "
     "body bytes, the message holds 40"),
    (b"OggS\x00" + bytes(21) + b"\x01\x04" + bytes(4) + b"OggX", "Ogg page at byte 0: 4 bytes after it that are "
     "no page"),
])
def test_what_is_not_whole_pages_is_refused_saying_where_and_why(message: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match="^" + reason.replace("(", r"\(").replace(")", r"\)")) as error:
        OpusDecoder().decode(message)
    assert error.value.code == "bad_audio"


def test_a_capped_lacing_value_without_a_matching_crc_is_refused() -> None:
    """Trailing bytes are the writer's packet only when the CRC says so; otherwise they are junk."""
    _, packets, _ = _sphn_stream()
    page = bytearray(_fujielab_page(_padded(packets[0], 300), 2))
    page[22] ^= 1
    with pytest.raises(ProtocolError, match="45 bytes after it that are no page"):
        OpusDecoder().decode(bytes(page))


def test_the_pages_fujielab_moshi_client_writes_all_play() -> None:
    """Its own encoder, unmodified (opuslib, 80 ms packets, one page a message, headers in their own messages)."""
    from fujielab.moshi.moshi_client_lib import OpusEncoder as FujielabEncoder

    rng = np.random.default_rng(1)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    encoder = FujielabEncoder()
    messages = encoder.get_headers() + encoder.encode(pcm)
    sizes = [len(m) - 28 for m in messages[2:]]
    assert max(sizes) > 255 and min(sizes) < 255, sizes  # both kinds of page, or this test tests less than it says
    assert sum(_decode_all(messages)) == pcm.size // FRAME_SAMPLES * FRAME_SAMPLES
