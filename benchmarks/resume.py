"""`contextspan bench resume`: what a crash costs a session against its length. Two replicas (`contextspan serve`
subprocesses sharing a real redis-server on loopback and the resume secret); a session on A streamed flat out (the
wire is the model's clock: input sent ahead of real time runs the model as fast as it keeps up) to each history
length, A killed -9, and the client (`contextspan_client`, failover to B) resumes on B by itself. Per length: the
state's bytes in Redis and what saving it costs, the client's wait from the kill to B's handshake, B's replay of the
history, and the first agent audio after the kill."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import redis

from benchmarks.harness import start_server, stop_server
from benchmarks.harness.redis_server import redis_server
from benchmarks.report import machine_info, save_json
from contextspan_client import AudioChunk, connect
from frontend_model.frame import FRAME_S, FRAME_SAMPLES
from server.session.resume import KEY_PREFIX
from server.wire import protocol as p

SECRET = "bench-replicas-share-this"
USER = "bench"
AHEAD_FRAMES = 25  # sent beyond what came back: under the server's 50-frame input backlog, so nothing is dropped
AFTER_S = 3.0  # input at real time after the kill, for B's first audio
SAVE_S = 1.0  # the replicas' --resume-save-s


@dataclass
class Watch:
    """What the client saw, in time.perf_counter() seconds."""

    frames_back: float = 0.0  # agent audio from A, in frames: how far A's model has stepped
    handshake_at: float | None = None  # B's handshake: the client's `resumes` went to 1
    ready_b: p.SessionReady | None = None
    first_audio_b_at: float | None = None
    events: list[str] = field(default_factory=list)


def replica(workdir: Path, redis_url: str, profile: str) -> tuple[subprocess.Popen[bytes], str]:
    workdir.mkdir(parents=True, exist_ok=True)
    return start_server(workdir, "--profile", profile, "--no-asr", "--max-sessions", "1", "--admission", "fixed",
                        "--resume-store", redis_url, "--resume-secret", SECRET, "--resume-save-s", str(SAVE_S),
                        "--recordings-dir", str(workdir / "recordings"), "--log-level", "info")


async def crash_and_resume(a: subprocess.Popen[bytes], a_url: str, b_url: str, store: redis.Redis,
                           stream_s: float) -> dict[str, Any]:
    """One session of `stream_s` seconds of stream time on A, A killed -9 once its last save is in, resumed on B."""
    frames = round(stream_s / FRAME_S)
    pcm = (0.05 * np.random.default_rng(0).standard_normal(FRAME_SAMPLES)).astype(np.float32)
    watch = Watch()
    async with connect(a_url, failover=[b_url], user=USER) as conversation:

        async def receive() -> None:
            async for item in conversation:
                if isinstance(item, AudioChunk):
                    if conversation.resumes == 0:
                        watch.frames_back += len(item.pcm) / FRAME_SAMPLES
                    elif watch.first_audio_b_at is None and len(item.pcm):
                        watch.first_audio_b_at = time.perf_counter()
                elif isinstance(item, p.SessionReady) and conversation.resumes == 1:
                    watch.ready_b = item

        async def handshake() -> None:  # `resumes` counts B's handshake the moment it arrives
            while conversation.resumes == 0:
                await asyncio.sleep(0.005)
            watch.handshake_at = time.perf_counter()

        receiver = asyncio.create_task(receive())
        start, start_bytes = time.perf_counter(), store.info("stats")["total_net_input_bytes"]
        for i in range(frames):  # never slower than real time, whatever comes back
            while (i >= watch.frames_back + AHEAD_FRAMES and time.perf_counter() < start + i * FRAME_S
                   and not receiver.done()):
                await asyncio.sleep(0.002)
            await conversation.send_audio(pcm)
        last = (watch.frames_back, time.perf_counter())
        while watch.frames_back < frames - 2 and time.perf_counter() - last[1] < 2.0:  # the decoder holds a frame back
            if watch.frames_back > last[0]:
                last = (watch.frames_back, time.perf_counter())
            await asyncio.sleep(0.01)
        streamed_s = time.perf_counter() - start
        assert conversation.ready is not None, "no session.ready from A"
        session_id = conversation.ready.session_id
        await asyncio.sleep(SAVE_S + 0.5)  # a save of the whole history
        written = store.info("stats")["total_net_input_bytes"] - start_bytes
        written_s = time.perf_counter() - start
        state_bytes = int(store.strlen(KEY_PREFIX + session_id))
        watcher = asyncio.create_task(handshake())
        killed = time.perf_counter()
        a.kill()
        while time.perf_counter() - killed < AFTER_S or watch.first_audio_b_at is None:
            if receiver.done():
                receiver.result()  # the resume's refusal, if it was refused
                raise AssertionError("the session ended before B's audio")
            assert time.perf_counter() - killed < 120, "no audio from B within 120 s"
            await conversation.send_audio(pcm)
            await asyncio.sleep(FRAME_S)
        await watcher
        receiver.cancel()
    a.wait()
    ready = watch.ready_b
    assert ready is not None and ready.session_id == session_id and ready.resumed_frames is not None, ready
    assert watch.handshake_at is not None and watch.first_audio_b_at is not None
    return {"stream_s": stream_s, "frames_sent": frames, "frames_back_from_a": round(watch.frames_back),
            "streamed_wall_s": round(streamed_s, 2), "resumed_frames": ready.resumed_frames,
            "prefix_frames": ready.prefix_frames, "stream_time_at_resume_s": ready.t,
            "state_bytes": state_bytes, "state_bytes_per_session_s": round(state_bytes / stream_s, 1),
            "saved_bytes_per_s_at_this_length": round(state_bytes / SAVE_S),
            "redis_bytes_in": written, "redis_bytes_in_per_wall_s": round(written / written_s),
            "kill_to_handshake_ms": round((watch.handshake_at - killed) * 1e3, 1),
            "replay_ms": ready.prefill_ms, "kill_to_first_audio_ms": round((watch.first_audio_b_at - killed) * 1e3, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench resume", description=__doc__)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--minutes", default="1,4", help="history lengths, in minutes of stream time, comma-separated")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    lengths = [float(m) * 60 for m in args.minutes.split(",")]
    runs = []
    with tempfile.TemporaryDirectory(prefix="contextspan-resume-") as tmp, redis_server(Path(tmp)) as server:
        store = redis.Redis.from_url(server.url)
        b, b_url = replica(Path(tmp) / "b", server.url, args.profile)
        try:
            for n, stream_s in enumerate(lengths):
                a, a_url = replica(Path(tmp) / f"a{n}", server.url, args.profile)
                try:
                    runs.append(asyncio.run(crash_and_resume(a, a_url, b_url, store, stream_s)))
                finally:
                    stop_server(a)
        finally:
            stop_server(b)
            store.close()
    print(f"{'stream':>7} | frames | state (B) | B/session-s | saved B/s at it | kill->B handshake | B replay | "
          "kill->first audio")
    for run in runs:
        print(f"{run['stream_s'] / 60:5.1f} m | {run['resumed_frames']:6d} | {run['state_bytes']:9d} | "
              f"{run['state_bytes_per_session_s']:11.1f} | {run['saved_bytes_per_s_at_this_length']:15d} | "
              f"{run['kill_to_handshake_ms']:14.1f} ms | {run['replay_ms']:5.0f} ms | "
              f"{run['kill_to_first_audio_ms']:14.1f} ms", flush=True)
    save_json(args.json, {"benchmark": "resume", "profile": args.profile, "resume_save_s": SAVE_S,
                          "ahead_frames": AHEAD_FRAMES, "machine": machine_info("cpu"),
                          "load_average": os.getloadavg(), "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
