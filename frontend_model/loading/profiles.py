"""Model architectures by profile name: the small CPU `tiny` configs and the real Moshi 7B shape.

- `tiny`, `moshi-7b`: random weights built in memory (seeded).
- `tiny-personaplex`, `tiny-contextspan`: random tiny weights with 16 depformer codebooks, written once to a cache
  directory in the PersonaPlex / Context Spanning file layouts and loaded from there like a real checkpoint.
- `tiny-contextspan-trained`: the tiny Context Spanning model trained on this machine (`contextspan train`, cached),
  loaded from its directory like any Context Spanning checkpoint: on a CPU it asks for facts and says them.
- `moshi`, `personaplex`, `contextspan`: a checkpoint given with --checkpoint; its layout is read from its files.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from moshi.models import loaders

TRAINED_PROFILE = "tiny-contextspan-trained"
PROFILES = ("tiny", "tiny-personaplex", "tiny-contextspan", TRAINED_PROFILE, "moshi-7b", "moshi", "personaplex",
            "contextspan")
RANDOM_PROFILES = ("tiny", "moshi-7b")
# The file layouts checkpoints come in (frontend_model/loading/checkpoint/files.py tells them apart).
Layout = Literal["kyutai", "personaplex", "contextspan"]
# Random tiny checkpoints and the file layout each is written in.
TINY_CHECKPOINT_PROFILES: dict[str, Layout] = {"tiny-personaplex": "personaplex", "tiny-contextspan": "contextspan"}
# The layout each checkpoint profile expects (a mismatch is logged, not refused).
PROFILE_LAYOUTS: dict[str, Layout] = {"moshi": "kyutai", "personaplex": "personaplex", "contextspan": "contextspan",
                                      TRAINED_PROFILE: "contextspan", **TINY_CHECKPOINT_PROFILES}

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


# What `reduced_width` shrinks: everything but the vocabulary, the codebooks, dep_q and the delays.
WIDTH_KEYS = ("dim", "num_heads", "num_layers", "hidden_scale", "depformer_dim", "depformer_dim_feedforward",
              "depformer_num_heads", "depformer_num_layers")


def reduced_width(lm_config: dict[str, Any]) -> dict[str, Any]:
    """A real architecture at the tiny widths, so a CPU test steps its vocabulary, codebooks, dep_q and delays."""
    return {**lm_config, **{k: TINY_LM_CONFIG[k] for k in WIDTH_KEYS}}
