"""The unit the engine forces into the model: n frames of tokens, one column a frame."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Block:
    """Row 0 the text token of each frame, then the agent audio rows (the depformer's place, in its delayed
    layout), then the user audio rows (the user's input): what n forced LMGen steps would feed and write."""

    tokens: torch.Tensor  # [1 + agent + user, n] int64

    @property
    def frames(self) -> int:
        return int(self.tokens.shape[1])
