"""Device memory honesty, on CPU: the wide KV ring is the only ring, per-session bytes match the tensors, calibration
stops where memory ends, a stuck worker's model is freed before a reload, and model threads sit on the model's CUDA
device (torch.cuda.set_device replaced by a recorder: there is no GPU here)."""

from __future__ import annotations

import gc
import importlib.util
import logging
import threading
import time
import weakref
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from moshi.modules.transformer import RingKVCache
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from frontend_model.engine import calibration
from frontend_model.engine import device_memory as memory
from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.device_memory import session_bytes, sessions_fit, streaming_bytes, weight_bytes
from frontend_model.engine.engine import GREEDY
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.moshi_internals.kv_ring import MaskedRingKVCache, attention_layers
from server.app import routes as app_module
from server.batching.worker import ModelWorker
from server.settings import ServerSettings
from tests.e2e.servers import in_process_server, pinned_settings

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 64
SPAN = 32


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32, context=CONTEXT)


class Allocations(TorchDispatchMode):
    """Counts the bytes of every storage torch allocates inside the block, and which of them are still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.alive: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if storage.nbytes() and key not in self.alive:
                    self.total += storage.nbytes()
                    self.alive[key] = storage.nbytes()
                    weakref.finalize(storage, self.alive.pop, key, None)
        return out


def ring_bytes_alive(*modules: torch.nn.Module) -> int:
    return sum(s.kv_cache.cache.nbytes for root in modules for m in root.modules()
               if (s := getattr(m, "_streaming_state", None)) is not None
               and isinstance(getattr(s, "kv_cache", None), RingKVCache))


def test_streaming_allocates_the_wide_ring_and_no_other(model: LoadedModel) -> None:
    engine = BatchEngine(model, 3, GREEDY, max_span_frames=SPAN)
    with Allocations() as allocations:
        engine.start()
    try:
        kept = sum(allocations.alive.values())
        state = streaming_bytes(engine.lm_gen)
        assert state <= kept < state + 1024  # the streaming state, and the row sampler's few settings
        # Nothing of a ring's size was allocated and thrown away: a narrow ring beside the wide one would be 2/3 of it.
        assert allocations.total - kept < 1024, (allocations.total, kept)
        for attn in attention_layers(model.lm.transformer):
            ring = attn._streaming_state.kv_cache
            assert isinstance(ring, MaskedRingKVCache) and ring.capacity == CONTEXT + SPAN == engine.kv_capacity
            assert ring.cache.shape[1] == 3 and attn.context == CONTEXT  # the mask still looks back `context`
    finally:
        engine.close()
    assert streaming_bytes(model.lm) == 0


def test_session_bytes_are_the_rings_a_session_adds(model: LoadedModel) -> None:
    """The number /readyz and docs/operations.md use, against the tensors of a real batch of 1 and of 3."""
    rings, state = {}, {}
    for slots in (1, 3):
        batched = BatchedModel(model, slots, GREEDY, max_span_frames=SPAN)
        batched.start()
        try:
            batched.tick(dict.fromkeys(range(slots), np.zeros(FRAME_SAMPLES, np.float32)))
            rings[slots] = ring_bytes_alive(model.lm, model.mimi)
            state[slots] = streaming_bytes(model.lm, model.mimi)
        finally:
            batched.close()
    expected = session_bytes(model.lm, model.mimi, SPAN)
    assert (rings[3] - rings[1]) // 2 == expected.temporal_kv + expected.mimi_kv
    per_session = (state[3] - state[1]) / 2
    # The depformer's rings live only inside a step; the rest of the state (token ring, conv buffers) is small.
    assert expected.total * 0.97 < per_session < expected.total * 1.03, (per_session, expected)


def test_calibration_stops_at_the_largest_batch_that_fits(model: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Memory for 3 rows: a ring of 4 or more rows runs out half way through entering streaming, as on a GPU."""
    allocate = RingKVCache.__init__

    def ring(self: RingKVCache, batch_size: int, *args: object, **kwargs: object) -> None:
        if batch_size > 3:
            raise torch.OutOfMemoryError(f"CUDA out of memory: a ring of {batch_size} rows (simulated)")
        allocate(self, batch_size, *args, **kwargs)

    monkeypatch.setattr(RingKVCache, "__init__", ring)
    with caplog.at_level(logging.WARNING, logger=calibration.__name__):
        result = calibration.calibrate_ticks(model, calibration.tick_sizes(8), repeats=1)
    assert result.memory_slots == 3
    assert sorted(result.ticks) == [1, 2, 3]
    assert "a batch of 4 session(s) does not fit the memory of cpu: calibrated up to 3" in caplog.text
    assert streaming_bytes(model.lm, model.mimi) == 0, "what the failed batches took is freed"
    batched = BatchedModel(model, 3, GREEDY)  # and the model serves the batch that fits
    batched.start()
    batched.close()


def test_model_threads_run_on_the_models_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: calls.append((device, threading.current_thread().name)))
    worker = ModelWorker("cuda:1")
    try:
        first = worker.submit(lambda: threading.current_thread().name).result(timeout=60)
        worker.restart()
        second = worker.submit(lambda: threading.current_thread().name).result(timeout=60)
    finally:
        worker.shutdown()
    assert calls == [(1, first), (1, second)] and first.startswith("model-cuda:1")

    calls.clear()
    loaded: list[str] = []

    def load_on_cpu(profile: str, checkpoint: str | None, device: str | None, *args: object) -> LoadedModel:
        loaded.append(threading.current_thread().name)  # after set_device, in the same thread
        assert device == "cuda:1" and calls == [(1, loaded[0])]
        return load_model(profile, device="cpu", context=CONTEXT)

    monkeypatch.setattr(app_module, "load_model", load_on_cpu)
    load = app_module.model_loader(ServerSettings(device="cuda:1"), "tiny", None)
    thread = threading.Thread(target=load, name="loader")
    thread.start()
    thread.join(timeout=120)
    assert loaded == ["loader"] and calls == [(1, "loader")]


