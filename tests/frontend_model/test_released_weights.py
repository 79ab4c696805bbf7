"""The committed release of the trained weights: it restores the checkpoint training wrote, bit for bit, without
training; it is only ever used for the recipe that made it; the default recipe has one, and the profile the README's
first command serves loads it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from frontend_model.loading.checkpoint.errors import ModelLoadError
from frontend_model.loading.loader import load_model
from frontend_model.loading.profiles import TRAINED_PROFILE
from frontend_model.training import checkpoint as training_checkpoint
from frontend_model.training.checkpoint import REPORT, VOICE_NAME, cache_key, trained_checkpoint
from frontend_model.training.codec import distil as distillation
from frontend_model.training.released import VOICE_KEY, release, released_file, tiny_contextspan_checkpoint
from frontend_model.training.trainer import TrainConfig
from server.app.routes import model_loader
from server.settings import ServerSettings

SHORT = TrainConfig(copy_steps=1, steps=1, batch_size=2, train_questions=2, train_chatter=1, train_follow_ups=1,
                    context=40)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return torch.load(directory / "context_spanning_7b.pt", weights_only=True)["model"]


def voice(directory: Path) -> torch.Tensor:
    return torch.load(directory / "voices" / f"{VOICE_NAME}.pt", weights_only=True)["codes"]


def must_not_train(*args: object, **kwargs: object) -> None:
    raise AssertionError("trained although a release of this recipe was there")


def test_a_release_restores_the_trained_checkpoint_exactly_without_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained = trained_checkpoint(SHORT, tmp_path / "trained-here", progress=False)
    released = release(trained, tmp_path / "weights")
    assert released == released_file(cache_key(SHORT), tmp_path / "weights")
    with safe_open(str(released), framework="pt") as file:
        names = set(file.keys())
    assert VOICE_KEY in names and "transformer.layers.0.self_attn.in_projs.0.weight" in names
    assert not any(name.startswith("depformer") for name in names), "only what training changed is released"

    monkeypatch.setattr(training_checkpoint, "train_into", must_not_train)
    restored = tiny_contextspan_checkpoint(SHORT, tmp_path / "elsewhere", progress=False,
                                           weights_dir=tmp_path / "weights")
    assert restored.name == trained.name and restored != trained
    original, copy = weights(trained), weights(restored)
    assert original.keys() == copy.keys() and all(torch.equal(original[k], copy[k]) for k in original)
    assert torch.equal(voice(trained), voice(restored))
    assert json.loads((restored / REPORT).read_text())["released"] == released.name


def test_a_release_of_another_recipe_is_refused(tmp_path: Path) -> None:
    trained = trained_checkpoint(SHORT, tmp_path / "trained-here", progress=False)
    other = replace(SHORT, steps=SHORT.steps + 1)
    release(trained, tmp_path / "weights").rename(released_file(cache_key(other), tmp_path / "weights"))
    with pytest.raises(ValueError, match="holds the weights of recipe"):
        tiny_contextspan_checkpoint(other, tmp_path / "elsewhere", progress=False, weights_dir=tmp_path / "weights")


def test_the_default_recipe_is_released() -> None:
    key = cache_key(TrainConfig())
    assert released_file(key).is_file(), (
        f"the training recipe changed (key {key}) and its weights are not released: run `contextspan train --out "
        "/tmp/trained --release` (the default recipe: about 42 minutes on 2 cores) and commit "
        "frontend_model/training/weights/")


def test_the_profile_the_first_readme_command_serves_is_the_release_restored_on_a_fresh_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scripts/dev.sh serve` without a GPU serves `tiny-contextspan-trained`: on an empty cache, the committed releases
    (the model's and its codec's), in seconds, asking for facts (`<ret>` not suppressed as in the random tiny
    checkpoints). The server finds its directory (`profile_checkpoint`); the loader, which training loads through, is
    handed it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(training_checkpoint, "train_into", must_not_train)
    monkeypatch.setattr(distillation, "distil", must_not_train)
    with pytest.raises(ModelLoadError, match="profile_checkpoint"):
        load_model(TRAINED_PROFILE, device="cpu")
    model = model_loader(ServerSettings(device="cpu"), TRAINED_PROFILE, None)()
    assert not model.random_weights and model.span.ret_id not in model.suppressed_text_ids
    assert "trained here" in model.description
    name = "transformer.layers.0.self_attn.in_projs.0.weight"
    with safe_open(str(released_file(cache_key(TrainConfig()))), framework="pt") as file:
        assert torch.equal(model.lm.state_dict()[name].float(), file.get_tensor(name).float())
