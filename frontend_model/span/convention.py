"""The Context Spanning sequence convention: how a conversation is laid out for training, and so for serving.

Written from the paper and the reference's training code (mindlogic-ai/Context-Spanning,
`model/sequence_convention.py` and `training/`), which the released model was trained on. One sequence of frames,
one column a frame, rows: text, the agent's codebooks, the user's codebooks (SpanConfig's counts).

- Prefix: the persona prefix's frames (`build_prefix`: voice codes, silence, `<system> persona <system>`, silence)
  come first. They carry no loss.
- `<ret>`: the text token of a frame (the reference places it on the frame before the agent's grounded turn) is
  `SpanConfig.ret_id`; its text loss is up-weighted.
- A span block inserted before frame f is n frames: text `[open] + tokens + [close]`, the silence codes on the agent
  rows, the sine codes on the user rows. No loss on them.
- The MOVE rule: the acoustic codes (every codebook but the first, both sides) of frame f-1 move to the block's last
  frame, and frame f-1 keeps the placeholders there (and loses its audio loss). Through the delays (acoustic rows
  lag one column), the transformer then reads the block as n constant columns and frame f-1's acoustic codes after
  the block, in frame f's column: real audio exactly once around the block.
- The text token of frame f is predicted at the block's close position, and supervised there.

`assemble` returns the frames (what `LMModel.forward_train` takes, undelayed) with per-frame loss weights;
`Assembled.columns` is the delayed stream the temporal transformer reads, position by position, which the engine is
tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import sentencepiece
import torch

from frontend_model.span.block import Prefix
from frontend_model.span.build import build_span
from frontend_model.span.config import SpanConfig


class Kind(IntEnum):
    """What a frame of an assembled sequence is."""

    PREFIX = 0
    LIVE = 1
    SPAN = 2


@dataclass(frozen=True)
class SpanAt:
    """A span block inserted before live frame `frame`; `text_ids` is its whole text row, open and close included."""

    frame: int
    text_ids: tuple[int, ...]

    @classmethod
    def from_text(
        cls, frame: int, text: str, tokenizer: sentencepiece.SentencePieceProcessor, span: SpanConfig,
        max_frames: int = 10_000,
    ) -> SpanAt:
        """Backend text as the server builds it (normalised, control text removed): the same ids at both ends."""
        built = build_span(text, tokenizer, span, max_frames)
        if built.block is None:
            raise ValueError(f"span text {text!r} leaves no tokens: {built.reason}")
        return cls(frame, tuple(int(t) for t in built.block.tokens[0].tolist()))


@dataclass(frozen=True)
class Conversation:
    """Live frames of a dialogue (one a frame, 80 ms) with its `<ret>` frames, spans and persona prefix.

    `text` [T] the agent's text id per frame (the pad id between words), `agent` [agent codebooks, T] and `user`
    [user codebooks, T] the Mimi codes, frame-aligned (undelayed). `ret_frames` are written to `<ret>` by `assemble`.
    `prefix` is `build_prefix`'s output (codes voice only: an embeddings voice prompt has no frames to train on).
    """

    text: torch.Tensor
    agent: torch.Tensor
    user: torch.Tensor
    ret_frames: tuple[int, ...] = ()
    spans: tuple[SpanAt, ...] = ()
    prefix: Prefix | None = None

    @property
    def frames(self) -> int:
        return int(self.text.shape[0])


@dataclass(frozen=True)
class LossWeights:
    """The reference's fine-tuning weights: `<ret>` up-weighted, pad down-weighted, acoustic codebooks light."""

    ret: float = 5.0
    pad: float = 0.5
    semantic: float = 1.0
    acoustic: float = 0.02


@dataclass(frozen=True)
class Assembled:
    """A training sequence of N frames, undelayed, with what each frame is and its loss weights.

    `frames` [rows, N]: text row, agent rows, user rows (after the MOVE rule). `kinds` [N] (`Kind`), `live` [N] the
    live frame index of each frame (-1 in prefix and span frames). `text_weight` [N] weighs the text target of each
    frame; `audio_weight` [agent + user codebooks, N] each audio target (the agent's semantic row weighs
    `semantic`, every other row `acoustic`, as the reference trains), aligned with frames as moshi's
    `forward_train` aligns its logits: a model whose depformer predicts fewer rows takes the first `dep_q`.
    `span_slices` locate each block's frames, in order.
    """

    frames: torch.Tensor
    kinds: torch.Tensor
    live: torch.Tensor
    text_weight: torch.Tensor
    audio_weight: torch.Tensor
    span_slices: tuple[slice, ...] = field(default=())

    def columns(self, delays: Sequence[int], initial: Sequence[int]) -> torch.Tensor:
        """[rows, N + 1]: what the temporal transformer reads at positions 0..N.

        Position 0 reads `initial` (the LM's initial token of each row); position j + 1 reads frame j's delay-0 rows
        and frame j - delay of the others, `initial` before the first frame, as moshi's `forward_train` and
        `LMGen` lay them out. The model's output at position j predicts frame j's text (and, through the depformer,
        the column at j + 1).
        """
        rows, n = self.frames.shape
        if len(delays) != rows or len(initial) != rows:
            raise ValueError(f"{len(delays)} delays and {len(initial)} initial tokens for {rows} rows")
        init = torch.tensor(list(initial), dtype=torch.long)[:, None]
        out = init.expand(rows, n + 1).clone()
        for r, d in enumerate(delays):
            if d < n:
                out[r, 1 + d:] = self.frames[r, : n - d]
        return out


