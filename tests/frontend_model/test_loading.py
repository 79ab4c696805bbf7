"""Loading by profile and from checkpoints in each real file layout (tiny random weights written to disk)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from moshi.models import loaders
from safetensors.torch import save_file

from frontend_model.loading.checkpoint.files import CONTEXT_SPANNING_WEIGHTS, OWN_CONFIG
from frontend_model.loading.loader import LoadedModel, ModelLoadError, load_model
from frontend_model.loading.profiles import TINY_LM_CONFIG, TINY_MIMI_CONFIG, Layout
from frontend_model.loading.random_weights import random_models
from frontend_model.loading.tiny_files import cached_tiny_checkpoint, tiny_lm_config, write_tiny_checkpoint
from frontend_model.loading.tiny_tokenizer import tiny_tokenizer_path
from frontend_model.span.config import PERSONAPLEX_SILENCE_CODES, PERSONAPLEX_SINE_CODES


def _state_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _load(profile: str, path: Path) -> LoadedModel:
    return load_model(profile, str(path), device="cpu", dtype=torch.float32)


def test_tiny_is_seeded_and_deterministic() -> None:
    a = load_model("tiny", device="cpu", seed=0)
    b = load_model("tiny", device="cpu", seed=0)
    c = load_model("tiny", device="cpu", seed=1)
    assert _state_equal(a.lm, b.lm) and _state_equal(a.mimi, b.mimi)
    assert not _state_equal(a.lm, c.lm)
    assert a.random_weights and "random" in a.description
    assert a.span.dep_q == 8 and a.span.context == TINY_LM_CONFIG["context"]


def test_unknown_profile_and_missing_checkpoint_are_named() -> None:
    with pytest.raises(ModelLoadError, match="unknown profile 'big'"):
        load_model("big")
    with pytest.raises(ModelLoadError, match="needs --checkpoint"):
        load_model("moshi")
    with pytest.raises(ModelLoadError, match="/nonexistent does not exist"):
        load_model("personaplex", "/nonexistent")


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.usefixtures("offline_hub")
def test_unreachable_hub_names_the_repo() -> None:
    with pytest.raises(ModelLoadError, match=r"could not fetch 'kyutai/moshiko-pytorch-bf16'.*--local-dir"):
        load_model("moshi", "kyutai/moshiko-pytorch-bf16", device="cpu")


def test_local_directory_missing_files_are_listed(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError) as err:
        load_model("moshi", str(tmp_path), device="cpu")
    assert "mimi (" in str(err.value) and "tokenizer (" in str(err.value) and "lm (" not in str(err.value)


def _write_checkpoint(tmp_path: Path, lm_suffix: str, extra_config: dict | None = None) -> Path:
    """Kyutai layout with every file named by config.json, as moshi.models.loaders writes it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = load_model("tiny", device="cpu", seed=3)
    lm_state = {k: v.contiguous() for k, v in source.lm.state_dict().items()}
    if lm_suffix == ".safetensors":
        save_file(lm_state, tmp_path / "model.safetensors")
    else:
        torch.save({"model": lm_state}, tmp_path / "model.pt")
    save_file({k: v.contiguous() for k, v in source.mimi.state_dict().items()}, tmp_path / "mimi.safetensors")
    shutil.copy(tiny_tokenizer_path(), tmp_path / "tokenizer.model")
    (tmp_path / "mimi_config.json").write_text(json.dumps(TINY_MIMI_CONFIG))
    config = dict(TINY_LM_CONFIG, text_card=source.tokenizer.vocab_size(), mimi_config_name="mimi_config.json",
                  moshi_name=f"model{lm_suffix}", mimi_name="mimi.safetensors", tokenizer_name="tokenizer.model",
                  **(extra_config or {}))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_local_safetensors_checkpoint_round_trips(tmp_path: Path) -> None:
    path = _write_checkpoint(tmp_path, ".safetensors", {"lm_gen_config": {"temp": 0.7}, "unknown_key": 1})
    loaded = _load("moshi", path)
    source = load_model("tiny", device="cpu", seed=3)
    assert not loaded.random_weights and loaded.layout == "kyutai"
    assert _state_equal(loaded.lm, source.lm) and _state_equal(loaded.mimi, source.mimi)
    assert loaded.span.silence_codes == source.span.silence_codes  # computed from the Kyutai layout's own Mimi


