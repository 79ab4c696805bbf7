"""The Mimi codes that stand in for audio inside span and prefix frames: silence (agent) and a sine (user)."""

from __future__ import annotations

import math

import torch
from moshi.models.compression import MimiModel

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE


def placeholder_signals() -> tuple[torch.Tensor, torch.Tensor]:
    """80 ms of silence and of a 440 Hz sine at amplitude 0.5: what span frames stand in for on each side."""
    t = torch.arange(FRAME_SAMPLES, dtype=torch.float32) / SAMPLE_RATE
    return torch.zeros(FRAME_SAMPLES), 0.5 * torch.sin(2 * math.pi * 440.0 * t)


@torch.no_grad()
def compute_placeholder_codes(mimi: MimiModel, warmup_frames: int = 3) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Codes of one frame of steady silence and of the sine, read after the codec's causal state has filled."""
    silence, sine = placeholder_signals()
    frames = warmup_frames + 1
    pcm = torch.stack([silence.repeat(frames), sine.repeat(frames)])[:, None]
    codes = mimi.encode(pcm.to(next(mimi.parameters()).device))[:, :, -1].tolist()
    return tuple(codes[0]), tuple(codes[1])


def placeholder_fields(mimi: MimiModel) -> dict[str, tuple[int, ...]]:
    """`mimi`'s placeholder codes as a checkpoint's own config (`contextspan.json`) and `SpanOverrides` name them."""
    silence, sine = compute_placeholder_codes(mimi)
    return {"silence_codes": silence, "sine_codes": sine}
