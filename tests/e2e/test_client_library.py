"""The public client library (contextspan_client) against a real in-process server with token auth on: a token minted
with the operator key, a spoken file streamed as Opus, typed events back, and each refusal as its typed exception."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

import contextspan_client as client
from contextspan_client import load_wav
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.loader import load_model
from server.wire import protocol as p

from .servers import InProcessServer, in_process_server, pinned_settings

pytestmark = pytest.mark.slow
KEY = "client-library-key"
DOCS = Path(__file__).parents[2] / "docs"
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    settings = pinned_settings(recordings_dir=tmp_path_factory.mktemp("rec"), max_sessions=1, api_keys=[KEY],
                               asr=False)
    with in_process_server(settings, load_model("tiny")) as running:
        yield running


def slot_free(server: InProcessServer) -> None:
    """The one slot comes back just after a close (the client does not wait for it); a hang guard, not a timing."""
    deadline = time.monotonic() + 30
    while server.state.batcher is not None and server.state.batcher.free < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.state.batcher is not None and server.state.batcher.free == 1


async def slot_back(server: InProcessServer) -> None:
    await asyncio.to_thread(slot_free, server)


def test_converse_streams_a_file_and_gets_typed_events(secured: InProcessServer, speech_path: Path) -> None:
    slot_free(secured)
    pcm = load_wav(str(speech_path))[: 2 * SAMPLE_RATE]
    tail_s = 0.5
    seen: dict[str, list[object]] = {"audio": [], "text": [], "event": []}

    async def run() -> client.Reply:
        token = await client.session_token(secured.http, KEY)
        return await client.converse(secured.http, pcm, token=token, tail_s=tail_s, catch_up_s=60, user="ada",
                                     on_audio=seen["audio"].append, on_text=seen["text"].append,
                                     on_event=seen["event"].append)

    reply = asyncio.run(run())
    assert reply.close_code == p.CLOSE_NORMAL
    frames = math.ceil((len(pcm) + tail_s * SAMPLE_RATE) / FRAME_SAMPLES)  # sent, the last one padded
    assert (frames - 1) * FRAME_SAMPLES <= reply.audio.size <= (frames + 1) * FRAME_SAMPLES, (reply.audio.size, frames)
    assert reply.audio.dtype == np.float32 and np.isfinite(reply.audio).all() and np.abs(reply.audio).max() > 0
    assert reply.text and reply.text == "".join(seen["text"])  # type: ignore[arg-type]
    assert sum(a.size for a in seen["audio"]) == reply.audio.size  # type: ignore[attr-defined]
    assert seen["event"] == reply.events and all(isinstance(e, p.ServerEvent) for e in reply.events)
    (ready,) = reply.of_type("session.ready")
    assert isinstance(ready, p.SessionReady) and ready.profile == "tiny" and ready.app_spans
    assert all(isinstance(e, p.AgentText) for e in reply.of_type("agent.text")) and reply.of_type("agent.text")
    stats = reply.of_type("stats")
    assert stats and all(isinstance(s, p.Stats) for s in stats)


def test_the_iterator_sends_typed_messages_and_reads_typed_answers(secured: InProcessServer) -> None:
    slot_free(secured)

    async def run() -> tuple[list[client.Received], p.SessionReady | None]:
        received: list[client.Received] = []
        async with client.connect(secured.ws, token=await client.session_token(secured.ws, KEY)) as conversation:

            async def talk() -> None:
                await conversation.send(p.SessionUpdate(type="session.update", notes="likes trains"))
                await conversation.stream_audio(np.zeros(SAMPLE_RATE, np.float32))
                await conversation.send(p.SpanInject(type="span.inject", text="The train leaves at noon.",
                                                     source="timetable"))
                give_up = time.monotonic() + 60  # a hang guard: silence until the span's outcome came
                while (not any(isinstance(e, p.SpanInjected | p.SpanDropped) for e in received)
                       and time.monotonic() < give_up):
                    await conversation.send_audio(np.zeros(FRAME_SAMPLES, np.float32))
                    await asyncio.sleep(FRAME_S)
                await conversation.close()

            talker = asyncio.create_task(talk())
            async for item in conversation:
                received.append(item)
            await talker
            return received, conversation.ready

    received, ready = asyncio.run(run())
    assert isinstance(ready, p.SessionReady) and received[0] == ready
    updated = [e for e in received if isinstance(e, p.SessionUpdated)]
    assert len(updated) == 1 and updated[0].notes == "likes trains"
    spans = [e for e in received if isinstance(e, p.SpanInjected | p.SpanDropped)]
    assert len(spans) == 1 and isinstance(spans[0], p.SpanInjected), spans
    assert spans[0].source == "timetable" and "train leaves at noon" in spans[0].text
    assert any(isinstance(e, client.AudioChunk) and e.pcm.size for e in received)
    assert any(isinstance(e, client.TextPiece) for e in received)


def test_refusals_and_closes_raise_their_typed_errors(secured: InProcessServer) -> None:
    async def refused(token: str | None, **query: str) -> client.ClientError:
        with pytest.raises(client.ClientError) as info:
            async with client.connect(secured.http, token=token, **query):
                pass
        return info.value

    async def run() -> list[client.ClientError]:
        await slot_back(secured)
        errors = [await refused(None), await refused("made-up")]
        spent = await client.session_token(secured.http, KEY)
        async with client.connect(secured.http, token=spent):
            pass
        errors.append(await refused(spent))
        errors.append(await refused(await client.session_token(secured.http, KEY), text_temperature="99"))
        await slot_back(secured)
        async with client.connect(secured.http, token=await client.session_token(secured.http, KEY)):
            errors.append(await refused(await client.session_token(secured.http, KEY)))  # the only slot is held
        with pytest.raises(client.Unauthorized) as bad_key:
            await client.session_token(secured.http, "not-the-key")
        errors.append(bad_key.value)
        return errors

    missing, unknown, spent, bad_sampling, busy, bad_key = asyncio.run(run())
    for error, name in ((missing, "token_missing"), (unknown, "token_unknown"), (spent, "token_unknown"),
                        (bad_key, "bad_api_key")):
        assert isinstance(error, client.Unauthorized) and error.status == 401 and error.error == name, error
    assert isinstance(bad_sampling, client.PolicyViolation) and bad_sampling.code == p.CLOSE_POLICY
    assert bad_sampling.error == "bad_sampling" and "text_temperature" in bad_sampling.message
    assert isinstance(busy, client.TryAgain) and busy.code == p.CLOSE_TRY_AGAIN and busy.error == "at_capacity"
    assert str(busy).startswith("close 1013 at_capacity: ")


def test_close_reasons_map_to_their_exceptions() -> None:
    """The server's JSON reasons (p.close_reason) come back as error and message; a plain or unknown one as is."""
    for code, kind in client.CLOSES.items():
        error = client.close_error(code, p.close_reason("some_error", "what happened"))
        assert type(error) is kind and (error.code, error.error, error.message) == (code, "some_error", "what happened")
    plain = client.close_error(4000, "bye")
    assert type(plain) is client.SessionClosed and (plain.error, plain.message) == ("", "bye")