def test_kyutai_config_with_file_refs_loads(tmp_path: Path) -> None:
    files = _write_checkpoint(tmp_path / "files", ".pt")
    refs = tmp_path / "refs"
    refs.mkdir()
    config = json.loads((files / "config.json").read_text())
    for key in ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name"):
        config[key] = f"file://{files / config[key]}"
    (refs / "config.json").write_text(json.dumps(config))
    loaded = _load("moshi", refs)
    assert _state_equal(loaded.lm, load_model("tiny", device="cpu", seed=3).lm)


@pytest.mark.parametrize(("extra", "reason"), [({"model_type": "tts"}, "model_type is 'tts'"),
                                               ({"lora_name": "lora.safetensors"}, "Kyutai LoRA adapter")])
def test_kyutai_configs_we_cannot_serve_are_refused(tmp_path: Path, extra: dict, reason: str) -> None:
    path = _write_checkpoint(tmp_path, ".safetensors", extra)
    with pytest.raises(ModelLoadError, match=reason):
        _load("moshi", path)


@pytest.mark.usefixtures("offline_hub")
def test_kyutai_config_with_unfetchable_hf_ref_names_it(tmp_path: Path) -> None:
    path = _write_checkpoint(tmp_path, ".safetensors")
    config = json.loads((path / "config.json").read_text())
    config["mimi_name"] = "hf://kyutai/moshiko-pytorch-bf16/tokenizer-e351c8d8-checkpoint125.safetensors"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"mimi_name 'hf://kyutai/moshiko-pytorch-bf16/tokenizer-e351c8d8"):
        _load("moshi", path)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny checkpoint per layout, written once; `_copy` gives each test its own to change."""
    root = tmp_path_factory.mktemp("pristine")
    layouts: tuple[Layout, ...] = ("personaplex", "contextspan")
    return {layout: write_tiny_checkpoint(layout, root / layout) for layout in layouts}


def _copy(pristine: dict[str, Path], layout: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine[layout], tmp_path / layout))


@pytest.mark.usefixtures("offline_hub")
def test_kyutai_config_with_hf_ref_in_the_local_cache_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    path = _write_checkpoint(tmp_path / "ckpt", ".safetensors")
    cache = tmp_path / "hub"
    snapshot = cache / "models--kyutai--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (cache / "models--kyutai--tiny" / "refs").mkdir()
    (cache / "models--kyutai--tiny" / "refs" / "main").write_text("0" * 40)
    shutil.move(path / "mimi.safetensors", snapshot / "mimi.safetensors")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, mimi_name="hf://kyutai/tiny/mimi.safetensors")))
    loaded = _load("moshi", path)
    assert _state_equal(loaded.mimi, load_model("tiny", device="cpu", seed=3).mimi)


def _reference_lm(layout: Layout, seed: int) -> torch.nn.Module:
    lm, _ = random_models(tiny_lm_config(layout), TINY_MIMI_CONFIG, "cpu", torch.float32, seed)
    return lm


def test_personaplex_layout_loads_with_16_depformer_heads_and_both_voice_formats(tmp_path: Path) -> None:
    path = write_tiny_checkpoint("personaplex", tmp_path, seed=5)
    loaded = _load("personaplex", path)
    assert loaded.layout == "personaplex" and _state_equal(loaded.lm, _reference_lm("personaplex", 5))
    assert loaded.span.dep_q == 16 and loaded.lm.dep_q == loaded.span.agent_codebooks == 8
    codes, embedded = loaded.voice_prompts["tiny-codes"], loaded.voice_prompts["tiny-embeddings"]
    assert codes.codes is not None and codes.codes.dtype == torch.long and codes.codes.shape[0] == 8
    assert embedded.embeddings is not None and embedded.cache is not None
    assert embedded.embeddings.shape[1:] == (1, 1, loaded.lm.dim) and embedded.cache.shape == (1, 17, 4)
    own = json.loads((path / OWN_CONFIG).read_text())
    assert list(loaded.span.silence_codes) == own["silence_codes"]


def test_personaplex_placeholders_default_to_the_released_codes(tmp_path: Path, pristine: dict[str, Path]) -> None:
    path = _copy(pristine, "personaplex", tmp_path)
    (path / OWN_CONFIG).write_text(json.dumps({"close_id": 12}))
    loaded = _load("personaplex", path)
    assert loaded.span.silence_codes == PERSONAPLEX_SILENCE_CODES and loaded.span.sine_codes == PERSONAPLEX_SINE_CODES
    assert (loaded.span.open_id, loaded.span.close_id, loaded.span.ret_id) == (12, 12, 4)


def test_own_config_is_validated(tmp_path: Path, pristine: dict[str, Path]) -> None:
    path = _copy(pristine, "personaplex", tmp_path)
    (path / OWN_CONFIG).write_text(json.dumps({"close": 12}))
    with pytest.raises(ModelLoadError, match=r"contextspan.json.*close"):
        _load("personaplex", path)
    (path / OWN_CONFIG).write_text(json.dumps({"silence_codes": [1, 2, 3]}))
    with pytest.raises(ModelLoadError, match="silence_codes has 3 codes, expected 8"):
        _load("personaplex", path)


def test_without_config_json_the_lm_is_moshi_7b_shaped(tmp_path: Path, pristine: dict[str, Path]) -> None:
    path = _copy(pristine, "personaplex", tmp_path)
    (path / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"text_card: the config says 32000, the weights' text head has \d+"):
        _load("personaplex", path)


def test_wrong_text_card_is_refused(tmp_path: Path, pristine: dict[str, Path]) -> None:
    path = _copy(pristine, "personaplex", tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, text_card=config["text_card"] + 1)))
    with pytest.raises(ModelLoadError, match="text_card: the config says"):
        _load("personaplex", path)
    # Weights and config agree, but the tokenizer cannot decode every id the text head samples.
    (path / "config.json").write_text(json.dumps(config))
    lm, _ = random_models(dict(tiny_lm_config("personaplex"), text_card=config["text_card"] + 1), TINY_MIMI_CONFIG,
                          "cpu", torch.float32, 0)
    save_file({k: v.contiguous() for k, v in lm.state_dict().items()}, path / loaders.MOSHI_NAME)
    (path / "config.json").write_text(json.dumps(dict(config, text_card=config["text_card"] + 1)))
    with pytest.raises(ModelLoadError, match=r"text_card mismatch: .* tokenizer .*tokenizer_spm_32k_3.model"):
        _load("personaplex", path)


@pytest.mark.parametrize("compiled_keys", [False, True])
def test_context_spanning_layout_loads_its_weights_over_the_base(tmp_path: Path, compiled_keys: bool) -> None:
    path = write_tiny_checkpoint("contextspan", tmp_path, seed=2, compiled_keys=compiled_keys)
    package = torch.load(path / CONTEXT_SPANNING_WEIGHTS, weights_only=True)
    assert any("_orig_mod." in k for k in package["model"]) == compiled_keys
    loaded = _load("contextspan", path)
    assert loaded.layout == "contextspan" and loaded.span.dep_q == 16
    state = loaded.lm.state_dict()
    for key, value in package["model"].items():
        plain = key.replace("_orig_mod.", "")
        assert torch.equal(state[plain], value.float()), plain
    assert not _state_equal(loaded.lm, _reference_lm("contextspan", 2))  # not the base weights


def test_context_spanning_lora_is_merged(tmp_path: Path) -> None:
    path = write_tiny_checkpoint("contextspan", tmp_path, lora_rank=4)
    package = torch.load(path / CONTEXT_SPANNING_WEIGHTS, weights_only=True)
    model, scale = package["model"], package["lora"]["alpha"] / package["lora"]["r"]
    adapted = [k.removesuffix(".lora_A") for k in model if k.endswith(".lora_A")]
    assert adapted
    state = _load("contextspan", path).lm.state_dict()
    for name in adapted:
        a, b, w = (model[f"{name}.{part}"].float() for part in ("lora_A", "lora_B", "base.weight"))
        assert torch.allclose(state[f"{name}.weight"], w + scale * b @ a, atol=1e-6)
        assert not torch.allclose(state[f"{name}.weight"], w, atol=1e-3)
    del package["lora"]
    torch.save(package, path / CONTEXT_SPANNING_WEIGHTS)
    with pytest.raises(ModelLoadError, match=r"LoRA adapters .* but no 'lora'"):
        _load("contextspan", path)


def test_missing_base_file_is_named(tmp_path: Path, pristine: dict[str, Path]) -> None:
    path = _copy(pristine, "contextspan", tmp_path)
    (path / loaders.MIMI_NAME).unlink()
    with pytest.raises(ModelLoadError, match=rf"missing: mimi \({loaders.MIMI_NAME}.*PersonaPlex base files"):
        _load("contextspan", path)


def test_voice_files_are_checked_at_load(tmp_path: Path, pristine: dict[str, Path]) -> None:
    path = _copy(pristine, "contextspan", tmp_path)
    voices = path / "voices"
    torch.save({"wav": torch.zeros(10)}, voices / "odd.pt")
    with pytest.raises(ModelLoadError, match=r"odd.pt: unknown format \(keys \['wav'\]\)"):
        _load("contextspan", path)
    torch.save({"codes": torch.zeros(7, 10, dtype=torch.long)}, voices / "odd.pt")
    with pytest.raises(ModelLoadError, match=r"odd.pt: 'codes' must be int64 \[8, frames\], got torch.int64 \[7, 10\]"):
        _load("contextspan", path)
    torch.save({"embeddings": torch.zeros(5, 1, 1, 3), "cache": torch.zeros(1, 17, 4, dtype=torch.long)},
               voices / "odd.pt")
    with pytest.raises(ModelLoadError, match=r"'embeddings' must be float \[frames, 1, 1, 128\]"):
        _load("contextspan", path)


class _Exploit:
    """Unpickling this would run a shell command: loading must refuse before that happens."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("target", ["model.pt", CONTEXT_SPANNING_WEIGHTS, "voices/tiny-codes.pt"])
