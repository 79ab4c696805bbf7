"""`contextspan.json` next to the weights: the span conventions of a checkpoint, where they differ from the defaults.

`{"ret_id": 4, "open_id": 12, "close_id": 13, "silence_codes": [8 ints], "sine_codes": [8 ints]}`, every key
optional. Older Context Spanning checkpoints used 12 for both open and close; checkpoints with their own codec
weights (the tiny ones) give the placeholder codes of that codec.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from frontend_model.loading.checkpoint.errors import ModelLoadError
from frontend_model.loading.checkpoint.files import read_json


class SpanOverrides(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ret_id: int = Field(4, ge=0)
    open_id: int = Field(12, ge=0)
    close_id: int = Field(13, ge=0)
    silence_codes: tuple[int, ...] | None = None
    sine_codes: tuple[int, ...] | None = None


def read_overrides(path: Path | None) -> SpanOverrides:
    if path is None:
        return SpanOverrides()
    try:
        return SpanOverrides.model_validate(read_json(path))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ModelLoadError(f"{path}: {problems}") from exc
