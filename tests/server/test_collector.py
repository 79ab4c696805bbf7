"""The garbage collector as the server runs it: what loading made frozen out of collections, their pauses measured."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram

from server.ops.collector import PauseWatch, freeze_loaded
from tests.e2e.servers import in_process_server, pinned_settings


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_what_was_loaded_is_frozen_and_no_later_collection_walks_it(unfrozen: None) -> None:
    loaded = [Node() for _ in range(1000)]
    frozen = freeze_loaded()
    assert frozen == gc.get_freeze_count() >= len(loaded)
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(node) in tracked for node in loaded)
    made_later = Node()
    assert id(made_later) in {id(o) for o in gc.get_objects()}


def test_freezing_again_collects_the_garbage_of_what_was_frozen_before(unfrozen: None) -> None:
    """A worker restart writes a model off: its cycles, frozen at startup, are freed when the new one is frozen."""
    stuck = Node()
    gone = weakref.ref(stuck)
    gc.freeze()
    del stuck
    gc.collect()
    assert gone() is not None, "frozen, a collection does not free it"
    freeze_loaded()
    assert gone() is None


def test_each_collection_s_pause_is_observed_by_generation_while_watched() -> None:
    ticks = iter([10.0, 10.25, 20.0, 20.5])
    histogram = Histogram("pause", "", ["generation"], registry=CollectorRegistry(), buckets=(0.1, 1.0))
    watch = PauseWatch(histogram, clock=lambda: next(ticks))
    gc.disable()  # no collection of its own between the two
    try:
        watch.start()
        gc.collect(2)
        gc.collect(0)
        watch.stop()
        gc.collect(2)
    finally:
        gc.enable()

    def observed(generation: str) -> tuple[float, float]:
        samples = {s.name: s.value for s in histogram.collect()[0].samples
                   if s.labels.get("generation") == generation and "le" not in s.labels}
        return samples["pause_count"], samples["pause_sum"]

    assert observed("2") == (1.0, 0.25) and observed("0") == (1.0, 0.5)


def test_a_server_freezes_its_model_once_loaded_and_times_collections_until_it_stops(unfrozen: None) -> None:
    callbacks = len(gc.callbacks)
    with in_process_server(pinned_settings(recordings=False, max_sessions=1, asr=False)) as server:
        model = server.state.model
        assert model is not None
        tracked = {id(o) for o in gc.get_objects()}
        assert id(model) not in tracked and id(model.lm) not in tracked, "walked by every full collection"
        gc.collect()
        metrics = httpx.get(f"{server.http}/metrics", timeout=10).text
    full = 'contextspan_gc_pause_seconds_count{generation="2"}'
    counts = [line for line in metrics.splitlines() if line.startswith(full)]
    assert counts and float(counts[0].split()[-1]) >= 1, counts
    assert len(gc.callbacks) == callbacks, "its watch is gone with it"
