"""The spoken set of `contextspan bench retrieval --spoken`: questions as ASR delivers them, per tool.

Each item is said by espeak-ng twice, bare and wrapped in greetings, fillers, thanks or a second sentence, as a user
says it to a model that emits `<ret>` mid-conversation; Whisper (the bundled tiny.en) transcribes it, the agent
answers it, and the answer counts when the expected tool gave it and its text holds the expected part. Accuracy is
reported per tool, for the bare and the wrapped forms, so that what the wrapping costs shows.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend_agent.agent import Agent
from backend_agent.asr.resample import resample_24k_to_16k
from backend_agent.asr.transcriber import WhisperTranscriber
from backend_agent.llm_client import ChatClient
from backend_agent.tools import build_catalogue
from backend_agent.tools.knowledge_base import KnowledgeBase
from contextspan_client import load_wav

MUSEUM = ("# City Museum\n\nThe City Museum opens at 9 am and closes at 5 pm from Tuesday to Sunday. "
          "It is closed on Mondays.")
PARKING = "Parking near the museum costs 3 euros per hour."
WORDS_PER_MINUTE = 150  # as the tests' speech: espeak-ng's default 175 loses tiny.en a word in four here


@dataclass(frozen=True)
class Item:
    tool: str
    bare: str
    wrapped: str
    expect: str  # in the answer's text, or its source for the knowledge base


ITEMS = [
    Item("time_in_place", "What time is it in Tokyo?",
         "Hello there, what time is it in Tokyo right now? Thank you.", "in Tokyo"),
    Item("time_in_place", "What's the time in New York?", "Hi. Um, what's the time in New York? Thanks.",
         "in New York"),
    Item("time_in_place", "What time is it in London?",
         "Okay, quick question. What time is it in London at the moment?", "in London"),
    Item("time_in_place", "What time is it in Sydney?",
         "I'm calling my sister later. Could you tell me what time it is in Sydney?", "in Sydney"),
    Item("date", "What day is it today?", "Hey, quick question, what day is it today?", "Today is"),
    Item("date", "What's the date tomorrow?", "I'm flying out soon. What's the date tomorrow? Thanks a lot.",
         "Tomorrow is"),
    Item("date", "What is today's date?", "Hello. What is today's date? Thanks.", "Today is"),
    Item("date", "What day is it tomorrow?", "Good morning! So, what day is it tomorrow? Thank you so much.",
         "Tomorrow is"),
    Item("arithmetic", "What is twelve times seven?", "Hello there, what is twelve times seven? Thank you.",
         "is 84"),
    Item("arithmetic", "What is fifteen percent of eighty?",
         "Hi, can you tell me what is fifteen percent of eighty?", "is 12"),
    Item("arithmetic", "What is two hundred divided by four?",
         "So I was doing my taxes. What is two hundred divided by four? Thanks.", "is 50"),
    Item("arithmetic", "What is nine plus ten?", "Okay. What is nine plus ten? Thank you.", "is 19"),
    Item("unit_conversion", "How many kilometres are in ten miles?",
         "Hey there! How many kilometres are in ten miles? That's all.", "16.0934 kilometres"),
    Item("unit_conversion", "Convert five feet to inches.",
         "Good afternoon, please convert five feet to inches. Thank you.", "60 inches"),
    Item("unit_conversion", "How many grams are in two pounds?",
         "I'm baking a cake. How many grams are in two pounds? Cheers.", "907.185 grams"),
    Item("unit_conversion", "How many feet are in three metres?",
         "Hello. How many feet are in three metres? Thanks.", "9.84252 feet"),
    Item("knowledge_base", "When does the museum open?", "Hello there, when does the museum open? Thank you.",
         "museum.md"),
    Item("knowledge_base", "Is the museum open on Mondays?", "Hi. Quick question. Is the museum open on Mondays?",
         "museum.md"),
    Item("knowledge_base", "How much does parking cost near the museum?",
         "We are visiting tomorrow. Do you know how much parking costs near the museum? Thanks.", "parking.txt"),
    Item("knowledge_base", "What time does the museum close?",
         "Good morning. What time does the museum close? Thank you.", "museum.md"),
]
FORMS = ("bare", "wrapped")


def hear(transcriber: WhisperTranscriber, text: str, wav: Path) -> str:
    """espeak-ng says `text` -> 24 kHz -> 16 kHz -> Whisper: what the backend hears of it."""
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(WORDS_PER_MINUTE), "-w", str(wav), text], check=True)
    return transcriber.transcribe(resample_24k_to_16k(load_wav(str(wav))))


def transcribe_all(transcriber: WhisperTranscriber, tmp: Path) -> list[dict[str, str]]:
    """Each form of each item, heard."""
    return [{form: hear(transcriber, getattr(item, form), tmp / f"s{i}-{form}.wav") for form in FORMS}
            for i, item in enumerate(ITEMS)]


def agent(llm: ChatClient | None) -> Agent:
    knowledge = KnowledgeBase()
    knowledge.add_document("museum.md", MUSEUM)
    knowledge.add_document("parking.txt", PARKING)
    return Agent(build_catalogue(knowledge=knowledge), llm)


def said() -> list[dict[str, str]]:
    """The text as written, for the same scoring without ASR: what is lost to Whisper and what to the wrapping."""
    return [{form: getattr(item, form) for form in FORMS} for item in ITEMS]


def score(heard: list[dict[str, str]], llm: ChatClient | None, timeout_s: float) -> dict[str, Any]:
    """Ask the agent every transcript; accuracy per tool and form, and every row for the record."""
    answerer = agent(llm)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(FORMS, 0))
    rows = []

    async def run() -> None:
        for item, transcripts in zip(ITEMS, heard, strict=True):
            for form in FORMS:
                started = time.perf_counter()
                result = await answerer.answer(transcripts[form], "", timeout_s)
                answer = result.answer
                found = answer.source if item.tool == "knowledge_base" and answer else answer.text if answer else ""
                right = answer is not None and answer.tool == item.tool and item.expect in found
                counts[item.tool][form] += right
                rows.append({"tool": item.tool, "form": form, "said": getattr(item, form),
                             "heard": transcripts[form], "answer_tool": answer.tool if answer else None,
                             "answer": answer.text if answer else None, "reason": result.reason, "right": right,
                             "ms": round((time.perf_counter() - started) * 1e3, 1)})
        if llm is not None:
            await llm.aclose()

    asyncio.run(run())
    per_tool = {tool: {form: f"{n}/{sum(i.tool == tool for i in ITEMS)}" for form, n in forms.items()}
                for tool, forms in counts.items()}
    total = {form: f"{sum(c[form] for c in counts.values())}/{len(ITEMS)}" for form in FORMS}
    return {"accuracy": per_tool, "total": total, "rows": rows}


def print_accuracy(name: str, result: dict[str, Any]) -> None:
    print(f"\n{name}: spoken questions answered right (bare / wrapped)")
    for tool, forms in result["accuracy"].items():
        print(f"{tool:<16} {forms['bare']:>5} / {forms['wrapped']}")
    print(f"{'total':<16} {result['total']['bare']:>5} / {result['total']['wrapped']}")
    for row in result["rows"]:
        if not row["right"]:
            print(f"  wrong: {row['form']} {row['heard']!r} -> {row['answer_tool']}: {row['answer'] or row['reason']}")
