"""Whisper in a process of its own, at low priority, restarted when it dies.

In a thread, faster-whisper's feature extraction and decoding hold the GIL for long stretches, and the frame
worker of every session missed deadlines while a user was being transcribed; a separate process keeps the GIL and
the CPU for the frames.

A process can die under the server (the OOM killer, a crash in CTranslate2, an operator's kill -9), and a
`ProcessPoolExecutor` whose worker died stays broken for good: every session would lose speech recognition
until the server restarts. `ASRProcess` replaces the dead process in the background instead.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import numpy as np

from backend_agent.asr.transcriber import DEFAULT_BEAM_SIZE, ASRLoadError, Decoding, WhisperTranscriber

logger = logging.getLogger(__name__)
NICENESS = 10  # as the tool threads (server/session/backend.py)
RESTART_DELAYS_S = (1.0, 2.0, 5.0, 15.0, 30.0)  # between failed restarts; the last one repeats
_transcriber: WhisperTranscriber | None = None
_load_error: str | None = None
T = TypeVar("T")


class ASRRestarting(RuntimeError):
    """The Whisper process died and its replacement is still loading: the call is refused rather than queued,
    so a session reports one failed transcription and goes on listening instead of waiting seconds for it."""


def _lower_priority() -> None:
    """Nice 10: under contention Linux gives Whisper about a tenth of a core beside the frame worker, so frames come
    first yet a question is still transcribed. SCHED_IDLE (only the time the frames leave) starved it for good on a
    host where the sessions use every core: no transcript, every span dropped late."""
    with contextlib.suppress(OSError):
        os.nice(NICENESS)


def _load(model: str | None, device: str, beam_size: int) -> None:
    global _transcriber, _load_error
    _lower_priority()
    try:
        _transcriber = WhisperTranscriber(model, device, decoding=Decoding(beam_size=beam_size))
    except ASRLoadError as exc:
        _load_error = str(exc)


def _loaded() -> tuple[int, str | None]:
    return os.getpid(), _load_error


def transcribe(audio: np.ndarray) -> str:
    """Runs in the worker process."""
    if _transcriber is None:
        raise ASRLoadError(_load_error or "speech recognition is not loaded")
    return _transcriber.transcribe(audio)


def _start_pool(model: str | None, device: str, timeout_s: float, beam_size: int) -> tuple[ProcessPoolExecutor, int]:
    """A one-process pool with the model loaded, and the process's pid; raises ASRLoadError (and stops the pool)
    if it cannot load."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_load,
                               initargs=(model, device, beam_size))
    try:
        pid, error = pool.submit(_loaded).result(timeout=timeout_s)
    except Exception as exc:
        pool.shutdown(wait=False, cancel_futures=True)
        raise ASRLoadError(f"speech recognition process failed to start: {type(exc).__name__}: {exc}") from exc
    if error is not None:
        pool.shutdown(wait=False, cancel_futures=True)
        raise ASRLoadError(error)
    return pool, pid


class ASRProcess(Executor):
    """The Whisper process as an executor (for `loop.run_in_executor`) that outlives the death of its process.

    A dead process shows as BrokenProcessPool, on the calls that were running and on the next `submit`; the first
    to see it starts a new process on a thread of its own, so neither the event loop nor the caller waits for the
    model to load, and only one replacement is ever loading. Until it is up, `submit` raises ASRRestarting at once.
    A replacement that fails to load is retried after `RESTART_DELAYS_S`, since the cause (memory, a GPU) may pass.
    """

    def __init__(self, model: str | None, device: str, timeout_s: float = 120.0,
                 beam_size: int = DEFAULT_BEAM_SIZE) -> None:
        self._model, self._device, self._timeout_s, self._beam_size = model, device, timeout_s, beam_size
        pool, self.pid = _start_pool(model, device, timeout_s, beam_size)
        self._pool: ProcessPoolExecutor | None = pool
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._restarter: threading.Thread | None = None
        self.restarts = 0
        self.restart_error: str | None = None  # why the latest attempt to replace the process failed

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._closing.is_set():
                raise RuntimeError("cannot schedule new futures after shutdown")
            pool = self._pool
        if pool is None:
            raise ASRRestarting(self._restarting_message())
        try:
            future = pool.submit(fn, *args, **kwargs)
        except BrokenProcessPool as exc:
            self._replace(pool)
            raise ASRRestarting(self._restarting_message()) from exc
        future.add_done_callback(lambda f: self._check(pool, f))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closing.set()
            pool, self._pool, restarter = self._pool, None, self._restarter
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait and restarter is not None:
            restarter.join()  # a process it was loading is shut down when the load ends

    def _restarting_message(self) -> str:
        reason = f"; last attempt failed: {self.restart_error}" if self.restart_error else ""
        return f"speech recognition process died and is restarting{reason}"

    def _check(self, pool: ProcessPoolExecutor, future: Future[Any]) -> None:
        """When a call ends: a call killed with the process is the first sign of a death mid-transcription."""
        if not future.cancelled() and isinstance(future.exception(), BrokenProcessPool):
            self._replace(pool)

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not broken or self._closing.is_set():
                return  # already being replaced (every call the death failed reports it), or closing
            self._pool = None
            self._restarter = threading.Thread(target=self._restart, args=(broken,), name="asr-restart",
                                               daemon=True)
            self._restarter.start()
        logger.error("speech recognition process %d died; starting a new one", self.pid)

    def _restart(self, broken: ProcessPoolExecutor) -> None:
        broken.shutdown(wait=False, cancel_futures=True)
        started = time.monotonic()
        for attempt in itertools.count(1):
            try:
                pool, pid = _start_pool(self._model, self._device, self._timeout_s, self._beam_size)
                break
            except ASRLoadError as exc:
                self.restart_error = str(exc)
                delay = RESTART_DELAYS_S[min(attempt, len(RESTART_DELAYS_S)) - 1]
                logger.error("speech recognition restart %d failed, retrying in %.0f s: %s", attempt, delay, exc)
                if self._closing.wait(delay):
                    return
        with self._lock:
            if self._closing.is_set():
                pool.shutdown(wait=False, cancel_futures=True)
                return
            self._pool, self.pid, self.restart_error = pool, pid, None
            self.restarts += 1
        logger.warning("speech recognition process %d up after %.1f s (restart %d)", pid, time.monotonic() - started,
                       self.restarts)


def start_asr_process(model: str | None, device: str, timeout_s: float = 120.0,
                      beam_size: int = DEFAULT_BEAM_SIZE) -> ASRProcess:
    """The Whisper process with the model loaded; raises ASRLoadError if it cannot load (then nothing is left
    running): a server whose model is missing reports it once, rather than restarting forever."""
    return ASRProcess(model, device, timeout_s, beam_size)
