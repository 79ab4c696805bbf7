"""A resume that first meets a replica still draining or loading waits and tries again, as a rolling update behind a
load balancer makes it do (scripts/swarm_check.sh found a single try lost the call): a fake server on loopback hands
the session over (4000), refuses the resume twice with 1013, then takes it. A refusal that cannot pass (4404) ends
the session at once."""

from __future__ import annotations

import asyncio
import time

import pytest
import websockets
from websockets.asyncio.server import ServerConnection

from contextspan_client import SessionClosed, connect
from contextspan_client.client import RESUME_FIRST_PAUSE_S
from server.wire import protocol as p

TOKEN = "resume-token"


async def serve(refusals: list[int]) -> tuple[websockets.Server, list[str]]:
    """Opens a session that is handed over at once; each resume is refused with the next close code of `refusals`,
    then taken: the handshake and a normal close."""
    paths: list[str] = []

    async def handler(ws: ServerConnection) -> None:
        paths.append(ws.request.path if ws.request else "")
        if "resume=" not in paths[-1]:
            await ws.send(p.handshake())
            await ws.close(p.CLOSE_RESUME_ELSEWHERE, TOKEN)
        elif refusals:
            await ws.close(refusals.pop(0), p.close_reason("draining", "the server is shutting down"))
        else:
            await ws.send(p.handshake())
            await ws.close()

    return await websockets.serve(handler, "127.0.0.1", 0), paths


async def converse(refusals: list[int]) -> tuple[int, list[str]]:
    server, paths = await serve(refusals)
    port = server.sockets[0].getsockname()[1]
    try:
        async with connect(f"http://127.0.0.1:{port}", resume_within_s=10) as conversation:
            async for _ in conversation:
                pass
    finally:
        server.close()
    return conversation.resumes, paths


def test_a_resume_refused_while_replicas_drain_or_load_is_tried_again_until_one_takes_it() -> None:
    resumes, paths = asyncio.run(converse([p.CLOSE_TRY_AGAIN, p.CLOSE_TRY_AGAIN]))
    assert resumes == 1
    assert len(paths) == 4 and all(f"resume={TOKEN}" in path for path in paths[1:])


def test_a_refusal_that_cannot_pass_ends_the_session_without_waiting() -> None:
    started = time.monotonic()
    with pytest.raises(SessionClosed) as closed:
        asyncio.run(converse([p.CLOSE_RESUME_UNKNOWN]))
    assert closed.value.code == p.CLOSE_RESUME_ELSEWHERE
    assert time.monotonic() - started < RESUME_FIRST_PAUSE_S


def test_a_model_fault_is_resumed_once_but_not_when_the_replayed_session_faults_again_at_once() -> None:
    """A fault the history brings back (a NaN from frame 20 on) would otherwise loop: resume, replay, fault."""
    paths: list[str] = []

    async def run() -> None:
        async def handler(ws: ServerConnection) -> None:
            paths.append(ws.request.path if ws.request else "")
            await ws.send(p.handshake())
            await ws.send(p.SessionReady(
                t=0.0, session_id="s", profile="tiny", random_weights=True, description="", prefix_frames=0,
                prefill_ms=0.0, trigger="asr", app_spans=False, resume=TOKEN,
                sampling=p.Sampling(text_temperature=0.7, text_topk=25, audio_temperature=0.8, audio_topk=250,
                                    text_seed=1, audio_seed=2)).model_dump_json())
            await ws.close(p.CLOSE_INTERNAL, p.close_reason("model_fault", "NaN or inf in the model's logits"))

        server = await websockets.serve(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with connect(f"http://127.0.0.1:{port}") as conversation:
                async for _ in conversation:
                    pass
        finally:
            server.close()

    with pytest.raises(SessionClosed) as closed:
        asyncio.run(asyncio.wait_for(run(), 10))  # a loop would never end
    assert closed.value.code == p.CLOSE_INTERNAL
    assert len(paths) == 2 and f"resume={TOKEN}" in paths[1], paths
