"""A small SentencePiece model for the `tiny` profile, trained here so that no download is needed.

It keeps the id layout of Kyutai's 32k tokenizer that span configuration relies on: 0 unk, 1 bos, 2 eos,
3 pad, then the 256 byte-fallback pieces (so `<0x00>` is 4, `<0x08>` is 12, `<0x09>` is 13).
"""

from __future__ import annotations

import hashlib
import os
import string
import struct
import tempfile
from pathlib import Path

import sentencepiece as spm
from num2words import num2words

_SENTENCES = """\
The current time in Tokyo is a quarter past nine in the evening.
It is sunny in Paris today with a light breeze from the west.
The meeting with your team starts at ten thirty tomorrow morning.
Your flight to Berlin leaves on Monday and arrives in the afternoon.
The answer to your question is in the notes you saved last week.
According to the knowledge base, the museum opens every day except Tuesday.
The population of the city grew by twelve percent over the last decade.
The budget was four point five million dollars, more than the year before.
Hello, how can I help you? Sure, let me check that for you.
I found it. Here is what I know about that topic right now.
The train from London to Edinburgh takes about four and a half hours.
Water boils at one hundred degrees Celsius at sea level.
One mile is about one point six kilometres, and one pound is about half a kilogram.
The weather will be cloudy with a chance of rain in the evening.
Your next appointment is with the doctor on Thursday afternoon.
She said the report would be ready by the end of the month.
Please remember to call your mother on her birthday.
The restaurant is open from noon until eleven at night.
The distance between the earth and the moon is about three hundred eighty thousand kilometres.
January February March April May June July August September October November December.
Monday Tuesday Wednesday Thursday Friday Saturday Sunday.
dollars euros pounds yen cents percent degrees Fahrenheit minus plus equals point.
"""

VOCAB_SIZE = 1024


def _corpus() -> str:
    """Sentences, spelled-out numbers, and every printable ASCII character, so none needs a byte piece."""
    alphabet = " ".join(string.ascii_letters + string.digits + string.punctuation)
    numbers = [alphabet] + [num2words(i) for i in range(0, 1001)]
    years = [num2words(y, to="year") for y in range(1900, 2101)]
    ordinals = [num2words(i, to="ordinal") for i in range(1, 32)]
    return _SENTENCES + "\n".join(numbers + years + ordinals) + "\n"


def cache_root() -> Path:
    """Where generated models live: `$XDG_CACHE_HOME/contextspan`, else `~/.cache/contextspan`."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "contextspan"


def tiny_tokenizer_path(cache_dir: Path | None = None) -> Path:
    """Train once per corpus version and cache the model file: training takes about a second."""
    corpus = _corpus()
    digest = hashlib.sha256(f"{VOCAB_SIZE}\n{corpus}".encode()).hexdigest()[:16]
    base = cache_dir or cache_root()
    target = base / f"tiny_spm_{digest}.model"
    if target.exists():
        return target
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        corpus_file = Path(tmp) / "corpus.txt"
        corpus_file.write_text(corpus)
        prefix = Path(tmp) / "spm"
        spm.SentencePieceTrainer.train(
            input=str(corpus_file),
            model_prefix=str(prefix),
            vocab_size=VOCAB_SIZE,
            model_type="unigram",
            byte_fallback=True,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=3,
            hard_vocab_limit=False,
            character_coverage=1.0,
            num_threads=1,
            minloglevel=2,
        )
        os.replace(f"{prefix}.model", target)
    return target


def padded_tokenizer_path(vocab_size: int, cache_dir: Path | None = None) -> Path:
    """The tiny tokenizer with unused pieces appended up to `vocab_size`, for random models with a real-sized text
    head (Moshi 7B: 32000): every id the head can sample decodes, while encoding never yields the added pieces.

    The pieces are appended to the serialized ModelProto as more entries of its repeated `pieces` field (field 1),
    which protobuf parsing concatenates with the existing ones, so no protobuf library is needed.
    """
    source = tiny_tokenizer_path(cache_dir)
    data = source.read_bytes()
    target = source.with_name(f"{source.stem}_padded{vocab_size}.model")
    if target.exists():
        return target
    present = spm.SentencePieceProcessor(model_proto=data).vocab_size()
    if vocab_size < present:
        raise ValueError(f"the tiny tokenizer already has {present} pieces, more than {vocab_size}")
    extra = b"".join(_unused_piece(f"<unused{i}>") for i in range(present, vocab_size))
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data + extra)
    os.replace(tmp, target)
    return target


_UNUSED = 5  # ModelProto.SentencePiece.Type.UNUSED


def _unused_piece(piece: str) -> bytes:
    """One ModelProto `pieces` entry: {piece: 1 (string), score: 2 (float), type: 3 (enum)}."""
    text = piece.encode()
    inner = b"\x0a" + _varint(len(text)) + text + b"\x15" + struct.pack("<f", 0.0) + b"\x18" + _varint(_UNUSED)
    return b"\x0a" + _varint(len(inner)) + inner


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)
