from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from frontend_model.loading import ModelLoadError, load_model
from frontend_model.profiles import TINY_LM_CONFIG, TINY_MIMI_CONFIG
from frontend_model.span_config import PERSONAPLEX_SILENCE_CODES, PERSONAPLEX_SINE_CODES
from frontend_model.tiny_tokenizer import tiny_tokenizer_path


def _state_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


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


def test_unreachable_hub_names_the_repo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match=r"could not fetch 'kyutai/moshiko-pytorch-bf16'.*--local-dir"):
        load_model("moshi", "kyutai/moshiko-pytorch-bf16", device="cpu")


def test_local_directory_missing_files_are_listed(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError) as err:
        load_model("moshi", str(tmp_path), device="cpu")
    assert "mimi (" in str(err.value) and "tokenizer (" in str(err.value) and "lm (" not in str(err.value)


def _write_checkpoint(tmp_path: Path, lm_suffix: str, extra_config: dict | None = None) -> Path:
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
    path = _write_checkpoint(tmp_path, ".safetensors")
    loaded = load_model("moshi", str(path), device="cpu", dtype=torch.float32)
    source = load_model("tiny", device="cpu", seed=3)
    assert not loaded.random_weights
    assert _state_equal(loaded.lm, source.lm) and _state_equal(loaded.mimi, source.mimi)
    assert loaded.span.silence_codes == source.span.silence_codes


def test_personaplex_pt_checkpoint_uses_config_ids_and_fixed_placeholders(tmp_path: Path) -> None:
    path = _write_checkpoint(tmp_path, ".pt", {"context_span": {"ret_id": 4, "open_id": 12, "close_id": 12}})
    loaded = load_model("contextspan", str(path), device="cpu", dtype=torch.float32)
    assert loaded.span.open_id == loaded.span.close_id == 12
    assert loaded.span.silence_codes == PERSONAPLEX_SILENCE_CODES
    assert loaded.span.sine_codes == PERSONAPLEX_SINE_CODES


class _Exploit:
    def __reduce__(self) -> tuple:
        return (print, ("pwned",))


def test_pickled_checkpoint_cannot_run_code(tmp_path: Path) -> None:
    path = _write_checkpoint(tmp_path, ".pt")
    with (tmp_path / "model.pt").open("wb") as f:
        pickle.dump({"model": _Exploit()}, f)
    with pytest.raises(ModelLoadError, match="refusing"):
        load_model("personaplex", str(path), device="cpu")
