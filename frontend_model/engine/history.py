"""A session's resumable model state: the columns the model consumed, its pending column and its sampler's state.

Everything a conversation has left in the model is a function of the token columns its temporal transformer read
(the prefix, each stepped frame's input column, each injected span's columns; frontend_model/engine/columns.py), of
the column the last step left pending in LMGen's token ring, and of the row sampler's settings and draw count (its
noise is a hash of seed and draw: frontend_model/moshi_internals/row_sampling.py). An engine that records
(`start_recording`) keeps the latest columns on the device; `SessionHistory.of` reads one slot's out between ticks,
`to_bytes` packs it (int16 columns and a JSON header, about 425 bytes a second of conversation), and `replay`
writes it into a fresh slot of any engine on the same model: its columns in one-pass chunks at their own stream
positions, the pending column, the sampler. The resumed session then steps as the uninterrupted one would have
(tests/frontend_model/test_history.py).

How much is kept: attention reaches `context` positions back per layer, so the next step reads, through the layers,
columns up to layers x (context - 1) positions back (`receptive_field`), prefix included while it is that close;
older ones cannot change anything the model computes again, so they are dropped. Keeping only the attention window
(`context`) would not be exact: the oldest kept keys of the upper layers were computed from columns before it.

The server (server/session/resume.py) saves each live session's blob about once a second to a store the replicas
share; a replica that takes the session over replays it into a free slot (a PersonaPlex voice prompt's embeddings,
which are no columns, are passed back from the prefix of the voice they came from), warms the slot's decoder with
the agent audio the columns hold (`spoken_frames`) and goes on with the backend's turns; the user's encoder starts
fresh (its PCM is not kept).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass

import numpy
import torch
from moshi.models.lm import LMModel

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.column_log import EMBEDDED, ColumnLog
from frontend_model.engine.columns import embed_columns
from frontend_model.engine.engine import Engine, EngineStateError
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.moshi_internals.row_sampling import RowSampler, RowSampling, Stream
from frontend_model.moshi_internals.streaming_state import streaming_states
from frontend_model.span.config import SpanConfig

VERSION = 1
MAGIC = b"CSHI"
_HEAD = struct.Struct("<4sBI")  # magic, version, JSON header length
_WIDTHS = {"int16": "<i2", "int32": "<i4"}  # the columns' storage: int16 unless a token id needs more
_POSITION_ROWS = ("offset", "offsets")  # per-row stream positions of moshi's transformer states (RoPE, masks)


class HistoryFormatError(ValueError):
    """A blob that is not a session history this code can read (corrupt, truncated, or another version)."""


def receptive_field(engine: Engine) -> int:
    """Columns back that the next step can still depend on: each layer attends `context - 1` positions back."""
    return sum((attn.context or 0) - 1 for attn in attention_layers(engine.model.lm.transformer))


def start_recording(engine: Engine, keep: int | None = None) -> ColumnLog:
    """From now on `engine` logs what each slot consumes, its latest `keep` columns (the receptive field by
    default: what replays exactly). Start before a slot's first prefill or step for its history to be whole."""
    keep = receptive_field(engine) if keep is None else keep
    log = ColumnLog(engine.slots, engine.span.num_rows, keep, engine.model.device)
    engine.recorder = log
    return log


