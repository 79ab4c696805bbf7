"""Logs are one line per record; JSON lines carry the session id that session code put in `session_id_var`."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from server.ops.json_logging import JsonFormatter, TextFormatter, configure_logging, session_id_var


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    yield
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_json_lines_carry_level_logger_message_and_extras(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", json=True)
    log = logging.getLogger("contextspan.test")
    log.debug("below the level")
    log.info("span injected: %d frames", 12, extra={"frames": 12, "path": {"a": 1}})
    (line,) = _lines(capsys)
    assert line["level"] == "info" and line["logger"] == "contextspan.test"
    assert line["message"] == "span injected: 12 frames"
    assert line["frames"] == 12 and line["path"] == {"a": 1}
    assert "session_id" not in line
    assert str(line["ts"]).endswith("+00:00")


def test_session_id_comes_from_the_contextvar_in_tasks_and_threads(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", json=True)
    log = logging.getLogger("contextspan.session")

    async def session(session_id: str) -> None:
        session_id_var.set(session_id)
        await asyncio.gather(asyncio.create_task(asyncio.sleep(0, log.info("in a task"))),
                             asyncio.to_thread(log.info, "in to_thread"))
        with ThreadPoolExecutor(1) as pool:  # the model worker's kind of pool: context copied explicitly
            pool.submit(contextvars.copy_context().run, log.info, "on the worker").result()

    async def two_sessions() -> None:
        await asyncio.gather(session("s-1"), session("s-2"))

    asyncio.run(two_sessions())
    log.info("outside any session")
    lines = _lines(capsys)
    assert sorted((line["session_id"], line["message"]) for line in lines[:-1]) == sorted(
        (sid, message) for sid in ("s-1", "s-2") for message in ("in a task", "in to_thread", "on the worker"))
    assert "session_id" not in lines[-1]


def test_exceptions_stay_on_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", json=True)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("x").exception("failed", extra={"session_id": "explicit"})
    (line,) = _lines(capsys)
    assert line["session_id"] == "explicit" and "ValueError: boom" in str(line["exception"])


def test_text_format_names_the_session_and_reconfiguring_does_not_duplicate(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", json=True)
    configure_logging("info", json=False)
    token = session_id_var.set("s-9")
    try:
        logging.getLogger("server.app.routes").info("ready")
    finally:
        session_id_var.reset(token)
    logging.getLogger("server.app.routes").info("idle")
    first, second = capsys.readouterr().err.splitlines()
    assert first.endswith(" INFO server.app.routes [s-9]: ready")
    assert second.endswith(" INFO server.app.routes: idle")
    assert isinstance(logging.getLogger().handlers[0].formatter, TextFormatter)
    assert not isinstance(logging.getLogger().handlers[0].formatter, JsonFormatter)


def test_tokens_in_a_logged_query_string_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    """uvicorn logs a WebSocket's path with its query: resume and session tokens never reach the log."""
    configure_logging("info", json=True)
    logging.getLogger("contextspan.test").info('%s - "WebSocket %s" [accepted]', "127.0.0.1",
                                              "/api/chat?events=1&resume=abc.123.def.0123&user=ada&token=s3cr3t")
    (line,) = _lines(capsys)
    assert line["message"] == '127.0.0.1 - "WebSocket /api/chat?events=1&resume=***&user=ada&token=***" [accepted]'
