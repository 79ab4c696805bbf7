"""The model side of every session on one device: a BatchEngine and a BatchFrameCodec over the same slots.

One tick encodes the user frames of the slots that have one, steps the LM once for the whole batch and decodes the
agent audio, each with the slots that have nothing to do masked, so a slot's outputs are the ones it would get
alone. Every method runs on the worker thread that owns the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from frontend_model.engine.batch_engine import BatchEngine, RowFault
from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.codec import BatchFrameCodec, decoder_receptive_field
from frontend_model.engine.costs import PrefillCost
from frontend_model.engine.device_memory import drop_streaming_state, release_memory
from frontend_model.engine.engine import DEFAULT_MAX_SPAN_FRAMES, GREEDY, SAMPLED, EngineStateError, SamplingConfig
from frontend_model.engine.history import SessionHistory, replay, spoken_frames, start_recording
from frontend_model.engine.optimisations import Optimisations
from frontend_model.engine.window import WindowAhead, refill_window
from frontend_model.frame import FRAME_S, FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.graphs import to_host
from frontend_model.moshi_internals.row_sampling import RowSampling
from frontend_model.span.block import Block, Prefix
from frontend_model.span.build import SpanBuild


@dataclass(frozen=True)
class SlotOutput:
    text_token: int | None
    agent_pcm: np.ndarray | None  # None while the slot's delays fill (its first frame)


class BatchedModel:
    def __init__(
        self,
        model: LoadedModel,
        slots: int,
        sampling: SamplingConfig = SAMPLED,
        max_span_frames: int = DEFAULT_MAX_SPAN_FRAMES,
        cost: PrefillCost | None = None,
        frame_budget_s: float = FRAME_S,
        prefill: SpanPrefill = SpanPrefill.ONE_PASS,
        optimisations: Optimisations | None = None,
        record: bool = False,
    ) -> None:
        """`cost` and `frame_budget_s` cap a span so that its prefill fits the budget, `prefill` says how it is
        written, `optimisations` which GPU optimisations are off (see Engine); `record` keeps each slot's consumed
        columns on the device (engine/history.py), which `keep_window` feeds again."""
        self.model = model
        self.slots = slots
        self.engine = BatchEngine(model, slots, sampling, max_span_frames, cost, frame_budget_s, prefill,
                                  optimisations)
        self.codec = BatchFrameCodec(model.mimi, slots)
        self.decoder_frames = decoder_receptive_field(model.mimi)  # what a resumed slot's decoder is warmed with
        self.frames_stepped = [0] * slots
        self.window_ahead: WindowAhead | None = None  # `build_windows_ahead`
        if record:
            start_recording(self.engine)

    @property
    def optimisations(self) -> Optimisations:
        return self.engine.optimisations

    def start(self) -> None:
        self.codec.open(self.optimisations.enabled("step_graphs"))
        try:
            self.engine.start()
        except BaseException:
            self.codec.close()
            raise

    def close(self) -> None:
        self.stop_windows_ahead()
        self.engine.close()
        self.codec.close()

    def build_windows_ahead(self, chunk: int) -> WindowAhead:
        """A shadow row on which slots' windows are built ahead, `chunk` frames a tick (engine/window.py), after
        `start`: one session's KV row more on the device. Needs a batch that records."""
        self.window_ahead = WindowAhead(self.engine, chunk)
        return self.window_ahead

    def stop_windows_ahead(self) -> None:
        """No shadow row: windows roll in their tick (what a failed start of one falls back to)."""
        if self.window_ahead is not None:
            self.window_ahead.close()
        self.window_ahead = None

    def warm_up(self, ticks: int = 3) -> None:
        """First calls pay torch's lazy initialisation, and on a GPU capture the step graphs: pay it before a
        client's deadline depends on it. Every slot is reset when a session opens it, so the warm-up leaves nothing
        behind. No session runs yet, so a row that faults is the step itself failing: its RowFault is raised."""
        frames = dict.fromkeys(range(self.slots), np.zeros(FRAME_SAMPLES, np.float32))
        for _ in range(ticks):
            for output in self.tick(frames).values():
                if isinstance(output, RowFault):
                    raise output

    def open_slot(self, slot: int, prefix: Prefix | None, sampling: RowSampling | None = None) -> float:
        """A session takes `slot`: fresh state and its sampling, then its persona prefix; returns the prefill
        seconds."""
        self._forget_window(slot)
        self.engine.reset_slot(slot, sampling)
        self.codec.reset_slot(slot)
        self.frames_stepped[slot] = 0
        if prefix is None:
            return 0.0
        start = time.perf_counter()
        self.engine.prefill_slot(slot, prefix)
        return time.perf_counter() - start

    def resume_slot(self, slot: int, history: SessionHistory, embeddings: torch.Tensor | None = None) -> float:
        """A resumed session takes `slot`: fresh state, then its history replayed (engine/history.py) and its decoder
        warmed with the agent audio of its last `decoder_frames` frames (its receptive field), so that the first
        audio after the resume continues the conversation's instead of starting cold; returns the seconds of both.
        The user's encoder starts fresh: its PCM is not in the history."""
        self._forget_window(slot)
        self.engine.reset_slot(slot, history.sampling)
        self.codec.reset_slot(slot)
        # Spans go in at once, as after a first step; after an empty replay the engine refuses them: they are dropped
        # before the first frame, as they would have been on the first replica.
        self.frames_stepped[slot] = 1 if history.offset else 0
        start = time.perf_counter()
        replay(self.engine, history, slot, embeddings)
        self.codec.warm_decoder(slot, spoken_frames(history, self.engine.span, self.model.lm, self.decoder_frames))
        return time.perf_counter() - start

    def history(self, slot: int) -> SessionHistory:
        """`slot`'s session history, between ticks (the engine must be recording: history.start_recording)."""
        return SessionHistory.of(self.engine, slot)

    def inject(self, slot: int, block: Block) -> None:
        self.engine.inject_slot(slot, block)

    def keep_window(self, slot: int, prefix_frames: int, keep: int) -> None:
        """`slot`'s cache becomes its prefix and its `keep` most recent frames, as a fresh prefill of them would
        leave it (engine/window.py); the other slots are untouched. Needs a batch that records."""
        if self.engine.recorder is None:
            raise EngineStateError("keep_window feeds a slot's recorded columns again: make the batch with record")
        columns = self.engine.recorder.recent(slot, self.slot_offset(slot), keep)
        refill_window(self.engine, slot, prefix_frames, columns.long())

    def _forget_window(self, slot: int) -> None:
        if self.window_ahead is not None:
            self.window_ahead.forget(slot)

    def offsets(self) -> list[int]:
        """Every slot's offset (`slot_offset`), in one read from the device."""
        return self.engine._state().offsets.tolist()

    def prepare_span(self, text: str) -> SpanBuild:
        """Backend text -> a block within the span cap (Engine.prepare_span): CPU work, on any thread."""
        return self.engine.prepare_span(text)

    def slot_offset(self, slot: int) -> int:
        """Frames `slot`'s model has consumed: steps plus injected frames."""
        return self.engine.slot_offset(slot)

    def set_sampling(self, slot: int, sampling: RowSampling, restart: bool) -> None:
        """A session's new sampling from its next frame on; `restart` when it sent new seeds."""
        self.engine.set_sampling(slot, sampling, restart)

    @property
    def sampling(self) -> SamplingConfig:
        """The checkpoint's sampling, for the settings a session leaves out."""
        return self.engine.sampling

    @property
    def compact(self) -> bool:
        """Whether a tick steps only the rows from the first to the last with a frame (eager CPU), not the batch."""
        return self.engine.compact

    @property
    def max_span_frames(self) -> int:
        return self.engine.max_span_frames

    @property
    def span_frame_cap(self) -> int:
        """Most frames a span may have so that its prefill and the next step keep the frame slot."""
        return self.engine.span_frame_cap

    def scratch_bytes(self) -> int:
        """The chunked prefill's scratch row and the shadow row windows are built ahead on (0 without them), held
        beside the batch."""
        chunked = self.engine.chunked.scratch.nbytes() if self.engine.chunked is not None else 0
        return chunked + (self.window_ahead.nbytes() if self.window_ahead is not None else 0)

    @torch.no_grad()
    def tick(self, frames: dict[int, np.ndarray]) -> dict[int, SlotOutput | RowFault]:
        """One frame for each slot in `frames` (slot -> 1920 samples of user PCM), as one batch; a slot whose part
        of the step failed gets its RowFault (its state is lost), the others their output.

        Encode, step and decode stay on the device; the text tokens, who speaks, whose logits were finite and the
        agent PCM of every slot come back together in one transfer (a host read per slot would stall the device
        once per read)."""
        mask = np.zeros(self.slots, bool)
        pcm = np.zeros((self.slots, FRAME_SAMPLES), np.float32)
        for slot, frame in frames.items():
            mask[slot] = True
            pcm[slot] = frame
        active = torch.from_numpy(mask).to(self.model.device)
        step = self.engine.step_batch(self.codec.encode(pcm, active), active)
        tokens = step.tokens
        speaking = active & step.finite & (tokens[:, 0] != self.model.lm.ungenerated_token_id)
        agent_pcm = self.codec.decode(torch.where(speaking[:, None], tokens[:, 1:], 0), speaking)
        # Integers travel bit for bit as float32 (token ids < 2**31).
        flags = torch.stack([tokens[:, 0], speaking.long(), step.finite.long()], dim=1)
        host = to_host(torch.cat([agent_pcm, flags.to(torch.int32).view(torch.float32)], dim=1))
        text, spoke, finite = host[:, FRAME_SAMPLES:].view(np.int32).T
        outputs: dict[int, SlotOutput | RowFault] = {}
        for slot in frames:
            if slot in step.raised:
                outputs[slot] = step.raised[slot]
                continue
            if not finite[slot]:
                outputs[slot] = self.engine.non_finite(slot)
                continue
            self.frames_stepped[slot] += 1
            if spoke[slot]:
                outputs[slot] = SlotOutput(int(text[slot]), host[slot, :FRAME_SAMPLES].copy())
            else:
                outputs[slot] = SlotOutput(None, None)
        return outputs


def start_batch(make: Callable[[], BatchedModel]) -> BatchedModel:
    """`make()` started and warmed up, which captures the step graphs on a GPU. Where that fails, the step graphs go
    off (frontend_model/engine/optimisations.py) and a fresh batch starts eagerly; a failure of that is the model's,
    and raised."""
    batched = make()
    if not batched.optimisations.enabled("step_graphs"):
        return _warm(batched)
    if batched.optimisations.attempt("step_graphs", lambda: _warm(batched)) is not None:
        return batched
    batched.close()
    drop_streaming_state(batched.model.lm, batched.model.mimi)
    release_memory(batched.model.device)
    return _warm(make())


def _warm(batched: BatchedModel) -> BatchedModel:
    batched.start()
    batched.warm_up()
    return batched


def capture_step_graphs(model: LoadedModel, optimisations: Optimisations, max_span_frames: int) -> None:
    """Start the step graphs once on a batch of one before calibration, so that where they fail calibration measures
    the eager step that will serve."""
    start_batch(lambda: BatchedModel(model, 1, GREEDY, max_span_frames, optimisations=optimisations)).close()
