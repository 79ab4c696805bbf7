"""The hearing bench's probe tells classes apart when the codes carry the difference and is no better than chance when
they do not, so its scores measure the codec; its floor is the utterance's length; the command runs end to end on the
trained checkpoint, a distilled codec and Whisper, and writes every row and each codec's cost."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from benchmarks.hearing import GROUPS, length_accuracy, main, probe_accuracy
from frontend_model.training.codec.distil import CodecConfig
from frontend_model.training.codec.release import distilled_codec


def coded(rng: random.Random, marked: bool) -> torch.Tensor:
    """[2 codebooks, 6-12 frames] of random codes; a marked one ends in code 7 in its first codebook."""
    frames = rng.randint(6, 12)
    codes = torch.tensor([[rng.randrange(8, 64) for _ in range(frames)] for _ in range(2)])
    if marked:
        codes[0, -1] = 7
    return codes


def probed(seed: int, carried: bool) -> dict[str, float]:
    """The probe's scores on 60 clips a group, half of them questions; `carried`: a question's codes are marked."""
    rng = random.Random(seed)
    groups = [group for group in GROUPS for _ in range(60)]
    questions = [rng.random() < 0.5 for _ in groups]
    codes = [coded(rng, carried and question) for question in questions]
    return probe_accuracy(codes, questions, groups, seed=0, epochs=15, vocabulary=64)


@pytest.mark.slow
def test_the_probe_hears_a_difference_the_codes_carry_in_new_takes() -> None:
    scores = probed(0, carried=True)
    assert scores["fit"] >= 0.95 and scores["new takes"] >= 0.9 and scores["held-out sentences"] >= 0.9


@pytest.mark.slow
def test_the_probe_is_at_chance_when_the_codes_carry_nothing() -> None:
    scores = probed(1, carried=False)
    assert scores["new takes"] <= 0.65 and scores["held-out sentences"] <= 0.65


def test_the_floor_is_the_best_length_threshold_on_the_fitted_clips_either_way() -> None:
    groups = ["fit"] * 4 + ["new takes"] * 2
    assert length_accuracy([3, 4, 9, 10, 2, 11], [False, False, True, True, False, True], groups) == {
        "fit": 1.0, "new takes": 1.0}
    # Shorter questions: the threshold's other side.
    assert length_accuracy([3, 4, 9, 10, 12, 2], [True, True, False, False, True, False], groups) == {
        "fit": 1.0, "new takes": 0.0}


@pytest.mark.slow
def test_bench_hear_probes_the_trained_codec_a_distilled_one_and_whisper_on_every_group(tmp_path: Path) -> None:
    out = tmp_path / "hear.json"
    codec = distilled_codec(CodecConfig(), progress=False)
    assert main(["--fit", "6", "--takes", "2", "--held", "2", "--codec", str(codec), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["clips"] == {"fit": 12, "new takes": 4, "held-out sentences": 4}
    distilled = f"the distilled codec ({codec.name})"
    assert [row["input"] for row in report["rows"]] == [
        "the utterance's length alone (the floor)", "the checkpoint's codec, all 8 user codebooks",
        "the checkpoint's codec, its semantic codebook", f"{distilled}, all 8 user codebooks",
        f"{distilled}, its semantic codebook", "Whisper tiny.en's encoder, one k-means codebook of 256 (a reference)"]
    assert all(0 <= row[group] <= 1 for row in report["rows"] for group in GROUPS)
    assert set(report["ms_per_frame"]) == {"the checkpoint's codec", distilled}
    assert all(cost["encode"] > 0 and cost["decode"] > 0 for cost in report["ms_per_frame"].values())
    assert report["set"].startswith("development")
