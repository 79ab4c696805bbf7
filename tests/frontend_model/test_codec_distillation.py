"""The distilled codec: it codes each frame as the student did; the student is taught the teacher's code of the frame
before; a release restores the distilled codec exactly without distilling; the default one is released."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.babble import babble
from frontend_model.loading.loader import load_model
from frontend_model.training.codec import distil as distillation
from frontend_model.training.codec.distil import CodecConfig, Student, batch, random_student
from frontend_model.training.codec.release import (
    REPORT,
    codec_key,
    distilled_codec,
    load_codec,
    release,
    released_codec,
)
from frontend_model.training.released import tiny_contextspan_checkpoint
from frontend_model.training.trainer import TrainConfig

TINY = CodecConfig(questions=3, statements=3, follow_ups=1, apps=1, steps=2, batch_size=4)


@pytest.mark.slow
@torch.no_grad()
def test_the_codec_codes_each_frame_as_the_student_does() -> None:
    student = Student(random_student(CodecConfig()), torch.Generator().manual_seed(0))
    pcm = babble(8.0)[None]
    latent = student.projection(student.mimi._encode_to_unquantized_latent(pcm[:, None]))[0].T
    student.centroids[:40].copy_(latent[torch.randperm(len(latent), generator=torch.Generator().manual_seed(1))[:40]])
    wanted = student.logits(pcm).argmax(-1)
    assert len(torch.unique(wanted)) > 20
    assert torch.equal(student.into_codec().encode(pcm[:, None])[:, 0], wanted)


def test_each_frame_is_taught_the_teachers_code_of_the_frame_before() -> None:
    pcms = [torch.zeros(3 * FRAME_SAMPLES).numpy(), torch.zeros(5 * FRAME_SAMPLES + 7).numpy()]
    pcm, target = batch(pcms, [torch.tensor([4, 5, 6]), torch.tensor([1, 2, 3, 4, 5])], delay=1)
    assert pcm.shape == (2, 5 * FRAME_SAMPLES)
    assert target.tolist() == [[-100, 4, 5, -100, -100], [-100, 1, 2, 3, 4]]


@pytest.mark.slow
def test_a_release_restores_the_distilled_codec_exactly_without_distilling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    distilled = distilled_codec(TINY, tmp_path / "here", progress=False)
    report = json.loads((distilled / REPORT).read_text())
    assert report["cache_key"] == codec_key(TINY) and report["metrics"]["takes"] == 8
    released = release(distilled, tmp_path / "weights")
    assert released == released_codec(codec_key(TINY), tmp_path / "weights")

    def must_not_distil(*args: object, **kwargs: object) -> None:
        raise AssertionError("distilled although a release of this codec was there")

    monkeypatch.setattr(distillation, "distil", must_not_distil)
    restored = distilled_codec(TINY, tmp_path / "elsewhere", progress=False, weights_dir=tmp_path / "weights")
    original, copy = (load_file(d / "tokenizer-e351c8d8-checkpoint125.safetensors") for d in (distilled, restored))
    assert original.keys() == copy.keys() and all(torch.equal(original[k], copy[k]) for k in original)
    assert json.loads((restored / REPORT).read_text())["released"] == released.name


def test_the_default_codec_is_released() -> None:
    assert released_codec(codec_key(CodecConfig())).is_file(), (
        "the codec's recipe changed and its weights are not released: run `contextspan distil --out /tmp/codec "
        "--release` (about 45 minutes on 2 cores) and commit frontend_model/training/weights/")


def test_the_trained_model_hears_through_the_default_codec() -> None:
    config = TrainConfig().codec
    assert config is not None
    model = load_model("contextspan", str(tiny_contextspan_checkpoint(TrainConfig(), progress=False)), device="cpu")
    codec = load_codec(distilled_codec(config, progress=False)).state_dict()
    assert all(torch.equal(value, codec[name]) for name, value in model.mimi.state_dict().items())
