"""`contextspan.json` next to the weights: the span conventions of a checkpoint, where they differ from the defaults.

`{"ret_id": 4, "open_id": 12, "close_id": 13, "silence_codes": [8 ints], "sine_codes": [8 ints]}`, every key
optional. Older Context Spanning checkpoints used 12 for both open and close; checkpoints with their own codec
weights (the tiny ones) give the placeholder codes of that codec. The span contract of the layout
(frontend_model/span/contract.py) may be changed too: `tool_prefix`, `abstain_text` ("" for none), `max_words`,
`default_persona`, `default_voice`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from frontend_model.loading.checkpoint.errors import ModelLoadError
from frontend_model.loading.checkpoint.files import read_json
from frontend_model.span.contract import SpanContract


class SpanOverrides(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ret_id: int = Field(4, ge=0)
    open_id: int = Field(12, ge=0)
    close_id: int = Field(13, ge=0)
    silence_codes: tuple[int, ...] | None = None
    sine_codes: tuple[int, ...] | None = None
    tool_prefix: str | None = None
    abstain_text: str | None = None
    max_words: int | None = Field(None, ge=1)
    default_persona: str | None = None
    default_voice: str | None = None

    def contract(self, layout: SpanContract) -> SpanContract:
        """The layout's contract with what this file changes."""
        keys = ("tool_prefix", "abstain_text", "max_words", "default_persona", "default_voice")
        return replace(layout, **{key: getattr(self, key) for key in keys if key in self.model_fields_set})


def read_overrides(path: Path | None) -> SpanOverrides:
    if path is None:
        return SpanOverrides()
    try:
        return SpanOverrides.model_validate(read_json(path))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ModelLoadError(f"{path}: {problems}") from exc