def test_pickles_with_code_are_refused_without_running(tmp_path: Path, target: str,
                                                        pristine: dict[str, Path]) -> None:
    path = _copy(pristine, "contextspan", tmp_path)
    marker = tmp_path / "pwned"
    if target == "model.pt":  # a plain pickle, not torch's zip format
        (path / loaders.MOSHI_NAME).unlink()
        with (path / "model.pt").open("wb") as f:
            pickle.dump({"model": _Exploit(marker)}, f)
        (path / CONTEXT_SPANNING_WEIGHTS).unlink()
    else:
        torch.save({"model": _Exploit(marker), "codes": _Exploit(marker)}, path / target)
    with pytest.raises(ModelLoadError, match=r"refusing to load .* it holds more than tensors"):
        _load("contextspan", path)
    assert not marker.exists()


def test_tiny_checkpoint_profiles_are_cached_and_load_like_real_ones(tmp_path: Path) -> None:
    first = cached_tiny_checkpoint("personaplex", seed=4, cache_dir=tmp_path)
    stamp = (first / loaders.MOSHI_NAME).stat().st_mtime_ns
    assert cached_tiny_checkpoint("personaplex", seed=4, cache_dir=tmp_path) == first
    assert (first / loaders.MOSHI_NAME).stat().st_mtime_ns == stamp
    assert not [p for p in (tmp_path / "tiny-checkpoints").iterdir() if p.name.startswith(".")]
    for profile, layout in (("tiny-personaplex", "personaplex"), ("tiny-contextspan", "contextspan")):
        model = load_model(profile, device="cpu", dtype=torch.float32)
        assert model.layout == layout and model.random_weights and model.span.dep_q == 16
        assert {model.span.ret_id, model.span.open_id, model.span.close_id} <= model.suppressed_text_ids
        assert sorted(model.voice_prompts) == ["tiny-codes", "tiny-embeddings"]


def test_a_corrupt_safetensors_voice_is_named(tmp_path: Path, pristine: dict[str, Path]) -> None:
    path = _copy(pristine, "personaplex", tmp_path)
    (path / "voices" / "broken.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ModelLoadError, match=r"cannot read .*broken.safetensors as safetensors"):
        _load("personaplex", path)
