"""`contextspan bench frameworks`: how long LiveKit Agents' and Pipecat's OpenAI realtime services, unmodified,
wait for `response.created` after asking for a response (`response.create`), against a real server on loopback.

LiveKit's `generate_reply` fails after 10 s without it; the server answers at the next 80 ms frame. The user's
microphone is noise above the `agent_listens` threshold (benchmarks/fakes/faulty_server.py), so the agent listens
and never ends a turn of its own: every `response.created` after the first answers a request."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.servers import start_server, stop_server
from benchmarks.report import machine_info, save_json
from benchmarks.span_latency import summarise
from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE

KEY = "bench-key"
NOISE_RMS = 0.05  # -26 dBFS: above agent_listens' -40 dBFS


def noise_frame(rng: np.random.Generator) -> bytes:
    return (NOISE_RMS * 32767 * rng.standard_normal(FRAME_SAMPLES)).astype("<i2").tobytes()


async def livekit(url: str, requests: int, gap_s: float) -> list[float]:
    from livekit import rtc
    from livekit.plugins import openai as livekit_openai

    model = livekit_openai.realtime.RealtimeModel(base_url=f"{url}/v1", api_key=KEY, model="contextspan")
    session = model.session()
    mic = asyncio.create_task(microphone(lambda pcm: session.push_audio(rtc.AudioFrame(pcm, SAMPLE_RATE, 1,
                                                                                        FRAME_SAMPLES))))
    try:
        waits = []
        for _ in range(requests):
            await asyncio.sleep(gap_s)
            asked = time.perf_counter()
            await asyncio.wait_for(session.generate_reply(), 15)
            waits.append(time.perf_counter() - asked)
        return waits
    finally:
        mic.cancel()
        await session.aclose()
        await model.aclose()


async def microphone(push: Callable[[bytes], Any]) -> None:
    """A room's track: a frame of the user's audio every 80 ms."""
    rng = np.random.default_rng(0)
    while True:
        result = push(noise_frame(rng))
        if isinstance(result, Awaitable):
            await result
        await asyncio.sleep(FRAME_S)


async def pipecat(url: str, requests: int, gap_s: float) -> list[float]:
    """Pipecat's service in its own pipeline; its `response.create` sent with its own `send_client_event`, and
    `response.created` seen where the service handles it."""
    from pipecat.frames.frames import InputAudioRawFrame
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.services.openai.realtime import events
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.tests.utils import SleepFrame, run_test

    created: list[float] = []

    class Timed(OpenAIRealtimeLLMService):
        async def _handle_evt_response_created(self, evt: Any) -> None:
            created.append(time.perf_counter())
            await super()._handle_evt_response_created(evt)

    llm = Timed(api_key=KEY, base_url=f"{url.replace('http', 'ws', 1)}/v1/realtime?model=contextspan")
    rng = np.random.default_rng(0)
    frames: list[object] = []
    for _ in range(int((requests * gap_s + 10) / FRAME_S)):
        frames += [InputAudioRawFrame(audio=noise_frame(rng), sample_rate=SAMPLE_RATE, num_channels=1),
                   SleepFrame(FRAME_S)]
    waits: list[float] = []

    async def ask() -> None:
        while not created:  # the session's first response: it is ready
            await asyncio.sleep(0.05)
        for _ in range(requests):
            await asyncio.sleep(gap_s)
            before, asked = len(created), time.perf_counter()
            await llm.send_client_event(events.ResponseCreateEvent())
            while len(created) == before and time.perf_counter() - asked < 15:
                await asyncio.sleep(0.005)
            if len(created) > before:
                waits.append(created[before] - asked)

    asking = asyncio.create_task(ask())
    await run_test(llm, frames_to_send=frames, pipeline_params=PipelineParams(
        audio_in_sample_rate=SAMPLE_RATE, audio_out_sample_rate=SAMPLE_RATE), start_timeout=30.0)
    await asking
    return waits


FRAMEWORKS: dict[str, Callable[[str, int, float], Awaitable[list[float]]]] = {"livekit": livekit, "pipecat": pipecat}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench frameworks", description=__doc__)
    parser.add_argument("--frameworks", type=lambda s: s.split(","), default=list(FRAMEWORKS))
    parser.add_argument("--requests", type=int, default=20, help="response.create per framework")
    parser.add_argument("--gap-s", type=float, default=1.0, help="between two requests")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
        process, url = start_server(Path(tmp), "--profile", args.profile, "--api-keys", KEY, "--no-asr",
                                    "--max-sessions", "1", module="benchmarks.fakes.faulty_server",
                                    env={"FAULTS": "agent_listens@6"})
        try:
            for name in args.frameworks:
                waits = asyncio.run(FRAMEWORKS[name](url, args.requests, args.gap_s))
                rows[name] = {"response_created": summarise(waits), "answered": len(waits),
                              "requests": args.requests}
                s = rows[name]["response_created"]
                print(f"{name}: response.create -> response.created P50 {s['p50_ms']:.1f} ms, P99 "
                      f"{s['p99_ms']:.1f} ms ({len(waits)} of {args.requests} answered)", flush=True)
        finally:
            stop_server(process)
    save_json(args.json, {"benchmark": "frameworks", "profile": args.profile, "frame_ms": 1000 * FRAME_S,
                          "machine": machine_info(), "frameworks": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
