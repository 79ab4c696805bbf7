"""`contextspan ask` and `contextspan infer` as an operator runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE
from tests.support.speech import silence, speak


def contextspan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], capture_output=True, text=True, check=True,
                          cwd=cwd, timeout=300, env={"NO_TORCH_COMPILE": "1", "PATH": "/usr/bin:/bin",
                                                      "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def test_ask_answers_a_time_question_with_the_time_there(tmp_path: Path) -> None:
    before = datetime.now(ZoneInfo("Asia/Tokyo"))
    out = json.loads(contextspan("ask", "What time is it in Tokyo?", cwd=tmp_path).stdout)
    after = datetime.now(ZoneInfo("Asia/Tokyo"))
    span = out["span"]
    assert span["tool"] == "time_in_place" and span["source"] == "zoneinfo:Asia/Tokyo"
    shown = {t.strftime("%-I:%M %p") for t in (before, after, before + timedelta(minutes=1))}
    assert any(s in span["text"] for s in shown), (span["text"], shown)
    assert not any(c.isdigit() for c in span["normalised"])


def test_ask_says_no_span_for_what_no_tool_answers(tmp_path: Path) -> None:
    out = json.loads(contextspan("ask", "Tell me a joke.", cwd=tmp_path).stdout)
    assert out["span"] is None and "no built-in tool" in out["reason"]


def write_wav(path: Path, pcm: np.ndarray) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes((pcm * 32767).astype("<i2").tobytes())


@pytest.mark.slow
def test_infer_writes_a_recording_and_span_events(tmp_path: Path) -> None:
    speech = np.concatenate([silence(0.3), speak("What is twelve times seven?", tmp_path / "q.wav")])
    # 20 s after the question: room for a slow, loaded host's Whisper and agent before the input ends (12 s once
    # was not).
    pcm = np.concatenate([speech, silence(20.0)])
    source = tmp_path / "in.wav"
    write_wav(source, pcm)
    ret = len(speech) // FRAME_SAMPLES + 10
    out, events = tmp_path / "out.wav", tmp_path / "events.json"
    done = contextspan("infer", str(source), "--out", str(out), "--events", str(events), "--ret-frames", str(ret),
                       "--realtime", "--span-cap", "fixed", "--span-deadline-s", "30", "--question-wait-s", "5",
                       cwd=tmp_path)
    assert "1 span(s) injected, 0 dropped" in done.stdout
    frames = len(pcm) // FRAME_SAMPLES
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getframerate()) == (2, SAMPLE_RATE)
        assert w.getnframes() >= frames * FRAME_SAMPLES  # and silence after, while a later <ret> was answered
    recorded = json.loads(events.read_text())
    kinds = [e["type"] for e in recorded]
    assert "retrieval" in kinds and "question" in kinds and "agent.text" in kinds
    span = next(e for e in recorded if e["type"] == "span.injected")
    assert span["tool"] == "arithmetic" and "eighty-four" in span["text"]
    assert span["offset_after"] - span["offset_before"] == span["frames"]


@pytest.mark.slow
def test_infer_waits_on_the_line_for_the_answer_to_a_question_at_the_end_of_the_input(tmp_path: Path) -> None:
    """Flat out, the input's last frames are stepped long before Whisper and the agent answer: infer paces the frames
    from the `<ret>` and steps silence after the input until the answer is in and said, as a caller waiting would."""
    pcm = np.concatenate([silence(0.3), speak("What is twelve times seven?", tmp_path / "q.wav"), silence(0.5)])
    source = tmp_path / "in.wav"
    write_wav(source, pcm)
    events, out = tmp_path / "events.json", tmp_path / "out.wav"
    ret = len(pcm) // FRAME_SAMPLES - 2
    done = contextspan("infer", str(source), "--out", str(out), "--events", str(events), "--ret-frames", str(ret),
                       "--span-cap", "fixed", "--span-deadline-s", "60", "--question-wait-s", "5", cwd=tmp_path)
    assert "1 span(s) injected, 0 dropped" in done.stdout and "silence after the input" in done.stdout
    span = next(e for e in json.loads(events.read_text()) if e["type"] == "span.injected")
    assert span["tool"] == "arithmetic" and "eighty-four" in span["text"]
    with wave.open(str(out)) as w:  # the input, the wait, then six seconds for the model to say it
        assert w.getnframes() >= (len(pcm) // FRAME_SAMPLES + 6 / FRAME_S) * FRAME_SAMPLES


@pytest.mark.slow
def test_infer_reports_a_retrieval_whose_answer_did_not_come_within_the_deadline(tmp_path: Path) -> None:
    """The wait after the input ends at the span deadline: the retrieval is reported as dropped, not lost."""
    pcm = np.concatenate([silence(0.3), speak("What is twelve times seven?", tmp_path / "q.wav"), silence(0.5)])
    source = tmp_path / "in.wav"
    write_wav(source, pcm)
    events = tmp_path / "events.json"
    ret = len(pcm) // FRAME_SAMPLES - 2
    done = contextspan("infer", str(source), "--out", str(tmp_path / "out.wav"), "--events", str(events),
                       "--ret-frames", str(ret), "--span-deadline-s", "0.2", "--question-wait-s", "1", cwd=tmp_path)
    assert "0 span(s) injected, 1 dropped" in done.stdout
    dropped = [e for e in json.loads(events.read_text()) if e["type"] == "span.dropped"]
    assert len(dropped) == 1 and dropped[0]["reason"] in ("input ended before the span could be injected", "late")
