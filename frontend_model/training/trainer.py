"""The trainer: moshi's own `LMModel` at the tiny widths, text loss only, on the delayed stream through
`forward_text` (no depformer cost), from the random `tiny-contextspan` base weights, hearing the user through the
codec distilled from Whisper (`checkpoint.base_checkpoint`).

The tiny model learns the text stream only. Its agent audio rows carry the convention's codes in the data, but
their input embeddings are held at zero: at serving time they hold what the untrained depformer samples, which
must not steer the text. The attention context is short (`context` frames), as the conversations are, so that a
long session, where the KV ring wraps, reads windows like the ones trained on.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from moshi.models.lm import LMModel
from moshi.modules.transformer import set_attention_context
from tqdm import tqdm

from frontend_model.loading.loader import LoadedModel
from frontend_model.span.voice_prompt import VoicePrompt
from frontend_model.training.codec.distil import CodecConfig
from frontend_model.training.data import (
    ALL_APPS,
    APP_SHARE,
    Assembler,
    Corpus,
    batch,
    speak_and_encode,
    synthesise_corpus,
)
from frontend_model.training.recipes import AGENT_VOICE

VOICE_FRAMES = 8  # the agent voice prompt: 0.64 s of codes (the whole prefix must fit the attention context)
AGENT_VOICE_TEXT = "Hello, I am your assistant. Ask me about the time, dates, numbers and units."


@dataclass(frozen=True)
class Phase:
    """A stretch of training with its own data mix; the learning rate warms up and decays again in each."""

    steps: int
    app_share: float  # turns where an app pushes a span (no question, no `<ret>`)
    slip: float


@dataclass(frozen=True)
class TrainConfig:
    """Everything that shapes the trained weights besides the code: part of the cache key."""

    seed: int = 0
    # Steps of copying only, before the mix: every turn that is not a long silence is an app's span, with no slips.
    # Apps' spans of notification shapes need none: 4000 of them and a mix of 4000 left 70 % of an app's words said
    # (sampled), as a mix of 6000 alone does; while apps' spans were words in no order, they lifted that from 10 % to
    # 57 % (benchmarks/README.md).
    copy_steps: int = 0
    steps: int = 6000  # the mix: questions, apps, chatter, silences
    app_share: float = APP_SHARE
    batch_size: int = 16
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.0
    context: int = 96
    # Columns a training sequence keeps, at most. Serving reads every column through two layers of `context` frames
    # each: 192 is what a column reads at most. A window cut mid-prefix reads truncated ones (with the 294-frame
    # reference persona, cut at 128, `<ret>` after it was 0.57 likely teacher-forced on the window and 0.19 on the
    # whole conversation, as served); the trained persona's prefix is 38 frames.
    window: int = 192
    max_gap: int = 30  # frames between `<ret>` and the span, at most (2.4 s: the server's deadline is 2.5 s)
    max_turns: int = 3  # turns a conversation has, at most: follow-ups, questions while the agent answers
    train_questions: int = 1500  # distinct spoken questions: with a few hundred, `<ret>` learns them by heart
    train_chatter: int = 900  # statements drawn from templates (`statements`): 44 sentences were learnt by heart
    train_follow_ups: int = 300
    slip: float = 0.1  # share of the agent's own answer tokens replaced in its input by another of the span's
    # The codec the model hears the user through: distilled from Whisper's encoder (`training.codec`), or (None) the
    # tiny profile's random one, whose codes carry less about question-or-statement than the utterance's length.
    codec: CodecConfig | None = field(default_factory=CodecConfig)
    threads: int = 1
    workers: int = 1  # processes assembling batches beside the training (0: inline; the batches are the same)

    def phases(self) -> tuple[Phase, ...]:
        drawn = (Phase(self.copy_steps, ALL_APPS, 0.0), Phase(self.steps, self.app_share, self.slip))
        return tuple(phase for phase in drawn if phase.steps > 0)

    @property
    def total_steps(self) -> int:
        return sum(phase.steps for phase in self.phases())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Metrics:
    """Running averages over recent steps, teacher-forced on the training batches (argmax)."""

    loss: float = 0.0
    ret_recall: float = 0.0  # `<ret>` predicted where the data has it
    false_ret: float = 0.0  # `<ret>` predicted per live frame where the data has none
    copy: float = 0.0  # answer tokens predicted after the span

    def update(self, other: Metrics, step: int, decay: float = 0.95) -> None:
        keep = decay if step > 1 else 0.0
        for name in ("loss", "ret_recall", "false_ret", "copy"):
            setattr(self, name, keep * getattr(self, name) + (1 - keep) * getattr(other, name))

    def postfix(self) -> dict[str, str]:
        return {"loss": f"{self.loss:.3f}", "ret": f"{self.ret_recall:.2f}", "false_ret": f"{self.false_ret:.4f}",
                "copy": f"{self.copy:.2f}"}


def prepare_for_training(lm: LMModel, context: int) -> list[torch.nn.Parameter]:
    """Attention limited to `context` frames, agent audio embeddings at zero and frozen; returns what trains."""
    set_attention_context(lm.transformer, context)
    lm.context = context
    agent = lm.dep_q if lm.dep_q <= lm.n_q // 2 else lm.n_q // 2
    for emb in list(lm.emb)[:agent]:
        emb.weight.data.zero_()
        emb.weight.requires_grad_(False)
    trained = []
    for name, param in lm.named_parameters():
        keep = not name.startswith(("depformer", "linears")) and param.requires_grad
        param.requires_grad_(keep)
        if keep:
            trained.append(param)
    return trained


def text_loss(lm: LMModel, columns: torch.Tensor, weights: torch.Tensor,
              read: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cross-entropy of each column's text token, predicted from the position before it, the model reading
    `read` (default: the columns themselves)."""
    _, logits = lm.forward_text((columns if read is None else read)[:, :, :-1])
    logits = logits[:, 0].float()
    target, weight = columns[:, 0, 1:], weights[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
    return (ce.reshape(target.shape) * weight).sum() / weight.sum().clamp_min(1e-6), logits


class Batches(torch.utils.data.IterableDataset):
    """The training batches, drawn from one seeded generator in order: in a worker process, on the second core,
    they are the batches an inline loop draws."""

    def __init__(self, assembler: Assembler, corpus: Corpus, config: TrainConfig) -> None:
        super().__init__()
        self.assembler, self.corpus, self.config = assembler, corpus, config

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[tuple[int, ...], ...]]]]:
        """(columns, the columns the model reads, weights, answer columns) per step."""
        config = self.config
        rng = random.Random(config.seed)
        pad_column = self.assembler.quiet(1)[:, 0]
        for phase in config.phases():
            for _ in range(phase.steps):
                sequences = [self.assembler.conversation(rng, self.corpus, config.max_gap,
                                                         rng.randint(1, config.max_turns), config.window,
                                                         phase.app_share)
                             for _ in range(config.batch_size)]
                columns, weights = batch(sequences, pad_column)
                answers = [s.answer_columns for s in sequences]
                yield columns, slipped(columns, answers, phase.slip, rng), weights, answers


