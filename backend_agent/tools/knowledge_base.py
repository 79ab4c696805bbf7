"""The operator's local knowledge base: text and markdown files (plus per-user notes) cut into passages
of a few sentences and indexed with SQLite FTS5. A question is searched by its content words with OR
semantics and bm25 ranking, so a spoken question that shares only some words with a document still
finds it; the best passage is the span, its file the source."""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend_agent.tools.base import Tool, ToolError, ToolResult, required_str

SENTENCES_PER_PASSAGE = 3
DOCUMENT_SUFFIXES = (".txt", ".md", ".markdown")

_STOPWORD_TEXT = """
    a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just let me more
    most my myself no nor not now of off on once only or other our ours ourselves out over own please
    same she should so some such tell than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when where which while who whom why
    will with would you your yours yourself yourselves know want like get got okay ok hey hi hello"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


@dataclass(frozen=True)
class Passage:
    """A few consecutive sentences of one document, with where they came from and their bm25 rank."""

    text: str
    source: str
    score: float


def content_words(question: str) -> list[str]:
    """The words of a question that carry meaning (no stopwords), lower-cased, in order, no repeats."""
    words = [w.lower() for w in _WORD.findall(question)]
    return list(dict.fromkeys(w for w in words if w not in _STOPWORDS and (len(w) > 1 or w.isdigit())))


def split_passages(text: str, sentences_per_passage: int = SENTENCES_PER_PASSAGE) -> list[str]:
    """Cut a document into passages: paragraphs (blank-line separated) of at most a few sentences; a
    markdown heading is kept in front of each passage under it, since it often names the topic."""
    passages: list[str] = []
    heading = ""
    for block in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        body: list[str] = []
        for line in lines:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            else:
                body.append(re.sub(r"^(?:[-*+]|\d+\.)\s+", "", line))
        sentences = _SENTENCE_END.split(" ".join(body)) if body else []
        for start in range(0, len(sentences), sentences_per_passage):
            chunk = " ".join(sentences[start : start + sentences_per_passage])
            prefix = f"{heading}: " if heading and heading.lower() not in chunk.lower() else ""
            passages.append(prefix + chunk)
    return passages


class KnowledgeBase:
    """An FTS5 index of passages; safe to share between threads (one connection behind a lock)."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        with self._lock, self._db:
            self._db.execute(
                "CREATE VIRTUAL TABLE IF NOT EXISTS passages USING fts5("
                "text, source UNINDEXED, user_id UNINDEXED, tokenize = 'porter unicode61')"
            )

    def add_document(self, source: str, text: str, user_id: str | None = None) -> int:
        """Index (or re-index) one document under `source`; returns the number of passages."""
        passages = split_passages(text)
        with self._lock, self._db:
            self._db.execute("DELETE FROM passages WHERE source = ? AND user_id IS ?", (source, user_id))
            self._db.executemany(
                "INSERT INTO passages (text, source, user_id) VALUES (?, ?, ?)",
                [(passage, source, user_id) for passage in passages],
            )
        return len(passages)

    def add_note(self, user_id: str, text: str) -> None:
        """Index one note of a user, searchable only in that user's questions."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO passages (text, source, user_id) VALUES (?, ?, ?)", (text, "note", user_id)
            )

    def index_folder(self, folder: str | Path) -> int:
        """Index every text or markdown file under `folder` (sources are paths relative to it); returns
        the number of documents."""
        root = Path(folder)
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in DOCUMENT_SUFFIXES)
        for file in files:
            self.add_document(
                file.relative_to(root).as_posix(), file.read_text(encoding="utf-8", errors="replace")
            )
        return len(files)

    def search(self, question: str, user_id: str | None = None, limit: int = 3) -> list[Passage]:
        """Passages sharing content words with `question`, best first. With more than three content
        words, a passage must share at least two of them, so one incidental word does not make an answer."""
        words = content_words(question)
        if not words:
            return []
        query = " OR ".join('"' + word.replace('"', "") + '"' for word in words)
        with self._lock:
            rows = self._db.execute(
                "SELECT text, source, bm25(passages), highlight(passages, 0, char(1), char(2)) FROM passages "
                "WHERE passages MATCH ? AND (user_id IS NULL OR user_id = ?) ORDER BY bm25(passages) LIMIT ?",
                (query, user_id, max(limit * 4, 10)),
            ).fetchall()
        needed = 1 if len(words) <= 3 else 2
        passages = [
            Passage(text, source, score)
            for text, source, score, marked in rows
            if len({hit.lower() for hit in re.findall("\x01(.*?)\x02", marked)}) >= needed
        ]
        return passages[:limit]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def make_tool(knowledge_base: KnowledgeBase, user_id: str | None = None) -> Tool:
    """A `knowledge_base` tool searching the operator's documents and `user_id`'s notes."""

    def run(args: dict[str, Any]) -> ToolResult:
        query = required_str(args, "query")
        found = knowledge_base.search(query, user_id=user_id, limit=1)
        if not found:
            raise ToolError("nothing in the knowledge base matches the question")
        return ToolResult(text=found[0].text, source=found[0].source)

    return Tool(
        name="knowledge_base",
        description="Search the operator's local documents (opening hours, prices, policies, places) and the "
        "user's own notes; returns the best matching passage and its source file.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string", "description": "the question, in plain words"}},
            "required": ["query"],
        },
        run=run,
    )
