"""What the engine forces into the model: n frames of tokens (a span, or a prefix's frames)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Block:
    """Row 0 the text token of each frame, then the agent audio rows, then the user audio rows, one column a frame.

    A span block's columns go into the delayed stream verbatim; a prefix's block holds undelayed frames (`Prefix`).
    """

    tokens: torch.Tensor  # [1 + agent + user, n] int64

    @property
    def frames(self) -> int:
        return int(self.tokens.shape[1])


@dataclass(frozen=True)
class Prefix:
    """A persona prefix, prefilled before the first step: optional replayed columns, then frames.

    `block` holds undelayed frames (text, agent rows, user rows). Without embeddings they are laid out as the model
    was trained on them (frontend_model/span/convention.py): the stream's initial column, then frame j at position
    j + 1. `embeddings` [E, dim] are the summed input embeddings of the stream's first E columns, initial one
    included (a PersonaPlex voice prompt), after which the frames are laid out through the LM's delays as
    PersonaPlex's runtime steps them; `carry` [rows] is the frame before them, whose delayed rows the first of them
    reads.
    """

    block: Block
    embeddings: torch.Tensor | None = None
    carry: torch.Tensor | None = None

    @property
    def replayed(self) -> int:
        return 0 if self.embeddings is None else int(self.embeddings.shape[0])

    @property
    def frames(self) -> int:
        """Stream positions the prefix fills, the initial column included: the engine's offset after prefilling it."""
        return (self.replayed or 1) + self.block.frames
