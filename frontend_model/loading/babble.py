"""A synthetic speech-like signal: what a random codec's codebooks are drawn from, so that they tell sounds apart."""

from __future__ import annotations

import math

import torch

from frontend_model.frame import SAMPLE_RATE

# (F1, F2, F3) in Hz of ten English vowels: voiced segments sit under one of them, varied by +-15 %.
VOWEL_FORMANTS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (660, 1720, 2410),
                  (490, 1350, 1690), (570, 840, 2410), (440, 1020, 2240), (390, 1990, 2550), (640, 1190, 2390))
SEGMENT_KINDS = torch.tensor([0.55, 0.2, 0.1, 0.15])  # voiced, fricative, burst, pause
RAMP_S = 0.01


def babble(seconds: float, seed: int = 0) -> torch.Tensor:
    """Segments of 40-220 ms as speech has them: gliding voiced harmonics under vowel formants, band noise, bursts,
    pauses. Deterministic from `seed` and free of any synthesizer, so every machine draws the same codebooks."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(low: float, high: float) -> float:
        return low + (high - low) * torch.rand((), generator=generator).item()

    total = int(seconds * SAMPLE_RATE)
    segments: list[torch.Tensor] = []
    phase, f0, made = 0.0, uniform(90, 240), 0
    while made < total:
        kind = int(torch.multinomial(SEGMENT_KINDS, 1, generator=generator).item())
        length = int(uniform(0.04, 0.22) * SAMPLE_RATE)
        t = torch.arange(length) / SAMPLE_RATE
        if kind == 0:
            vowel = VOWEL_FORMANTS[int(torch.randint(len(VOWEL_FORMANTS), (), generator=generator).item())]
            formants = [f * uniform(0.85, 1.15) for f in vowel]
            start, f0 = f0, min(max(f0 * uniform(0.8, 1.25), 80.0), 300.0)
            wave, phase = _voiced(start + (f0 - start) * t / t[-1], phase, formants)
        elif kind == 1:
            low = uniform(1500, 5000)
            wave = _band_noise(length, low, low + uniform(1500, 6000), generator) * uniform(0.2, 0.6)
        elif kind == 2:
            wave = torch.randn(length, generator=generator) * torch.exp(-t / uniform(0.005, 0.02))
        else:
            wave = torch.zeros(length)
        wave = wave * torch.clamp(torch.minimum(t, t[-1] - t) / RAMP_S, max=1.0)
        segments.append(wave / wave.abs().max().clamp(min=1e-6) * uniform(0.05, 0.6))
        made += length
    return torch.cat(segments)[:total]


def _voiced(pitch: torch.Tensor, phase: float, formants: list[float]) -> tuple[torch.Tensor, float]:
    phases = phase + 2 * math.pi * torch.cumsum(pitch, 0) / SAMPLE_RATE
    harmonics = torch.arange(1, int(7600 / pitch.max()) + 1, dtype=torch.float32)[:, None]
    freqs = harmonics * pitch[None]
    envelope = sum(gain / (1 + ((freqs - f) / width) ** 2)
                   for f, width, gain in zip(formants, (90, 110, 150), (1.0, 0.6, 0.3), strict=True))
    return (envelope / harmonics.sqrt() * torch.sin(harmonics * phases[None])).sum(0), phases[-1].item()


def _band_noise(length: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    spectrum = torch.fft.rfft(torch.randn(length, generator=generator))
    hz = torch.fft.rfftfreq(length, 1 / SAMPLE_RATE)
    return torch.fft.irfft(spectrum * ((hz > low) & (hz < high)), length)
