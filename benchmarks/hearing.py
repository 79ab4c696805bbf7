"""`contextspan bench hear`: what a checkpoint's codec keeps of the words, on a development set (issue 35).

Why: the trained tiny model asks (`<ret>`) after nearly every statement, training ones included (`bench asks`), so
the question is whether its input can tell a statement from a question at all. The model hears the user only
through the codec's codes; a small classifier (`Probe`: an embedding of each code, a GRU, its last state) is fitted
on the codes of the recipes' training sentences, questions against statements, and scored where a model would have
to generalise: new takes of the same sentences (other voices, rates, pitches, gains and rooms) and sentences
training never spoke (the recipes' "held_out" ones). The floor is the utterance's length alone (the best threshold
on the fitted takes). The reference is what a codebook distilled from a speech encoder would give, as Mimi's
semantic codebook is from WavLM: Whisper tiny.en's encoder states (the bundled model, offline), averaged to the
codec's 12.5 Hz and quantised by k-means into one codebook of `TEACHER_CODES` (`training.codec.teacher`).
`--codec DIR` probes a codec `contextspan distil` wrote beside the checkpoint's, and each codec's cost per frame
(a session's streaming codec, one thread) is measured side by side.

Speech is served as the model hears it (`served.session`: the room, an Opus round trip, the leveller), the codec run
from the session's start, the codes of the words kept from `LEAD_FRAMES` on (2 frames of the room before them). A
development set, never the test set: its numbers are labelled so.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from moshi.models.compression import MimiModel
from torch import nn

from benchmarks.asking import take
from benchmarks.report import add_trained_checkpoint_flag, machine_info, save_json, trained_checkpoint
from frontend_model.engine.codec import FrameCodec
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.babble import babble
from frontend_model.loading.loader import load_model
from frontend_model.training.codec.distil import KEPT_BEFORE, LEAD_FRAMES, WORDS_FROM, served_session
from frontend_model.training.codec.release import load_codec
from frontend_model.training.codec.teacher import TEACHER_CODES, WhisperStates
from frontend_model.training.recipes import draw_chatter, draw_exchange
from frontend_model.training.speech import speak

DEFAULT_OUT = Path("benchmarks/results/hear-tiny-contextspan-cpu.json")
Group = Literal["fit", "new takes", "held-out sentences"]
GROUPS: tuple[Group, ...] = ("fit", "new takes", "held-out sentences")


@dataclass(frozen=True)
class Clip:
    text: str
    question: bool
    group: Group
    pcm: np.ndarray  # the session as served, at 24 kHz, from its start


def clips(fit: int, takes: int, held: int, seed: int) -> list[Clip]:
    """Per class (questions, statements): `fit` and `takes` of the training sentences, `held` of held-out ones, each in
    a take (`asking.take`: voice and gain) and a room drawn for it."""
    rng = random.Random(seed)
    out = []
    for group, count, split in (("fit", fit, "train"), ("new takes", takes, "train"),
                                ("held-out sentences", held, "held_out")):
        for question in (True, False):
            for _ in range(count):
                text = draw_exchange(rng, split).question if question else draw_chatter(rng, split)
                out.append(Clip(text, question, group, served(rng, text)))
    return out


def served(rng: random.Random, text: str) -> np.ndarray:
    voice, gain = take(rng)
    return served_session(speak(text, voice) * gain, rng)


@torch.no_grad()
def codec_codes(mimi: torch.nn.Module, clip: Clip) -> torch.Tensor:
    """[user codebooks, frames] of the words and the room around them, the codec run from the session's start."""
    codes = mimi.encode(torch.from_numpy(clip.pcm.astype(np.float32))[None, None])[0]
    return codes[:, LEAD_FRAMES - KEPT_BEFORE:]


