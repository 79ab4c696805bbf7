"""The auth matrix against a real server with an API key: tokens, origins, recordings, and the bind rule."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from benchmarks.harness import stream
from contextspan_client import chat_url
from server.wire import protocol as p

from .servers import RunningServer, start_server, stop_server

pytestmark = pytest.mark.slow
KEY = "operator-key-for-tests"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("secured"), "--api-keys", KEY, "--token-ttl-s", "2",
                           "--allowed-origins", "https://app.example", "--max-sessions", "1")
    yield running
    stop_server(running)


def new_token(server: RunningServer) -> str:
    response = httpx.post(f"{server.http}/api/token", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["expires_in"] == 2
    return str(body["token"])


def refused(url: str, **connect: object) -> tuple[int, dict[str, str]]:
    async def run() -> tuple[int, dict[str, str]]:
        with pytest.raises(InvalidStatus) as info:
            async with websockets.connect(url, open_timeout=10, **connect):  # type: ignore[arg-type]
                pass
        response = info.value.response
        return response.status_code, json.loads(response.body or b"{}")

    return asyncio.run(run())


def opens(url: str, **connect: object) -> str | None:
    """Connects, waits for the handshake, leaves; returns the subprotocol the server chose."""
    async def run() -> str | None:
        async with websockets.connect(url, open_timeout=10, **connect) as ws:  # type: ignore[arg-type]
            assert await asyncio.wait_for(ws.recv(), timeout=30) == p.handshake()
            chosen = ws.subprotocol
        await asyncio.sleep(0.3)  # the slot is released after the close
        return chosen

    return asyncio.run(run())


def test_token_endpoint_wants_an_api_key(secured: RunningServer) -> None:
    assert httpx.post(f"{secured.http}/api/token", timeout=5).status_code == 401
    wrong = httpx.post(f"{secured.http}/api/token", headers={"Authorization": "Bearer nope"}, timeout=5)
    assert wrong.status_code == 401 and wrong.json()["error"] == "bad_api_key"
    assert new_token(secured) != new_token(secured)


def test_session_tokens(secured: RunningServer) -> None:
    url = chat_url(secured.ws)
    status, body = refused(url)
    assert status == 401 and body["error"] == "token_missing"
    status, body = refused(url, additional_headers={"Authorization": "Bearer made-up"})
    assert status == 401 and body["error"] == "token_unknown"

    token = new_token(secured)
    assert opens(url, additional_headers={"Authorization": f"Bearer {token}"}) is None
    status, body = refused(url, additional_headers={"Authorization": f"Bearer {token}"})
    assert status == 401 and body["error"] == "token_unknown", "a token opens one session"

    token = new_token(secured)
    assert opens(f"{url}?token={token}") is None

    token = new_token(secured)
    assert opens(url, subprotocols=["contextspan", f"bearer.{token}"]) == "contextspan", "as a browser does"

    token = new_token(secured)
    time.sleep(2.2)
    status, body = refused(url, additional_headers={"Authorization": f"Bearer {token}"})
    assert status == 401 and body["error"] == "token_expired"
    metrics = secured.metrics()
    for outcome in ("token_missing", "token_unknown", "token_expired"):
        assert f'contextspan_sessions_total{{outcome="refused_{outcome}"}}' in metrics


def test_origins(secured: RunningServer) -> None:
    url = chat_url(secured.ws)
    token = new_token(secured)
    status, body = refused(url, origin="https://evil.example", additional_headers={"Authorization": f"Bearer {token}"})
    assert status == 403 and body["error"] == "origin_not_allowed"
    assert opens(url, origin="https://evil.example".replace("evil", "app"),
                 additional_headers={"Authorization": f"Bearer {token}"}) is None, "the refusal did not spend it"
    host = secured.http.removeprefix("http://")
    assert opens(url, origin=f"http://{host}", additional_headers={"Authorization": f"Bearer {new_token(secured)}"}
                 ) is None, "the server's own page"


def test_recordings_need_the_key_or_the_signed_link(secured: RunningServer, speech: np.ndarray) -> None:
    result = asyncio.run(stream(chat_url(secured.ws, events=True), speech[: 24000 * 2], token=new_token(secured)))
    ready = result.of_type("session.ready")[0]
    signed = ready.recording["wav"]
    assert "?sig=" in signed
    bare = signed.split("?")[0]
    deadline = time.monotonic() + 10
    while httpx.get(f"{secured.http}{signed}", timeout=5).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(f"{secured.http}{signed}", timeout=5).status_code == 200
    assert httpx.get(f"{secured.http}{bare}", timeout=5).status_code == 401
    assert httpx.get(f"{secured.http}{bare}?sig=0123", timeout=5).status_code == 401
    keyed = httpx.get(f"{secured.http}{bare}", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert keyed.status_code == 200 and keyed.content[:4] == b"RIFF"


def test_without_keys_the_token_endpoint_says_auth_is_off(server: RunningServer) -> None:
    response = httpx.post(f"{server.http}/api/token", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert response.status_code == 404 and response.json()["error"] == "auth_off"


def test_public_bind_without_auth_is_refused(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2
    assert "without authentication" in done.stderr and "--allow-public-without-auth" in done.stderr
    assert time.monotonic() - started < 30, "refused before loading anything"


def test_public_bind_with_the_explicit_flag_starts(tmp_path: Path) -> None:
    running = start_server(tmp_path, "--host", "0.0.0.0", "--allow-public-without-auth", "--no-asr")
    try:
        assert httpx.get(f"{running.http}/healthz", timeout=5).status_code == 200
    finally:
        stop_server(running)
