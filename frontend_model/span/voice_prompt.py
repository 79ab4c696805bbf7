"""A voice prompt as the PersonaPlex family ships it: the agent's voice, prefilled ahead of the persona.

Two formats exist. Context Spanning's `voices/*.pt` hold agent-voice Mimi codes to feed as prefix frames;
PersonaPlex's hold the summed input embedding of each prompt column (replayed through the transformer as is) and
the LMGen token ring to restore afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VoicePrompt:
    name: str
    codes: torch.Tensor | None = None  # int64 [agent codebooks, P]: Context Spanning format
    embeddings: torch.Tensor | None = None  # [N-1, 1, 1, dim]: PersonaPlex format, one summed embedding a frame
    cache: torch.Tensor | None = None  # int64 [1, num_codebooks, 4]: PersonaPlex format, the ring after the replay

    @property
    def frames(self) -> int:
        if self.codes is not None:
            return int(self.codes.shape[1])
        if self.embeddings is not None:
            return int(self.embeddings.shape[0])
        return 0
