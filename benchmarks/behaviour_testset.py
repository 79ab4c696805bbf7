"""`bench behaviour` on the frozen test set (`benchmarks/harness/testset.py`): conversations of several questions,
follow-ups among them, in voices training never heard, served with the server's default span deadline and question
wait. Per question: `<ret>`, whether the span was a tool's answer or the abstain span, whether the tool answered the
question as written (Whisper may have misheard it), and whether the answer was said exactly; why each miss missed;
`<ret>` per minute in chatter and in room noise; Whisper's word error on the questions."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from backend_agent.asr.resample import resample_24k_to_16k
from backend_agent.asr.transcriber import Decoding, WhisperTranscriber
from backend_agent.request import Answered, Request
from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from backend_agent.tools.numbers import replace_number_words
from benchmarks.behaviour_scoring import LEAD_S, SERVER_FLAGS, Turn, answered, score, stream_when_free, words
from benchmarks.harness import start_server, stop_server
from benchmarks.harness.testset import Conversation, FrozenTestSet, room_noise, say, word_edits
from contextspan_client import chat_url
from frontend_model.frame import SAMPLE_RATE

# Silence after each question of a conversation: the end of the utterance heard (0.6 s of silence), the span
# deadline (2.5 s, from that end) at the most, then the answer (about 3 s).
TURN_GAP_S = 7.0
CHATTER_GAP_S = 3.0


@dataclass(frozen=True)
class SetTurn:
    """One question of a conversation and what became of it."""

    conversation: str
    voice: str
    intent: str
    follow_up: bool
    turn: Turn
    misheard: bool  # the router's answer to what the server heard is not its answer to the question as written

    @property
    def outcome(self) -> str:
        """"answered" (a tool's answer to the question as written, said exactly), else why not."""
        t = self.turn
        if not t.asked:
            return "no <ret>"
        if not t.span:
            return "span dropped" if t.dropped else "no span"
        if self.misheard:
            return "misheard"
        return "answered" if t.said_exactly else "said wrong"


def conversation_audio(conversation: Conversation,
                       gap_s: float = TURN_GAP_S) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """The conversation's audio: each question then `gap_s` of silence; each question's (start, end) in seconds."""
    parts = [np.zeros(int(LEAD_S * SAMPLE_RATE), np.float32)]
    spans = []
    t = LEAD_S
    for question in conversation.questions:
        speech = say(question.text, conversation.voice)
        spans.append((t, t + len(speech) / SAMPLE_RATE))
        parts += [speech, np.zeros(int(gap_s * SAMPLE_RATE), np.float32)]
        t += len(speech) / SAMPLE_RATE + gap_s
    return np.concatenate(parts), spans


def routed(router: Router, text: str, history: tuple[Answered, ...]) -> Answered | None:
    answer = router.route(Request((text,), answered=history)).answer
    return Answered(text, answer.tool, answer.arguments, answer.text) if answer else None


def misheard(want: Answered | None, got: Answered | None) -> bool:
    """Whether the router's answer to what was heard (`got`) is not its answer to what was said (`want`): compared by
    the answer, not the arguments ("liters" and "litres" are one conversion), so both are routed at one instant."""
    return got is None or want is None or (got.tool, got.text) != (want.tool, want.text)


def heard_as_written(conversation: Conversation, transcriber: WhisperTranscriber) -> bool:
    """Whether Whisper, on each question's clean speech, hears what the router answers as it answers the question as
    written (a follow-up from the answers before it). A test that must see the speech model use a span asks such
    conversations, as `audible_questions` picks single questions, so that its outcome is the speech model's, not the
    ASR's (Whisper tiny.en mishears "which day is it tomorrow?" in flite's voice as "which is it tomorrow?")."""
    now = datetime.now(UTC)
    router = Router(build_catalogue(clock=lambda: now))
    history: tuple[Answered, ...] = ()
    for question in conversation.questions:
        want = routed(router, question.text, history)
        heard = transcriber.transcribe(resample_24k_to_16k(say(question.text, conversation.voice)))
        if want is None or misheard(want, routed(router, heard, history)):
            return False
        history += (want,)
    return True


async def converse(ws: str, conversation: Conversation, gap_s: float = TURN_GAP_S) -> list[SetTurn]:
    """One session asks the conversation's questions in turn, `gap_s` apart; each is scored from its own `<ret>`."""
    pcm, spans = conversation_audio(conversation, gap_s)
    last_start, last_end = spans[-1]
    result = await stream_when_free(chat_url(ws, events=True), pcm, until=answered(last_end, last_start),
                                    until_timeout_s=60.0)
    now = datetime.now(UTC)  # one instant for both answers: they are compared by their text
    router = Router(build_catalogue(clock=lambda: now))
    written: tuple[Answered, ...] = ()
    heard: tuple[Answered, ...] = ()
    turns = []
    for i, (question, (start, end)) in enumerate(zip(conversation.questions, spans, strict=True)):
        until = spans[i + 1][0] if i + 1 < len(spans) else float("inf")
        turn = score(question.text, end, result, start, until)
        want = routed(router, question.text, written)
        got = routed(router, turn.heard, heard) if turn.heard else None
        turns.append(SetTurn(conversation.id, conversation.voice.label(), question.intent, question.follow_up, turn,
                             misheard(want, got)))
        written += (want,) if want else ()
        heard += (got,) if got else ()
    return turns


async def false_asks(ws: str, testset: FrozenTestSet) -> dict[str, Any]:
    """`<ret>` per minute in the chatter (each line in the next voice, then silence) and in the room noise."""
    gap = np.zeros(int(CHATTER_GAP_S * SAMPLE_RATE), np.float32)
    voices = testset.voices
    talk = np.concatenate([part for i, line in enumerate(testset.chatter)
                           for part in (say(line, voices[i % len(voices)]), gap)])
    chat = await stream_when_free(chat_url(ws, events=True), talk)
    noise = room_noise(testset.noise)
    room = await stream_when_free(chat_url(ws, events=True), noise)
    talk_s, noise_s = len(talk) / SAMPLE_RATE, len(noise) / SAMPLE_RATE
    return {"chatter_s": round(talk_s, 1), "chatter_rets": len(chat.of_type("retrieval")),
            "chatter_rets_per_min": round(len(chat.of_type("retrieval")) * 60 / talk_s, 2),
            "noise_s": round(noise_s, 1), "noise_rets": len(room.of_type("retrieval")),
            "noise_rets_per_min": round(len(room.of_type("retrieval")) * 60 / noise_s, 2)}


def share(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def testset_summary(turns: Sequence[SetTurn]) -> dict[str, Any]:
    """The issue's measures: `<ret>` recall, tool answers said exactly, follow-ups answered, abstains apart."""
    tool = [t for t in turns if t.turn.span and not t.turn.abstained]
    abstain = [t for t in turns if t.turn.abstained]
    follow = [t for t in turns if t.follow_up]
    rets = [t.turn.ret_ms for t in turns if t.turn.ret_ms is not None]
    return {
        "questions": len(turns),
        "ret_recall": share(sum(t.turn.asked for t in turns), len(turns)),
        "tool_spans": len(tool),
        "tool_answer_said_exactly": share(sum(t.turn.said_exactly for t in tool), len(tool)),
        "abstain_spans": len(abstain),
        "abstain_said": share(sum(t.turn.said_exactly for t in abstain), len(abstain)),
        "answered": share(sum(t.outcome == "answered" for t in turns), len(turns)),
        "follow_ups": len(follow),
        "follow_up_ret_recall": share(sum(t.turn.asked for t in follow), len(follow)),
        "follow_ups_answered": share(sum(t.outcome == "answered" for t in follow), len(follow)),
        "outcomes": dict(Counter(t.outcome for t in turns)),
        "heard_wer": wer(*zip(*[(t.turn.question, t.turn.heard) for t in turns if t.turn.heard], strict=True))
        if any(t.turn.heard for t in turns) else None,
        "median_question_end_to_ret_ms": round(statistics.median(rets), 1) if rets else None,
        "ret_recall_by_position": by_position(turns),
    }


def by_position(turns: Sequence[SetTurn]) -> list[float | None]:
    """`<ret>` recall of each conversation's first question, second, ...: later ones are a model's weak spot."""
    positions: list[list[bool]] = []
    seen: Counter[str] = Counter()
    for t in turns:
        at = seen[t.conversation]
        seen[t.conversation] += 1
        positions += [[] for _ in range(at + 1 - len(positions))]
        positions[at].append(t.turn.asked)
    return [share(sum(asked), len(asked)) for asked in positions]


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float | None:
    """Word error rate over the pairs: word edits over reference words, numbers as digits on both sides."""
    def spoken(text: str) -> list[str]:
        return replace_number_words(" ".join(words(text))).split()

    pairs = [(spoken(r), spoken(h)) for r, h in zip(references, hypotheses, strict=True)]
    total = sum(len(r) for r, _ in pairs)
    return round(sum(word_edits(r, h) for r, h in pairs) / total, 3) if total else None


def whisper_wer(testset: FrozenTestSet, decoding: Decoding | None = None) -> dict[str, Any]:
    """Whisper (the server's, bundled tiny.en, decoding as served unless `decoding` says) on every question as the
    server's ASR gets it: the voice's speech, resampled to 16 kHz; each question's transcript, and the word error over
    them all."""
    transcriber = WhisperTranscriber(decoding=decoding)
    rows = [{"conversation": c.id, "question": q.text,
             "heard": transcriber.transcribe(resample_24k_to_16k(say(q.text, c.voice)))}
            for c in testset.conversations for q in c.questions]
    return {"wer": wer([r["question"] for r in rows], [r["heard"] for r in rows]), "rows": rows}


def run_testset(checkpoint: Path, prefill: str, batch: int, conversations: Sequence[Conversation],
                false_asks_in: FrozenTestSet | None = None, serve_with: Sequence[str] = (),
                gap_s: float = TURN_GAP_S, label: str = "test") -> dict[str, Any]:
    """One server, default settings but for `serve_with`: the conversations `batch` at a time, then (given a set in
    `false_asks_in`) its chatter and noise."""
    with tempfile.TemporaryDirectory() as tmp:
        process, http = start_server(Path(tmp), "--profile", "contextspan", "--checkpoint", str(checkpoint),
                                     "--max-sessions", str(batch), "--span-prefill", prefill, *SERVER_FLAGS,
                                     *serve_with)
        ws = "ws" + http.removeprefix("http")
        try:
            turns: list[SetTurn] = []
            for lo in range(0, len(conversations), batch):
                async def some(part: Sequence[Conversation] = conversations[lo:lo + batch]) -> list[list[SetTurn]]:
                    return await asyncio.gather(*[converse(ws, c, gap_s) for c in part])

                turns += [t for group in asyncio.run(some()) for t in group]
            quiet = asyncio.run(false_asks(ws, false_asks_in)) if false_asks_in else {}
        finally:
            stop_server(process)
    return {"set": label, "prefill": prefill, "batch": batch, "serve_with": list(serve_with), "turn_gap_s": gap_s,
            **testset_summary(turns), **quiet,
            "turns": [{**asdict(t), "outcome": t.outcome} for t in turns]}


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def testset_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| prefill | sessions | `<ret>` recall | tool answer said exactly | answered right | follow-ups answered "
             "| abstain spans (said) | misses: no `<ret>` / dropped / misheard / said wrong | heard WER "
             "| `<ret>`/min chatter | `<ret>`/min room noise | `<ret>` by question of a conversation |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o = r["outcomes"]
        lines.append(
            f"| {r['prefill']} | {r['batch']} | {percent(r['ret_recall'])} | {percent(r['tool_answer_said_exactly'])} "
            f"of {r['tool_spans']} | {percent(r['answered'])} of {r['questions']} | {percent(r['follow_ups_answered'])}"
            f" of {r['follow_ups']} | {r['abstain_spans']} ({percent(r['abstain_said'])}) | {o.get('no <ret>', 0)} / "
            f"{o.get('span dropped', 0) + o.get('no span', 0)} / {o.get('misheard', 0)} / {o.get('said wrong', 0)} | "
            f"{r['heard_wer']} | {r.get('chatter_rets_per_min', '-')} | {r.get('noise_rets_per_min', '-')} | "
            f"{', '.join(percent(p) for p in r.get('ret_recall_by_position', []))} |")
    return "\n".join(lines)