def slipped(columns: torch.Tensor, answers: list[tuple[tuple[int, ...], ...]], share: float,
            rng: random.Random) -> torch.Tensor:
    """The columns with some of the agent's answer tokens swapped for another token of the same answer, in what the
    model reads only (its targets stay right). Sampling slips when it serves, and a model that copies by the last
    token it said then loses its place for the rest of the answer; trained on slips, it copies by position."""
    read = columns.clone()
    for i, said in enumerate(answers):
        for answer in said:
            tokens = [int(columns[i, 0, c]) for c in answer]
            for c in answer:
                if rng.random() < share:
                    read[i, 0, c] = rng.choice(tokens)
    return read


def batch_metrics(logits: torch.Tensor, columns: torch.Tensor, weights: torch.Tensor,
                  answers: list[tuple[tuple[int, ...], ...]], ret_id: int, loss: float) -> Metrics:
    predicted = logits.argmax(-1)  # [B, L-1]: position p predicts column p + 1
    target = columns[:, 0, 1:]
    live = weights[:, 1:] > 0
    is_ret = target == ret_id
    said_ret = predicted == ret_id
    ret_recall = (said_ret & is_ret).sum() / is_ret.sum().clamp_min(1)
    false_ret = (said_ret & ~is_ret & live).sum() / (live & ~is_ret).sum().clamp_min(1)
    hits = total = 0
    for i, said in enumerate(answers):
        for answer in said:
            index = torch.tensor(answer) - 1
            hits += int((predicted[i, index] == target[i, index]).sum())
            total += len(answer)
    return Metrics(loss, float(ret_recall), float(false_ret), hits / max(total, 1))


