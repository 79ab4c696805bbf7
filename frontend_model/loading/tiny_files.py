"""Random tiny checkpoints written in the real file layouts, so that tests and the CPU demo load them through
exactly the code path of a released checkpoint.

`write_tiny_checkpoint(layout, directory, seed)` writes one anywhere (tests vary it: `_orig_mod.` keys, a LoRA
entry); `cached_tiny_checkpoint(layout, seed)` writes it once under the cache directory, keyed by a hash of
everything that shapes it, and returns the directory (the `tiny-personaplex` / `tiny-contextspan` profiles).

Every layout gets a `config.json` with the tiny widths (the real PersonaPlex release has none: Moshi 7B's shape
is the default) and a `contextspan.json` with the placeholder codes of its random Mimi. Voices come in both
formats: `voices/tiny-codes.pt` (Context Spanning: agent codes) and `voices/tiny-embeddings.pt` (PersonaPlex:
per-frame input embeddings and token ring; random values of the right shapes, not derived from the codes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import sentencepiece
import torch
from moshi.models import loaders
from moshi.models.lm import LMModel
from safetensors.torch import save_file

from frontend_model.loading.checkpoint.files import CONTEXT_SPANNING_WEIGHTS, OWN_CONFIG
from frontend_model.loading.profiles import TINY_LM_CONFIG, TINY_MIMI_CONFIG, Layout
from frontend_model.loading.random_weights import random_models
from frontend_model.loading.tiny_tokenizer import cache_root, tiny_tokenizer_path
from frontend_model.span.placeholders import placeholder_fields

FORMAT_VERSION = 2  # bump when what is written changes, so that caches are rewritten
VOICE_FRAMES = 10
MIMI_CONFIG_NAME = "mimi_config.json"


def tiny_lm_config(layout: Layout) -> dict[str, Any]:
    """The `tiny` widths; the PersonaPlex family's 16 depformer codebooks; the tiny tokenizer's vocabulary."""
    vocab = sentencepiece.SentencePieceProcessor(model_file=str(tiny_tokenizer_path())).vocab_size()
    return dict(TINY_LM_CONFIG, dep_q=8 if layout == "kyutai" else 16, text_card=vocab)


def cached_tiny_checkpoint(layout: Layout, seed: int = 0, cache_dir: Path | None = None) -> Path:
    """Written once, atomically (a complete directory is renamed into place), then reused."""
    key = json.dumps([FORMAT_VERSION, layout, seed, tiny_lm_config(layout), TINY_MIMI_CONFIG,
                      tiny_tokenizer_path().name], sort_keys=True)
    base = (cache_dir or cache_root()) / "tiny-checkpoints"
    target = base / f"{layout}-{seed}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if target.is_dir():
        return target
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".{target.name}-"))
    try:
        write_tiny_checkpoint(layout, tmp, seed)
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():  # another process renamed its copy into place first: use that one
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_tiny_checkpoint(
    layout: Layout, directory: Path, seed: int = 0, *, compiled_keys: bool = False, lora_rank: int | None = None
) -> Path:
    """`compiled_keys` and `lora_rank` shape the Context Spanning weights as a compiled / LoRA-trained run saves
    them (`_orig_mod.` in the keys; `<name>.base.weight`, `.lora_A`, `.lora_B` and a `lora` entry)."""
    lm_config = tiny_lm_config(layout)
    lm, mimi = random_models(lm_config, TINY_MIMI_CONFIG, "cpu", torch.float32, seed)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(_contiguous(lm.state_dict()), directory / loaders.MOSHI_NAME)
    save_file(_contiguous(mimi.state_dict()), directory / loaders.MIMI_NAME)
    shutil.copy(tiny_tokenizer_path(), directory / loaders.TEXT_TOKENIZER_NAME)
    (directory / MIMI_CONFIG_NAME).write_text(json.dumps(TINY_MIMI_CONFIG))
    (directory / "config.json").write_text(json.dumps({**lm_config, "mimi_config_name": MIMI_CONFIG_NAME}))
    (directory / OWN_CONFIG).write_text(json.dumps(placeholder_fields(mimi)))
    generator = torch.Generator().manual_seed(seed)
    if layout != "kyutai":
        _write_voices(directory / "voices", lm, generator)
    if layout == "contextspan":
        package = _fine_tuned(lm, generator, lora_rank)
        if compiled_keys:
            package["model"] = {_compiled_name(k): v for k, v in package["model"].items()}
        torch.save(package, directory / CONTEXT_SPANNING_WEIGHTS)
    return directory


def _contiguous(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in state.items()}


def _write_voices(folder: Path, lm: LMModel, generator: torch.Generator) -> None:
    folder.mkdir(exist_ok=True)
    codes = torch.randint(0, lm.card, (lm.n_q // 2, VOICE_FRAMES), generator=generator)
    torch.save({"codes": codes}, folder / "tiny-codes.pt")
    embeddings = torch.randn(VOICE_FRAMES - 1, 1, 1, lm.dim, generator=generator)
    cache = torch.randint(0, lm.card, (1, lm.num_codebooks, max(lm.delays) + 3), generator=generator)
    cache[:, 0] = lm.existing_text_padding_id
    torch.save({"embeddings": embeddings, "cache": cache}, folder / "tiny-embeddings.pt")


def _fine_tuned(lm: LMModel, generator: torch.Generator, lora_rank: int | None) -> dict[str, Any]:
    """The base weights, nudged as a fine-tune would, in bf16 as Context Spanning ships them."""
    state = {}
    for name, value in lm.state_dict().items():
        if value.dtype.is_floating_point:
            value = value + 0.05 * value.std().nan_to_num() * torch.randn(value.shape, generator=generator)
            value = value.to(torch.bfloat16)
        state[name] = value.contiguous()
    if lora_rank is None:
        return {"model": state}
    linears = [name for name, module in lm.named_modules() if isinstance(module, torch.nn.Linear)][:3]
    for name in linears:
        weight = state.pop(f"{name}.weight")
        state[f"{name}.base.weight"] = weight
        state[f"{name}.lora_A"] = (0.1 * torch.randn(lora_rank, weight.shape[1], generator=generator)).bfloat16()
        state[f"{name}.lora_B"] = (0.1 * torch.randn(weight.shape[0], lora_rank, generator=generator)).bfloat16()
    return {"model": state, "lora": {"r": lora_rank, "alpha": 2 * lora_rank}}


def _compiled_name(key: str) -> str:
    """As torch.compile names them: inside a compiled submodule (`transformer._orig_mod.`) or at the top."""
    if key.startswith("transformer."):
        return key.replace("transformer.", "transformer._orig_mod.", 1)
    return f"_orig_mod.{key}"
