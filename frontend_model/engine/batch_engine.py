"""Many conversations on one model: every slot steps in one batched `LMGen` step per tick.

A slot without a fresh user frame this tick is masked (exec mask), not fed silence, so its state is exactly as if
the tick had not happened; a span is injected for one slot with the others masked; a slot is reset when a session
joins. Each session therefore produces what it would produce alone (tests/frontend_model/test_batch_engine.py).

A fault in one slot's part of a step (its row raises, or its logits hold a NaN or +inf) costs that slot only: the
slot gets a RowFault in place of its result, and the other slots get the result and the state they would have had
without it. A NaN shows in the per-row flag the sampler keeps on the device, copied to the host with the step's
outputs in the tick's one device-to-host copy; rows never mix, so the other rows' results stand as they are. A step
that raises is undone (StepCheckpoint: the counters a step moves, saved before each step), each active slot is
stepped alone to find the ones that raise (fault path only: one step per active slot), and the others are stepped
again together. A failed slot's KV rows are zeroed when the slot is next reset, so its NaN cannot leak into the next
session through an attention weight of zero.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.costs import PrefillCost
from frontend_model.engine.engine import (
    DEFAULT_MAX_SPAN_FRAMES,
    SAMPLED,
    Engine,
    EngineStateError,
    SamplingConfig,
    StepResult,
)
from frontend_model.engine.optimisations import Optimisations
from frontend_model.frame import FRAME_S
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.graphs import graph_path, to_host
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.moshi_internals.row_sampling import RowSampling
from frontend_model.moshi_internals.row_view import active_rows, rows
from frontend_model.moshi_internals.step_undo import Checkpoints, StepCheckpoint
from frontend_model.span.block import Block, Prefix

logger = logging.getLogger(__name__)


class RowFault(RuntimeError):
    """One slot's part of a batched step failed (it raised, or its logits were not finite): that slot's state is
    lost, the other slots' state is intact."""


@dataclass(frozen=True)
class BatchStep:
    """A tick's outputs, on the device until the tick's one transfer to the host."""

    tokens: torch.Tensor  # [slots, 1 + agent codebooks]: text, agent codes; the ungenerated id where no output
    finite: torch.Tensor  # [slots] bool: the row's logits held no NaN or +inf
    raised: dict[int, RowFault]  # slots whose part of the step raised


