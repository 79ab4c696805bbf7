"""Many conversations on one model: every slot steps in one batched `LMGen` step per tick.

A slot without a fresh user frame this tick is masked (exec mask), not fed silence, so its state is exactly as if
the tick had not happened; a span is injected for one slot with the others masked; a slot is reset when a session
joins. Each session therefore produces what it would produce alone (tests/test_batch_engine.py).
"""

from __future__ import annotations

import torch

from frontend_model.block import Block, Prefix
from frontend_model.engine import (
    DEFAULT_MAX_SPAN_FRAMES,
    FRAME_S,
    SAMPLED,
    Engine,
    EngineStateError,
    PrefillCost,
    SamplingConfig,
    StepResult,
)
from frontend_model.graphs import graph_path, to_host
from frontend_model.loading import LoadedModel
from frontend_model.row_sampling import RowSampling
from frontend_model.row_view import active_rows, rows


class BatchEngine(Engine):
    def __init__(
        self,
        model: LoadedModel,
        slots: int,
        sampling: SamplingConfig = SAMPLED,
        max_span_frames: int = DEFAULT_MAX_SPAN_FRAMES,
        cost: PrefillCost | None = None,
        frame_budget_s: float = FRAME_S,
    ) -> None:
        super().__init__(model, sampling, max_span_frames, cost, frame_budget_s)
        if slots < 1:
            raise ValueError("a batch needs at least one slot")
        self.slots = slots
        self._span_slot = 0
        # Step only the rows from the first to the last with a frame: eager on CPU; CUDA graphs want the batch.
        self.compact = not graph_path(model.device)

    def slot_offset(self, slot: int) -> int:
        return int(self._state().offsets[slot])

    @torch.no_grad()
    def reset_slot(self, slot: int, sampling: RowSampling | None = None) -> None:
        """A new session takes `slot`: its state starts fresh with its sampling (the engine's default when None,
        with fresh random seeds), the other slots' states are untouched."""
        self._require_running("reset_slot")
        state = self._state()
        mask = self._one_hot(slot)
        self._sampler().set_row(slot, sampling or RowSampling.from_config(self.sampling))
        offset_cpu = state.offset_cpu
        self.lm_gen.reset_streaming(mask)
        # LMGen counts global steps in offset_cpu only to hold back its very first outputs; per-slot offsets do
        # that job for a joining slot, and resetting the count would blank everyone's next outputs.
        state.offset_cpu = offset_cpu

    @torch.no_grad()
    def step_batch(self, user_codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """One tick, left on the device (no host read): `user_codes` [slots, user codebooks]; `active` [slots] marks
        slots with a fresh frame. Returns [slots, 1 + agent codebooks] (text, agent codes); a slot without output
        (masked, or its delays still filling) has the ungenerated id in its text column."""
        self._require_running("step_batch")
        if user_codes.shape != (self.slots, self.span.user_codebooks) or active.shape != (self.slots,):
            raise ValueError(f"expected codes [{self.slots}, {self.span.user_codebooks}] and a mask [{self.slots}]")
        active = active.to(self.model.device, torch.bool)
        self.lm_gen.set_exec_mask(active)
        lo, hi = active_rows(active, self.compact)
        with rows([self.lm_gen], lo, hi), self._sampler().installed(active, lo, hi):
            out = self.lm_gen.step(user_codes.to(self.model.device, torch.long)[lo:hi, :, None])
        self.steps += 1
        tokens = torch.full((self.slots, 1 + self.span.agent_codebooks), self.model.lm.ungenerated_token_id,
                            dtype=torch.long, device=self.model.device)
        if out is not None:
            tokens[lo:hi] = out[:, : 1 + self.span.agent_codebooks, 0]
        return tokens

    @torch.no_grad()
    def step_slots(self, user_codes: torch.Tensor, active: torch.Tensor) -> list[StepResult | None]:
        """`step_batch` with its outputs on the host, in one transfer: a StepResult per active slot, else None."""
        device = self.model.device
        tokens = self.step_batch(user_codes, active)
        host = to_host(torch.cat([tokens, active.to(device, torch.long)[:, None]], dim=1))
        ungenerated = self.model.lm.ungenerated_token_id
        return [None if not row[-1] else StepResult(None, None) if row[0] == ungenerated
                else StepResult(int(row[0]), torch.from_numpy(row[1:-1].copy())) for row in host]

    @torch.no_grad()
    def inject_slot(self, slot: int, block: Block) -> None:
        """Inject a span for one slot; every other slot is masked and left exactly as it was."""
        self._require_running("inject_slot")
        if self.slot_offset(slot) == 0:
            raise EngineStateError(f"inject before slot {slot}'s first step")
        self.lm_gen.set_exec_mask(self._one_hot(slot))
        self._span_slot = slot
        self._insert(block, one_pass=True)

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