def learning_rate_factor(step: int, config: TrainConfig) -> float:
    """In each phase, a linear warm-up, then a cosine down to a tenth of the peak at the phase's last step."""
    phases = config.phases()
    for phase in phases[:-1]:
        if step < phase.steps:
            break
        step -= phase.steps
    else:
        phase = phases[-1]
    warm = min(1.0, (step + 1) / config.warmup_steps)
    progress = min(1.0, step / max(1, phase.steps))
    return warm * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class Trained:
    state: dict[str, torch.Tensor]
    voice_codes: torch.Tensor  # [agent codebooks, frames]: the agent voice prompt written to voices/
    metrics: dict[str, float]
    seconds: float


def train(model: LoadedModel, config: TrainConfig, progress: bool = True,
          on_step: Callable[[int, Metrics], None] | None = None) -> Trained:
    """Seeded and deterministic for a given machine and thread count; `model` is trained in place. The process's
    torch threads are the caller's again afterwards (a server that trains on its first start serves with its own)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(model, config, progress, on_step)
    finally:
        torch.set_num_threads(threads)


def _train(model: LoadedModel, config: TrainConfig, progress: bool,
           on_step: Callable[[int, Metrics], None] | None) -> Trained:
    started = time.monotonic()
    torch.manual_seed(config.seed)
    lm, mimi = model.lm, model.mimi
    torch.set_num_threads(config.threads + config.workers)  # the cores the training takes, idle until it starts
    voice_codes = speak_and_encode(mimi, [(AGENT_VOICE_TEXT, AGENT_VOICE, 1.0)])[0].codes[:, :VOICE_FRAMES]
    corpus: Corpus = synthesise_corpus(mimi, "train", config.train_questions, config.train_chatter, config.seed,
                                       config.train_follow_ups)
    torch.set_num_threads(config.threads)
    assembler = Assembler.for_model(model, VoicePrompt("agent", codes=voice_codes))
    params = prepare_for_training(lm, config.context)
    lm.train()
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: learning_rate_factor(s, config))
    running = Metrics()
    batches = torch.utils.data.DataLoader(Batches(assembler, corpus, config), batch_size=None,
                                          num_workers=config.workers)
    bar = tqdm(batches, total=config.total_steps, desc="train", disable=not progress, file=sys.stderr, mininterval=2.0)
    for step, (columns, read, weights, answers) in enumerate(bar, start=1):
        loss, logits = text_loss(lm, columns, weights, read)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            running.update(batch_metrics(logits.detach(), columns, weights, answers, model.span.ret_id,
                                         float(loss)), step)
        bar.set_postfix(running.postfix(), refresh=False)
        if on_step is not None:
            on_step(step, running)
    lm.eval()
    state = {k: v.detach().clone().contiguous() for k, v in lm.state_dict().items()}
    return Trained(state, voice_codes, asdict(running), time.monotonic() - started)