@dataclass(frozen=True)
class SessionHistory:
    """Columns [rows, n] at stream positions start..start+n-1, the column pending at start+n, and the sampler."""

    start: int
    columns: torch.Tensor  # [rows, n] int64; EMBEDDED where a prefix replayed embeddings
    pending: torch.Tensor  # [rows] int64: what LMGen's token ring holds for the next step
    sampling: RowSampling
    draws: int

    @property
    def offset(self) -> int:
        """Stream positions the session has filled: where the next step is read."""
        return self.start + int(self.columns.shape[1])

    @classmethod
    def of(cls, engine: Engine, slot: int = 0) -> SessionHistory:
        """`slot`'s history now, between ticks, read to the host."""
        log = engine.recorder
        if log is None:
            raise EngineStateError("the engine keeps no history: start_recording(engine) before the session")
        state = engine._state()
        sampler = engine._sampler()
        offset = int(state.offsets[slot])
        n = min(log.keep, offset)
        settings = torch.stack([sampler.temperature[s][slot].double() for s in Stream]
                               + [t[s][slot].double() for t in (sampler.topk, sampler.seed) for s in Stream]
                               + [sampler.draws[slot].double()])
        # A copy of the ring's column: on CPU `.cpu()` is no copy, and the session's next step would change it.
        pending = state.cache[slot, :, offset % state.cache.shape[2]].clone()
        columns, pending, values = (t.cpu() for t in (log.recent(slot, offset, n).long(), pending, settings))
        text_t, audio_t, text_k, audio_k, text_s, audio_s, draws = values.tolist()
        sampling = RowSampling(text_t, int(text_k), audio_t, int(audio_k), int(text_s), int(audio_s))
        return cls(offset - n, columns, pending, sampling, int(draws))

    def to_bytes(self) -> bytes:
        """Magic, version, JSON header, then the columns and the pending column as little-endian integers."""
        tokens = torch.cat([self.columns, self.pending[:, None]], dim=1)
        dtype = "int16" if int(tokens.min()) >= -(2**15) and int(tokens.max()) < 2**15 else "int32"
        header = json.dumps({"start": self.start, "rows": int(tokens.shape[0]), "frames": int(self.columns.shape[1]),
                             "dtype": dtype, "sampling": asdict(self.sampling), "draws": self.draws},
                            separators=(",", ":")).encode()
        body = tokens.numpy().astype(_WIDTHS[dtype]).tobytes()
        return _HEAD.pack(MAGIC, VERSION, len(header)) + header + body

    @classmethod
    def from_bytes(cls, blob: bytes) -> SessionHistory:
        """The history `to_bytes` wrote; HistoryFormatError for anything else."""
        if len(blob) < _HEAD.size:
            raise HistoryFormatError(f"a session history blob is at least {_HEAD.size} bytes, got {len(blob)}")
        magic, version, length = _HEAD.unpack_from(blob)
        if magic != MAGIC:
            raise HistoryFormatError(f"not a session history (magic {magic!r}, expected {MAGIC!r})")
        if version != VERSION:
            raise HistoryFormatError(f"session history version {version}; this server reads version {VERSION}")
        try:
            header = json.loads(blob[_HEAD.size : _HEAD.size + length])
            rows, frames, width = int(header["rows"]), int(header["frames"]), numpy.dtype(_WIDTHS[header["dtype"]])
            sampling = RowSampling(**header["sampling"])
            start, draws = int(header["start"]), int(header["draws"])
        except (ValueError, KeyError, TypeError) as exc:
            raise HistoryFormatError(f"corrupt session history header: {exc}") from exc
        body = blob[_HEAD.size + length :]
        if rows < 1 or frames < 0 or start < 0 or len(body) != rows * (frames + 1) * width.itemsize:
            raise HistoryFormatError(f"session history body of {len(body)} bytes does not hold {rows} rows of "
                                     f"{frames} + 1 columns")
        tokens = torch.from_numpy(numpy.frombuffer(body, dtype=width).astype(numpy.int64).reshape(rows, frames + 1))
        return cls(start, tokens[:, :frames], tokens[:, frames], sampling, draws)


