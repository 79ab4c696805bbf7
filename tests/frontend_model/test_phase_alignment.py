"""Phase alignment: silence ahead of a new stream moves where its frames end onto the other sessions' grid."""

from __future__ import annotations

import numpy as np
import pytest

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire.frame_clock import FrameAssembler, phase_pad


@pytest.mark.parametrize("chunk", [480, 960])
@pytest.mark.parametrize("until_ms", [0.0, 5.0, 19.9, 20.0, 39.0, 40.0, 41.0, 60.0, 79.9, 80.0, 200.0])
def test_the_padded_stream_ends_frames_at_most_one_page_before_the_grid(chunk: int, until_ms: float) -> None:
    pad = phase_pad(chunk, until_ms / 1e3)
    assert 0 <= pad < FRAME_SAMPLES and pad % chunk == 0
    # The stream's first chunk is here now; one more arrives every chunk / SAMPLE_RATE seconds. Its first frame
    # ends with the chunk that brings the buffer (silence + audio) to a whole frame.
    first_frame_ends_ms = (FRAME_SAMPLES - pad - chunk) / SAMPLE_RATE * 1e3
    chunk_ms = chunk / SAMPLE_RATE * 1e3
    grid_ms = until_ms % 80.0
    early = (grid_ms - first_frame_ends_ms) % 80.0
    assert early < chunk_ms + 1e-6, (pad, first_frame_ends_ms, grid_ms)


@pytest.mark.parametrize("chunk", [0, FRAME_SAMPLES, 2 * FRAME_SAMPLES, 1000])
def test_pages_of_a_whole_frame_or_odd_sizes_are_not_padded(chunk: int) -> None:
    assert phase_pad(chunk, 0.03) == 0


def test_padding_puts_silence_ahead_of_the_audio_and_only_once() -> None:
    assembler = FrameAssembler()
    audio = np.linspace(0.1, 0.9, FRAME_SAMPLES, dtype=np.float32)
    assembler.pad(1440)
    with pytest.raises(RuntimeError):
        assembler.pad(480)
    frames = assembler.push(audio[:480])
    assert len(frames) == 1 and assembler.padded == 1440
    assert not frames[0].pcm[:1440].any() and np.array_equal(frames[0].pcm[1440:], audio[:480])
    assert assembler.push(audio[480:]) == []
    (second,) = assembler.push(np.full(480, 0.5, np.float32))
    assert second.index == 1 and np.array_equal(second.pcm[: FRAME_SAMPLES - 480], audio[480:])


def test_a_stream_cannot_be_padded_once_a_frame_has_gone() -> None:
    assembler = FrameAssembler()
    assembler.push(np.zeros(FRAME_SAMPLES, np.float32))
    with pytest.raises(RuntimeError):
        assembler.pad(480)