def test_a_stuck_workers_model_is_freed_before_a_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    """The abandoned thread keeps the model, its batch and a ring in its locals; their memory is freed anyway."""
    model = load_model("tiny", device="cpu", dtype=torch.float32, context=CONTEXT)
    batched = BatchedModel(model, 2, GREEDY, max_span_frames=SPAN)
    batched.start()
    storages = [weakref.ref(t.untyped_storage()) for t in (*model.lm.parameters(), *model.mimi.parameters())]
    ring = attention_layers(model.lm.transformer)[0]._streaming_state.kv_cache
    storages.append(weakref.ref(ring.cache.untyped_storage()))
    release, failure = threading.Event(), []

    def stuck(held: BatchedModel = batched, held_ring: RingKVCache = ring) -> None:
        release.wait(60)
        try:
            held.tick({0: np.zeros(FRAME_SAMPLES, np.float32)})
        except Exception as exc:  # the written-off model must not run on
            failure.append(exc)

    thread = threading.Thread(target=stuck)
    thread.start()
    del ring
    per_session = session_bytes(model.lm, model.mimi, SPAN).total
    need = weight_bytes(model.lm, model.mimi) + 2 * per_session
    assert app_module.write_off(batched, per_session) is None
    gc.collect()
    assert not [s for s in storages if s() is not None], "every weight and ring is freed"
    assert streaming_bytes(model.lm, model.mimi) == weight_bytes(model.lm, model.mimi) == 0
    release.set()
    thread.join(timeout=60)
    assert failure, "the stuck call, once it returns, cannot run on the emptied model"

    # Where the stuck call still holds what a reload needs (a hung kernel's operands), the reload is refused.
    again = BatchedModel(load_model("tiny", device="cpu", dtype=torch.float32, context=CONTEXT), 2, GREEDY)
    again.start()
    monkeypatch.setattr(app_module, "free_bytes", lambda device: need // 2)
    refusal = app_module.write_off(again, per_session)
    assert refusal is not None and "restart the process" in refusal and "GiB free" in refusal


def test_the_docs_gpu_sizing_is_what_the_code_computes() -> None:
    spec = importlib.util.spec_from_file_location("gpu_sizing", ROOT / "scripts" / "gpu_sizing.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    committed = (ROOT / "docs" / "operations.md").read_text()
    assert script.block() in committed, "run .venv/bin/python scripts/gpu_sizing.py --write docs/operations.md"


@pytest.mark.slow
def test_readyz_and_metrics_report_the_models_memory(tmp_path: Path) -> None:
    served = load_model("tiny", device="cpu", dtype=torch.float32)
    settings = pinned_settings(recordings_dir=tmp_path, max_sessions=2, asr=False)
    with in_process_server(settings, served) as server:
        deadline = time.monotonic() + 300
        while (info := httpx.get(f"{server.http}/readyz", timeout=10)).status_code != 200:
            assert time.monotonic() < deadline, info.text
            time.sleep(0.2)
        report = info.json()["memory"]
        metrics = httpx.get(f"{server.http}/metrics", timeout=10).text
    per_session = session_bytes(served.lm, served.mimi, settings.max_span_frames).total
    weights = weight_bytes(served.lm, served.mimi)
    assert report["device"] == "cpu" and report["weight_bytes"] == weights
    assert report["session_bytes"] == per_session
    # The batch of 2 holds its rings, codec state and the engine's token ring beside the weights, and the span
    # scratch row (one row of temporal KV) when spans may go in chunks.
    scratch = report["scratch_bytes"]
    temporal_kv = session_bytes(served.lm, served.mimi, settings.max_span_frames).temporal_kv
    assert scratch == 0 or temporal_kv <= scratch < temporal_kv + 1024  # the rings and a few per-row counters
    assert weights + scratch + 2 * per_session * 0.97 < report["in_use_bytes"] == report["reserved_bytes"]
    assert report["in_use_bytes"] < weights + scratch + 2 * per_session * 1.03
    assert report["sessions_fit"] == sessions_fit(report["total_bytes"], weights + scratch, per_session) > 2
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("contextspan_"))
    assert float(values['contextspan_device_memory_bytes{kind="in_use"}']) == report["in_use_bytes"]
    assert float(values['contextspan_device_memory_bytes{kind="per_session"}']) == per_session
    assert float(values["contextspan_memory_session_capacity"]) == report["sessions_fit"]


def test_cuda_memory_calls_go_to_the_models_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda's memory API replaced by fakes of the same signatures, standing for a 2-GPU host."""
    gib = 2**30
    asked: list[object] = []

    def mem_get_info(device: torch.device | int | None = None) -> tuple[int, int]:
        asked.append(device)
        return 3 * gib, 80 * gib

    emptied: list[bool] = []
    set_to: list[int] = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(torch.cuda, "set_device", set_to.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cuda1 = torch.device("cuda:1")
    assert memory.free_bytes(cuda1) == 3 * gib and memory.device_total_bytes(cuda1) == 80 * gib
    assert asked == [cuda1, cuda1]
    memory.release_memory(cuda1)
    memory.release_memory(torch.device("cpu"))
    assert emptied == [True]
    for device in ("cuda:1", "cuda", "cpu", torch.device("cuda:0")):
        memory.set_device(device)
    assert set_to == [1, 0]  # bare "cuda" is whatever device the thread has: nothing to set
    assert memory.sessions_fit(80 * gib, 15 * gib, 2 * gib) == 28  # (0.9 x 80 - 15) / 2
