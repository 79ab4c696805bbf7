"""Whether a session was served without a stall, however fast the host.

These tests check isolation, not speed (`benchmarks/` measures speed). A host too slow for real time (CI machines of
one kind differ 2-3x; on one 2-core box a `tiny` session alone took 46 ms of the 80 ms frame,
`benchmarks/results/load-tiny-cpu-1-no-asr.json`) falls behind gradually: each frame waits a few milliseconds more
than the one before, and after a minute the wait can be seconds. A blocked worker, a span computed frame by frame,
or a slow client or fault leaking into another session is something else: the worker does nothing for the length of
the fault, so one frame waits that much longer than the frame before it. So the bar is: every frame answered (or
dropped by the server's input bound, and reported), and no frame waiting half a second more than the one before it.
"""

from __future__ import annotations

import numpy as np

from benchmarks.harness import StreamResult

STALL_MS = 500.0


def assert_kept_pace(result: StreamResult, min_frames: int) -> None:
    stats = result.of_type("stats")
    latencies = np.array([ms for s in stats for ms in s.latency_ms])
    assert len(latencies) > min_frames, (len(latencies), min_frames)
    jumps = np.diff(latencies)
    worst = int(np.argmax(jumps))
    assert jumps[worst] < STALL_MS, (f"frame {worst + 1} waited {jumps[worst]:.0f} ms more than the frame before it "
                                     f"({latencies[worst]:.0f} -> {latencies[worst + 1]:.0f} ms): the session stalled")
    dropped = max((s.input_dropped for s in stats), default=0)
    assert abs(result.audio_messages + dropped - result.frames_sent) <= 1, (result.audio_messages, dropped,
                                                                           result.frames_sent)
