"""Prometheus metrics, on a registry per app so that tests can run several servers in one process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from frontend_model.engine.optimisations import ACTIVE

if TYPE_CHECKING:
    from frontend_model.engine.device_memory import DeviceMemory

_MS_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.5, 1.0)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.sessions_active = Gauge("contextspan_sessions_active", "Sessions streaming now", registry=r)
        self.session_slots = Gauge("contextspan_session_slots", "Configured concurrent session slots", registry=r)
        self.sessions = Counter(
            "contextspan_sessions", "Session attempts by outcome", ["outcome"], registry=r
        )
        self.step_latency = Histogram(
            "contextspan_step_latency_seconds", "Model compute per frame (encode, step, decode) on the worker",
            buckets=_MS_BUCKETS, registry=r,
        )
        self.frame_latency = Histogram(
            "contextspan_frame_latency_seconds", "From a frame's last input sample to its output being queued",
            buckets=_MS_BUCKETS, registry=r,
        )
        self.deadline_misses = Counter(
            "contextspan_deadline_misses", "Frames whose output was later than the frame deadline", registry=r
        )
        self.span_injections = Counter(
            "contextspan_span_injections", "Span requests by result", ["result"], registry=r
        )
        self.span_latency = Histogram(
            "contextspan_span_latency_seconds", "From a span request to the end of its injection",
            buckets=(*_MS_BUCKETS, 2.5, 5.0), registry=r,
        )
        self.frames_dropped = Counter(
            "contextspan_frames_dropped", "Frames dropped: oldest outgoing audio of slow clients, or input backlog",
            ["reason"], registry=r,
        )
        self.worker_restarts = Counter(
            "contextspan_worker_restarts", "Model workers restarted after a call stalled past worker_stall_s",
            registry=r,
        )
        self.batch_size = Histogram(
            "contextspan_batch_size", "Sessions stepped in one batched tick",
            buckets=(1, 2, 4, 8, 16, 32, 64), registry=r,
        )
        self.tick_seconds = Histogram(
            "contextspan_tick_seconds", "One batched tick on the worker: spans injected, encode, step, decode",
            buckets=_MS_BUCKETS, registry=r,
        )
        self.tick_cpu_seconds = Histogram(
            "contextspan_tick_cpu_seconds", "CPU time the worker thread spent on a tick; well under the tick's "
            "seconds means the worker waited for the GIL or for a core",
            buckets=_MS_BUCKETS, registry=r,
        )
        self.window_rolls = Histogram(
            "contextspan_window_roll_seconds", "A session's window rolled past the context (its prefix kept, its "
            "recent frames prefilled again after it), on the worker before its tick",
            buckets=_MS_BUCKETS, registry=r,
        )
        self.window_rolls_in_tick = Counter(
            "contextspan_window_rolls_in_tick", "Rolls whose kept frames were all prefilled in the tick: no window "
            "was built ahead for the session (no shadow row, or another session's build on it)", registry=r,
        )
        self.window_build_seconds = Histogram(
            "contextspan_window_build_seconds", "A window built ahead, fed one chunk of a session's recent frames in "
            "its tick", buckets=_MS_BUCKETS, registry=r,
        )
        self.spans_deferred = Counter(
            "contextspan_spans_deferred", "Span injections put off to a later tick: they did not fit its budget",
            registry=r,
        )
        self.protocol_errors = Counter(
            "contextspan_protocol_errors", "Bad client messages by code", ["code"], registry=r
        )
        self.device_memory = Gauge(
            "contextspan_device_memory_bytes", "The model's device memory: in_use, reserved, total, weights, and "
            "per_session (one session's KV caches)", ["kind"], registry=r,
        )
        self.memory_sessions = Gauge(
            "contextspan_memory_session_capacity", "Sessions whose state fits the device's memory beside the weights",
            registry=r,
        )
        self.gc_pause = Histogram(
            "contextspan_gc_pause_seconds", "Python's garbage collector held the process (ticks and the event loop "
            "wait): one collection, by generation; what loading made is frozen out of them", ["generation"],
            buckets=_MS_BUCKETS, registry=r,
        )
        self.optimisation_active = Gauge(
            "contextspan_optimisation_active", "GPU optimisations running (1) or not (0: off after a failed start, "
            "unused, or not applicable); /readyz says why", ["name"], registry=r,
        )

    def set_optimisations(self, status: dict[str, str]) -> None:
        """1 for each GPU optimisation that runs, 0 for one that is off, unused or not applicable (/readyz: why)."""
        for name, state in status.items():
            self.optimisation_active.labels(name).set(int(state == ACTIVE))

    def set_memory(self, memory: DeviceMemory | None) -> None:
        if memory is None:
            return
        for kind, value in (("in_use", memory.in_use_bytes), ("reserved", memory.reserved_bytes),
                            ("total", memory.total_bytes), ("weights", memory.weight_bytes),
                            ("per_session", memory.session_bytes)):
            self.device_memory.labels(kind).set(value)
        self.memory_sessions.set(memory.sessions_fit)

    def render(self) -> bytes:
        return generate_latest(self.registry)
