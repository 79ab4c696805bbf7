"""Where model compute runs: one thread per device, fed from the event loop."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from frontend_model.engine.device_memory import set_device
from server.ops.json_logging import session_id_var

T = TypeVar("T")


class WorkerRestarted(RuntimeError):
    """A model call was still queued when its worker was replaced; it never ran."""


class ModelWorker:
    """A single thread that runs every model call of every session, in submission order.

    One thread keeps torch off the event loop and serialises the sessions' steps on the device, so a session's
    `close` queued after its last step can never race it. A call that never returns (a wedged driver, a
    deadlock) would stall every session: `busy_for` lets a watchdog see it, `restart` abandons that thread.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.restarts = 0
        self._executor = self._new_executor()
        self._lock = threading.Lock()
        self._running_since: float | None = None
        self._running_session: str | None = None

    def _new_executor(self) -> ThreadPoolExecutor:
        """The thread starts on the model's CUDA device (each thread has its own current device)."""
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{self.device}",
                                  initializer=set_device, initargs=(self.device,))

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Runs in the caller's context, so the worker's log lines carry the session id."""
        context = contextvars.copy_context()

        def timed() -> T:
            with self._lock:
                self._running_since, self._running_session = time.monotonic(), session_id_var.get()
            try:
                return context.run(fn)
            finally:
                with self._lock:
                    self._running_since = None

        return self._executor.submit(timed)

    async def run(self, fn: Callable[[], T]) -> T:
        future = self.submit(fn)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if future.cancelled() and task is not None and not task.cancelling():
                raise WorkerRestarted("the model worker was restarted before this call ran") from None
            raise

    def busy_for(self) -> tuple[float, str | None]:
        """Seconds the current call has run (0 when idle), and the session that submitted it."""
        with self._lock:
            if self._running_since is None:
                return 0.0, None
            return time.monotonic() - self._running_since, self._running_session

    def restart(self) -> None:
        """A fresh thread for later calls; queued calls are cancelled, the stuck one is left to finish alone."""
        old, self._executor = self._executor, self._new_executor()
        with self._lock:
            self._running_since = None
        self.restarts += 1
        old.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)
