"""Per-checkpoint Context Span configuration: every special id and placeholder lives here, nowhere else."""

from __future__ import annotations

from dataclasses import dataclass, field

from frontend_model.span.contract import SpanContract

# Mimi codes of 80 ms of silence and of a 440 Hz sine at amplitude 0.5 for PersonaPlex-family codec weights.
PERSONAPLEX_SILENCE_CODES = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
PERSONAPLEX_SINE_CODES = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
# Silence frames after the voice prompt and after the persona text: PersonaPlex's runtime steps half a second,
# the Context Spanning model was trained with one.
PERSONAPLEX_PREFIX_SILENCE_FRAMES = 6
CONTEXT_SPANNING_PREFIX_SILENCE_FRAMES = 1
# By checkpoint file layout; Kyutai's Moshi was trained on no prefix at all, so the shorter one.
PREFIX_SILENCE_FRAMES = {"personaplex": PERSONAPLEX_PREFIX_SILENCE_FRAMES,
                         "contextspan": CONTEXT_SPANNING_PREFIX_SILENCE_FRAMES,
                         "kyutai": CONTEXT_SPANNING_PREFIX_SILENCE_FRAMES}


@dataclass(frozen=True)
class SpanConfig:
    """What the engine and the block builder must know about one checkpoint's span conventions.

    `agent_codebooks` / `user_codebooks` are the audio rows the LM reads per side (8 each for Moshi 7B);
    `dep_q` is how many rows the depformer predicts, which PersonaPlex-family checkpoints set to 16.
    `prefix_silence_frames` follow the voice prompt and the persona text in a prefix (per family); `contract` is what
    the model was trained to read in span text and a prefix (frontend_model/span/contract.py).
    """

    ret_id: int
    open_id: int
    close_id: int
    text_pad_id: int
    silence_codes: tuple[int, ...]
    sine_codes: tuple[int, ...]
    agent_codebooks: int
    user_codebooks: int
    dep_q: int
    context: int
    prefix_silence_frames: int = CONTEXT_SPANNING_PREFIX_SILENCE_FRAMES
    contract: SpanContract = field(default_factory=SpanContract)

    def __post_init__(self) -> None:
        if len(self.silence_codes) != self.agent_codebooks:
            raise ValueError(
                f"silence_codes has {len(self.silence_codes)} codes, expected {self.agent_codebooks}"
            )
        if len(self.sine_codes) != self.user_codebooks:
            raise ValueError(f"sine_codes has {len(self.sine_codes)} codes, expected {self.user_codebooks}")

    @property
    def num_rows(self) -> int:
        return 1 + self.agent_codebooks + self.user_codebooks

    @property
    def control_ids(self) -> frozenset[int]:
        return frozenset({self.ret_id, self.open_id, self.close_id, self.text_pad_id})
