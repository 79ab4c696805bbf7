"""Which text-stream ids are text: one answer per checkpoint, for the agent's transcript (live and offline alike)
and for the scrubber that keeps backend text from writing anything else into a span.

Not text: the span and retrieval ids and the padding id (SpanConfig), and the tokenizer's control, unknown and
byte-fallback pieces. In Kyutai's id layout that covers 0 (unknown, which Moshi also samples as its end of padding),
1 and 2 (bos, eos), 3 (padding) and the 256 byte pieces, `<ret>` and the span markers among them.
"""

from __future__ import annotations

import sentencepiece

from frontend_model.span.config import SpanConfig

WORD_START = "\u2581"


def non_text_ids(tokenizer: sentencepiece.SentencePieceProcessor, span: SpanConfig) -> frozenset[int]:
    """Every id of the vocabulary that is not text (see the module docstring)."""
    special = {
        i for i in range(tokenizer.vocab_size())
        if tokenizer.is_byte(i) or tokenizer.is_control(i) or tokenizer.is_unknown(i)
    }
    return frozenset(special | span.control_ids)


class AgentText:
    """The text pieces of the agent's text stream: what a client is sent and a transcript records."""

    def __init__(self, tokenizer: sentencepiece.SentencePieceProcessor, span: SpanConfig) -> None:
        self._tokenizer = tokenizer
        self.non_text = non_text_ids(tokenizer, span)
        self._size = tokenizer.vocab_size()

    def piece(self, token: int) -> str | None:
        """The text of `token` with word starts as spaces; None when it is no text (or past the tokenizer, which a
        text head larger than its tokenizer may sample)."""
        if token in self.non_text or not 0 <= token < self._size:
            return None
        return self._tokenizer.id_to_piece(token).replace(WORD_START, " ") or None
