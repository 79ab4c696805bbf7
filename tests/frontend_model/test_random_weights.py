"""The random codec of the tiny profiles hears speech: its codebooks are drawn from a speech-like probe."""

from __future__ import annotations

import torch

from frontend_model.loading.babble import babble
from frontend_model.loading.loader import load_model
from frontend_model.training.speech import Voice, speak

SENTENCES = ("What is the time in Tokyo?", "I went for a walk by the river this morning.",
             "How many kilometres is twelve miles?", "The weather was lovely yesterday.")


def test_babble_is_the_same_on_every_machine_and_sounds_like_speech() -> None:
    a, b, other = babble(4.0), babble(4.0), babble(4.0, seed=1)
    assert torch.equal(a, b) and not torch.equal(a, other)
    assert a.shape == (96000,) and a.abs().max() <= 0.6
    frames = a.reshape(-1, 480).abs().amax(dim=1)
    assert (frames == 0).float().mean() > 0.05, "pauses between segments"
    assert (frames > 0.05).float().mean() > 0.5, "mostly sound"


def test_the_tiny_codec_gives_different_words_different_codes() -> None:
    """Codewords around noise and a sine gave espeak-ng's speech 3 semantic codes in 1103 frames: a model trained on
    them could not tell a question from a statement."""
    mimi = load_model("tiny", device="cpu", dtype=torch.float32).mimi
    voice = Voice("en-us")
    with torch.no_grad():
        codes = torch.cat([mimi.encode(torch.from_numpy(speak(text, voice))[None, None])[0] for text in SENTENCES],
                          dim=1)
    semantic = codes[0].unique().numel()
    distinct_frames = codes.unique(dim=1).shape[1]
    assert semantic >= 20, f"{semantic} semantic codes over {codes.shape[1]} frames"
    assert distinct_frames >= 0.8 * codes.shape[1], f"{distinct_frames} distinct frames of {codes.shape[1]}"
