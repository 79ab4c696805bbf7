"""Seeded random weights in a given architecture: the `tiny` and `moshi-7b` profiles and the tiny checkpoints."""

from __future__ import annotations

import math
from typing import Any

import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE


def random_models(
    lm_config: dict[str, Any], mimi_config: dict[str, Any], device: str, dtype: torch.dtype, seed: int
) -> tuple[LMModel, MimiModel]:
    """The same seed gives the same weights; the caller's global RNG state is left as it was."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        mimi = loaders.get_mimi(None, mimi_config, device=device, num_codebooks=lm_config["n_q"] // 2)
        randomise_codebooks(mimi)
        lm = loaders.get_moshi_lm(None, lm_kwargs=lm_config, device=device, dtype=dtype)
    finally:
        torch.random.set_rng_state(generator_state)
    return lm.eval(), mimi


def randomise_codebooks(mimi: MimiModel) -> None:
    """Untrained codebooks are all zeros, which would map every frame to code 0 and hide codec bugs.

    Each residual stage gets random codewords at the scale of the residual it quantises, measured on a fixed
    probe signal, so that different sounds get different codes as with a trained codec.
    """
    t = torch.arange(FRAME_SAMPLES * 8, dtype=torch.float32) / SAMPLE_RATE
    probe = torch.stack([0.3 * torch.randn_like(t), 0.5 * torch.sin(2 * math.pi * 440 * t), torch.zeros_like(t)])
    device = next(mimi.parameters()).device
    with torch.no_grad():
        latent = mimi._encode_to_unquantized_latent(probe[:, None].to(device))
        for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
            residual = rvq.input_proj(latent)
            for layer in rvq.vq.layers:
                codebook = layer._codebook
                x = layer.project_in(residual.transpose(1, 2))
                scale = x.std().clamp(min=1e-6)
                codebook.embedding_sum.copy_(torch.randn_like(codebook.embedding_sum) * scale)
                codebook.cluster_usage.fill_(1.0)
                codebook._initialized.fill_(1.0)
                codebook._cached_initialized = False
                codebook.register_buffer("_embedding", None, persistent=False)
                residual = residual - layer.decode(layer.encode(residual))
