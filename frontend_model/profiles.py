"""Model architectures by profile name: the small CPU `tiny` configs and the real Moshi 7B shape."""

from __future__ import annotations

import copy
from typing import Any

from moshi.models import loaders

PROFILES = ("tiny", "moshi-7b", "moshi", "personaplex", "contextspan")
RANDOM_PROFILES = ("tiny", "moshi-7b")

MOSHI_DELAYS = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]

# Small enough that Mimi encode + LM step + Mimi decode stays well under 25 ms per frame on a 2-core CPU, while
# keeping Mimi's 24 kHz / 12.5 Hz / 8 x 2048 token layout, so every code path matches the real model.
TINY_MIMI_CONFIG: dict[str, Any] = {
    "sample_rate": 24000,
    "channels": 1,
    "frame_rate": 12.5,
    "seanet": {
        **loaders._seanet_kwargs,
        "dimension": 64,
        "n_filters": 4,
    },
    "quantizer": {"dimension": 32, "n_q": 8, "bins": 2048, "input_dimension": 64, "output_dimension": 64},
    "transformer": {
        **loaders._transformer_kwargs,
        "d_model": 64,
        "num_heads": 4,
        "num_layers": 1,
        "dim_feedforward": 128,
        "input_dimension": 64,
        "output_dimensions": [64],
    },
}

TINY_LM_CONFIG: dict[str, Any] = {
    "dim": 128,
    "existing_text_padding_id": 3,
    "n_q": 16,
    "dep_q": 8,
    "card": 2048,
    "num_heads": 4,
    "num_layers": 2,
    "hidden_scale": 4,
    "causal": True,
    "layer_scale": None,
    "context": 3000,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 64,
    "depformer_dim_feedforward": 128,
    "depformer_num_heads": 4,
    "depformer_num_layers": 1,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": MOSHI_DELAYS,
}


def moshi_7b_lm_config() -> dict[str, Any]:
    return copy.deepcopy(loaders._lm_kwargs)


def full_mimi_config() -> dict[str, Any]:
    return copy.deepcopy(loaders._mimi_config)