class BatchEngine(Engine):
    def __init__(
        self,
        model: LoadedModel,
        slots: int,
        sampling: SamplingConfig = SAMPLED,
        max_span_frames: int = DEFAULT_MAX_SPAN_FRAMES,
        cost: PrefillCost | None = None,
        frame_budget_s: float = FRAME_S,
        prefill: SpanPrefill = SpanPrefill.ONE_PASS,
        optimisations: Optimisations | None = None,
    ) -> None:
        super().__init__(model, sampling, max_span_frames, cost, frame_budget_s, prefill, optimisations)
        if slots < 1:
            raise ValueError("a batch needs at least one slot")
        self.slots = slots
        self._span_slot = 0
        # Step only the rows from the first to the last with a frame: eager on CPU; CUDA graphs want the batch.
        self.compact = not graph_path(model.device)
        self._checkpoints: Checkpoints | None = None
        self._faulted: set[int] = set()  # slots whose KV rows may hold NaN until they are reset

    def start(self) -> None:
        super().start()
        self._checkpoints = Checkpoints([self.lm_gen], [(self._sampler(), "draws")])

    def slot_offset(self, slot: int) -> int:
        return int(self._state().offsets[slot])

    @torch.no_grad()
    def reset_slot(self, slot: int, sampling: RowSampling | None = None) -> None:
        """A new session takes `slot`: its state starts fresh with its sampling (the engine's default when None,
        with fresh random seeds), the other slots' states are untouched."""
        self._require_running("reset_slot")
        state = self._state()
        mask = self._one_hot(slot)
        if slot in self._faulted:
            for attn in attention_layers(self.model.lm.transformer):
                attn._streaming_state.kv_cache.cache[:, slot].zero_()  # type: ignore[union-attr]
            self._faulted.discard(slot)
        self._sampler().set_row(slot, sampling or RowSampling.from_config(self.sampling))
        offset_cpu = state.offset_cpu
        self.lm_gen.reset_streaming(mask)
        # LMGen counts global steps in offset_cpu only to hold back its very first outputs; per-slot offsets do
        # that job for a joining slot, and resetting the count would blank everyone's next outputs.
        state.offset_cpu = offset_cpu

    def set_sampling(self, slot: int, sampling: RowSampling, restart: bool) -> None:
        """A session changes its sampling mid-stream (between ticks); `restart` when it sent new seeds."""
        self._sampler().set_row(slot, sampling, restart)

    @torch.no_grad()
    def step_batch(self, user_codes: torch.Tensor, active: torch.Tensor) -> BatchStep:
        """One tick, left on the device (no host read): `user_codes` [slots, user codebooks]; `active` [slots] marks
        slots with a fresh frame. A slot whose part of the step raised is in `raised` (found on the fault path);
        the others' results are unchanged by it."""
        self._require_running("step_batch")
        if user_codes.shape != (self.slots, self.span.user_codebooks) or active.shape != (self.slots,):
            raise ValueError(f"expected codes [{self.slots}, {self.span.user_codebooks}] and a mask [{self.slots}]")
        codes = user_codes.to(self.model.device, torch.long)
        checkpoint = self._checkpoint().take()
        try:
            out, lo, hi = self._step_rows(codes, active)
        except Exception as exc:
            return self._isolate(codes, active, checkpoint, exc)
        self.steps += 1
        return BatchStep(self._tokens(out, lo, hi), self._sampler().finite.clone(), {})

    def _step_rows(self, codes: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor | None, int, int]:
        """LMGen's step for the `active` slots: its output for the rows lo..hi-1 it computed, lo and hi."""
        mask = active.to(self.model.device, torch.bool)
        self.lm_gen.set_exec_mask(mask)
        lo, hi = active_rows(mask, self.compact)
        with rows([self.lm_gen], lo, hi), self._sampler().installed(mask, lo, hi):
            out = self.lm_gen.step(codes[lo:hi, :, None])
        self._record_step()
        return out, lo, hi

    def _tokens(self, out: torch.Tensor | None, lo: int, hi: int) -> torch.Tensor:
        """[slots, 1 + agent codebooks] (text, agent codes); the ungenerated id where a slot has no output (masked,
        or its delays still filling)."""
        tokens = torch.full((self.slots, 1 + self.span.agent_codebooks), self.model.lm.ungenerated_token_id,
                            dtype=torch.long, device=self.model.device)
        if out is not None:
            tokens[lo:hi] = out[:, : 1 + self.span.agent_codebooks, 0]
        return tokens

    @torch.no_grad()
    def step_slots(self, user_codes: torch.Tensor, active: torch.Tensor) -> list[StepResult | RowFault | None]:
        """`step_batch` with its outputs on the host, in one transfer: per slot a StepResult, a RowFault, or None
        when it was not active."""
        step = self.step_batch(user_codes, active)
        device = self.model.device
        flags = torch.stack([step.finite.long(), active.to(device, torch.long)], dim=1)
        host = to_host(torch.cat([step.tokens, flags], dim=1))
        ungenerated = self.model.lm.ungenerated_token_id
        results: list[StepResult | RowFault | None] = []
        for slot, row in enumerate(host):
            if slot in step.raised:
                results.append(step.raised[slot])
            elif not row[-1]:
                results.append(None)
            elif not row[-2]:
                results.append(self.non_finite(slot))
            elif row[0] == ungenerated:
                results.append(StepResult(None, None))
            else:
                results.append(StepResult(int(row[0]), torch.from_numpy(row[1:-2].copy())))
        return results

    def non_finite(self, slot: int) -> RowFault:
        """`slot`'s logits held a NaN or +inf this tick: its state is lost (and its KV rows zeroed at its reset)."""
        self._faulted.add(slot)
        return RowFault(f"slot {slot}: NaN or inf in the model's logits")

    def _isolate(self, codes: torch.Tensor, active: torch.Tensor, checkpoint: StepCheckpoint,
                 error: Exception) -> BatchStep:
        """The batched step raised: undo it, step each active slot alone to find the ones that raise, and step the
        others again together. If no slot raises alone, the step as a whole failed: `error` is raised with every
        slot's state as it was before the step. (The fault path: the host reads the mask here.)"""
        logger.warning("a batched step raised; finding the slots that raise alone", exc_info=error)
        checkpoint.restore()
        faults: dict[int, RowFault] = {}
        for slot in active.cpu().nonzero().flatten().tolist():
            try:
                self._step_rows(codes, self._one_hot(slot))
            except Exception as exc:
                faults[slot] = RowFault(f"slot {slot}: {type(exc).__name__}: {exc}")
                faults[slot].__cause__ = exc
                self._faulted.add(slot)
            checkpoint.restore()
        if not faults:
            raise error
        healthy = active.to(self.model.device, torch.bool).clone()
        healthy[list(faults)] = False
        if not bool(healthy.any()):
            return BatchStep(self._tokens(None, 0, 0), torch.ones(self.slots, dtype=torch.bool,
                                                                  device=self.model.device), faults)
        step = self.step_batch(codes, healthy)
        return BatchStep(step.tokens, step.finite, {**step.raised, **faults})

    def _checkpoint(self) -> Checkpoints:
        if self._checkpoints is None:
            raise EngineStateError("engine not started")
        return self._checkpoints

    @torch.no_grad()
    def inject_slot(self, slot: int, block: Block) -> None:
        """Inject a span for one slot; every other slot is masked and left exactly as it was."""
        self._require_running("inject_slot")
        if self.slot_offset(slot) == 0:
            raise EngineStateError(f"inject before slot {slot}'s first step")
        self.lm_gen.set_exec_mask(self._one_hot(slot))
        self._span_slot = slot
        try:
            self._insert(block, one_pass=True)
        except Exception:
            self._faulted.add(slot)  # its session fails; its KV rows are zeroed when the slot is reset
            raise

    @torch.no_grad()
    def prefill_slot(self, slot: int, prefix: Prefix) -> None:
        """Prefill a joining slot's persona prefix, before its first step; the other slots are left as they were."""
        self._require_running("prefill_slot")
        if self.slot_offset(slot) != 0:
            raise EngineStateError(f"prefill of slot {slot} after its first step")
        self.lm_gen.set_exec_mask(self._one_hot(slot))
        self._span_slot = slot
        self._prefill(prefix, one_pass=True)

    def _forced_rows(self) -> tuple[int, int]:
        """Only the injecting slot's row goes through the transformer: the others would be computed for nothing."""
        return self._span_slot, self._span_slot + 1

    def _one_hot(self, slot: int) -> torch.Tensor:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} out of range 0..{self.slots - 1}")
        mask = torch.zeros(self.slots, dtype=torch.bool, device=self.model.device)
        mask[slot] = True
        return mask
