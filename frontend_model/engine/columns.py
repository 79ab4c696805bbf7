"""The delayed token stream the temporal transformer reads, one column a position.

Column c holds the delay-0 rows of frame c (text, agent semantic, user semantic) and each delayed row of frame
c - delay (the acoustic rows, delay 1). Spans are columns inserted verbatim into this stream; prefixes are frames
laid out through the delays, as PersonaPlex's runtime steps them. Feeding a column means embedding it the way
`LMModel.forward_text` does; a PersonaPlex voice prompt instead hands over those summed embeddings directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from moshi.models.lm import LMModel


def embed_columns(lm: LMModel, columns: torch.Tensor) -> torch.Tensor:
    """[B, rows, T] token columns -> [B, T, dim]: the summed input embedding, as `forward_text` computes it."""
    summed = None
    for cb in range(lm.num_audio_codebooks):
        emb = lm.emb[cb](columns[:, cb + lm.audio_offset])
        summed = emb if summed is None else summed + emb
    text = lm.text_emb(columns[:, 0])
    return text if summed is None else summed + text


def forward_last(lm: LMModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed embeddings [B, T, dim] through the streaming transformer: (transformer out, text logits) at the last
    position, [B, 1, dim] and [B, 1, 1, card], as `forward_text` computes them: all a prefill samples from, so a
    chunk's graph computes no more."""
    out = lm.transformer(x)
    if lm.out_norm:
        out = lm.out_norm(out)
    last = out[:, -1:]
    return last, lm.text_linear(last)[:, None]


def delayed_columns(frames: torch.Tensor, delays: Sequence[int], carry: torch.Tensor | None) -> torch.Tensor:
    """Frames [rows, m] (one frame a column, undelayed) -> the m stream columns they fill, [rows, m].

    Row r of column j reads frame j - delays[r]; before the first frame it reads `carry` [rows] (the frame before
    these ones, e.g. what a restored ring holds), or anything when None: the stream's first columns read initial
    tokens there (`initial_columns`). Exact for delays of at most 1, the only ones in this family.
    """
    rows, m = frames.shape
    before = carry if carry is not None else frames[:, 0]
    history = torch.cat([before[:, None].expand(rows, max(delays)), frames], dim=1)
    index = torch.arange(m)[None] + max(delays) - torch.tensor(list(delays))[:, None]
    return history.gather(1, index.to(frames.device))


def initial_columns(columns: torch.Tensor, start: int, delays: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """Where column `start + j` is among the stream's first ones (position <= delay), the row reads `initial`.

    `columns` [B, rows, T], `delays` [rows], `initial` [1, rows, 1]; as LMGen does at its first steps.
    """
    positions = start + torch.arange(columns.shape[-1], device=columns.device)
    return torch.where(positions[None, None] <= delays[None, :, None], initial, columns)
