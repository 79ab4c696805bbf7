"""Tick timing, span budgeting and admission: pure decisions, checked by hand and on a simulated clock."""

from __future__ import annotations

import math

import pytest

from frontend_model.engine.calibration import tick_sizes
from frontend_model.engine.costs import PrefillCost, TickCost
from server.batching.tick_scheduler import (
    MARGIN_S,
    MAX_DEFERS,
    Capacity,
    TickScheduler,
    Waiting,
    admission_log,
    admit,
    capacity,
)

BUDGET = 0.080


def flat(tick_s: float):  # a tick costs the same whatever the batch (masked rows are computed too)
    return lambda batch: tick_s


def per_frame(ms: float):
    return lambda frames: frames * ms / 1e3


def test_waits_only_while_the_oldest_frame_can_still_make_it() -> None:
    scheduler = TickScheduler(BUDGET, flat(0.030), per_frame(0.5), batch=4, compact=False)
    assert scheduler.wait_s(1.0, [], active=4) == math.inf
    assert scheduler.wait_s(1.0, [Waiting(0, 1.0)], active=1) == 0.0  # everyone has a frame
    hold = BUDGET - 0.030 - MARGIN_S
    assert scheduler.wait_s(1.0, [Waiting(0, 1.0)], active=4) == pytest.approx(hold)
    assert scheduler.wait_s(1.03, [Waiting(0, 1.0), Waiting(1, 1.02)], active=4) == pytest.approx(hold - 0.03)
    assert scheduler.wait_s(1.2, [Waiting(0, 1.0)], active=4) == 0.0  # already late: run at once
    # A waiting span makes the tick longer, so it holds less.
    with_span = scheduler.wait_s(1.0, [Waiting(0, 1.0, span_frames=20)], active=4)
    assert with_span == pytest.approx(hold - 0.010)


def test_spans_ride_while_they_fit_oldest_request_first() -> None:
    scheduler = TickScheduler(BUDGET, flat(0.030), per_frame(1.0), batch=4, compact=False)
    waiting = [Waiting(0, 1.0, span_frames=30, span_requested=0.5), Waiting(1, 1.0),
               Waiting(2, 1.0, span_frames=15, span_requested=0.4), Waiting(3, 1.0, span_frames=10, span_requested=0.6)]
    # 50 ms left after the 30 ms tick: the 15-frame span (oldest) and the 30-frame one fit, the last does not.
    plan = scheduler.plan_spans(1.0, waiting)
    assert plan.inject == [2, 0] and plan.defer == [3]
    # 20 ms later only 30 ms are left.
    plan = scheduler.plan_spans(1.02, waiting)
    assert plan.inject == [2, 3] and plan.defer == [0]
    assert scheduler.plan_spans(1.0, [Waiting(1, 1.0)]).inject == []


def test_a_span_put_off_too_often_rides_anyway() -> None:
    scheduler = TickScheduler(BUDGET, flat(0.030), per_frame(1.0), batch=4, compact=False)
    late = [Waiting(0, 0.9, span_frames=10, span_requested=0.5, span_deferrals=MAX_DEFERS - 1),
            Waiting(1, 0.9, span_frames=10, span_requested=0.6, span_deferrals=MAX_DEFERS)]
    plan = scheduler.plan_spans(1.0, late)  # the oldest frame is already past its deadline: nothing fits
    assert plan.inject == [1] and plan.defer == [0]


