"""What the agent remembers: per-user profile and notes, per-session turns and tool results, in SQLite.
`working_context` condenses it into a bounded text for the LLM prompt, newest turns first to survive."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field, field_validator

from backend_agent.tools.base import ToolResult

Role = Literal["user", "agent", "tool"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS profiles (
    user_id TEXT PRIMARY KEY, name TEXT, location TEXT, timezone TEXT, language TEXT);
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY, user_id TEXT NOT NULL, text TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, user_id TEXT NOT NULL, role TEXT NOT NULL,
    text TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tool_results (
    id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, user_id TEXT NOT NULL, tool TEXT NOT NULL,
    arguments TEXT NOT NULL, text TEXT NOT NULL, source TEXT NOT NULL, created REAL NOT NULL,
    question TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS notes_by_user ON notes (user_id, id);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (session_id, id);
CREATE INDEX IF NOT EXISTS tool_results_by_session ON tool_results (session_id, id);
"""


class Profile(BaseModel):
    """What we know about a user; notes are free-form facts ("allergic to nuts")."""

    user_id: str
    name: str | None = None
    location: str | None = None
    timezone: str | None = None
    language: str | None = None
    notes: list[str] = Field(default_factory=list)

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ZoneInfo(value)
            except (ZoneInfoNotFoundError, ValueError) as error:
                raise ValueError(f"unknown IANA timezone {value!r}") from error
        return value


class Turn(BaseModel):
    """One utterance of a session: the user's (final ASR text), the agent's, or a tool's answer."""

    session_id: str
    user_id: str
    role: Role
    text: str
    timestamp: float


class ToolRecord(BaseModel):
    """One request the agent answered in a session: the question, the tool, its real arguments, what it returned."""

    session_id: str
    question: str = ""
    tool: str
    arguments: dict[str, Any]
    text: str
    source: str
    timestamp: float


class ContextStore:
    """SQLite-backed memory, shared between the event loop and worker threads (one connection behind a
    lock). `path` may be ":memory:"."""

    def __init__(self, path: str | Path = ":memory:", clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        with self._lock, self._db:
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(tool_results)")}
            if "question" not in columns:  # a store written before answered requests kept their question
                self._db.execute("ALTER TABLE tool_results ADD COLUMN question TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def get_profile(self, user_id: str) -> Profile:
        """The user's profile; an empty one for a user we have not met."""
        with self._lock:
            row = self._db.execute(
                "SELECT name, location, timezone, language FROM profiles WHERE user_id = ?", (user_id,)
            ).fetchone()
            notes = [
                text
                for (text,) in self._db.execute(
                    "SELECT text FROM notes WHERE user_id = ? ORDER BY id", (user_id,)
                )
            ]
        fields = dict(zip(("name", "location", "timezone", "language"), row or (), strict=False))
        return Profile(user_id=user_id, notes=notes, **fields)

    def save_profile(self, profile: Profile) -> None:
        """Store the profile, its notes replacing the stored ones."""
        now = self._clock()
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO profiles (user_id, name, location, timezone, language) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (user_id) DO UPDATE SET name = excluded.name, location = excluded.location, "
                "timezone = excluded.timezone, language = excluded.language",
                (profile.user_id, profile.name, profile.location, profile.timezone, profile.language),
            )
            self._db.execute("DELETE FROM notes WHERE user_id = ?", (profile.user_id,))
            self._db.executemany(
                "INSERT INTO notes (user_id, text, created) VALUES (?, ?, ?)",
                [(profile.user_id, note, now) for note in profile.notes],
            )

    def add_note(self, user_id: str, text: str) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO notes (user_id, text, created) VALUES (?, ?, ?)", (user_id, text, self._clock())
            )

    def forget_user(self, user_id: str) -> None:
        """Everything kept for `user_id`: for an anonymous session, whose id no later session can ask for."""
        with self._lock, self._db:
            for table in ("profiles", "notes", "turns", "tool_results"):
                self._db.execute(f"DELETE FROM {table} WHERE user_id = ?", (user_id,))

    def add_turn(self, user_id: str, session_id: str, role: Role, text: str) -> Turn:
        turn = Turn(session_id=session_id, user_id=user_id, role=role, text=text, timestamp=self._clock())
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO turns (session_id, user_id, role, text, created) VALUES (?, ?, ?, ?, ?)",
                (session_id, user_id, role, text, turn.timestamp),
            )
        return turn

    def turns(self, session_id: str, limit: int | None = None) -> list[Turn]:
        """The session's turns in order; with `limit`, only the latest ones."""
        with self._lock:
            rows = self._db.execute(
                "SELECT session_id, user_id, role, text, created FROM turns WHERE session_id = ? "
                "ORDER BY id DESC LIMIT ?",
                (session_id, -1 if limit is None else limit),
            ).fetchall()
        return [
            Turn(session_id=s, user_id=u, role=r, text=t, timestamp=c) for s, u, r, t, c in reversed(rows)
        ]

    def record_tool_result(
        self, user_id: str, session_id: str, tool: str, arguments: dict[str, Any], result: ToolResult,
        question: str = "",
    ) -> None:
        """Keep an answered request (the tool's real arguments), and add it to the conversation as a "tool" turn."""
        now = self._clock()
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO tool_results (session_id, user_id, tool, arguments, text, source, created, question) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, user_id, tool, json.dumps(arguments), result.text, result.source, now, question),
            )
            self._db.execute(
                "INSERT INTO turns (session_id, user_id, role, text, created) VALUES (?, ?, 'tool', ?, ?)",
                (session_id, user_id, f"{tool}: {result.text} (source: {result.source})", now),
            )

    def tool_results(self, session_id: str, limit: int | None = None) -> list[ToolRecord]:
        """The session's answered requests in order; with `limit`, only the latest ones."""
        with self._lock:
            rows = self._db.execute(
                "SELECT question, tool, arguments, text, source, created FROM tool_results WHERE session_id = ? "
                "ORDER BY id DESC LIMIT ?",
                (session_id, -1 if limit is None else limit),
            ).fetchall()
        return [
            ToolRecord(session_id=session_id, question=q, tool=t, arguments=json.loads(a), text=x, source=s,
                       timestamp=c)
            for q, t, a, x, s, c in reversed(rows)
        ]

    def working_context(
        self, user_id: str, session_id: str, max_turns: int = 12, max_chars: int = 2000
    ) -> str:
        """Profile, notes and the latest turns as prompt text of at most `max_chars` characters. When it
        does not fit, the oldest turns go first, then the oldest notes; the latest turn stays longest."""
        profile = self.get_profile(user_id)
        facts = [
            f"{key} {value}"
            for key, value in profile.model_dump(exclude={"user_id", "notes"}).items()
            if value
        ]
        header = [f"User profile: {'; '.join(facts)}."] if facts else []
        notes = [f"- {note}" for note in profile.notes]
        turns = [f"{turn.role}: {turn.text}" for turn in self.turns(session_id, limit=max_turns)]

        def render() -> str:
            lines = [
                *header,
                *(["Notes:", *notes] if notes else []),
                *(["Conversation:", *turns] if turns else []),
            ]
            return "\n".join(lines)

        text = render()
        while len(text) > max_chars and (len(turns) > 1 or notes):
            if len(turns) > 1:
                turns.pop(0)
            else:
                notes.pop(0)
            text = render()
        if len(text) > max_chars:  # the profile alone, or the one remaining turn, is too long
            text = text[: max_chars - 1] + "…" if max_chars > 0 else ""
        return text
