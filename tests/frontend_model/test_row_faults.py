"""A fault in one slot's row of the batched step costs that slot only (float32, tiny profile, sampled with seeds).

The fault is injected inside the model's forward (tests/engine_helpers.ForwardFault): a hook on a transformer layer
that raises, or writes NaN into the armed slot's activations. The other slots must get every frame, with exactly
the outputs of a run without the fault, and the failed slot must serve its next session as a fresh one.
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest
import torch

from benchmarks.fakes.forward_fault import ForwardFault, InjectedFault
from frontend_model.engine.batch_engine import BatchEngine, RowFault
from frontend_model.engine.engine import SAMPLED, StepResult
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.moshi_internals.row_sampling import RowSampling
from tests.support.engine import snapshot, span_like_block, user_frames

CONTEXT = 8
MAX_SPAN = 16
TICKS = 30  # > CONTEXT + MAX_SPAN: the rings wrap
FAULT_AT = 12
SLOTS = 3


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32, context=CONTEXT)


def sampling(slot: int) -> RowSampling:
    return RowSampling(0.8, 50, 0.8, 100, 100 + slot, 200 + slot)


Output = tuple[int | None, tuple[int, ...] | None] | str


def run(model: LoadedModel, kind: str | None, victim: int, compact: bool = True,
        span_at: int | None = None, span_slot: int = 0) -> list[list[Output]]:
    """Every slot steps for TICKS with its own seed and audio; `victim` is armed at FAULT_AT (no fault if `kind` is
    None) and its session ends there; `span_slot` gets a span before tick `span_at`. Outputs per slot, 'fault' for a
    RowFault, 'span fault' for a span whose prefill raised (that session ends, as the Batcher ends it)."""
    frames = [user_frames(TICKS, 7 + slot) for slot in range(SLOTS)]
    got: list[list[Output]] = [[] for _ in range(SLOTS)]
    with BatchEngine(model, SLOTS, SAMPLED, max_span_frames=MAX_SPAN) as engine, ExitStack() as stack:
        engine.compact = compact
        fault = stack.enter_context(ForwardFault(engine, kind)) if kind is not None else None
        for slot in range(SLOTS):
            engine.reset_slot(slot, sampling(slot))
        for tick in range(TICKS):
            if tick == FAULT_AT and fault is not None:
                fault.arm(victim)
            if tick == span_at:
                try:
                    engine.inject_slot(span_slot, span_like_block(engine, MAX_SPAN, seed=3))
                except InjectedFault:
                    got[span_slot].append("span fault")
            active = torch.tensor([not (slot == victim and tick > FAULT_AT) and "span fault" not in got[slot]
                                   for slot in range(SLOTS)])
            for slot, result in enumerate(engine.step_slots(torch.stack([f[tick] for f in frames]), active)):
                if isinstance(result, RowFault):
                    got[slot].append("fault")
                elif isinstance(result, StepResult):
                    codes = None if result.agent_codes is None else tuple(result.agent_codes.tolist())
                    got[slot].append((result.text_token, codes))
        if fault is not None:
            assert fault.fired, "the fault never fired"
    return got


@pytest.mark.parametrize(("kind", "victim", "compact"), [("raise", 1, True), ("raise", 2, False), ("nan", 0, True),
                                                         ("nan", 1, False)])
def test_a_fault_in_one_row_fails_that_slot_only(model: LoadedModel, kind: str, victim: int, compact: bool) -> None:
    clean = run(model, None, victim, compact)
    faulty = run(model, kind, victim, compact)
    assert faulty[victim][:FAULT_AT] == clean[victim][:FAULT_AT]
    assert faulty[victim][FAULT_AT:] == ["fault"]
    for slot in set(range(SLOTS)) - {victim}:
        assert faulty[slot] == clean[slot], f"slot {slot}'s outputs changed"


def test_a_raise_with_a_span_in_the_same_tick_keeps_the_span(model: LoadedModel) -> None:
    """Slot 0's span is injected before the tick whose step raises for slot 2: the step is undone, not the span."""
    clean = run(model, None, 2, span_at=FAULT_AT)
    faulty = run(model, "raise", 2, span_at=FAULT_AT)
    assert faulty[0] == clean[0] and faulty[1] == clean[1]
    assert faulty[2][FAULT_AT:] == ["fault"]


def test_a_span_prefill_that_raises_fails_that_slot_only(model: LoadedModel) -> None:
    """The victim's own span prefill raises (one-slot forward, the others masked and not computed)."""
    clean = run(model, None, 1, span_at=FAULT_AT, span_slot=1)
    faulty = run(model, "raise", 1, span_at=FAULT_AT, span_slot=1)
    assert faulty[1][FAULT_AT:] == ["span fault"]
    assert faulty[0] == clean[0] and faulty[2] == clean[2]


def test_a_step_that_fails_for_every_row_raises_with_the_state_undone(model: LoadedModel) -> None:
    frames = user_frames(4, 1)
    with BatchEngine(model, 2, SAMPLED, max_span_frames=MAX_SPAN) as engine, ForwardFault(engine, "raise") as fault:
        for slot in range(2):
            engine.reset_slot(slot, sampling(slot))
        engine.step_slots(torch.stack([frames[0], frames[1]]), torch.tensor([True, True]))
        before, draws = snapshot(engine), engine.sampler.draws.clone()
        fault.arm(0)
        fault.arm(1)
        with pytest.raises(RowFault) as faults:
            raise_if_all_failed(engine.step_slots(torch.stack([frames[2], frames[3]]), torch.tensor([True, True])))
        assert "InjectedFault" in str(faults.value)
        after = snapshot(engine)
        # Every counter back; the KV contents are not restored (StepCheckpoint: the written slot is the oldest).
        assert torch.equal(after.ring, before.ring) and torch.equal(after.offsets, before.offsets)
        assert after.offset_cpu == before.offset_cpu
        for x, y in [*zip(after.kv_end, before.kv_end, strict=True),
                     *zip(after.attn_offsets, before.attn_offsets, strict=True)]:
            assert torch.equal(x, y)
        assert torch.equal(engine.sampler.draws, draws)


def raise_if_all_failed(results: list[StepResult | RowFault | None]) -> None:
    faults = [r for r in results if isinstance(r, RowFault)]
    if len(faults) == len(results):
        raise faults[0]


def test_a_slot_that_failed_with_nan_serves_its_next_session_fresh(model: LoadedModel) -> None:
    """The NaN written into the failed row's KV cache would reach its next session through attention weights of
    zero (0 * NaN); the slot's KV rows are zeroed when it is reset."""
    frames = user_frames(TICKS, 5)

    def session(engine: BatchEngine) -> list[Output]:
        engine.reset_slot(0, sampling(9))
        out: list[Output] = []
        for tick in range(20):
            result = engine.step_slots(frames[tick][None], torch.tensor([True]))[0]
            assert isinstance(result, StepResult)
            out.append((result.text_token, None if result.agent_codes is None else tuple(result.agent_codes.tolist())))
        return out

    with BatchEngine(model, 1, SAMPLED, max_span_frames=MAX_SPAN) as engine:
        fresh = session(engine)
    with BatchEngine(model, 1, SAMPLED, max_span_frames=MAX_SPAN) as engine, ForwardFault(engine, "nan") as fault:
        engine.reset_slot(0, sampling(0))
        for tick in range(TICKS):  # the ring fills with NaN keys
            fault.arm(0)
            assert isinstance(engine.step_slots(frames[tick][None], torch.tensor([True]))[0], RowFault)
        fault.disarm(0)
        assert session(engine) == fresh
