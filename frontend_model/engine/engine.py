"""Frame-by-frame stepping of a Moshi-family LM with one-pass Context Span injection.

A span block is n columns inserted verbatim into the delayed stream the temporal transformer reads, the layout the
Context Spanning model was trained on (frontend_model/span/convention.py): after live column k-1 the transformer
reads B_1 .. B_n, then column k. Column k is the one the last step left pending in LMGen's token ring (the next
frame's text and agent semantic, the acoustic codes of the frame before on both sides); `inject` writes the block
into the KV cache in one T=n forward, samples that column's text token and agent semantic code again from the close
position (where training supervises them; the ones sampled before the span are dropped) and moves the ring n places
on, so that column is read after the block. The first frame out after a span is therefore conditioned on it. (The
reference runtime instead returns the block's close id and SILENCE[0] there and patches them.) `inject_stepwise`
feeds the same columns one at a time, the reference that tests and benchmarks compare with.

A persona prefix is undelayed frames laid out as trained (the stream's initial column, then frame j at position
j + 1), or after a replayed PersonaPlex voice prompt, through the delays as PersonaPlex steps its prompts; `prefill`
runs it in one pass and samples the pending column from its last position.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import torch
from moshi.models.lm import LMGen

from frontend_model.engine.chunked_prefill import ChunkedPrefill, ScratchRow, SpanPrefill
from frontend_model.engine.column_log import ColumnLog
from frontend_model.engine.columns import delayed_columns, embed_columns, forward_last, initial_columns
from frontend_model.engine.costs import PrefillCost
from frontend_model.engine.optimisations import Optimisation, Optimisations
from frontend_model.frame import FRAME_S
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.graphs import graph_path, release_graphs, set_up_graphs, step_depformer
from frontend_model.moshi_internals.kv_ring import wide_rings
from frontend_model.moshi_internals.row_sampling import RowSampler, RowSampling, SamplingConfig, Stream
from frontend_model.moshi_internals.row_view import rows
from frontend_model.moshi_internals.streaming_state import stop_streaming
from frontend_model.span.block import Block, Prefix
from frontend_model.span.build import MIN_SPAN_FRAMES, SpanBuild, build_span

DEFAULT_MAX_SPAN_FRAMES = 640
NO_FRAME_BUDGET = "no_frame_budget"
CHUNK_OPTIMISATIONS: tuple[Optimisation, ...] = ("scratch_row", "prefill_graphs")


class EngineStateError(RuntimeError):
    """An engine call made in a lifecycle state that does not allow it."""


@dataclass(frozen=True)
class StepResult:
    """One frame of output, aligned across delays; both are None while the delays are still filling."""

    text_token: int | None
    agent_codes: torch.Tensor | None  # [agent codebooks] int64


GREEDY = SamplingConfig(use_sampling=False)
SAMPLED = SamplingConfig()


class Engine:
    """One conversation on one model: `start`, optional `prefill`, then `step` per frame and `inject` spans.

    The engine owns the LM's streaming state while started, so one model serves one started engine at a time.
    `prefill` chooses how spans and prefixes are written (frontend_model/engine/chunked_prefill.py): CHUNKED builds
    the chunk
    graphs at `start`; FASTER picks per length by `cost` and builds them only if chunks win for some length.
    `optimisations` is the record of the GPU optimisations this model's engines start with (a fresh one when None):
    one that failed is off, and the engine takes its eager path (frontend_model/engine/optimisations.py).
    """

    def __init__(
        self,
        model: LoadedModel,
        sampling: SamplingConfig = SAMPLED,
        max_span_frames: int = DEFAULT_MAX_SPAN_FRAMES,
        cost: PrefillCost | None = None,
        frame_budget_s: float = FRAME_S,
        prefill: SpanPrefill = SpanPrefill.ONE_PASS,
        optimisations: Optimisations | None = None,
    ) -> None:
        if model.lm.dep_q != model.span.agent_codebooks:
            raise ValueError(
                f"{model.profile}: the depformer runs {model.lm.dep_q} steps but the model speaks "
                f"{model.span.agent_codebooks} agent codebooks; a PersonaPlex-family (dep_q 16) checkpoint must be "
                "limited to its agent rows first "
                "(frontend_model.moshi_internals.depformer.run_depformer_for_agent_only)"
            )
        self.model = model
        self.optimisations = optimisations or Optimisations(cuda=model.device.type == "cuda")
        self.span = model.span
        self.max_span_frames = max_span_frames
        self.cost = cost
        self.frame_budget_s = frame_budget_s
        # Most frames a span may have so that its prefill and the next step keep the frame slot (fixed once started).
        self.prefill_mode = prefill
        self.span_frame_cap = cost.max_frames(frame_budget_s, max_span_frames, prefill) if cost else max_span_frames
        self._forbidden = model.agent_text.non_text
        suppressed = sorted(model.suppressed_text_ids)
        self._suppressed = torch.tensor(suppressed, device=model.device) if suppressed else None
        self.lm_gen = LMGen(
            model.lm,
            use_sampling=True,
            temp=Stream.AUDIO,  # the row sampler's markers: each row samples with its own settings
            temp_text=Stream.TEXT,
            on_text_logits_hook=self._on_text_logits,
        )
        self.slots = 1
        self.sampling = sampling
        self.sampler: RowSampler | None = None
        self.chunked: ChunkedPrefill | None = None
        self.last_text_logits: torch.Tensor | None = None
        self.recorder: ColumnLog | None = None  # what each slot consumed, to resume it (engine/history.py)
        self.kv_capacity = 0
        self.steps = 0
        self._stream: ExitStack | None = None
        self._started = False
        self._closed = False
        self._delays = torch.tensor(model.lm.delays, dtype=torch.long, device=model.device)

    # lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._closed:
            raise EngineStateError("engine is closed; create a new one")
        if self._started:
            raise EngineStateError("engine already started")
        try:
            with wide_rings(self.model.lm.transformer, self.max_span_frames) as capacity:
                self._stream = self.lm_gen.streaming(self.slots)
            self.kv_capacity = capacity
            set_up_graphs(self.lm_gen, self.optimisations.enabled("step_graphs"))
            if self._may_chunk():
                self.chunked = self._chunked_prefill()
            if self.chunked is None:
                self._one_pass()
        except BaseException:
            # Out of device memory, say: the model is left as it was found, for a smaller engine to start.
            self.close()
            stop_streaming(self.lm_gen)
            raise
        self.sampler = RowSampler(self.slots, RowSampling.from_config(self.sampling), self.model.device)
        self._started = True

    def close(self) -> None:
        if self._stream is not None:
            release_graphs(self.lm_gen)
            self._stream.close()
            self._stream = None
        if self.chunked is not None:
            self.chunked.close()
        self.chunked = None
        self._closed = True

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def offset(self) -> int:
        """Frames the model has consumed so far (steps plus injected frames)."""
        return int(self._state().offsets[0])

    def prepare_span(self, text: str) -> SpanBuild:
        """Backend text -> block within the frame cap (cut at a word boundary, reported in the result).

        Pure CPU work on the caller's thread; only `inject` must run where the model steps. A cap too small for any
        span (a slow host: see `no_span_budget_warning`) yields no block, with the reason.
        """
        if self.span_frame_cap < MIN_SPAN_FRAMES:
            return SpanBuild(None, text, (), reason=NO_FRAME_BUDGET)
        return build_span(text, self.model.tokenizer, self.span, self.span_frame_cap, self._forbidden)

    # per frame -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, user_codes: torch.Tensor) -> StepResult:
        """Feed one frame of user codes ([user codebooks]); sample one text token and the agent's codes."""
        self._require_running("step")
        with self._sampler().installed(self._state().exec_mask):
            out = self.lm_gen.step(self._user_column(user_codes))
        self._record_step()
        self.steps += 1
        if out is None:
            return StepResult(None, None)
        return StepResult(int(out[0, 0, 0]), out[0, 1 : 1 + self.span.agent_codebooks, 0])

    @torch.no_grad()
    def inject(self, block: Block) -> None:
        """Write a span block into the KV cache in one forward pass at the current frame boundary."""
        self._require_running("inject")
        if self.steps == 0:
            raise EngineStateError("inject before the first step: use prefill() for a prefix before streaming")
        self._insert(block, one_pass=True)

    @torch.no_grad()
    def inject_stepwise(self, block: Block) -> None:
        """The column-by-column reference: the same columns through the transformer one at a time (T=1)."""
        self._require_running("inject_stepwise")
        self._insert(block, one_pass=False)

    @torch.no_grad()
    def prefill(self, prefix: Prefix) -> None:
        """Prefill a persona / system prefix in one pass, before the first step."""
        self._require_running("prefill")
        if self.steps != 0 or self.offset != 0:
            raise EngineStateError("prefill is only allowed before the first step")
        self._prefill(prefix, one_pass=True)

    @torch.no_grad()
    def prefill_stepwise(self, prefix: Prefix) -> None:
        """The column-by-column reference for `prefill`."""
        self._require_running("prefill_stepwise")
        self._prefill(prefix, one_pass=False)

    # internals -----------------------------------------------------------------------------------------
    def _sampler(self) -> RowSampler:
        if self.sampler is None:
            raise EngineStateError("engine not started")
        return self.sampler

    def _state(self) -> Any:
        state = self.lm_gen._streaming_state
        if state is None:
            raise EngineStateError("engine not started")
        return state

    def _require_running(self, what: str) -> None:
        if self._closed:
            raise EngineStateError(f"{what} after close: the engine's state has been released")
        if not self._started:
            raise EngineStateError(f"{what} before start()")

    def _check_block(self, block: Block) -> None:
        num_rows = self.span.num_rows
        if block.tokens.dim() != 2 or block.tokens.shape[0] != num_rows:
            raise ValueError(f"block must be [{num_rows}, n], got {tuple(block.tokens.shape)}")
        self._check_length(block.frames)

    def _user_column(self, user_codes: torch.Tensor) -> torch.Tensor:
        codes = user_codes.to(self.model.device, torch.long).reshape(-1)
        if codes.numel() != self.span.user_codebooks:
            raise ValueError(f"expected {self.span.user_codebooks} user codes, got {codes.numel()}")
        return codes.view(1, -1, 1)

    def _on_text_logits(self, logits: torch.Tensor) -> None:
        """Keeps a copy of the model's own logits for inspection (under CUDA graphs `logits` is the graph's output
        buffer, which the next step overwrites), then masks the ids this model must never sample."""
        self.last_text_logits = logits.clone()
        if self._suppressed is not None:
            logits[..., self._suppressed] = float("-inf")

    def _forced_rows(self) -> tuple[int, int]:
        """The batch rows a span or prefix is written for: the engine's only one here."""
        return 0, self.slots

    def _may_chunk(self) -> bool:
        """Whether the chunk graphs and the scratch row (a session's KV ring) are worth building: CHUNKED, or FASTER
        where calibration measured chunks faster for some span length."""
        if self.prefill_mode is SpanPrefill.CHUNKED:
            return True
        return self.prefill_mode is SpanPrefill.FASTER and any(self._chunks(n)
                                                               for n in range(1, self.max_span_frames + 1))

    def _one_pass(self) -> None:
        """No chunks were built (not wanted, or they failed to start): spans go in one pass, and the cap counts what
        one pass costs."""
        for name in CHUNK_OPTIMISATIONS:
            self.optimisations.unused(name)
        if self.cost is not None and self.cost.chunk_s:
            self.cost = replace(self.cost, chunk_s={})
            self.span_frame_cap = self.cost.max_frames(self.frame_budget_s, self.max_span_frames, self.prefill_mode)

    def _chunked_prefill(self) -> ChunkedPrefill | None:
        """The scratch row and the chunk graphs captured on it; None, and spans in one pass, where either fails."""
        lm, optimisations = self.model.lm, self.optimisations
        if not optimisations.enabled("prefill_graphs"):
            return None  # no scratch row for chunks that cannot run
        scratch = optimisations.attempt("scratch_row", lambda: ScratchRow(lm.transformer))
        if scratch is None:
            return None
        return optimisations.attempt("prefill_graphs", lambda: ChunkedPrefill(lm, scratch, self.max_span_frames))

    def _chunks(self, frames: int) -> bool:
        """Whether a fast prefill of `frames` positions goes in chunks (by the mode, and for FASTER the cost)."""
        if self.prefill_mode is SpanPrefill.CHUNKED:
            return True
        return self.prefill_mode is SpanPrefill.FASTER and self.cost is not None and self.cost.chunked_faster(frames)

    def _forward(self, x: torch.Tensor, one_pass: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed input embeddings [rows, T, dim] of the forced rows through the temporal transformer, in one pass
        or chunks (`one_pass`), else position by position: (out, text logits) at the last position."""
        lo, hi = self._forced_rows()
        lm = self.model.lm
        if one_pass and self.chunked is not None and self._chunks(x.shape[1]):
            return self.chunked.forward(x, lo)
        with rows([lm.transformer], lo, hi):
            if one_pass:
                return forward_last(lm, x)
            for i in range(x.shape[1]):
                last = forward_last(lm, x[:, i : i + 1])
        return last

    def _check_length(self, frames: int) -> None:
        if not 0 < frames <= self.max_span_frames:
            raise ValueError(f"block has {frames} frames; this engine takes 1..{self.max_span_frames}")

    def _insert(self, block: Block, one_pass: bool) -> None:
        """Span columns verbatim into the stream; the pending column is read after them, its text token and agent
        semantic code sampled again from the close position (the frame training supervises there)."""
        self._check_block(block)
        lo, hi = self._forced_rows()
        columns = block.tokens.to(self.model.device)[None].expand(hi - lo, -1, -1)
        out, logits = self._forward(embed_columns(self.model.lm, columns), one_pass)
        text, semantic = self._sample_next(out, logits, lo, hi)
        state = self._state()
        ring = state.cache[lo:hi]
        offsets = state.offsets[lo:hi]
        # The pending column would have been read at its own position: the stream's first ones read initial tokens.
        at = (offsets % ring.shape[2])[:, None, None].expand(-1, ring.shape[1], 1)
        pending = ring.gather(2, at)
        pending[:, 0, 0] = text
        pending[:, 1, 0] = semantic
        is_init = offsets[:, None, None] <= self._delays[None, :, None]
        ring.scatter_(2, at, torch.where(is_init, state.initial, pending))
        ring.copy_(torch.roll(ring, block.frames, dims=2))
        if self.recorder is not None:
            self.recorder.forced(lo, offsets, columns)
        self._advance(lo, hi, block.frames)

    def _sample_next(self, out: torch.Tensor, logits: torch.Tensor, lo: int, hi: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """What LMGen's step samples from a position's output: the next column's text token and agent semantic
        code ([hi - lo] each), with the rows' own sampling; the depformer's other codebooks are not kept.

        On the graph path through the step's own graphed depformer, for the whole batch (the one shape it was
        captured for) with only rows lo..hi drawing: the one shape a graph replays (docs/engine.md says what the
        exit costs on an H200)."""
        self._on_text_logits(logits)
        exec_mask = self._state().exec_mask
        if not graph_path(self.model.device):
            with self._sampler().installed(exec_mask, lo, hi):
                text = self._sampler().sample(logits, Stream.TEXT)[:, 0, 0]
                return text, self.lm_gen.depformer_step(text, out)[:, 0]
        drawing = torch.zeros_like(exec_mask)
        drawing[lo:hi] = exec_mask[lo:hi]
        with self._sampler().installed(drawing):
            text = self._sampler().sample(_whole_batch(logits, lo, exec_mask.shape[0]), Stream.TEXT)[:, 0, 0]
            semantic = step_depformer(self.lm_gen)(text, _whole_batch(out, lo, exec_mask.shape[0]))[:, 0]
        return text[lo:hi], semantic[lo:hi].clone()  # a replayed graph overwrites its output at the next call

    def _prefill(self, prefix: Prefix, one_pass: bool) -> None:
        """Replayed embeddings, then the frames' columns, in one forward; then the pending column is sampled."""
        block = prefix.block
        self._check_block(block)
        self._check_length(prefix.frames)
        lm = self.model.lm
        state = self._state()
        lo, hi = self._forced_rows()
        device = self.model.device
        frames = block.tokens.to(device)
        if prefix.embeddings is None:
            # As the model was trained: the stream's initial column, then frame j at position j + 1.
            initial = state.initial[0, :, 0]
            columns = delayed_columns(torch.cat([initial[:, None], frames], dim=1), lm.delays, initial)
            columns = columns[None].expand(hi - lo, -1, -1)
        else:
            carry = None if prefix.carry is None else prefix.carry.to(device)
            columns = delayed_columns(frames, lm.delays, carry)[None].expand(hi - lo, -1, -1)
            columns = initial_columns(columns, prefix.replayed, self._delays, state.initial)
        x = embed_columns(lm, columns)
        if prefix.embeddings is not None:
            replay = prefix.embeddings.to(device, x.dtype).reshape(1, prefix.replayed, -1).expand(hi - lo, -1, -1)
            x = torch.cat([replay, x], dim=1)
        # The next column's text token and agent semantic code come from the last position; its acoustic rows (agent
        # and user, delay 1) are the last frame's.
        text, semantic = self._sample_next(*self._forward(x, one_pass), lo, hi)
        # The ring as LMGen's step on the last column leaves it: that column, then the next one but for the user
        # rows a step reads from its own input.
        ring = state.cache[lo:hi]
        ring_len = ring.shape[2]
        ring[:, :, (prefix.frames - 1) % ring_len] = columns[:, :, -1]
        user_input = torch.zeros_like(self._delays, dtype=torch.bool)
        user_input[1 + self.span.agent_codebooks :] = self._delays[1 + self.span.agent_codebooks :] == 0
        at = prefix.frames % ring_len
        pending = torch.where(user_input[None], ring[:, :, at], frames[:, -1][None])
        pending[:, 0] = text
        pending[:, 1] = semantic
        ring[:, :, at] = pending
        if self.recorder is not None:
            self.recorder.forced(lo, state.offsets[lo:hi], columns, prefix.replayed)
        self._advance(lo, hi, prefix.frames)

    def _record_step(self) -> None:
        """The columns a step consumed, into the session history where one is kept."""
        if self.recorder is not None:
            self.recorder.stepped(self._state(), self._delays)

    def _advance(self, lo: int, hi: int, frames: int) -> None:
        state = self._state()
        state.offsets[lo:hi] += frames
        state.offset_cpu += frames


def _whole_batch(rows: torch.Tensor, lo: int, batch: int) -> torch.Tensor:
    """Rows lo.. of a batch, zeros elsewhere: the batch's shape, for a graph captured at it."""
    if rows.shape[0] == batch:
        return rows
    whole = torch.zeros((batch, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    whole[lo : lo + rows.shape[0]] = rows
    return whole
