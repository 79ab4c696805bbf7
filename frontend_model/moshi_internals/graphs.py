"""What CUDA graphs demand of the code around them, made checkable on CPU.

moshi CUDA-graphs the LM step, the depformer, the exec mask and the codec (`moshi.utils.compile.CUDAGraphed`). A
replayed graph reads the tensors it was captured with and writes its results into the same static output tensors on
every call, so on a GPU two mistakes go unnoticed until outputs are wrong: a streaming state reassigned instead of
updated in place (the graph keeps reading the old one) and a graph output kept past the next step (the replay
overwrites it). On CPU graphs are off and neither shows. The replay mode (`CONTEXTSPAN_REPLAY_OUTPUTS=1`) runs the
graph path on CPU: the whole batch every tick, and every graphed callable copies its arguments into persistent
inputs and its results into persistent outputs, which it returns, as a replayed graph does.

A tick's outputs leave the device in one transfer, `to_host`: a host read of a device tensor anywhere else stalls the
stream once per read (tests/frontend_model/test_graph_safety.py audits the ops of a tick).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from moshi.modules.streaming import StreamingModule
from moshi.utils.compile import CUDAGraphed

REPLAY_ENV = "CONTEXTSPAN_REPLAY_OUTPUTS"


def replay_outputs() -> bool:
    """Whether CPU runs emulate replayed graphs (`CONTEXTSPAN_REPLAY_OUTPUTS=1`), for tests."""
    return os.environ.get(REPLAY_ENV, "") == "1"


def graph_path(device: torch.device) -> bool:
    """Whether the code on `device` takes the path of CUDA graphs (fixed batch shape): on a GPU, or replaying on
    CPU."""
    return device.type == "cuda" or replay_outputs()


def to_host(tensor: torch.Tensor) -> np.ndarray:
    """The one device -> host transfer of a tick."""
    return tensor.cpu().numpy()


def _static_like(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple | list):
        return type(value)(_static_like(v) for v in value)
    return value


def _copy_into(static: Any, value: Any) -> None:
    if isinstance(static, torch.Tensor):
        if not isinstance(value, torch.Tensor) or value.shape != static.shape:
            raise ValueError(f"a replayed graph's output changed from {tuple(static.shape)} to {value!r:.80}")
        static.copy_(value)
    elif isinstance(static, tuple | list):
        for s, v in zip(static, value, strict=True):
            _copy_into(s, v)


class ReplayedGraph:
    """A `CUDAGraphed` as a replayed graph behaves: static inputs, static outputs returned on every call."""

    def __init__(self, graphed: CUDAGraphed) -> None:
        self.func: Callable[..., Any] = graphed.func
        self._args: tuple[Any, ...] | None = None
        self._output: Any = None

    def __call__(self, *args: Any) -> Any:
        if self._args is None:
            self._args = _static_like(args)
        else:
            for index, (static, arg) in enumerate(zip(self._args, args, strict=True)):
                if isinstance(static, torch.Tensor):
                    if not isinstance(arg, torch.Tensor) or arg.shape != static.shape:
                        raise ValueError(f"argument #{index} of a replayed graph changed shape: a graph replays one "
                                         f"shape ({tuple(static.shape)})")
                    static.copy_(arg)
        output = self.func(*self._args)
        if self._output is None:
            self._output = _static_like(output)
        else:
            _copy_into(self._output, output)
        return self._output


def step_depformer(lm_gen: Any) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    """The depformer as `LMGen`'s step runs it: moshi's graph of it on a GPU (one captured shape, the whole batch), a
    `ReplayedGraph` in replay mode, eager where the step graphs are off."""
    return lm_gen._streaming_state.graphed_depth


def release_graphs(root: StreamingModule) -> None:
    """Destroys now every graph captured in the streaming states under `root`. Left to a later garbage collection, a
    graph destroyed while another engine captures its own invalidates that capture (the H200's
    cudaErrorStreamCaptureInvalidated, benchmarks/README.md)."""
    for module in root.modules():
        state = getattr(module, "_streaming_state", None) if isinstance(module, StreamingModule) else None
        for value in vars(state).values() if state is not None else ():
            if isinstance(value, CUDAGraphed):
                value.reset()


def set_up_graphs(root: StreamingModule, graphed: bool) -> None:
    """Every `CUDAGraphed` in the streaming states under `root` as this run uses it: eager where not `graphed` (the
    fallback where the step graphs failed to capture: moshi then calls each function itself), swapped for a
    `ReplayedGraph` in replay mode, else as moshi made it."""
    if graphed and not replay_outputs():
        return
    for module in root.modules():
        state = getattr(module, "_streaming_state", None) if isinstance(module, StreamingModule) else None
        if state is None:
            continue
        for name, value in vars(state).items():
            if not isinstance(value, CUDAGraphed):
                continue
            if graphed:
                setattr(state, name, ReplayedGraph(value))
            else:
                value.disable = True
