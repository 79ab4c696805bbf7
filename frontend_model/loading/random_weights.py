"""Seeded random weights in a given architecture: the `tiny` and `moshi-7b` profiles and the tiny checkpoints."""

from __future__ import annotations

from typing import Any

import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel

from frontend_model.loading.babble import babble

STAGE_PROBE_SECONDS = 20.0  # a stretch of the probe for each residual stage
CODEWORD_JITTER = 0.05  # of the residual's spread: copies of one probe frame stay apart


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

    Each residual stage's codewords are frames of a speech-like probe's residual at that stage, a little jittered,
    as k-means starts. Codewords drawn around noise and a sine kept 3 semantic codes of 2048 over a thousand frames
    of speech, so a model trained on the codes could not hear words; these keep about 500 of each codebook. Each
    stage draws from its own stretch of the probe, which the stages before it quantised without having been drawn
    from it: a stretch that had drawn its own codewords would leave a residual of jitter only, and the next stage's
    codewords would all but coincide.
    """
    device = next(mimi.parameters()).device
    # The stages in use: the full Mimi has 32, of which a model with 8 codebooks uses 8 (the rest stay unused).
    stages = max(mimi.quantizer.rvq_first.n_q, mimi.quantizer.rvq_rest.n_q)
    probe = babble(STAGE_PROBE_SECONDS * stages).to(device)
    with torch.no_grad():  # a stretch at a time: the full Mimi's encoder on the whole probe would take gigabytes
        latent = torch.cat([mimi._encode_to_unquantized_latent(stretch[None, None])
                            for stretch in probe.chunk(stages)], dim=-1)
        stretches = latent.shape[-1] // stages
        for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
            _ignore_the_constant(rvq.input_proj, latent.mean(dim=(0, 2)))
            residual = rvq.input_proj(latent)
            for stage, layer in enumerate(rvq.vq.layers[:rvq.n_q]):
                codebook = layer._codebook
                bins, dim = codebook.embedding_sum.shape
                own = residual[..., stage * stretches:(stage + 1) * stretches]
                frames = layer.project_in(own.transpose(1, 2)).reshape(-1, dim)
                picked = frames[torch.randint(len(frames), (bins,)).to(device)]
                codebook.embedding_sum.copy_(picked + CODEWORD_JITTER * frames.std() * torch.randn_like(picked))
                codebook.cluster_usage.fill_(1.0)
                codebook._initialized.fill_(1.0)
                codebook._cached_initialized = False
                codebook.register_buffer("_embedding", None, persistent=False)
                residual = residual - layer.decode(layer.encode(residual))


def _ignore_the_constant(projection: torch.nn.Module, mean: torch.Tensor) -> None:
    """A random encoder's latent is mostly one constant vector (its spread over speech is ~5 % of its norm): the
    quantiser, which measures distances as |x|^2 - 2 x.c + |c|^2, would then round away the differences between
    codewords, and a one-ulp change of the input (a batch of another size) would pick another code. The projection
    into the quantiser drops that direction."""
    if not isinstance(projection, torch.nn.Conv1d):
        return
    direction = mean / mean.norm().clamp(min=1e-12)
    weight = projection.weight[:, :, 0]
    projection.weight[:, :, 0] = weight - torch.outer(weight @ direction, direction)
