"""User loudness levelling: bring the user's audio to the loudness the model was trained on, frame by frame.

The Context Spanning model's training data had the user channel at about -24 LUFS (reference
`runtime/user_leveller.py`); a quiet microphone reads to it as near silence and a hot one as shouting, and Whisper
hears the same difference. Each 80 ms frame is metered with the ITU-R BS.1770 K-weighting (pre-filter shelf and
RLB high-pass), applied as a magnitude response to the frame's spectrum, so numpy is all it needs. The loudness of
the last 3 s (EBU R128 short-term) comes from 400 ms blocks with BS.1770's absolute (-70 LUFS) and relative
(-10 LU) gates; the gain moves toward the target with one-pole smoothing while the latest block passes the gates,
holds through pauses (so that a pause does not wind it up), and is pulled down at once rather than let a frame
clip. Causal: the frame that goes in is levelled with what has arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE

TARGET_LUFS = -24.0
WINDOW_S = 3.0  # EBU R128 short-term loudness
BLOCK_S = 0.4  # BS.1770 gating block
ABSOLUTE_GATE_LUFS = -70.0
RELATIVE_GATE_LU = -10.0
LOUDNESS_OFFSET = -0.691  # BS.1770: LUFS = -0.691 + 10 log10(mean square of the K-weighted signal)
PEAK_CEILING = 0.95


@dataclass(frozen=True)
class LevellerConfig:
    target_lufs: float = TARGET_LUFS
    max_gain_db: float = 30.0
    min_gain_db: float = -24.0
    smoothing_s: float = 0.1  # time constant of the gain's approach to what the meter asks for
    sample_rate: int = SAMPLE_RATE
    frame_samples: int = FRAME_SAMPLES

    @property
    def window_frames(self) -> int:
        return round(WINDOW_S / (self.frame_samples / self.sample_rate))

    @property
    def block_frames(self) -> int:
        return round(BLOCK_S / (self.frame_samples / self.sample_rate))


@dataclass
class LevellerState:
    """What one stream's levelling remembers: the K-weighted mean square of recent frames, and the gain."""

    energies: list[float] = field(default_factory=list)
    gain: float = 1.0


def biquad_power(b: tuple[float, float, float], a: tuple[float, float, float], freqs: np.ndarray,
                 sample_rate: int) -> np.ndarray:
    """|H(e^jw)|^2 of a biquad at `freqs` (Hz)."""
    z = np.exp(-1j * 2 * np.pi * freqs / sample_rate)
    h = (b[0] + b[1] * z + b[2] * z * z) / (a[0] + a[1] * z + a[2] * z * z)
    return np.abs(h) ** 2


def k_weighting_power(sample_rate: int, frame_samples: int) -> np.ndarray:
    """The BS.1770 K-weighting's power response at the rfft bins of one frame, at any sample rate.

    Both stages from their analog parameters (bilinear transform): the high shelf (+4 dB, 1681.97 Hz, Q 0.7072)
    that models the head, and the RLB high-pass (38.14 Hz, Q 0.5003).
    """
    freqs = np.fft.rfftfreq(frame_samples, 1.0 / sample_rate)
    k = np.tan(np.pi * 1681.974450955533 / sample_rate)
    gain, q = 10 ** (3.999843853973347 / 20), 0.7071752369554196
    vh, vb = gain, gain ** 0.4996667741545416
    a0 = 1 + k / q + k * k
    shelf_b = ((vh + vb * k / q + k * k) / a0, 2 * (k * k - vh) / a0, (vh - vb * k / q + k * k) / a0)
    shelf_a = (1.0, 2 * (k * k - 1) / a0, (1 - k / q + k * k) / a0)
    k = np.tan(np.pi * 38.13547087602444 / sample_rate)
    q = 0.5003270373238773
    a0 = 1 + k / q + k * k
    high_pass_b = (1.0, -2.0, 1.0)
    high_pass_a = (1.0, 2 * (k * k - 1) / a0, (1 - k / q + k * k) / a0)
    return biquad_power(shelf_b, shelf_a, freqs, sample_rate) * biquad_power(high_pass_b, high_pass_a, freqs,
                                                                            sample_rate)


