"""A fault inside the batched step's transformer forward, for one session's row: how the fault benchmark and the
tests show that one broken row costs the other sessions in the same forward nothing."""

from __future__ import annotations

import torch

from frontend_model.engine.engine import Engine


class InjectedFault(RuntimeError):
    """Raised by ForwardFault inside the model's forward."""


class ForwardFault:
    """A fault inside the temporal transformer's forward for armed slots only: a forward hook on its last layer
    that raises, or writes NaN into those rows' activations, whenever an armed slot's row executes.

    The armed flags live in the layer's streaming state, so `row_view.rows` slices them with the rows a call
    computes: the hook sees the flags of exactly the rows in its batch, and a masked row (which the model reads
    as initial tokens) does not fault, as a bad code in a masked row would not."""

    def __init__(self, engine: Engine, kind: str) -> None:
        if kind not in ("raise", "nan"):
            raise ValueError(f"unknown fault kind {kind!r}")
        self.kind = kind
        self.fired = 0
        self._layer = engine.model.lm.transformer.layers[-1]
        self._device = engine.model.device
        self._handle = self._layer.register_forward_hook(self._hook)

    def arm(self, slot: int) -> None:
        self._flags()[slot] = True

    def disarm(self, slot: int) -> None:
        self._flags()[slot] = False

    def _flags(self) -> torch.Tensor:
        """The armed flags of the layer's streaming state now: a batch that restarts (or grows) has a new state."""
        state = self._layer._streaming_state
        armed = getattr(state, "armed", None)
        if armed is None or armed.shape[0] != state.batch_size:
            armed = state.armed = torch.zeros(state.batch_size, dtype=torch.bool, device=self._device)
        return armed

    def __enter__(self) -> ForwardFault:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def _hook(self, module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
        state = module._streaming_state
        armed = getattr(state, "armed", None)  # None: another engine streams this model now
        if armed is None:
            return
        hit = armed & state.exec_mask
        if not bool(hit.any()):
            return
        self.fired += 1
        if self.kind == "raise":
            raise InjectedFault("injected fault in the forward")
        output[hit] = float("nan")
