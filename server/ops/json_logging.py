"""Logging setup: one line per record, plain text for people or JSON for log pipelines, keyed by session id.

Session code sets `session_id_var` once at the start of a conversation; asyncio tasks and `asyncio.to_thread`
calls started from there inherit it, so every record they log carries the session's id without passing it
around (a thread pool's `submit` does not copy context: wrap the call in `contextvars.copy_context().run`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

session_id_var: ContextVar[str | None] = ContextVar("session_id", default=None)

# Credentials that clients may put in a query string, which uvicorn logs with the path ("WebSocket /api/chat?...").
_CREDENTIAL_QUERY = re.compile(r"([?&](?:resume|token)=)[^&\s\"]+")

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def _session_id(record: logging.LogRecord) -> str | None:
    return getattr(record, "session_id", None) or session_id_var.get()


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", "session_id"?, "exception"?, **extra}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        session_id = _session_id(record)
        if session_id:
            entry["session_id"] = session_id
        entry.update({k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS and k not in entry})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The human format, with `[session id]` after the logger name when there is one."""

    _format = "%(asctime)s %(levelname)s %(name)s%(session)s: %(message)s"

    def __init__(self) -> None:
        super().__init__(self._format)

    def formatMessage(self, record: logging.LogRecord) -> str:
        session_id = _session_id(record)
        return self._format % {**record.__dict__, "session": f" [{session_id}]" if session_id else ""}


class RedactCredentials(logging.Filter):
    """Writes `?resume=` and `?token=` values as *** in any record, before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _CREDENTIAL_QUERY.sub(r"\1***", message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def configure_logging(level: str, json: bool) -> None:
    """Route every logger (uvicorn's too, when it is given `log_config=None`) to one stderr handler.

    Replaces the root logger's handlers, so calling it twice does not print each record twice.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    handler.addFilter(RedactCredentials())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