def test_events_from_a_newer_server_are_read_or_skipped() -> None:
    stats = p.Stats(t=1.0, frames_in=12, frames_out=12, latency_ms=[3.0], deadline_misses=0, audio_dropped=0,
                    input_dropped=0, send_queue=0)
    newer = {**json.loads(p.encode_event(stats)), "added_later": 1}
    assert client.decode_event_text(json.dumps(newer)) == stats
    assert client.decode_event_text('{"type": "added.later", "t": 1.0}') is None
    with pytest.raises(ValidationError):  # a known event without its fields is a broken server, not a newer one
        client.decode_event_text('{"type": "stats", "t": 1.0}')


def test_the_command_line_writes_the_reply_and_prints_events(
        secured: InProcessServer, speech_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli import main

    slot_free(secured)
    out = tmp_path / "reply.wav"
    code = main(["client", str(speech_path), "--url", secured.http, "--api-key", KEY, "--out", str(out), "--fast",
                 "--tail-s", "1", "--catch-up-s", "120"])  # a hang guard: a loaded host answers late
    printed = capsys.readouterr()
    assert code == 0, printed.err
    events = [p.decode_event(line) for line in printed.out.splitlines()]
    assert isinstance(events[0], p.SessionReady) and any(isinstance(e, p.Stats) for e in events)
    assert "agent: " in printed.err
    reply = load_wav(str(out))  # the close waited for the voice answering every frame sent but the last
    assert reply.size / SAMPLE_RATE >= len(load_wav(str(speech_path))) / SAMPLE_RATE + 1.0 - 2 * FRAME_S

    assert main(["client", str(speech_path), "--url", secured.http, "--token", "made-up", "--out", str(out)]) == 1
    assert "Unauthorized: HTTP 401 token_unknown" in capsys.readouterr().err


def test_the_documented_example_runs(secured: InProcessServer, speech_path: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/client.md's first example, pointed at this server, its key and a spoken file."""
    block = re.findall(r"```python\n(.*?)```", (DOCS / "client.md").read_text(), re.S)[0]
    code = block
    for old, new in (('"http://127.0.0.1:8998"', repr(secured.http)), ('"my-api-key"', repr(KEY)),
                     ('"question.wav"', repr(str(speech_path)))):
        assert old in code, old
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    slot_free(secured)
    exec(compile(code, "docs/client.md", "exec"), {"__name__": "__main__"})
    assert "; closed 1000" in capsys.readouterr().out
    assert load_wav(str(tmp_path / "reply.wav")).size > 0