class Probe(nn.Module):
    """Codes [batch, codebooks, frames] (left-padded with `pad`) -> the logit that they are a question's."""

    def __init__(self, codebooks: int, pad: int, width: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.ModuleList(nn.Embedding(pad + 1, width) for _ in range(codebooks))
        self.gru = nn.GRU(width, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        x = sum(embed(codes[:, k]) for k, embed in enumerate(self.embed))
        states, _ = self.gru(x)
        return self.out(states[:, -1]).squeeze(-1)


def left_padded(codes: list[torch.Tensor], pad: int) -> torch.Tensor:
    """[batch, codebooks, frames]: the ends aligned, where the probe reads its answer."""
    out = torch.full((len(codes), codes[0].shape[0], max(c.shape[1] for c in codes)), pad, dtype=torch.long)
    for i, c in enumerate(codes):
        out[i, :, out.shape[2] - c.shape[1]:] = c
    return out


def batches(n: int, size: int, rng: random.Random) -> Iterator[list[int]]:
    order = list(range(n))
    rng.shuffle(order)
    for lo in range(0, n, size):
        yield order[lo:lo + size]


def probe_accuracy(codes: list[torch.Tensor], questions: list[bool], groups: list[Group], seed: int,
                   epochs: int = 25, vocabulary: int = 2048) -> dict[str, float]:
    """Fitted on the "fit" clips, the share of each group's clips the probe puts in the right class."""
    torch.manual_seed(seed)
    probe = Probe(codes[0].shape[0], vocabulary)
    optimiser = torch.optim.Adam(probe.parameters(), lr=1e-3)
    labels = torch.tensor(questions, dtype=torch.float)
    fit = [i for i, g in enumerate(groups) if g == "fit"]
    rng = random.Random(seed)
    for _ in range(epochs):
        for picked in batches(len(fit), 32, rng):
            rows = [fit[i] for i in picked]
            loss = F.binary_cross_entropy_with_logits(probe(left_padded([codes[i] for i in rows], vocabulary)),
                                                      labels[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    scores = {}
    with torch.no_grad():
        for group in GROUPS:
            rows = [i for i, g in enumerate(groups) if g == group]
            if rows:
                guess = probe(left_padded([codes[i] for i in rows], vocabulary)) > 0
                scores[group] = round(float((guess == labels[rows].bool()).float().mean()), 3)
    return scores


def length_accuracy(lengths: list[int], questions: list[bool], groups: list[Group]) -> dict[str, float]:
    """The floor: the best length threshold on the fitted clips (longer: a question, or shorter), applied to each."""
    fit = [(n, q) for n, q, g in zip(lengths, questions, groups, strict=True) if g == "fit"]

    def accuracy(pairs: list[tuple[int, bool]], threshold: int, longer: bool) -> float:
        return statistics.fmean(((n > threshold) == longer) == q for n, q in pairs)

    threshold, longer = max(((t, side) for t in range(min(lengths), max(lengths) + 1) for side in (True, False)),
                            key=lambda choice: accuracy(fit, *choice))
    return {group: round(accuracy([(n, q) for n, q, g in zip(lengths, questions, groups, strict=True)
                                   if g == group], threshold, longer), 3)
            for group in GROUPS if group in groups}


def measure(checkpoint: Path, fit: int, takes: int, held: int, seed: int, whisper: bool,
            codec: Path | None = None) -> dict[str, object]:
    said = clips(fit, takes, held, seed)
    questions, groups = [c.question for c in said], [c.group for c in said]
    model = load_model("contextspan", str(checkpoint), device="cpu", dtype=torch.float32)
    codecs = {"the checkpoint's codec": model.mimi}
    if codec is not None:
        codecs[f"the distilled codec ({codec.name})"] = load_codec(codec)
    codes = {name: [codec_codes(mimi, c) for c in said] for name, mimi in codecs.items()}
    first = next(iter(codes.values()))
    rows = [{"input": "the utterance's length alone (the floor)",
             **length_accuracy([c.shape[1] for c in first], questions, groups)}]
    for name, coded in codes.items():
        rows += [{"input": f"{name}, all {coded[0].shape[0]} user codebooks",
                  **probe_accuracy(coded, questions, groups, seed, vocabulary=model.lm.card)},
                 {"input": f"{name}, its semantic codebook",
                  **probe_accuracy([c[:1] for c in coded], questions, groups, seed, vocabulary=model.lm.card)}]
    if whisper:
        teacher = WhisperStates()
        states = [teacher.states(c.pcm[WORDS_FROM:]) for c in said]
        teacher.fit([s for s, g in zip(states, groups, strict=True) if g == "fit"], seed)
        rows.append({"input": f"Whisper tiny.en's encoder, one k-means codebook of {TEACHER_CODES} (a reference)",
                     **probe_accuracy([teacher.codes(s)[None] for s in states], questions, groups, seed,
                                      vocabulary=TEACHER_CODES)})
    cost = {name: frame_cost(mimi) for name, mimi in codecs.items()}
    return {"clips": {group: groups.count(group) for group in GROUPS}, "rows": rows, "ms_per_frame": cost}


def frame_cost(mimi: MimiModel, frames: int = 100) -> dict[str, float]:
    """Milliseconds to encode and to decode one frame as a session's codec does (`FrameCodec`), one thread
    (medians after the first 10)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    codec = FrameCodec(mimi)
    timings: dict[str, list[float]] = {"encode": [], "decode": []}
    codec.open()
    try:
        pcm = babble(frames * FRAME_SAMPLES / SAMPLE_RATE).numpy()
        for i in range(frames):
            started = time.perf_counter()
            codes = codec.encode(pcm[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES])
            encoded = time.perf_counter()
            codec.decode(codes)
            timings["encode"].append(encoded - started)
            timings["decode"].append(time.perf_counter() - encoded)
    finally:
        codec.close()
        torch.set_num_threads(threads)
    return {what: round(1000 * statistics.median(seconds[10:]), 2) for what, seconds in timings.items()}


def table(rows: list[dict]) -> str:
    lines = ["| what the probe reads | " + " | ".join(GROUPS) + " |", "|---" * (len(GROUPS) + 1) + "|"]
    lines += [f"| {row['input']} | " + " | ".join(f"{row[g]:.0%}" if g in row else "-" for g in GROUPS) + " |"
              for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench hear", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trained_checkpoint_flag(parser)
    parser.add_argument("--fit", type=int, default=400, help="fitted clips per class")
    parser.add_argument("--takes", type=int, default=100, help="new takes of training sentences per class")
    parser.add_argument("--held", type=int, default=60, help="held-out sentences per class")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--no-whisper", action="store_true", help="skip the Whisper encoder's reference row")
    parser.add_argument("--codec", type=Path, default=None,
                        help="also probe a codec `contextspan distil` wrote (its directory)")
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    checkpoint = trained_checkpoint(args.checkpoint)
    started = time.monotonic()
    result = measure(checkpoint, args.fit, args.takes, args.held, args.seed, not args.no_whisper, args.codec)
    print(table(result["rows"]))
    for name, cost in result["ms_per_frame"].items():
        print(f"{name}: {cost['encode']} ms to encode a frame, {cost['decode']} ms to decode one (one thread)")
    save_json(args.json, {"machine": machine_info("cpu"), "set": "development (recipes' sentences, not the test set)",
                          "checkpoint": checkpoint.name, "seed": args.seed,
                          "seconds": round(time.monotonic() - started), **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
