"""Which checkpoint `load_model` loads for a profile. The trained tiny model's directory is found (or made) by
training, and training loads its models through the loader: so callers resolve it here and hand the loader a
directory, and the loader never imports training."""

from __future__ import annotations

from frontend_model.loading.profiles import TRAINED_PROFILE


def profile_checkpoint(profile: str, checkpoint: str | None, seed: int = 0) -> str | None:
    """For `TRAINED_PROFILE`, the trained tiny model's cached directory (restored from its release, else trained);
    for any other profile, `checkpoint`. Training's modules are imported only for that profile."""
    if profile != TRAINED_PROFILE:
        return checkpoint
    from frontend_model.training.released import tiny_contextspan_checkpoint
    from frontend_model.training.trainer import TrainConfig

    return str(tiny_contextspan_checkpoint(TrainConfig(seed=seed)))
