"""Random Moshi 7B weights written in a family's real file layout, so that the GPU check loads the architecture the
Context Spanning model ships in (16 depformer codebooks, a voice prompt, the fine-tune's weights over the base)
through the checkpoint path a release takes, and a CPU test does the same at reduced width.

At full width nothing but the release's own files is written: no `config.json` (the loader takes Moshi 7B's shape and
reads dep_q from the weights), no `contextspan.json` (the PersonaPlex placeholder codes apply). At reduced width a
`config.json` names the tiny widths and Mimi, as for the tiny checkpoints. The Context Spanning file holds the
fine-tuned share of the weights only (`OVERLAY_PREFIXES`): the loader reads what it lacks from the base, its path
for any overlay, and the check writes 16 GB once instead of twice. tiny_files' helpers are reused, not moved out:
its source keys the trained release (frontend_model/training/checkpoint.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from moshi.models import loaders
from moshi.models.lm import LMModel
from safetensors.torch import save_file

from frontend_model.loading.checkpoint.files import CONTEXT_SPANNING_WEIGHTS
from frontend_model.loading.profiles import (
    TINY_MIMI_CONFIG,
    Layout,
    full_mimi_config,
    moshi_7b_lm_config,
    reduced_width,
)
from frontend_model.loading.random_weights import random_models
from frontend_model.loading.tiny_files import MIMI_CONFIG_NAME, _compiled_name, _contiguous
from frontend_model.loading.tiny_tokenizer import padded_tokenizer_path

VOICE_FRAMES = 100  # a voice prompt of 8 s
NUDGE = 0.05  # a fine-tuned weight: the base's plus this much of its spread in noise
# What the fine-tune's file holds at full width: the text embedding and head and the first layer, as a fine-tune that
# saved what it changed most would; the rest comes from the base.
OVERLAY_PREFIXES = ("text_emb.", "text_linear.", "transformer.layers.0.")


def full_width_lm_config(layout: Layout, reduced: bool) -> dict:
    config = dict(moshi_7b_lm_config(), dep_q=8 if layout == "kyutai" else 16)
    return reduced_width(config) if reduced else config


def write_full_width_checkpoint(layout: Layout, directory: Path, *, reduced: bool = False, seed: int = 0,
                                device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> Path:
    """Built on `device` (a GPU initialises 8 B parameters in seconds), written from the CPU."""
    lm_config = full_width_lm_config(layout, reduced)
    mimi_config = TINY_MIMI_CONFIG if reduced else full_mimi_config()
    lm, mimi = random_models(lm_config, mimi_config, device, dtype, seed)
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    base = _contiguous({k: v.detach().cpu() for k, v in lm.state_dict().items()})
    if layout == "contextspan":
        tuned = {_compiled_name(k): _nudged(v, generator) for k, v in base.items() if k.startswith(OVERLAY_PREFIXES)}
        torch.save({"model": tuned}, directory / CONTEXT_SPANNING_WEIGHTS)
    save_file(base, directory / loaders.MOSHI_NAME)
    del base
    save_file(_contiguous({k: v.cpu() for k, v in mimi.state_dict().items()}), directory / loaders.MIMI_NAME)
    shutil.copy(padded_tokenizer_path(lm_config["text_card"]), directory / loaders.TEXT_TOKENIZER_NAME)
    if reduced:
        (directory / MIMI_CONFIG_NAME).write_text(json.dumps(mimi_config))
        (directory / "config.json").write_text(json.dumps({**lm_config, "mimi_config_name": MIMI_CONFIG_NAME}))
    if layout != "kyutai":
        _write_voice(directory / "voices", layout, lm, generator)
    return directory


def _nudged(value: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """As a fine-tune leaves a weight, in bf16 as Context Spanning ships them."""
    if not value.dtype.is_floating_point:
        return value
    noise = torch.randn(value.shape, generator=generator)
    return (value.float() + NUDGE * value.float().std().nan_to_num() * noise).to(torch.bfloat16).contiguous()


def _write_voice(folder: Path, layout: Layout, lm: LMModel, generator: torch.Generator) -> None:
    """The family's own voice format: Context Spanning's agent codes, PersonaPlex's replayed embeddings and token
    ring (random values of the right shapes, the ring's text row padding)."""
    folder.mkdir(exist_ok=True)
    if layout == "contextspan":
        codes = torch.randint(0, lm.card, (lm.n_q // 2, VOICE_FRAMES), generator=generator)
        torch.save({"codes": codes}, folder / "random.pt")
        return
    embeddings = torch.randn(VOICE_FRAMES - 1, 1, 1, lm.dim, generator=generator)
    cache = torch.randint(0, lm.card, (1, lm.num_codebooks, max(lm.delays) + 3), generator=generator)
    cache[:, 0] = lm.existing_text_padding_id
    torch.save({"embeddings": embeddings.to(torch.bfloat16), "cache": cache}, folder / "random.pt")