def _prefix_frames(prefix: Prefix | None, span: SpanConfig) -> torch.Tensor:
    if prefix is None:
        return torch.zeros(span.num_rows, 0, dtype=torch.long)
    if prefix.embeddings is not None:
        raise ValueError("a prefix with a replayed (embeddings) voice prompt has no frames to assemble")
    return prefix.block.tokens.to(torch.long)


def _check(conversation: Conversation, span: SpanConfig) -> None:
    t = conversation.frames
    if conversation.text.dim() != 1:
        raise ValueError(f"text must be [T], got {tuple(conversation.text.shape)}")
    if tuple(conversation.agent.shape) != (span.agent_codebooks, t):
        raise ValueError(f"agent must be [{span.agent_codebooks}, {t}], got {tuple(conversation.agent.shape)}")
    if tuple(conversation.user.shape) != (span.user_codebooks, t):
        raise ValueError(f"user must be [{span.user_codebooks}, {t}], got {tuple(conversation.user.shape)}")
    for f in conversation.ret_frames:
        if not 0 <= f < t:
            raise ValueError(f"<ret> frame {f} outside the {t} live frames")
    seen = set()
    for s in conversation.spans:
        if not 0 <= s.frame < t:
            raise ValueError(f"span before frame {s.frame}: it must go before one of the {t} live frames")
        if s.frame in seen:
            raise ValueError(f"two spans before frame {s.frame}")
        seen.add(s.frame)
        ids = s.text_ids
        if len(ids) < 3 or ids[0] != span.open_id or ids[-1] != span.close_id:
            raise ValueError(f"span text ids must be [open, token(s)..., close], got {list(ids)}")


def assemble(conversation: Conversation, span: SpanConfig, weights: LossWeights = LossWeights()) -> Assembled:
    """The training sequence of a conversation: prefix, live frames with `<ret>`, span blocks by the MOVE rule."""
    _check(conversation, span)
    a, u = span.agent_codebooks, span.user_codebooks
    text = conversation.text.to(torch.long).clone()
    for f in conversation.ret_frames:
        text[f] = span.ret_id
    live = torch.cat([text[None], conversation.agent.to(torch.long), conversation.user.to(torch.long)], dim=0)
    prefix = _prefix_frames(conversation.prefix, span)
    frames = torch.cat([prefix, live], dim=1)
    p = prefix.shape[1]
    kinds = torch.cat([torch.full((p,), Kind.PREFIX), torch.full((live.shape[1],), Kind.LIVE)])
    index = torch.cat([torch.full((p,), -1), torch.arange(live.shape[1])])
    audio_on = kinds == Kind.LIVE
    acoustic = [*range(2, 1 + a), *range(2 + a, 1 + a + u)]
    silence = torch.tensor(span.silence_codes, dtype=torch.long)
    sine = torch.tensor(span.sine_codes, dtype=torch.long)
    placeholder = torch.cat([silence, sine])[[r - 1 for r in acoustic]]
    # Latest first, so that each span's frame index still points into the unspliced live frames.
    for s in sorted(conversation.spans, key=lambda s: s.frame, reverse=True):
        at = p + s.frame
        n = len(s.text_ids)
        block = torch.cat([torch.tensor(s.text_ids, dtype=torch.long)[None],
                           silence[:, None].expand(a, n), sine[:, None].expand(u, n)], dim=0).clone()
        if at > 0:
            block[acoustic, -1] = frames[acoustic, at - 1]
            frames[acoustic, at - 1] = placeholder
            audio_on[at - 1] = False
        frames = torch.cat([frames[:, :at], block, frames[:, at:]], dim=1)
        kinds = torch.cat([kinds[:at], torch.full((n,), Kind.SPAN), kinds[at:]])
        index = torch.cat([index[:at], torch.full((n,), -1), index[at:]])
        audio_on = torch.cat([audio_on[:at], torch.zeros(n, dtype=torch.bool), audio_on[at:]])
    text_weight = (kinds == Kind.LIVE).float()
    text_weight = torch.where(frames[0] == span.text_pad_id, text_weight * weights.pad, text_weight)
    text_weight = torch.where(frames[0] == span.ret_id, text_weight * weights.ret, text_weight)
    per_row = torch.full((a + u,), weights.acoustic)
    per_row[0] = weights.semantic
    audio_weight = per_row[:, None] * audio_on.float()[None]
    starts = (kinds == Kind.SPAN) & torch.cat([torch.tensor([True]), kinds[:-1] != Kind.SPAN])
    lengths = [len(s.text_ids) for s in sorted(conversation.spans, key=lambda s: s.frame)]
    slices = tuple(slice(int(i), int(i) + n) for i, n in zip(torch.nonzero(starts).flatten().tolist(), lengths))
    return Assembled(frames, kinds, index, text_weight, audio_weight, slices)
