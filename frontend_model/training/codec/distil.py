"""The tiny codec's encoder taught to hear words: trained so that its semantic codebook's code of each 80 ms frame is
the teacher's (`teacher.WhisperStates`) code of the frame before, over served takes of the training sentences.

The random tiny codec's codes carry less about question-or-statement than an utterance's length (`bench hear`), so
no recipe taught the model trained on them not to ask after statements. Mimi's own semantic codebook is distilled
from a speech encoder (WavLM); this is that step, small: the student is the tiny Mimi at `filters` wide (at the
profile's 4 it learnt next to nothing in 12 minutes, at 16 a quarter of the teacher's codes in 21), its SEANet,
encoder transformer, downsampling and semantic projection trained against `TEACHER_CODES` learnt centroids, which
then become the semantic codebook. One frame late, as the codec is causal and Whisper's encoder is not. The decoder
and the acoustic codebooks stay random (re-drawn over the trained encoder's latents, as the random codec's are).
"""

from __future__ import annotations

import copy
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from moshi.models import loaders
from moshi.models.compression import MimiModel
from tqdm import tqdm

from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.profiles import TINY_MIMI_CONFIG
from frontend_model.loading.random_weights import randomise_codebooks
from frontend_model.training.codec.teacher import TEACHER_CODES, WhisperStates
from frontend_model.training.data import LEAD_FRAMES
from frontend_model.training.recipes import (
    app_text,
    draw_chatter,
    draw_exchange,
    draw_follow_up,
    draw_voice,
    follow_up_kinds,
)
from frontend_model.training.served import PROFILES, session
from frontend_model.training.speech import speak

KEPT_BEFORE = 2  # frames of that room the take keeps before its words
WORDS_FROM = (LEAD_FRAMES - KEPT_BEFORE) * FRAME_SAMPLES
TAIL_FRAMES = 4
FAR = 1e3  # where the semantic codebook's codewords beyond the student's centroids go: never the nearest


@dataclass(frozen=True)
class CodecConfig:
    """Everything that shapes the distilled codec besides the code: part of its cache key."""

    seed: int = 0
    filters: int = 16
    questions: int = 400  # served takes of each kind of training sentence
    statements: int = 400
    follow_ups: int = 100
    apps: int = 400  # app notifications, spoken: more words
    steps: int = 800
    batch_size: int = 16
    lr: float = 2e-3
    clip: float = 1.0  # the gradient's norm, at most: unclipped, one batch sent the loss from 5 to 28 at step 219
    delay: int = 1  # frames the student's code comes after the teacher's
    threads: int = 2

    def mimi_config(self) -> dict[str, Any]:
        config = copy.deepcopy(TINY_MIMI_CONFIG)
        config["seanet"]["n_filters"] = self.filters
        return config

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


@dataclass
class Distilled:
    mimi: MimiModel
    metrics: dict[str, float]
    seconds: float


def texts(config: CodecConfig, rng: random.Random) -> list[str]:
    """The training split's sentences: what the model is trained to hear."""
    kinds = follow_up_kinds("train")
    return ([draw_exchange(rng, "train").question for _ in range(config.questions)]
            + [draw_chatter(rng, "train") for _ in range(config.statements)]
            + [draw_follow_up(rng, "train", rng.choice(kinds)) for _ in range(config.follow_ups)]
            + [app_text(rng, "train") for _ in range(config.apps)])


def served_session(words: np.ndarray, rng: random.Random) -> np.ndarray:
    """`words` said `LEAD_FRAMES` into a session in a random room, as served, with `TAIL_FRAMES` of the room after."""
    frames = LEAD_FRAMES + math.ceil(len(words) / FRAME_SAMPLES) + TAIL_FRAMES
    return session(PROFILES[rng.randrange(len(PROFILES))], words, LEAD_FRAMES, frames,
                   np.random.default_rng(rng.randrange(1 << 30)))


def served_take(text: str, rng: random.Random) -> np.ndarray:
    """`text` in a training voice at a random gain, served (`served_session`), from `KEPT_BEFORE` frames before its
    words."""
    pcm = served_session(speak(text, draw_voice(rng, "train")) * rng.uniform(0.3, 1.3), rng)
    return pcm[WORDS_FROM:].astype(np.float32)


