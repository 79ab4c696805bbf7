"""Pure construction of span and prefix blocks: backend or persona text -> normalised, scrubbed tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sentencepiece
import torch

from frontend_model.span.block import Block, Prefix
from frontend_model.span.config import SpanConfig
from frontend_model.span.normaliser import normalise_text
from frontend_model.span.text_ids import WORD_START, non_text_ids
from frontend_model.span.voice_prompt import VoicePrompt

MIN_SPAN_FRAMES = 3  # open, one token, close


@dataclass(frozen=True)
class SpanBuild:
    """The outcome of turning backend text into a span: a block, or the reason there is none."""

    block: Block | None
    text: str
    token_ids: tuple[int, ...]
    truncated: bool = False
    dropped_text: str = ""
    reason: str | None = None

    @property
    def frames(self) -> int:
        return self.block.frames if self.block is not None else 0


def tokenize_data_text(
    text: str, tokenizer: sentencepiece.SentencePieceProcessor, forbidden: frozenset[int]
) -> tuple[str, list[int]]:
    """Normalise, drop characters the vocabulary can only spell with byte pieces, tokenise, drop control ids.

    Unspellable characters go before tokenising so that none leaves a dangling word-start piece behind.
    """
    normalised = normalise_text(text)
    unspellable = {ch for ch in set(normalised) if not ch.isspace() and forbidden.intersection(tokenizer.encode(ch))}
    if unspellable:
        normalised = " ".join("".join(ch for ch in normalised if ch not in unspellable).split())
    ids = [i for i in tokenizer.encode(normalised) if i not in forbidden]
    return normalised, ids


def cut_at_word_boundary(
    ids: list[int], limit: int, tokenizer: sentencepiece.SentencePieceProcessor
) -> list[int]:
    """The longest prefix of at most `limit` tokens that ends where a word ends (hard cut if no word fits)."""
    if len(ids) <= limit:
        return ids
    for end in range(limit, 0, -1):
        if tokenizer.id_to_piece(ids[end]).startswith(WORD_START):
            return ids[:end]
    return ids[:limit]


def cut_at_words(ids: list[int], words: int, tokenizer: sentencepiece.SentencePieceProcessor) -> list[int]:
    """The tokens of the first `words` words: a word starts at a piece that starts one, or at the first token."""
    starts = [i for i, token in enumerate(ids) if i == 0 or tokenizer.id_to_piece(token).startswith(WORD_START)]
    return ids[: starts[words]] if len(starts) > words else ids


def frames_block(text_ids: list[int], agent: torch.Tensor, user: torch.Tensor) -> Block:
    """Stack a text row over [agent, n] and [user, n] code rows."""
    text = torch.tensor(text_ids, dtype=torch.long)[None]
    return Block(torch.cat([text, agent.to(torch.long), user.to(torch.long)], dim=0))


def placeholder_rows(span: SpanConfig, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    agent = torch.tensor(span.silence_codes, dtype=torch.long)[:, None].expand(-1, frames)
    user = torch.tensor(span.sine_codes, dtype=torch.long)[:, None].expand(-1, frames)
    return agent, user


def build_span(
    text: str,
    tokenizer: sentencepiece.SentencePieceProcessor,
    span: SpanConfig,
    max_frames: int,
    forbidden: frozenset[int] | None = None,
) -> SpanBuild:
    """Backend text -> `[open] + tokens + [close]` with silence on agent rows and sine on user rows.

    Cut at a word boundary to fit `max_frames`, and to the contract's `max_words`; the cut is reported.
    """
    if max_frames < MIN_SPAN_FRAMES:
        raise ValueError(f"max_frames must leave room for open, one token and close, got {max_frames}")
    forbidden = forbidden if forbidden is not None else non_text_ids(tokenizer, span)
    normalised, ids = tokenize_data_text(text, tokenizer, forbidden)
    if not ids:
        reason = "empty text" if not text.strip() else "nothing left after removing control text"
        return SpanBuild(None, normalised, (), reason=reason)
    kept = cut_at_word_boundary(ids, max_frames - 2, tokenizer)
    contract = span.contract
    if contract.max_words is not None:
        # The cap is on the answer: the tool prefix in front of it is not counted.
        lead = contract.tool_prefix.strip()
        kept = cut_at_words(kept, contract.max_words + (len(lead.split()) if lead and normalised.startswith(lead)
                                                        else 0), tokenizer)
    truncated = len(kept) < len(ids)
    row = [span.open_id, *kept, span.close_id]
    agent, user = placeholder_rows(span, len(row))
    return SpanBuild(
        block=frames_block(row, agent, user),
        text=tokenizer.decode(kept),
        token_ids=tuple(kept),
        truncated=truncated,
        dropped_text=tokenizer.decode(ids[len(kept):]) if truncated else "",
    )


def silence_frames(span: SpanConfig, frames: int) -> Block:
    agent, user = placeholder_rows(span, frames)
    return frames_block([span.text_pad_id] * frames, agent, user)


def voice_part(
    voice: VoicePrompt, span: SpanConfig, delays: Sequence[int]
) -> tuple[torch.Tensor | None, torch.Tensor | None, Block]:
    """A voice prompt as (replayed embeddings [E, dim], carry frame [rows], frames) of a prefix.

    Codes (Context Spanning): one frame per code column, text padded, the sine on the user side. Embeddings
    (PersonaPlex): E replayed columns, then the restored ring, which holds column E whole and the delayed rows of
    column E + 1; as frames, that is frame E (delay-0 rows from column E, delayed ones from column E + 1) after a
    carry frame whose delayed rows column E reads.
    """
    if voice.codes is not None:
        codes = voice.codes.to(torch.long)
        if codes.dim() != 2 or codes.shape[0] != span.agent_codebooks:
            raise ValueError(f"voice {voice.name}: codes must be [{span.agent_codebooks}, frames]")
        _, user = placeholder_rows(span, codes.shape[1])
        return None, None, frames_block([span.text_pad_id] * codes.shape[1], codes, user)
    if voice.embeddings is None or voice.cache is None:
        raise ValueError(f"voice {voice.name} holds neither codes nor embeddings with their cache")
    ring = voice.cache.to(torch.long).reshape(voice.cache.shape[-2], voice.cache.shape[-1])
    if ring.shape[0] != span.num_rows or len(delays) != span.num_rows:
        raise ValueError(f"voice {voice.name}: a cache of {ring.shape[0]} rows and {len(delays)} delays, "
                         f"the model has {span.num_rows} rows")
    replayed = voice.frames
    here, after = ring[:, replayed % ring.shape[1]], ring[:, (replayed + 1) % ring.shape[1]]
    frame = torch.where(torch.tensor(list(delays)) > 0, after, here)
    return voice.embeddings.reshape(replayed, -1), here, Block(frame[:, None])


def build_prefix(
    system_text: str,
    tokenizer: sentencepiece.SentencePieceProcessor,
    span: SpanConfig,
    voice: VoicePrompt | None = None,
    delays: Sequence[int] = (),
    forbidden: frozenset[int] | None = None,
) -> Prefix | None:
    """Persona prefix in the family's order: voice prompt, silence, `<system> persona <system>`, silence.

    One text token a frame with silence on the agent rows and the sine on the user rows; `span.prefix_silence_frames`
    silence frames after the voice and after the text, and in their place when there is no voice or no text if the
    contract says the family always runs them. `delays` (the LM's) place an embeddings voice prompt.
    """
    forbidden = forbidden if forbidden is not None else non_text_ids(tokenizer, span)
    always = span.contract.prefix_silences_always
    embeddings = carry = None
    parts: list[Block] = []
    if voice is not None:
        embeddings, carry, frames = voice_part(voice, span, delays)
        parts.append(frames)
    if voice is not None or always:
        parts.append(silence_frames(span, span.prefix_silence_frames))
    _, persona_ids = tokenize_data_text(system_text, tokenizer, forbidden)
    if persona_ids:
        marker = tokenizer.encode("<system>")
        row = [*marker, *persona_ids, *marker]
        agent, user = placeholder_rows(span, len(row))
        parts.append(frames_block(row, agent, user))
    if persona_ids or always:
        parts.append(silence_frames(span, span.prefix_silence_frames))
    if not parts:
        return None
    return Prefix(Block(torch.cat([p.tokens for p in parts], dim=1)), embeddings, carry)
