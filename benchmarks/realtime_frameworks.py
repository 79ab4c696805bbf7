"""`contextspan bench frameworks`: how long LiveKit Agents' and Pipecat's OpenAI realtime services, unmodified,
wait for `response.created` after asking for a response (`response.create`), against a real server on loopback;
and a client tool's round trip through LiveKit's.

LiveKit's `generate_reply` fails after 10 s without it; the server answers at the next 80 ms frame. The user's
microphone is noise above the `agent_listens` threshold (benchmarks/fakes/faulty_server.py), so the agent listens
and never ends a turn of its own: every `response.created` after the first answers a request.

The tool's round trip: a spoken question (espeak-ng, real Whisper) starts a retrieval whose LLM (a fake on
loopback) calls the client's tool; LiveKit's session gets the call when its response is done and answers at once
as AgentSession does (`update_chat_ctx`, then `generate_reply`). The server times the call to its answer (the
span's `timings_ms.tool_ms`, read from the session's recorded transcript) and the question to the injected span."""

from __future__ import annotations

import argparse
import asyncio
import json
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


async def microphone(push: Callable[[bytes], None]) -> None:
    """A room's track: a frame of the user's audio every 80 ms."""
    rng = np.random.default_rng(0)
    while True:
        push(noise_frame(rng))
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
QUESTION = "What is the weather like in Paris today?"


async def livekit_tool_rounds(url: str, rounds: int, question: np.ndarray) -> int:
    """`rounds` questions, each answered through the client's tool; returns the tool calls answered."""
    from livekit import rtc
    from livekit.agents import llm as livekit_llm
    from livekit.plugins import openai as livekit_openai

    @livekit_llm.function_tool
    async def get_weather(place: str) -> str:
        """The weather now in a place."""
        return "answered below, as AgentSession answers"

    model = livekit_openai.realtime.RealtimeModel(base_url=f"{url}/v1", api_key=KEY, model="contextspan")
    session = model.session()
    answered: list[str] = []
    tasks: list[asyncio.Task[None]] = []

    async def run_tools(generation: Any) -> None:
        async for call in generation.function_stream:
            chat_ctx = session.chat_ctx.copy()
            chat_ctx.items.append(livekit_llm.FunctionCallOutput(call_id=call.call_id, name=call.name,
                                                                 output="Sunny and mild.", is_error=False))
            await session.update_chat_ctx(chat_ctx)
            await session.generate_reply()
            answered.append(call.call_id)

    session.on("generation_created", lambda generation: tasks.append(asyncio.create_task(run_tools(generation))))
    silent = bytes(2 * FRAME_SAMPLES)
    pcm = (question * 32767).astype("<i2")
    try:
        await session.update_tools([get_weather])
        for _ in range(rounds):
            before = len(answered)
            for i in range(len(pcm) // FRAME_SAMPLES):
                session.push_audio(rtc.AudioFrame(pcm[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES].tobytes(),
                                                  SAMPLE_RATE, 1, FRAME_SAMPLES))
                await asyncio.sleep(FRAME_S)
            for _ in range(int(30 / FRAME_S)):  # Whisper, the LLM, the tool, the span; then 2 s more
                session.push_audio(rtc.AudioFrame(silent, SAMPLE_RATE, 1, FRAME_SAMPLES))
                await asyncio.sleep(FRAME_S)
                if len(answered) > before:
                    break
            for _ in range(int(2 / FRAME_S)):
                session.push_audio(rtc.AudioFrame(silent, SAMPLE_RATE, 1, FRAME_SAMPLES))
                await asyncio.sleep(FRAME_S)
        return len(answered)
    finally:
        for task in tasks:
            task.cancel()
        await session.aclose()
        await model.aclose()


def injected_spans(recordings: Path) -> list[dict[str, Any]]:
    """Every `span.injected` the sessions recorded (server/ops/recording.py's JSONL transcripts)."""
    records = (json.loads(line) for path in sorted(recordings.rglob("*.jsonl")) for line in path.open())
    return [r for r in records if r.get("type") == "span.injected"]


def tool_round_trip(tmp: Path, rounds: int) -> dict[str, Any]:
    from benchmarks.fakes.fake_openai import fake_openai
    from benchmarks.harness.speech import speak

    question = np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32), speak(QUESTION, tmp / "question.wav")])
    recordings = tmp / "recordings"
    with fake_openai() as (llm_url, script):
        script.mode, script.tool, script.arguments = "tool_call", "get_weather", {"place": "Paris"}
        process, url = start_server(tmp, "--profile", "tiny", "--api-keys", KEY, "--max-sessions", "1", "--trigger",
                                    "asr", "--llm-base-url", llm_url, "--llm-model", "fake", "--recordings-dir",
                                    str(recordings), module="benchmarks.fakes.faulty_server",
                                    env={"FAULTS": "agent_listens@6"})
        try:
            answered = asyncio.run(livekit_tool_rounds(url, rounds, question))
        finally:
            stop_server(process)
    spans = injected_spans(recordings)
    return {"rounds": rounds, "answered_by_the_client": answered, "injected": len(spans),
            "tool_round_trip": summarise([s["timings_ms"]["tool_ms"] / 1000 for s in spans]) if spans else None,
            "question_to_span": summarise([s["latency_ms"] / 1000 for s in spans]) if spans else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench frameworks", description=__doc__)
    parser.add_argument("--frameworks", type=lambda s: s.split(","), default=list(FRAMEWORKS))
    parser.add_argument("--requests", type=int, default=20, help="response.create per framework")
    parser.add_argument("--gap-s", type=float, default=1.0, help="between two requests")
    parser.add_argument("--tool-rounds", type=int, default=5, help="questions answered through LiveKit's tool")
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
        tools = tool_round_trip(Path(tmp), args.tool_rounds) if args.tool_rounds and "livekit" in args.frameworks \
            else None
    if tools and tools["tool_round_trip"]:
        t, q = tools["tool_round_trip"], tools["question_to_span"]
        print(f"livekit client tool: call -> answer P50 {t['p50_ms']:.0f} ms, P99 {t['p99_ms']:.0f} ms; question -> "
              f"span P50 {q['p50_ms']:.0f} ms ({tools['injected']} of {tools['rounds']} injected)", flush=True)
    save_json(args.json, {"benchmark": "frameworks", "profile": args.profile, "frame_ms": 1000 * FRAME_S,
                          "machine": machine_info(), "frameworks": rows, "livekit_client_tool": tools})
    return 0


if __name__ == "__main__":
    sys.exit(main())
