"""The user loudness leveller: a BS.1770 meter, and a streaming gain that brings any microphone to -24 LUFS."""

from __future__ import annotations

import numpy as np
import pytest

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire.leveller import PEAK_CEILING, TARGET_LUFS, LevellerState, UserLeveller, loudness_lufs


def sine(freq: float, amplitude: float, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def babble(rms: float, seconds: float, seed: int = 0) -> np.ndarray:
    """Noise shaped like speech in time: syllable-rate bursts with pauses, so the meter's gates have work to do."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    envelope = np.clip(np.sin(2 * np.pi * 3.0 * np.arange(n) / SAMPLE_RATE), 0, None)
    x = rng.standard_normal(n) * envelope
    return (rms * x / np.sqrt(np.mean(x * x))).astype(np.float32)


def run(leveller: UserLeveller, pcm: np.ndarray) -> np.ndarray:
    return np.concatenate([leveller.process(pcm[i: i + FRAME_SAMPLES])
                           for i in range(0, pcm.size - FRAME_SAMPLES + 1, FRAME_SAMPLES)])


def test_the_meter_reads_a_full_scale_1_khz_sine_at_minus_3_lufs() -> None:
    # BS.1770's calibration point: a 997 Hz sine at 0 dBFS peak reads -3.01 LUFS.
    assert loudness_lufs(sine(997, 1.0, 4.0)) == pytest.approx(-3.01, abs=0.1)
    assert loudness_lufs(sine(997, 0.1, 4.0)) == pytest.approx(-23.01, abs=0.1)


def test_the_meter_weighs_low_frequencies_down_and_high_ones_up() -> None:
    low, mid, high = (loudness_lufs(sine(f, 0.1, 4.0)) for f in (60, 997, 4000))
    assert low is not None and mid is not None and high is not None
    assert low < mid - 0.5 and high > mid + 2.0


def test_silence_reads_as_no_loudness() -> None:
    assert loudness_lufs(np.zeros(4 * SAMPLE_RATE, np.float32)) is None


@pytest.mark.parametrize("rms", [0.002, 0.3])
def test_a_quiet_or_a_loud_voice_is_brought_to_minus_24_lufs(rms: float) -> None:
    out = run(UserLeveller(), babble(rms, 8.0))
    assert loudness_lufs(babble(rms, 8.0)) == pytest.approx(TARGET_LUFS + 20 * np.log10(rms / 0.063), abs=3.0)
    settled = loudness_lufs(out[4 * SAMPLE_RATE:])
    assert settled == pytest.approx(TARGET_LUFS, abs=1.0)


def test_the_gain_holds_through_silence() -> None:
    leveller = UserLeveller()
    run(leveller, babble(0.01, 5.0))
    gain = leveller.state.gain
    run(leveller, np.zeros(FRAME_SAMPLES * 5, np.float32))
    settled = leveller.state.gain
    out = run(leveller, np.zeros(5 * SAMPLE_RATE, np.float32))
    assert not out.any() and leveller.state.gain == settled
    assert abs(20 * np.log10(settled / gain)) < 1.0, "the tail of the last word must not wind the gain up"


def test_a_sudden_shout_is_never_clipped() -> None:
    leveller = UserLeveller()
    run(leveller, babble(0.002, 4.0))
    assert leveller.state.gain > 10
    out = run(leveller, babble(0.5, 1.0, seed=1))
    assert np.max(np.abs(out)) <= PEAK_CEILING + 1e-6


def test_levelling_is_causal_and_resumes_from_its_state() -> None:
    pcm = babble(0.01, 6.0)
    whole = run(UserLeveller(), pcm)
    split = 40 * FRAME_SAMPLES
    first = UserLeveller()
    head = run(first, pcm[:split])
    assert np.array_equal(head, whole[:split]), "later audio changed earlier frames"
    resumed = UserLeveller(state=LevellerState(list(first.state.energies), first.state.gain))
    assert np.array_equal(run(resumed, pcm[split:]), whole[split:])


def test_a_frame_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="1920 samples"):
        UserLeveller().process(np.zeros(100, np.float32))