def weighted_mean_square(pcm: np.ndarray, weights: np.ndarray) -> float:
    """Mean square of the K-weighted frame (Parseval over the weighted spectrum)."""
    spectrum = np.abs(np.fft.rfft(pcm)) ** 2 * weights
    n = pcm.size
    # One-sided spectrum: DC and (for even n) Nyquist once, every other bin twice.
    total = spectrum[0] + 2 * spectrum[1:].sum() - (spectrum[-1] if n % 2 == 0 else 0.0)
    return float(total / (n * n))


def gated_loudness(energies: list[float], block_frames: int) -> tuple[float | None, bool]:
    """BS.1770 gated loudness over 400 ms blocks (one a frame, overlapping), None below the absolute gate; and
    whether the latest block passed both gates (someone is speaking now, not a pause or its tail)."""
    if len(energies) < block_frames:
        return None, False
    blocks = np.convolve(np.asarray(energies), np.ones(block_frames) / block_frames, mode="valid")
    with np.errstate(divide="ignore"):
        loudness = LOUDNESS_OFFSET + 10 * np.log10(blocks)
    active = loudness > ABSOLUTE_GATE_LUFS
    if not active.any():
        return None, False
    relative = LOUDNESS_OFFSET + 10 * np.log10(blocks[active].mean()) + RELATIVE_GATE_LU
    active &= loudness > relative
    return float(LOUDNESS_OFFSET + 10 * np.log10(blocks[active].mean())), bool(active[-1])


def level_frame(pcm: np.ndarray, state: LevellerState, config: LevellerConfig,
                weights: np.ndarray) -> tuple[np.ndarray, LevellerState]:
    """One frame levelled with what has arrived so far; the state to level the next one with."""
    energies = [*state.energies, weighted_mean_square(pcm, weights)][-config.window_frames:]
    gain = state.gain
    loudness, speaking = gated_loudness(energies, config.block_frames)
    if loudness is not None and speaking:
        wanted_db = np.clip(config.target_lufs - loudness, config.min_gain_db, config.max_gain_db)
        keep = np.exp(-(config.frame_samples / config.sample_rate) / config.smoothing_s)
        gain = keep * gain + (1 - keep) * 10 ** (wanted_db / 20)
    peak = float(np.max(np.abs(pcm))) if pcm.size else 0.0
    if peak * gain > PEAK_CEILING:
        gain = PEAK_CEILING / peak
    return (pcm * gain).astype(np.float32), LevellerState(energies, float(gain))


def loudness_lufs(pcm: np.ndarray, config: LevellerConfig | None = None) -> float | None:
    """Gated loudness of a whole clip with the same meter, frame by frame (for tests and benchmarks)."""
    config = config or LevellerConfig()
    weights = k_weighting_power(config.sample_rate, config.frame_samples)
    frames = [pcm[i: i + config.frame_samples] for i in range(0, pcm.size - config.frame_samples + 1,
                                                                config.frame_samples)]
    return gated_loudness([weighted_mean_square(f, weights) for f in frames], config.block_frames)[0]


class UserLeveller:
    """One stream's leveller: `process(frame) -> frame`, the state kept between frames."""

    def __init__(self, config: LevellerConfig | None = None, state: LevellerState | None = None) -> None:
        self.config = config or LevellerConfig()
        self.state = state or LevellerState()
        self._weights = k_weighting_power(self.config.sample_rate, self.config.frame_samples)

    def process(self, pcm: np.ndarray) -> np.ndarray:
        if pcm.size != self.config.frame_samples:
            raise ValueError(f"a frame is {self.config.frame_samples} samples, got {pcm.size}")
        out, self.state = level_frame(pcm, self.state, self.config, self._weights)
        return out