def simulate(phases_ms: list[float], tick_s: float, periods: int, span: tuple[int, int, int] | None = None
             ) -> tuple[list[float], int, int]:
    """The Batcher's loop on a virtual clock: latencies, ticks run, and how many times a span was put off.

    `span` = (session, frame index, frames): that session's frame carries a span of that many frames; a deferred
    span moves to the session's next frame, as the Batcher hands it back.
    """
    scheduler = TickScheduler(BUDGET, flat(tick_s), per_frame(1.0), batch=len(phases_ms), compact=False)
    arrivals = [[p / 1e3 + 0.080 * i for i in range(periods)] for p in phases_ms]
    next_frame = [0] * len(phases_ms)
    spans = {span[:2]: span[2]} if span is not None else {}
    latencies: list[float] = []
    ticks, deferrals, now = 0, 0, 0.0
    while any(n < periods for n in next_frame):
        waiting = [Waiting(s, arrivals[s][n], spans.get((s, n), 0), 0.0)
                   for s, n in enumerate(next_frame) if n < periods and arrivals[s][n] <= now]
        wait = scheduler.wait_s(now, waiting, len(phases_ms))
        if wait > 0:
            upcoming = [arrivals[s][n] for s, n in enumerate(next_frame) if n < periods and arrivals[s][n] > now]
            now = min([now + wait, *upcoming])
            continue
        plan = scheduler.plan_spans(now, waiting)
        now += tick_s + sum(scheduler.span_s(w.span_frames) for w in waiting if w.slot in plan.inject)
        ticks += 1
        deferrals += len(plan.defer)
        for w in waiting:
            n = next_frame[w.slot]
            if w.slot in plan.defer:
                spans[(w.slot, n + 1)] = spans.pop((w.slot, n))
            latencies.append(now - w.arrived)
            next_frame[w.slot] += 1
    return latencies, ticks, deferrals


def test_four_sessions_at_spread_phases_batch_up_and_keep_the_deadline() -> None:
    latencies, ticks, _ = simulate([0, 20, 40, 60], tick_s=0.030, periods=50)
    assert max(latencies) <= BUDGET
    assert ticks <= 2 * 50 + 1, "a tick per frame would be 200 ticks: frames of several sessions share ticks"


def test_aligned_sessions_run_one_tick_per_frame() -> None:
    latencies, ticks, _ = simulate([0, 1, 2, 3], tick_s=0.030, periods=50)
    assert ticks == 50 and max(latencies) <= 0.040


def test_a_span_shortens_the_hold_so_its_tick_still_makes_the_deadline() -> None:
    put_off = []
    for frame in range(10, 18):
        latencies, _, deferrals = simulate([0, 20, 40, 60], tick_s=0.030, periods=20, span=(1, frame, 20))
        put_off.append(deferrals)
        assert max(latencies) <= BUDGET
    # Its tick fires early enough to carry it, unless its frame came while another tick ran and ate the room:
    # then it rides on the next one.
    assert max(put_off) <= 1 and put_off.count(0) >= len(put_off) // 2, put_off


def test_admission_stops_where_the_tick_would_not_fit() -> None:
    ticks = {1: 0.020, 2: 0.030, 4: 0.050, 5: 0.065}
    cost = TickCost(ticks, PrefillCost(0.02, {1: 0.021}))
    assert capacity(cost.tick, BUDGET, 4).slots == 4
    assert capacity(cost.tick, BUDGET, 4).reason == "max_sessions is 4"
    tight = capacity(cost.tick, BUDGET, 8)
    assert tight.slots == 4
    assert tight.reason == "a tick of 5 would take 65 ms > 75% of the 80 ms frame"
    assert capacity(cost.tick, 0.020, 8).slots == 1  # one session always runs


def test_admission_admits_k_when_the_tick_of_k_fits_and_k_plus_1_does_not() -> None:
    limit = BUDGET * 0.75
    for k in range(1, 7):
        # A tick of k sessions just inside the limit, of k + 1 just over it.
        ticks = {n: (limit - 0.001) * n / k if n <= k else limit + 0.001 * n for n in range(1, 9)}
        admitted = capacity(ticks.__getitem__, BUDGET, 8)
        assert admitted.slots == k, (k, admitted)
        assert admitted.reason == f"a tick of {k + 1} would take {ticks[k + 1] * 1e3:.0f} ms > 75% of the 80 ms frame"


