"""The decode settings chosen for Whisper (`Decoding`, `--asr-beam-size`) are the ones it decodes with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backend_agent.asr import worker_process
from backend_agent.asr.transcriber import DEFAULT_BEAM_SIZE, Decoding, WhisperTranscriber
from server.settings import ServerSettings
from tests.support.speech import speak


def test_the_transcriber_decodes_with_the_beam_size_it_was_given(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    transcriber = WhisperTranscriber(decoding=Decoding(beam_size=3))
    calls: list[dict[str, Any]] = []
    decode = transcriber.model.transcribe

    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return decode(*args, **kwargs)

    monkeypatch.setattr(transcriber.model, "transcribe", recorded)
    heard = transcriber.transcribe(speak("What time is it in Tokyo?", tmp_path / "q.wav", rate=16000))
    assert [c["beam_size"] for c in calls] == [3]
    assert "tokyo" in heard.lower()


def test_the_server_serves_the_default_beam_size_unless_told_otherwise() -> None:
    assert ServerSettings().asr_beam_size == DEFAULT_BEAM_SIZE == Decoding().beam_size
    assert ServerSettings(asr_beam_size=5).asr_beam_size == 5


def test_the_whisper_process_loads_the_beam_size_the_server_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_process, "_lower_priority", lambda: None)  # not the test process's priority
    monkeypatch.setattr(worker_process, "_transcriber", None)
    worker_process._load(None, "cpu", 4)
    assert worker_process._transcriber is not None
    assert worker_process._transcriber.decoding == Decoding(beam_size=4)
