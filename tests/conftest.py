import os

import pytest

os.environ.setdefault("NO_TORCH_COMPILE", "1")


@pytest.fixture(params=["compact", "whole-batch", "replay"])
def compact(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """How a batch steps: compact, only the rows from the first to the last with a frame (CPU); whole-batch, every
    row, masked ones too (the CUDA graph path); replay, the whole batch with every graphed call returning persistent
    outputs, as replayed CUDA graphs do (frontend_model.graphs). True for compact."""
    if request.param == "replay":
        monkeypatch.setenv("CONTEXTSPAN_REPLAY_OUTPUTS", "1")
    return request.param == "compact"
