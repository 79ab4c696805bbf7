"""Streaming ASR for one session: PCM in on the event loop, transcripts out, Whisper on a thread pool."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from backend_agent.asr.resample import resample_24k_to_16k
from backend_agent.asr.segmenter import Cue, SegmenterConfig, SegmentEvent, UtteranceSegmenter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transcript:
    text: str
    final: bool
    start_s: float  # seconds of session audio
    end_s: float
    at: float  # time.monotonic() when it became known


@dataclass(frozen=True)
class SpeechEdge:
    """The user started or stopped speaking, as the segmenter's VAD hears it: voice clients (server VAD) react to
    speech before any transcript of it exists."""

    started: bool
    at_s: float  # seconds of session audio: the start (pre-roll included), or the end (the silence that ended it)


class StreamingASR:
    """Feed 24 kHz frames with `feed` (never blocks); partial and final transcripts reach `on_transcript`, and the
    start and end of each utterance `on_speech` (the end at once, before its final transcript is computed). `commit`
    ends the utterance going on at that point of the stream, as silence would.

    `transcribe` runs on `executor`: a thread pool in tests, the Whisper process (worker_process) in the server.

    The input queue is bounded: if transcription falls behind, the oldest audio is dropped and counted. A partial
    is skipped while any transcription of this stream is queued or running; finals are always transcribed, in order.
    The executor is shared by every session and queues without bound, so `close` withdraws every call this stream
    still has there: on a host where Whisper is slower than the sessions, a call left behind would keep its session
    (through the callbacks it holds) until Whisper reached it, and the backlog of the dead would only grow.
    """

    def __init__(
        self,
        transcribe: Callable[[np.ndarray], str],
        executor: Executor,
        on_transcript: Callable[[Transcript], None],
        on_error: Callable[[Exception], None] | None = None,
        segmenter: SegmenterConfig | None = None,
        queue_frames: int = 250,
        on_speech: Callable[[SpeechEdge], None] | None = None,
    ) -> None:
        self._transcribe = transcribe
        self._executor = executor
        self._on_transcript = on_transcript
        self._on_error = on_error
        self._on_speech = on_speech
        self._segmenter = UtteranceSegmenter(segmenter or SegmenterConfig())
        self._queue: asyncio.Queue[np.ndarray | None] = asyncio.Queue(maxsize=queue_frames)  # None: a commit
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Future[str]] = set()  # this stream's transcriptions queued or running
        self._final_running = False
        self.dropped_frames = 0
        self._finals = 0
        self.latest_final: Transcript | None = None
        self.latest_partial: Transcript | None = None
        self._final_waiters: list[asyncio.Future[Transcript | None]] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="asr")

    async def close(self) -> None:
        """Also withdraws every transcription still queued for the shared Whisper process (one already running
        finishes there, its result dropped) and the audio not yet segmented: a session that has left must neither
        delay the others' transcriptions nor stay in memory until Whisper gets to it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for call in list(self._calls):
            call.cancel()
        self._calls.clear()
        for waiter in self._final_waiters:
            waiter.cancel()
        self._final_waiters.clear()
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()

    def feed(self, pcm24k: np.ndarray) -> None:
        self._put(pcm24k)

    def commit(self) -> None:
        """The user is done (push to talk): the utterance going on after the audio fed so far ends there."""
        self._put(None)

    def _put(self, item: np.ndarray | None) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self._queue.task_done()
            self.dropped_frames += 1
        self._queue.put_nowait(item)

    @property
    def in_speech(self) -> bool:
        """The user is speaking: an utterance has started and its end has not been heard yet."""
        return self._segmenter.in_speech

    @property
    def awaiting_final(self) -> bool:
        """An utterance is going on, or has ended and its final transcript is still being computed (a slow host)."""
        return self._segmenter.in_speech or self._final_running

    async def next_final(self) -> Transcript | None:
        """The final transcript of the utterance going on or being transcribed now; None when there is none, or
        when Whisper heard no words in it."""
        if not self.awaiting_final:
            return None
        waiter: asyncio.Future[Transcript | None] = asyncio.get_running_loop().create_future()
        self._final_waiters.append(waiter)
        try:
            return await waiter
        finally:
            with contextlib.suppress(ValueError):
                self._final_waiters.remove(waiter)

    async def transcribe_recent(self, seconds: float) -> str:
        """Transcribe the last `seconds` heard, for a question whose utterance has not ended."""
        audio = self._segmenter.recent_audio(seconds)
        if len(audio) == 0:
            return ""
        return await self._submit(audio)

    async def drain(self) -> None:
        """Wait until every queued frame has gone through the segmenter (tests and offline inference)."""
        await self._queue.join()

    def _submit(self, audio: np.ndarray) -> asyncio.Future[str]:
        call = asyncio.get_running_loop().run_in_executor(self._executor, self._transcribe, audio)
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        return call

    async def _run(self) -> None:
        while True:
            pcm = await self._queue.get()
            try:
                events = self._segmenter.finish() if pcm is None else self._segmenter.feed(resample_24k_to_16k(pcm))
                for event in events:
                    if event.cue is Cue.START:
                        self._speech(SpeechEdge(True, event.start_s))
                        continue
                    if event.cue is Cue.PARTIAL and self._calls:
                        continue
                    busy = self._submit(event.audio)
                    if event.cue is Cue.FINAL:
                        self._speech(SpeechEdge(False, event.end_s))
                        self._final_running = True
                        try:
                            text = await busy
                        finally:
                            self._final_running = False
                        self._emit(Transcript(text, True, event.start_s, event.end_s, time.monotonic()))
                    else:
                        busy.add_done_callback(lambda f, e=event, n=self._finals: self._deliver_partial(e, n, f))
            except Exception as exc:  # a failing ASR must not end the session: report and keep listening
                logger.exception("ASR failed")
                if not self.awaiting_final:
                    self._settle(None)  # a final that failed: whoever waits for it must not wait for ever
                if self._on_error is not None:
                    self._on_error(exc)
            finally:
                self._queue.task_done()

    def _speech(self, edge: SpeechEdge) -> None:
        if self._on_speech is not None:
            self._on_speech(edge)

    def _deliver_partial(self, event: SegmentEvent, finals_before: int, future: asyncio.Future[str]) -> None:
        """Deliver unless the utterance's final has been emitted meanwhile (a late partial would confuse)."""
        if future.cancelled():
            return
        if future.exception() is not None:
            if self._on_error is not None:
                self._on_error(future.exception())  # type: ignore[arg-type]
            return
        if self._finals == finals_before:
            self._emit(Transcript(future.result(), False, event.start_s, event.end_s, time.monotonic()))

    def _settle(self, final: Transcript | None) -> None:
        waiters, self._final_waiters = self._final_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(final)

    def _emit(self, transcript: Transcript) -> None:
        if transcript.final:
            self._finals += 1
            self._settle(transcript if transcript.text else None)
        if not transcript.text:
            return
        if transcript.final:
            self.latest_final = transcript
        else:
            self.latest_partial = transcript
        self._on_transcript(transcript)
