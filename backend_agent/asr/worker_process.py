"""Whisper in a process of its own, at low priority.

In a thread, faster-whisper's feature extraction and decoding hold the GIL for long stretches, and the frame
worker of every session missed deadlines while a user was being transcribed; a separate process keeps the GIL and
the CPU for the frames.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from backend_agent.asr.transcriber import ASRLoadError, WhisperTranscriber

NICENESS = 19
_transcriber: WhisperTranscriber | None = None
_load_error: str | None = None


def _lower_priority() -> None:
    """SCHED_IDLE where Linux offers it: Whisper gets only CPU time the frame worker leaves."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(NICENESS)


def _load(model: str | None, device: str) -> None:
    global _transcriber, _load_error
    _lower_priority()
    try:
        _transcriber = WhisperTranscriber(model, device)
    except ASRLoadError as exc:
        _load_error = str(exc)


def _loaded() -> str | None:
    return _load_error


def transcribe(audio: np.ndarray) -> str:
    """Runs in the worker process."""
    if _transcriber is None:
        raise ASRLoadError(_load_error or "speech recognition is not loaded")
    return _transcriber.transcribe(audio)


def start_asr_process(model: str | None, device: str, timeout_s: float = 120.0) -> ProcessPoolExecutor:
    """A one-process pool with the model loaded; raises ASRLoadError (and stops the pool) if it cannot load."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_load,
                               initargs=(model, device))
    try:
        error = pool.submit(_loaded).result(timeout=timeout_s)
    except Exception as exc:
        pool.shutdown(wait=False, cancel_futures=True)
        raise ASRLoadError(f"speech recognition process failed to start: {type(exc).__name__}: {exc}") from exc
    if error is not None:
        pool.shutdown(wait=False, cancel_futures=True)
        raise ASRLoadError(error)
    return pool
