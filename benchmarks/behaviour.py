"""`contextspan bench behaviour`: what the trained tiny Context Spanning model does on a real server, by behaviour.

A server runs `--profile contextspan --checkpoint DIR` (the tiny model trained by `contextspan train`, from the
cache), trigger `auto` (-> `ret`), the real Whisper and the built-in router, no forcing hook, the server's default
span deadline and question wait. Sets of spoken questions stream in over the real WebSocket + Opus path:

- the test set (`benchmarks/harness/testset.py`, scored by `benchmarks/behaviour_testset.py`): frozen, never used to
  choose a recipe; conversations of several questions with follow-ups, phrasings and voices training never used;
- the development set: the recipes' held-out questions (sentences and a voice training never used), one a session;
  recipes were chosen while looking at it, so it flatters;
- development conversations (`--set conversations`, `benchmarks/development_conversations.py`): the test set's shape
  (a question, its follow-up, another) in the recipes' held-out phrasings, to choose recipes on what the test set
  measures, `<ret>` by a question's place in its conversation;
- a long call (`--set long`, `benchmarks/behaviour_long.py`): the development set's questions every few seconds in
  one session of minutes, past many windows of the model's context, and the server's RSS across it.

Per question: did the model emit `<ret>` itself, which span went in, and how many of the span's words the agent's text
then said in order; times from the end of the question to `<ret>`, to the span injected, to the first answer word
(stream time, 80 ms a frame). Also: `<ret>` per minute in silence or room noise and in chatter that asks nothing.
Runs with one-pass and chunked span prefill, one session at a time and two at once (a batch of 2).

What it proves: the mechanism, end to end, on a model that learnt the convention. What it does not: the speech
quality of the real 7B model (the tiny model's voice is its untrained depformer's noise).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from backend_agent.asr.resample import resample_24k_to_16k
from backend_agent.asr.transcriber import WhisperTranscriber
from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from benchmarks.behaviour_long import long_table, run_long
from benchmarks.behaviour_scoring import LEAD_S, SERVER_FLAGS, Turn, answered, score, stream_when_free
from benchmarks.behaviour_testset import TURN_GAP_S, run_testset, testset_table, whisper_wer
from benchmarks.development_conversations import development_conversations
from benchmarks.harness import start_server, stop_server
from benchmarks.harness.testset import load_testset
from benchmarks.report import add_trained_checkpoint_flag, machine_info, save_json, trained_checkpoint
from contextspan_client import chat_url
from frontend_model.frame import FRAME_S, SAMPLE_RATE
from frontend_model.training.recipes import HELD_OUT_VOICES, draw_exchange
from frontend_model.training.speech import Voice, speak
from frontend_model.training.statements import draw_statement

DEFAULT_OUT = Path("benchmarks/results/behaviour-tiny-contextspan-cpu.json")


def held_out_questions(count: int, seed: int = 7) -> list[str]:
    """Distinct held-out questions (never trained on), in a fixed order."""
    rng = random.Random(seed)
    questions: list[str] = []
    while len(questions) < count:
        question = draw_exchange(rng, "held_out").question
        if question not in questions:
            questions.append(question)
    return questions


def audible_questions(count: int, voice: Voice, seed: int = 7, heard: dict[str, str] | None = None) -> list[str]:
    """Held-out questions, in the fixed order, that Whisper (the server's ASR, on the clean speech) hears as a question
    the built-in router answers as it answers the question itself. The bench scores every question; a test that must
    see the speech model use a span asks these, so that its outcome is the speech model's, not the ASR's misses
    (Whisper tiny.en mishears about a third of the held-out voice's questions: "what is your game" for "what is
    today's date"). Each synthesis differs a little (sox dithers), so a question on the edge is heard one way or the
    other: `heard`, if given, gets what Whisper made of each question picked."""
    transcriber = WhisperTranscriber()
    router = Router(build_catalogue(clock=lambda: datetime(2026, 12, 2, 9, 30, tzinfo=UTC)))
    found: list[str] = []
    asked = 0
    while len(found) < count:
        asked += count
        for question in held_out_questions(asked, seed)[asked - count:]:
            transcript = transcriber.transcribe(resample_24k_to_16k(speak(question, voice)))
            answer, expected = router.answer(transcript), router.answer(question)
            if answer is not None and expected is not None and answer.text == expected.text and len(found) < count:
                found.append(question)
                if heard is not None:
                    heard[question] = transcript
    return found


def held_out_voice(index: int = 0) -> Voice:
    return Voice(HELD_OUT_VOICES[index % len(HELD_OUT_VOICES)], 160, 55)


def question_audio(text: str, voice: Voice, lead_s: float = LEAD_S) -> tuple[np.ndarray, float]:
    """`lead_s` of silence, the question, a little silence; and when the question's speech ends (seconds of stream
    time)."""
    speech = speak(text, voice)
    pcm = np.concatenate([np.zeros(int(lead_s * SAMPLE_RATE), np.float32), speech,
                          np.zeros(int(0.5 * SAMPLE_RATE), np.float32)])
    return pcm, lead_s + len(speech) / SAMPLE_RATE


async def ask(ws: str, questions: Sequence[str], voice: Voice, spans: Sequence[tuple[float, str]] = (),
              lead_s: float = LEAD_S) -> list[Turn]:
    """Each question in its own session, `lead_s` into it, all at once (a batch of len(questions))."""
    audio = [question_audio(q, voice, lead_s) for q in questions]
    results = await asyncio.gather(*[
        stream_when_free(chat_url(ws, events=True), pcm, until=answered(end), until_timeout_s=60.0, texts=spans)
        for pcm, end in audio])
    return [score(q, end, r) for q, (_, end), r in zip(questions, audio, results, strict=True)]


async def false_triggers(ws: str, silence_s: float, chatter: Sequence[str], voice: Voice) -> dict[str, Any]:
    """`<ret>` in a stretch of silence, and in statements that ask nothing, each followed by 3 s of silence."""
    quiet = await stream_when_free(chat_url(ws, events=True), np.zeros(int(silence_s * SAMPLE_RATE), np.float32))
    gap = np.zeros(3 * SAMPLE_RATE, np.float32)
    talk = np.concatenate([part for line in chatter for part in (speak(line, voice), gap)])
    chat = await stream_when_free(chat_url(ws, events=True), talk)
    talk_s = len(talk) / SAMPLE_RATE
    return {"silence_s": silence_s, "silence_rets": len(quiet.of_type("retrieval")),
            "chatter_s": round(talk_s, 1), "chatter_lines": len(chatter),
            "chatter_rets": len(chat.of_type("retrieval")),
            "chatter_rets_per_min": round(len(chat.of_type("retrieval")) * 60 / talk_s, 2)}


def summary(turns: Sequence[Turn]) -> dict[str, Any]:
    def median(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 1) if present else None

    injected = [t for t in turns if t.span]
    return {
        "questions": len(turns),
        "ret_recall": round(sum(t.asked for t in turns) / len(turns), 3),
        "spans_injected": len(injected),
        "span_word_recall_in_order": round(sum(t.recall for t in injected) / len(injected), 3) if injected else 0.0,
        "median_question_end_to_ret_ms": median([t.ret_ms for t in turns]),
        "median_ret_to_span_ms": median([t.span_ms for t in turns]),
        "median_span_to_first_word_ms": median([t.first_word_ms for t in turns]),
    }


def run_config(checkpoint: Path, prefill: str, batch: int, questions: list[str], voice: Voice,
               silence_s: float, lead_s: float = LEAD_S) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        process, http = start_server(Path(tmp), "--profile", "contextspan", "--checkpoint", str(checkpoint),
                                     "--max-sessions", str(max(batch, 1)), "--span-prefill", prefill, *SERVER_FLAGS)
        ws = "ws" + http.removeprefix("http")
        try:
            turns: list[Turn] = []
            for lo in range(0, len(questions), batch):
                turns += asyncio.run(ask(ws, questions[lo:lo + batch], voice, lead_s=lead_s))
            quiet = asyncio.run(false_triggers(ws, silence_s, [draw_statement(random.Random(i), "held_out")
                                                               for i in range(5)], voice)) if silence_s else {}
        finally:
            stop_server(process)
    return {"prefill": prefill, "batch": batch, "lead_s": lead_s, **summary(turns), **quiet,
            "turns": [asdict(t) for t in turns]}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| prefill | sessions | question at s | `<ret>` recall | span words in order | end of question -> `<ret>` "
             "ms | `<ret>` -> span ms | span -> first word ms | `<ret>` in silence | `<ret>`/min in chatter |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['prefill']} | {r['batch']} | {r.get('lead_s', LEAD_S)} | {r['ret_recall']:.0%} | "
                     f"{r['span_word_recall_in_order']:.0%} "
                     f"| {r['median_question_end_to_ret_ms']} | {r['median_ret_to_span_ms']} | "
                     f"{r['median_span_to_first_word_ms']} | {r.get('silence_rets', '-')} in "
                     f"{r.get('silence_s', '-')} s | {r.get('chatter_rets_per_min', '-')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench behaviour", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trained_checkpoint_flag(parser)
    parser.add_argument("--set", nargs="+", choices=["test", "development", "conversations", "long"],
                        default=["test", "development"],
                        help="the frozen test set (conversations, unseen voices), the development set (the recipes' "
                        "held-out questions, one a session), development conversations (the test set's shape, the "
                        "recipes' held-out phrasings), a long call (those questions throughout one session)")
    parser.add_argument("--long-s", type=float, default=600.0, help="long call: its length")
    parser.add_argument("--every-s", type=float, default=10.0, help="long call: a question this often")
    parser.add_argument("--questions", type=int, default=20, help="development set: how many")
    parser.add_argument("--silence-s", type=float, default=60.0, help="development set: silence for false <ret>")
    parser.add_argument("--lead-s", type=float, default=LEAD_S,
                        help="development set: silence before each session's question (a question asked seconds "
                        "into a session reaches a codec that has heard those seconds)")
    parser.add_argument("--prefill", nargs="+", default=["one-pass", "chunked"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--span-deadline-s", type=float, default=None,
                        help="test set and long call: over the server's default (to see the model apart from a slow "
                        "host's Whisper; the issue's numbers take the default)")
    parser.add_argument("--question-wait-s", type=float, default=None,
                        help="test set and long call: over the server's default")
    parser.add_argument("--turn-gap-s", type=float, default=TURN_GAP_S, help="test set: silence after each question")
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    checkpoint = trained_checkpoint(args.checkpoint)
    started = time.monotonic()
    report: dict[str, Any] = {"machine": machine_info("cpu"), "checkpoint": checkpoint.name, "frame_s": FRAME_S}
    serve_with = [f"--{name.replace('_', '-')}={value}" for name, value in
                  (("span_deadline_s", args.span_deadline_s), ("question_wait_s", args.question_wait_s))
                  if value is not None]
    if "test" in args.set:
        testset = load_testset()
        report["test_whisper"] = whisper_wer(testset)
        print(f"test set: Whisper tiny.en word error {report['test_whisper']['wer']}", flush=True)
        rows = []
        for prefill in args.prefill:
            for batch in args.batch:
                # Chatter and room noise once per prefill, alone: they do not depend on the batch.
                rows.append(run_testset(checkpoint, prefill, batch, testset.conversations,
                                        testset if batch == args.batch[0] else None, serve_with, args.turn_gap_s))
                print(testset_table(rows[-1:]).splitlines()[-1], flush=True)
        print("test set\n" + testset_table(rows))
        report["test"] = rows
    if "conversations" in args.set:
        conversations = development_conversations()
        rows = [run_testset(checkpoint, prefill, batch, conversations, None, serve_with, args.turn_gap_s,
                            label="development conversations")
                for prefill in args.prefill for batch in args.batch]
        print("development conversations\n" + testset_table(rows))
        report["conversations"] = rows
    if "development" in args.set:
        questions = held_out_questions(args.questions)
        rows = []
        for prefill in args.prefill:
            for batch in args.batch:
                rows.append(run_config(checkpoint, prefill, batch, questions, held_out_voice(),
                                       args.silence_s if batch == args.batch[0] else 0.0, args.lead_s))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
        print("development set\n" + table(rows))
        report["development"] = rows
    if "long" in args.set:
        row = run_long(checkpoint, args.long_s, args.every_s, held_out_questions(args.questions), held_out_voice(),
                       serve_with)
        print("long call (development-set questions)\n" + long_table([row]))
        report["long"] = row
    report["seconds"] = round(time.monotonic() - started)
    save_json(args.json, report)
    return 0
