"""A model that cannot load: the app stays up, says why on /readyz, and refuses chats with 1013 (`contextspan serve`
then exits unless --wait-for-model: tests/server/test_serve_exit.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from server.app.routes import create_app
from server.settings import ServerSettings


def test_load_error_is_reported_and_chats_are_refused(tmp_path: Path) -> None:
    app = create_app(ServerSettings(profile="moshi", recordings_dir=tmp_path))  # no --checkpoint
    with TestClient(app) as client:
        deadline = time.monotonic() + 10
        while not (body := client.get("/readyz").json())["load_error"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.get("/readyz").status_code == 503 and "needs --checkpoint" in body["load_error"]
        assert client.get("/healthz").json() == {"status": "alive"}
        with client.websocket_connect("/api/chat") as ws, pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
        assert closed.value.code == 1013 and json.loads(closed.value.reason)["error"] == "not_ready"
