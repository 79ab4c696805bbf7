"""Where model compute runs: one thread per device, fed from the event loop, and the pool of model slots."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from frontend_model.loading import LoadedModel

T = TypeVar("T")


class ModelWorker:
    """A single thread that runs every model call of every session, in submission order.

    One thread keeps torch off the event loop and serialises the sessions' steps on the device, so a session's
    `close` queued after its last step can never race it.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{device}")

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Runs in the caller's context, so the worker's log lines carry the session id."""
        return self._executor.submit(contextvars.copy_context().run, fn)

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)


class SlotPool:
    """`size` model copies, one per concurrent session: an Engine owns its model's streaming state.

    `acquire` never waits, so a full server can refuse at once; `release` is thread-safe because it runs when
    the worker has finished closing the session.
    """

    def __init__(self, model: LoadedModel, size: int) -> None:
        self.size = size
        self._free: list[LoadedModel] = [model] + [copy.deepcopy(model) for _ in range(size - 1)]
        self._lock = threading.Lock()

    def acquire(self) -> LoadedModel | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def models(self) -> list[LoadedModel]:
        """The free models (all of them before serving starts): for warming each one up."""
        with self._lock:
            return list(self._free)

    def release(self, model: LoadedModel) -> None:
        with self._lock:
            self._free.append(model)

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)
