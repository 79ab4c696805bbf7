"""Whether a session was served without a stall.

These tests check isolation, not speed (`benchmarks/` measures speed; a shared 2-core CI box misses the 80 ms
deadline on a third or more of the frames of two sessions with speech recognition, by tens of milliseconds). A
blocked worker, a span computed frame by frame, or a slow client or fault leaking into another session shows as
frames held for the length of the fault: seconds. So the bar is: every frame answered, none held half a second.
"""

from __future__ import annotations

from benchmarks.harness import StreamResult

STALL_MS = 500.0


def assert_kept_pace(result: StreamResult, min_frames: int) -> None:
    latencies = [ms for s in result.of_type("stats") for ms in s.latency_ms]
    assert len(latencies) > min_frames, (len(latencies), min_frames)
    assert max(latencies) < STALL_MS, f"a frame waited {max(latencies):.0f} ms: the session stalled"
    assert abs(result.audio_messages - result.frames_sent) <= 1, (result.audio_messages, result.frames_sent)
