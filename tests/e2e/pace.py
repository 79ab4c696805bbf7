"""Whether a session was served without a stall.

These tests check isolation, not speed (benchmarks/ measures speed): a blocked worker, a span computed frame by
frame or a slow client leaking into another session shows as frames held for the length of the fault (seconds),
while a shared 2-core CI box only makes frames a little late: on a slow one even a fault-free pair of sessions with
speech recognition misses the 80 ms deadline on up to ~30 % of frames, by tens of milliseconds (benchmarks/ has the
numbers). So the bar is: every frame answered, none held half a second, and most within the deadline.
"""

from __future__ import annotations

from server.client import StreamResult

MAX_MISS_RATE = 0.35
STALL_MS = 500.0


def assert_kept_pace(result: StreamResult, min_frames: int) -> None:
    stats = result.of_type("stats")
    latencies = [ms for s in stats for ms in s.latency_ms]
    missed = sum(s.deadline_misses for s in stats)
    assert len(latencies) > min_frames, (len(latencies), min_frames)
    assert max(latencies) < STALL_MS, f"a frame waited {max(latencies):.0f} ms: the session stalled"
    assert missed <= MAX_MISS_RATE * len(latencies), (missed, len(latencies), sorted(latencies)[-10:])
    assert abs(result.audio_messages - result.frames_sent) <= 1, (result.audio_messages, result.frames_sent)