@torch.no_grad()
def replay(engine: Engine, history: SessionHistory, slot: int = 0, embeddings: torch.Tensor | None = None) -> None:
    """Resume `history` in `slot` (fresh: reset, never prefilled or stepped): its columns through the transformer at
    their own positions, in one-pass chunks of at most the engine's span length (each as exact as a span), then
    the pending column and the sampler; no token is sampled. `embeddings` are the prefix's replayed ones [E, dim],
    needed while the history still reaches them."""
    engine._require_running("replay")
    state = engine._state()
    if int(state.offsets[slot]) != 0:
        raise EngineStateError(f"replay into slot {slot}, which has a session of its own: reset it first")
    if history.columns.shape[0] != engine.span.num_rows:
        raise ValueError(f"a history of {history.columns.shape[0]} rows; this model reads {engine.span.num_rows}")
    if isinstance(engine, BatchEngine):
        engine.lm_gen.set_exec_mask(engine._one_hot(slot))
        engine._span_slot = slot
    elif slot != 0:
        raise ValueError("an Engine has one slot, 0")
    lo, hi = engine._forced_rows()
    device = engine.model.device
    columns = history.columns.to(device)
    marked = columns[0] == EMBEDDED
    x = embed_columns(engine.model.lm, torch.where(marked, 0, columns)[None])
    embedded = int(marked.sum())
    if embedded:
        if embeddings is None:
            raise ValueError(f"the history starts with {embedded} positions of replayed embeddings: pass the prefix's")
        x[:, :embedded] = embeddings[history.start : history.start + embedded].to(device, x.dtype).reshape(
            1, embedded, -1)
    for positions in _positions(engine):
        positions[lo:hi] = history.start
    for chunk in x.split(engine.max_span_frames, dim=1) if x.shape[1] else ():  # a session that never stepped
        engine._forward(chunk, one_pass=True)
    offset = history.offset
    state.cache[lo, :, offset % state.cache.shape[2]] = history.pending.to(device)
    state.offsets[lo:hi] = offset
    state.offset_cpu = max(state.offset_cpu, offset)  # LMGen holds back outputs while this global count is small
    _restore_sampler(engine._sampler(), slot, history)
    if engine.recorder is not None:
        engine.recorder.forced(lo, state.offsets[lo:hi] - history.columns.shape[1], columns[None])
    engine.steps = max(engine.steps, 1)  # a resumed conversation takes spans at once


def spoken_frames(history: SessionHistory, span: SpanConfig, lm: LMModel, last: int) -> torch.Tensor:
    """The agent audio codes [agent codebooks, n] of the last `last` frames (n <= last) that the session's decoder
    decoded, read back from the history's columns: a resumed slot's decoder is warmed with them (no byte more in the
    blob).

    Only steps emit audio, and a frame's codes are spread over the columns the steps read by the delays: row r's code
    of the frame a step read at column c sits `delays[r]` stepped columns on (the pending column last). The columns
    no step read, a prefix's and the spans', hold the sine placeholder on every user row (or the initial token where
    the stream starts, or EMBEDDED: a replayed voice prompt); a stepped column holds the user's own codes, so only a
    user whose codes are the placeholder's on every codebook would be taken for a span. LMGen emits nothing for a
    step at a position below its largest delay (the stream's start)."""
    columns = history.columns
    user = columns[1 + span.agent_codebooks :]
    placeholder = (user == torch.tensor(span.sine_codes)[:, None]) | (user >= lm.card)
    stepped = (~(placeholder.all(dim=0) | (columns[0] == EMBEDDED))).nonzero()[:, 0]
    stream = torch.cat([columns[:, stepped], history.pending[:, None]], dim=1)
    agent = slice(1, 1 + span.agent_codebooks)
    max_delay = max(lm.delays)
    n = max(0, stream.shape[1] - max_delay)  # frames whose every code is in the history
    at = torch.arange(n)[None] + torch.tensor(lm.delays[agent])[:, None]
    frames = stream[agent].gather(1, at)[:, history.start + stepped[:n] >= max_delay]
    return frames[:, frames.shape[1] - min(last, frames.shape[1]) :]


def _positions(engine: Engine) -> list[torch.Tensor]:
    """Every per-row stream position the transformer keeps: the layers' offsets and their rings' end offsets."""
    found: list[torch.Tensor] = []
    for state in streaming_states([engine.model.lm.transformer]):
        found += [getattr(state.state, name) for name in state.rows if name in _POSITION_ROWS]
        found += [getattr(state.state, name).end_offset for name in state.rings]
    return found


def _restore_sampler(sampler: RowSampler, slot: int, history: SessionHistory) -> None:
    sampler.set_row(slot, history.sampling)
    sampler.draws[slot] = history.draws
