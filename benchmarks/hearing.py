"""`contextspan bench hear`: what a checkpoint's codec keeps of the words, on a development set (issue 35).

Why: the trained tiny model asks (`<ret>`) after nearly every statement, training ones included (`bench asks`), so
the question is whether its input can tell a statement from a question at all. The model hears the user only
through the codec's codes; a small classifier (`Probe`: an embedding of each code, a GRU, its last state) is fitted
on the codes of the recipes' training sentences, questions against statements, and scored where a model would have
to generalise: new takes of the same sentences (other voices, rates, pitches, gains and rooms) and sentences
training never spoke (the recipes' "held_out" ones). The floor is the utterance's length alone (the best threshold
on the fitted takes). The reference is what a codebook distilled from a speech encoder would give, as Mimi's
semantic codebook is from WavLM: Whisper tiny.en's encoder states (the bundled model, offline), averaged to the
codec's 12.5 Hz and quantised by k-means into one codebook of `TEACHER_CODES`.

Speech is served as the model hears it (`served.session`: the room, an Opus round trip, the leveller), the codec run
from the session's start, the codes of the words kept from `LEAD_FRAMES` on (2 frames of the room before them). A
development set, never the test set: its numbers are labelled so.
"""

from __future__ import annotations

import argparse
import math
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
from torch import nn

from backend_agent.asr.resample import resample_24k_to_16k
from backend_agent.asr.transcriber import bundled_model_path
from benchmarks.asking import take
from benchmarks.report import add_trained_checkpoint_flag, machine_info, save_json, trained_checkpoint
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import load_model
from frontend_model.training.recipes import draw_chatter, draw_exchange
from frontend_model.training.served import PROFILES, session
from frontend_model.training.speech import speak

DEFAULT_OUT = Path("benchmarks/results/hear-tiny-contextspan-cpu.json")
LEAD_FRAMES = 10  # the room before the words, from the session's start: the leveller has settled on it
KEPT_BEFORE = 2  # frames of that room kept with the words
TAIL_FRAMES = 4
TEACHER_CODES = 256
STATES_PER_FRAME = 4  # Whisper's encoder states come at 50 Hz, the codec's frames at 12.5
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
    words = speak(text, voice) * gain
    frames = LEAD_FRAMES + math.ceil(len(words) / FRAME_SAMPLES) + TAIL_FRAMES
    profile = PROFILES[rng.randrange(len(PROFILES))]
    return session(profile, words, LEAD_FRAMES, frames, np.random.default_rng(rng.randrange(1 << 30)))


@torch.no_grad()
def codec_codes(mimi: torch.nn.Module, clip: Clip) -> torch.Tensor:
    """[user codebooks, frames] of the words and the room around them, the codec run from the session's start."""
    codes = mimi.encode(torch.from_numpy(clip.pcm.astype(np.float32))[None, None])[0]
    return codes[:, LEAD_FRAMES - KEPT_BEFORE:]


class WhisperStates:
    """Whisper tiny.en's encoder states of a clip's words, averaged to the codec's frames, and one k-means codebook
    over those of the fitted clips."""

    def __init__(self) -> None:
        import ctranslate2
        from faster_whisper import WhisperModel
        from faster_whisper.feature_extractor import FeatureExtractor

        self._storage = ctranslate2.StorageView
        self._model = WhisperModel(bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=1)
        self._features = FeatureExtractor(feature_size=80)
        self._window = self._features.nb_max_frames  # mel frames Whisper's encoder reads: 30 s
        self.centroids: torch.Tensor | None = None
        self.mean = self.std = torch.zeros(0)  # of the fitted states

    def states(self, clip: Clip) -> torch.Tensor:
        """[frames, width]: the encoder's states, averaged over each codec frame."""
        words = clip.pcm[(LEAD_FRAMES - KEPT_BEFORE) * FRAME_SAMPLES:].astype(np.float32)
        mel = self._features(resample_24k_to_16k(words))
        padded = np.zeros((mel.shape[0], self._window), np.float32)
        padded[:, :min(mel.shape[1], self._window)] = mel[:, :self._window]
        encoded = np.array(self._model.model.encode(self._storage.from_array(padded[None]), to_cpu=True))[0]
        frames = len(words) // FRAME_SAMPLES
        kept = encoded[:frames * STATES_PER_FRAME].reshape(frames, STATES_PER_FRAME, -1)
        return torch.from_numpy(kept.mean(1).astype(np.float32))

    def fit(self, states: list[torch.Tensor], seed: int, iterations: int = 20) -> None:
        x = torch.cat(states)
        self.mean, self.std = x.mean(0), x.std(0) + 1e-5
        self.centroids = kmeans((x - self.mean) / self.std, TEACHER_CODES, seed, iterations)

    def codes(self, states: torch.Tensor) -> torch.Tensor:
        assert self.centroids is not None, "fit first"
        return torch.cdist((states - self.mean) / self.std, self.centroids).argmin(1)[None]


def kmeans(x: torch.Tensor, k: int, seed: int, iterations: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(len(x), generator=generator)[:k]].clone()
    for _ in range(iterations):
        nearest = torch.cdist(x, centroids).argmin(1)
        sums = torch.zeros_like(centroids).index_add_(0, nearest, x)
        counts = torch.bincount(nearest, minlength=len(centroids))[:, None]
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1), centroids)
    return centroids


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


def measure(checkpoint: Path, fit: int, takes: int, held: int, seed: int, whisper: bool) -> dict[str, object]:
    said = clips(fit, takes, held, seed)
    questions, groups = [c.question for c in said], [c.group for c in said]
    model = load_model("contextspan", str(checkpoint), device="cpu", dtype=torch.float32)
    codes = [codec_codes(model.mimi, c) for c in said]
    vocabulary = model.lm.card
    rows = [{"input": "the utterance's length alone (the floor)",
             **length_accuracy([c.shape[1] for c in codes], questions, groups)},
            {"input": f"the codec's codes, all {codes[0].shape[0]} user codebooks",
             **probe_accuracy(codes, questions, groups, seed, vocabulary=vocabulary)},
            {"input": "the codec's semantic codebook",
             **probe_accuracy([c[:1] for c in codes], questions, groups, seed, vocabulary=vocabulary)}]
    if whisper:
        teacher = WhisperStates()
        states = [teacher.states(c) for c in said]
        teacher.fit([s for s, g in zip(states, groups, strict=True) if g == "fit"], seed)
        rows.append({"input": f"Whisper tiny.en's encoder, one k-means codebook of {TEACHER_CODES} (a reference)",
                     **probe_accuracy([teacher.codes(s) for s in states], questions, groups, seed,
                                      vocabulary=TEACHER_CODES)})
    return {"clips": {group: groups.count(group) for group in GROUPS}, "rows": rows}


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
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    checkpoint = trained_checkpoint(args.checkpoint)
    started = time.monotonic()
    result = measure(checkpoint, args.fit, args.takes, args.held, args.seed, not args.no_whisper)
    print(table(result["rows"]))
    save_json(args.json, {"machine": machine_info("cpu"), "set": "development (recipes' sentences, not the test set)",
                          "checkpoint": checkpoint.name, "seed": args.seed,
                          "seconds": round(time.monotonic() - started), **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
