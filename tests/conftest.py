import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from frontend_model.compile_policy import apply_compile_policy
from tests.support.redis_server import RedisServer, redis_server

apply_compile_policy()

if os.environ.get("CONTEXTSPAN_TEST_DEVICE", "cpu").startswith("cuda"):
    import torch

    # Exact float32 comparisons on a GPU: TF32 would round matmul and convolution inputs to 10-bit mantissas.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

CALIBRATION_CACHE = "CONTEXTSPAN_CALIBRATION_CACHE"


def pytest_configure(config: pytest.Config) -> None:
    """Every server this run starts, in this process or another, measures a model, machine and settings once and reads
    that back at its later starts (server/app/kept_calibration.py): seconds of each of some 80 starts. The folder is
    this run's own, so that no run reads what another measured."""
    os.environ[CALIBRATION_CACHE] = tempfile.mkdtemp(prefix="contextspan-calibration-")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.pop(CALIBRATION_CACHE, ""), ignore_errors=True)


@pytest.fixture(autouse=True)
def torch_threads() -> Iterator[None]:
    """Each test starts with the process's torch threads: benchmarks and servers run in-process set theirs, and a
    float32 result can round otherwise with another number of threads."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["compact", "whole-batch", "replay"])
def compact(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """How a batch steps: compact, only the rows from the first to the last with a frame (CPU); whole-batch, every
    row, masked ones too (the CUDA graph path); replay, the whole batch with every graphed call returning persistent
    outputs, as replayed CUDA graphs do (frontend_model.moshi_internals.graphs). True for compact."""
    if request.param == "compact" and os.environ.get("CONTEXTSPAN_TEST_DEVICE", "cpu").startswith("cuda"):
        pytest.skip("compact rows are the CPU's path: on a GPU a batch always steps whole, as its graphs were captured")
    if request.param == "replay":
        monkeypatch.setenv("CONTEXTSPAN_REPLAY_OUTPUTS", "1")
    return request.param == "compact"


@pytest.fixture
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server for one test (tests/support/redis_server.py)."""
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server
