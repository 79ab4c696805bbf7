"""Random weights in the Context Spanning release's files at Moshi 7B's architecture: what the GPU check loads at
full width, loaded here at reduced width through the same checkpoint path."""

from __future__ import annotations

from pathlib import Path

import torch
from moshi.models import loaders
from safetensors.torch import load_file

from frontend_model.loading.checkpoint.files import CONTEXT_SPANNING_WEIGHTS
from frontend_model.loading.full_width_files import OVERLAY_PREFIXES, full_width_lm_config, write_full_width_checkpoint
from frontend_model.loading.loader import load_model
from frontend_model.loading.profiles import moshi_7b_lm_config


def test_full_width_is_moshi_7b_with_sixteen_depformer_codebooks() -> None:
    assert full_width_lm_config("contextspan", reduced=False) == {**moshi_7b_lm_config(), "dep_q": 16}
    assert full_width_lm_config("kyutai", reduced=False) == moshi_7b_lm_config()


def test_the_fine_tune_is_read_over_the_base_and_the_rest_from_the_base(tmp_path: Path) -> None:
    directory = write_full_width_checkpoint("contextspan", tmp_path / "cs", reduced=True, dtype=torch.float32)
    model = load_model("contextspan", str(directory), device="cpu", dtype=torch.float32)
    assert model.layout == "contextspan" and model.span.dep_q == 16 and model.lm.dep_q == 8
    assert model.lm.text_card == 32000 and model.voice_prompts
    base = load_file(directory / loaders.MOSHI_NAME)
    tuned = torch.load(directory / CONTEXT_SPANNING_WEIGHTS, weights_only=True)["model"]
    assert tuned and all("_orig_mod." in k for k in tuned)  # as a compiled run saves them
    served = model.lm.state_dict()
    assert torch.equal(served["text_emb.weight"], tuned["_orig_mod.text_emb.weight"].float())
    assert not torch.equal(served["text_emb.weight"], base["text_emb.weight"])
    untouched = next(k for k in base if not k.startswith(OVERLAY_PREFIXES) and k in served)
    assert torch.equal(served[untouched], base[untouched])