def test_fixed_admission_takes_max_sessions_whatever_the_tick_costs() -> None:
    slow = {1: 0.070, 2: 0.140, 3: 0.210}.__getitem__
    fixed = admit("fixed", slow, BUDGET, 3)
    assert fixed == Capacity(3, "max_sessions is 3 (admission fixed)")
    assert admit("calibrated", slow, BUDGET, 3) == capacity(slow, BUDGET, 3) == Capacity(
        1, "a tick of 2 would take 140 ms > 75% of the 80 ms frame")
    # The startup line says what fixed admission overrides, so an operator sees the frames it will make late.
    assert admission_log("fixed", fixed, slow, BUDGET) == (
        "3 session(s) in one batch, tick 210.0 ms (max_sessions is 3 (admission fixed)); calibrated admission "
        "would take 1: a tick of 2 would take 140 ms > 75% of the 80 ms frame")
    fast = {1: 0.010, 2: 0.015, 3: 0.020}.__getitem__
    assert admission_log("fixed", admit("fixed", fast, BUDGET, 3), fast, BUDGET) == (
        "3 session(s) in one batch, tick 20.0 ms (max_sessions is 3 (admission fixed))")
    calibrated = admit("calibrated", slow, BUDGET, 3)
    assert admission_log("calibrated", calibrated, slow, BUDGET) == (
        "1 session(s) in one batch, tick 70.0 ms (a tick of 2 would take 140 ms > 75% of the 80 ms frame)")


def test_a_compact_tick_costs_the_rows_it_spans() -> None:
    rows = {1: 0.015, 2: 0.020, 3: 0.025, 4: 0.030}
    compact = TickScheduler(BUDGET, rows.__getitem__, per_frame(1.0), batch=4, compact=True)
    whole = TickScheduler(BUDGET, rows.__getitem__, per_frame(1.0), batch=4, compact=False)
    assert compact.tick_cost([Waiting(2, 0.0)]) == 0.015
    assert compact.tick_cost([Waiting(0, 0.0), Waiting(2, 0.0)]) == 0.025
    assert whole.tick_cost([Waiting(2, 0.0)]) == 0.030
    # A lone frame holds longer when its tick is cheap.
    assert compact.wait_s(0.0, [Waiting(2, 0.0)], active=4) > whole.wait_s(0.0, [Waiting(2, 0.0)], active=4)


def test_tick_cost_interpolates_and_prices_spans() -> None:
    cost = TickCost({1: 0.020, 2: 0.030, 4: 0.050}, PrefillCost(0.010, {1: 0.011, 65: 0.075}))
    assert cost.tick(3) == pytest.approx(0.040)
    assert cost.tick(8) == pytest.approx(0.090)
    assert cost.span(0) == 0.0 and cost.span(33) == pytest.approx(0.033)
    assert cost.span_budget(BUDGET, 4) == pytest.approx(BUDGET - 0.050 + 0.010)
    # Never past max_sessions: calibration must not need memory that serving would not.
    assert tick_sizes(4) == [1, 2, 4] and tick_sizes(6) == [1, 2, 4, 6] and tick_sizes(1) == [1]


def test_admission_stops_at_what_memory_holds() -> None:
    cheap = {1: 0.001, 2: 0.002, 4: 0.004, 8: 0.008}.__getitem__
    held = admit("fixed", cheap, BUDGET, 8, memory_slots=3)
    assert held.slots == 3 and held.reason == "device memory holds 3 (max_sessions 8)"
    assert admit("calibrated", per_frame(1.0), BUDGET, 8, memory_slots=3).slots == 3
    assert admit("fixed", cheap, BUDGET, 2, memory_slots=3).slots == 2  # memory is not the limit
    slow = admit("calibrated", per_frame(30.0), BUDGET, 8, memory_slots=3)  # compute binds before memory
    assert slow.slots < 3 and slow.reason.startswith("a tick of")
