"""Frame-by-frame stepping of a Moshi-family LM with one-pass Context Span injection.

`inject(block)` feeds the n frames of a block through the temporal transformer as one T=n forward and then
advances the LMGen token ring and offsets by hand, leaving exactly the state that n forced `LMGen` steps
(user input = the block's user rows, text forced, depformer replaced by the block's agent rows) would leave.
`inject_stepwise` is that frame-by-frame reference; tests and benchmarks compare the two.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from moshi.models.lm import LMGen, scatter_with_mask_

from frontend_model.block import Block
from frontend_model.kv_ring import widen_kv_rings
from frontend_model.loading import LoadedModel
from frontend_model.span_block import MIN_SPAN_FRAMES, SpanBuild, build_span, forbidden_ids

DEFAULT_MAX_SPAN_FRAMES = 640
FRAME_S = 0.080
NO_FRAME_BUDGET = "no_frame_budget"


class EngineStateError(RuntimeError):
    """An engine call made in a lifecycle state that does not allow it."""


@dataclass(frozen=True)
class StepResult:
    """One frame of output, aligned across delays; both are None while the delays are still filling."""

    text_token: int | None
    agent_codes: torch.Tensor | None  # [agent codebooks] int64


@dataclass(frozen=True)
class SamplingConfig:
    use_sampling: bool = True
    temp: float = 0.8
    temp_text: float = 0.7
    top_k: int = 250
    top_k_text: int = 25


GREEDY = SamplingConfig(use_sampling=False)
SAMPLED = SamplingConfig()


def interpolate(table: dict[int, float], x: int) -> float:
    """Linear interpolation between measured sizes (extrapolated from the last two past the end)."""
    sizes = sorted(table)
    lo = max((s for s in sizes if s <= x), default=sizes[0])
    hi = min((s for s in sizes if s >= x), default=sizes[-1])
    if lo == hi:
        if x > sizes[-1] and len(sizes) > 1:
            lo, hi = sizes[-2], sizes[-1]
        else:
            return table[lo]
    slope = (table[hi] - table[lo]) / (hi - lo)
    return table[lo] + slope * (x - lo)


@dataclass(frozen=True)
class PrefillCost:
    """Measured cost of one plain step and of a span prefill of n frames plus the next step."""

    step_s: float
    span_s: dict[int, float]

    def predict(self, frames: int) -> float:
        if frames <= 0:
            return self.step_s
        return interpolate(self.span_s, frames)

    def max_frames(self, budget_s: float, ceiling: int) -> int:
        """Largest n whose prefill and next step fit the budget (0 if even a one-frame span does not)."""
        best = 0
        for n in range(MIN_SPAN_FRAMES, ceiling + 1):
            if self.predict(n) > budget_s:
                break
            best = n
        return best


def no_span_budget_warning(cost: PrefillCost, budget_s: float) -> str:
    """Why a span cap is 0, for the startup log: every span will be dropped with reason `no_frame_budget`."""
    return (f"no span fits the frame: a {MIN_SPAN_FRAMES}-frame span and the next step were measured at "
            f"{cost.predict(MIN_SPAN_FRAMES) * 1e3:.1f} ms, over the {budget_s * 1e3:.1f} ms left of the frame budget; "
            f"every span will be dropped ({NO_FRAME_BUDGET}). Use a faster device, fewer sessions, or --span-cap fixed")


class Engine:
    """One conversation on one model: `start`, optional `prefill`, then `step` per frame and `inject` spans.

    The engine owns the LM's streaming state while started, so one model serves one started engine at a time.
    """

    def __init__(
        self,
        model: LoadedModel,
        sampling: SamplingConfig = SAMPLED,
        max_span_frames: int = DEFAULT_MAX_SPAN_FRAMES,
        cost: PrefillCost | None = None,
        frame_budget_s: float = FRAME_S,
    ) -> None:
        if model.lm.dep_q != model.span.agent_codebooks:
            raise NotImplementedError(
                f"{model.profile}: LMGen would run {model.lm.dep_q} depformer steps; loading limits it to the "
                f"{model.span.agent_codebooks} agent codebooks (frontend_model.depformer)"
            )
        self.model = model
        self.span = model.span
        self.max_span_frames = max_span_frames
        self.cost = cost
        self.frame_budget_s = frame_budget_s
        # Most frames a span may have so that its prefill and the next step keep the frame slot (fixed per engine).
        self.span_frame_cap = cost.max_frames(frame_budget_s, max_span_frames) if cost else max_span_frames
        self._forbidden = forbidden_ids(model.tokenizer, model.span)
        suppressed = sorted(model.suppressed_text_ids)
        self._suppressed = torch.tensor(suppressed, device=model.device) if suppressed else None
        self.lm_gen = LMGen(
            model.lm,
            use_sampling=sampling.use_sampling,
            temp=sampling.temp,
            temp_text=sampling.temp_text,
            top_k=sampling.top_k,
            top_k_text=sampling.top_k_text,
            on_text_hook=self._on_text,
            on_text_logits_hook=self._on_text_logits,
        )
        self.slots = 1
        self._forced_text: torch.Tensor | None = None
        self.last_text_logits: torch.Tensor | None = None
        self.kv_capacity = 0
        self.steps = 0
        self._stream: ExitStack | None = None
        self._started = False
        self._closed = False
        device = model.device
        self._delays = torch.tensor(model.lm.delays, dtype=torch.long, device=device)
        self._gen_rows = 1 + model.lm.dep_q
        self._max_delay = int(max(model.lm.delays))

    # lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._closed:
            raise EngineStateError("engine is closed; create a new one")
        if self._started:
            raise EngineStateError("engine already started")
        self._stream = self.lm_gen.streaming(self.slots)
        self.kv_capacity = widen_kv_rings(self.model.lm.transformer, self.max_span_frames)
        self._started = True

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
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
        out = self.lm_gen.step(self._user_column(user_codes))
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
        self._force(block)

    @torch.no_grad()
    def prefill(self, block: Block) -> None:
        """Prefill a persona / system prefix in one pass, before the first step."""
        self._require_running("prefill")
        if self.steps != 0 or self.offset != 0:
            raise EngineStateError("prefill is only allowed before the first step")
        self._force(block)

    @torch.no_grad()
    def inject_stepwise(self, block: Block) -> None:
        """The frame-by-frame reference: n ordinary LMGen steps with text and agent audio forced."""
        self._require_running("inject_stepwise")
        self._check_block(block)
        tokens = block.tokens.to(self.model.device)
        agent = slice(1, 1 + self.span.agent_codebooks)
        user = slice(1 + self.span.agent_codebooks, None)
        for i in range(block.frames):
            self._forced_text = tokens[0, i].view(1)
            try:
                self.lm_gen.step(tokens[None, user, i : i + 1], depformer_replace_tokens=tokens[None, agent, i : i + 1])
            finally:
                self._forced_text = None
        self.steps += block.frames

    # internals -----------------------------------------------------------------------------------------
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
        rows = self.span.num_rows
        if block.tokens.dim() != 2 or block.tokens.shape[0] != rows:
            raise ValueError(f"block must be [{rows}, n], got {tuple(block.tokens.shape)}")
        if not 0 < block.frames <= self.max_span_frames:
            raise ValueError(f"block has {block.frames} frames; this engine takes 1..{self.max_span_frames}")

    def _user_column(self, user_codes: torch.Tensor) -> torch.Tensor:
        codes = user_codes.to(self.model.device, torch.long).reshape(-1)
        if codes.numel() != self.span.user_codebooks:
            raise ValueError(f"expected {self.span.user_codebooks} user codes, got {codes.numel()}")
        return codes.view(1, -1, 1)

    def _on_text(self, text_token: torch.Tensor) -> None:
        if self._forced_text is not None:
            text_token.copy_(self._forced_text)

    def _on_text_logits(self, logits: torch.Tensor) -> None:
        """Keeps the model's own logits for inspection, then masks the ids this model must never sample."""
        if self._suppressed is None:
            self.last_text_logits = logits
            return
        self.last_text_logits = logits.clone()
        logits[..., self._suppressed] = float("-inf")

    def _forward_span(self, inputs: torch.Tensor, state: Any) -> None:
        """The T=n forward that writes the block into the KV cache."""
        self.model.lm.forward_text(inputs, state.condition_sum, state.condition_cross)

    def _force(self, block: Block) -> None:
        self._check_block(block)
        state = self._state()
        tokens = block.tokens.to(state.cache.device)[None].expand(state.batch_size, -1, -1)
        n = block.frames
        ring = state.cache
        ring_len = ring.shape[2]
        g = self._gen_rows
        offsets = state.offsets
        window = ring.gather(2, ((offsets[:, None] + torch.arange(max(self._max_delay, 1), device=ring.device))
                                 % ring_len)[:, None].expand(-1, ring.shape[1], -1))

        # Inputs of the n steps, in the LM's delayed layout. Text and agent rows read at position p what was
        # written after step p-1 (the ring for the first frame, then the block); a user row with delay d reads
        # what the user fed at step p-d (the ring for the first d frames, then the block).
        inputs = torch.empty_like(tokens)
        inputs[:, :g, 0] = window[:, :g, 0]
        inputs[:, :g, 1:] = tokens[:, :g, :-1]
        for d in sorted(set(self.model.lm.delays[g:])):
            rows = [g + k for k, delay in enumerate(self.model.lm.delays[g:]) if delay == d]
            inputs[:, rows] = torch.cat([window[:, rows, :d], tokens[:, rows]], dim=2)[:, :, :n]
        positions = offsets[:, None, None] + torch.arange(n, device=ring.device)
        is_init = positions <= self._delays[None, :, None]
        inputs = torch.where(is_init, state.initial, inputs)

        self._forward_span(inputs, state)

        # The ring after n forced steps: only the last `ring_len` steps' writes survive.
        mask = state.exec_mask[:, None, None]
        for i in range(max(0, n - ring_len), n):
            step = offsets + i
            user_pos = ((step[:, None] + self._delays[None, g:]) % ring_len)[:, :, None]
            scatter_with_mask_(ring[:, g:], -1, user_pos, tokens[:, g:, i : i + 1], mask)
            gen_pos = ((step + 1) % ring_len)[:, None, None].expand(-1, g, 1)
            scatter_with_mask_(ring[:, :g], -1, gen_pos, tokens[:, :g, i : i + 1], mask)
        state.offsets = torch.where(state.exec_mask, offsets + n, offsets)
        state.offset_cpu += n


def time_call(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def device_sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None