def random_student(config: CodecConfig) -> MimiModel:
    """The tiny Mimi at `config.filters` wide, seeded; the caller's RNG state is left as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        mimi = loaders.get_mimi(None, config.mimi_config(), device="cpu", num_codebooks=8)
        randomise_codebooks(mimi)
    return mimi


class Student:
    """The encoder path to the semantic codebook, and the centroids its codes are read against."""

    def __init__(self, mimi: MimiModel, generator: torch.Generator) -> None:
        self.mimi = mimi
        self.projection = mimi.quantizer.rvq_first.input_proj
        dim = mimi.quantizer.rvq_first.vq.layers[0]._codebook.dim
        self.centroids = torch.nn.Parameter(0.5 * torch.randn(TEACHER_CODES, dim, generator=generator))

    def parameters(self) -> list[torch.nn.Parameter]:
        return [*self.mimi.encoder.parameters(), *self.mimi.encoder_transformer.parameters(),
                *self.mimi.downsample.parameters(), *self.projection.parameters(), self.centroids]

    def logits(self, pcm: torch.Tensor) -> torch.Tensor:
        """[batch, samples] -> [batch, frames, codes]: minus each frame's squared distance to each centroid."""
        latent = self.projection(self.mimi._encode_to_unquantized_latent(pcm[:, None])).transpose(1, 2)
        return -(latent.pow(2).sum(-1, keepdim=True) - 2 * latent @ self.centroids.T
                 + self.centroids.pow(2).sum(-1))

    @torch.no_grad()
    def into_codec(self) -> MimiModel:
        """The semantic codebook's first codewords become the centroids, the rest go `FAR`; the acoustic codebooks
        are drawn again over the trained encoder (`randomise_codebooks`, which also re-draws the semantic stage: its
        projection and codebook are put back)."""
        self.mimi.eval()
        kept = copy.deepcopy(self.projection.state_dict())
        randomise_codebooks(self.mimi)
        self.projection.load_state_dict(kept)
        codebook = self.mimi.quantizer.rvq_first.vq.layers[0]._codebook
        codebook.embedding_sum.fill_(FAR)
        codebook.embedding_sum[:TEACHER_CODES] = self.centroids
        codebook.cluster_usage.fill_(1.0)
        codebook.register_buffer("_embedding", None, persistent=False)
        return self.mimi


def batch(pcms: list[np.ndarray], codes: list[torch.Tensor], delay: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Takes padded to the longest, and each frame's target: the teacher's code `delay` frames before (-100: none)."""
    frames = max(len(p) // FRAME_SAMPLES for p in pcms)
    pcm = torch.zeros(len(pcms), frames * FRAME_SAMPLES)
    target = torch.full((len(pcms), frames), -100, dtype=torch.long)
    for i, (p, c) in enumerate(zip(pcms, codes, strict=True)):
        n = len(p) // FRAME_SAMPLES
        pcm[i, :n * FRAME_SAMPLES] = torch.from_numpy(p[:n * FRAME_SAMPLES])
        target[i, delay:n] = c[:n - delay]
    return pcm, target


def distil(config: CodecConfig, progress: bool = True) -> Distilled:
    """Takes spoken and served, their teacher codes, the student trained `config.steps` steps. Torch threads are the
    caller's again afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _distil(config, progress)
    finally:
        torch.set_num_threads(threads)


def _distil(config: CodecConfig, progress: bool) -> Distilled:
    started = time.monotonic()
    rng = random.Random(f"codec-{config.seed}")
    said = texts(config, rng)
    teacher = WhisperStates(threads=config.threads)
    pcms, states = [], []
    for text in tqdm(said, desc="teacher", disable=not progress, file=sys.stderr, mininterval=2.0):
        pcms.append(served_take(text, rng))
        states.append(teacher.states(pcms[-1]))
    teacher.fit(states, config.seed)
    codes = [teacher.codes(s) for s in states]
    generator = torch.Generator().manual_seed(config.seed)
    student = Student(random_student(config), generator)
    optimiser = torch.optim.Adam(student.parameters(), config.lr)
    student.mimi.train()
    order: list[int] = []
    agreement = []
    bar = tqdm(range(config.steps), desc="codec", disable=not progress, file=sys.stderr, mininterval=2.0)
    for step in bar:
        if len(order) < config.batch_size:
            order += rng.sample(range(len(said)), len(said))
        picked, order = order[:config.batch_size], order[config.batch_size:]
        pcm, target = batch([pcms[i] for i in picked], [codes[i] for i in picked], config.delay)
        with torch.enable_grad():
            logits = student.logits(pcm)[:, :target.shape[1]]
            loss = F.cross_entropy(logits.reshape(-1, TEACHER_CODES), target.reshape(-1), ignore_index=-100)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), config.clip)
            optimiser.step()
        scored = target >= 0
        agreement.append(float((logits.argmax(-1) == target)[scored].float().mean()))
        if step % 20 == 19:
            bar.set_postfix(loss=f"{loss.item():.2f}", agreement=f"{sum(agreement[-20:]) / 20:.3f}")
    recent = agreement[-50:]
    metrics = {"teacher_agreement": round(sum(recent) / max(1, len(recent)), 4), "takes": len(said)}
    return Distilled(student.into_codec(), metrics, time.monotonic() - started)
