"""The trainer: moshi's own `LMModel` at the tiny widths, text loss only, on the delayed stream through
`forward_text` (no depformer cost), from the random `tiny-contextspan` base weights.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from moshi.models.lm import LMModel
from moshi.modules.transformer import set_attention_context
from tqdm import tqdm

from frontend_model.loading.loader import LoadedModel
from frontend_model.span.voice_prompt import VoicePrompt
from frontend_model.training.data import (
    Assembler,
    Corpus,
    Sequence,
    batch,
    speak_and_encode,
    steady_silence,
    synthesise_corpus,
)
from frontend_model.training.recipes import AGENT_VOICE

VOICE_FRAMES = 12  # the agent voice prompt: about a second of codes
AGENT_VOICE_TEXT = "Hello, I am your assistant. Ask me about the time, dates, numbers and units."


@dataclass(frozen=True)
class TrainConfig:
    """Everything that shapes the trained weights besides the code: part of the cache key."""

    seed: int = 0
    steps: int = 1000
    batch_size: int = 16
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.0
    context: int = 96
    window: int = 128  # columns a training sequence keeps, at most
    max_gap: int = 30  # frames between `<ret>` and the span, at most (2.4 s: the server's deadline is 2.5 s)
    max_turns: int = 1
    train_questions: int = 240
    train_chatter: int = 40
    threads: int = 1

    def as_dict(self) -> dict[str, int | float]:
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


def text_loss(lm: LMModel, columns: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cross-entropy of each column's text token, predicted from the position before it."""
    _, logits = lm.forward_text(columns[:, :, :-1])
    logits = logits[:, 0].float()
    target, weight = columns[:, 0, 1:], weights[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
    return (ce.reshape(target.shape) * weight).sum() / weight.sum().clamp_min(1e-6), logits


def batch_metrics(logits: torch.Tensor, columns: torch.Tensor, weights: torch.Tensor, sequences: list[Sequence],
                  ret_id: int, loss: float) -> Metrics:
    predicted = logits.argmax(-1)  # [B, L-1]: position p predicts column p + 1
    target = columns[:, 0, 1:]
    live = weights[:, 1:] > 0
    is_ret = target == ret_id
    said_ret = predicted == ret_id
    ret_recall = (said_ret & is_ret).sum() / is_ret.sum().clamp_min(1)
    false_ret = (said_ret & ~is_ret & live).sum() / (live & ~is_ret).sum().clamp_min(1)
    hits = total = 0
    for i, s in enumerate(sequences):
        for answer in s.answer_columns:
            index = torch.tensor(answer) - 1
            hits += int((predicted[i, index] == target[i, index]).sum())
            total += len(answer)
    return Metrics(loss, float(ret_recall), float(false_ret), hits / max(total, 1))


def learning_rate_factor(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then a cosine down to a tenth of the peak at the last step."""
    warm = min(1.0, (step + 1) / config.warmup_steps)
    progress = min(1.0, step / max(1, config.steps))
    return warm * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class Trained:
    state: dict[str, torch.Tensor]
    voice_codes: torch.Tensor  # [agent codebooks, frames]: the agent voice prompt written to voices/
    metrics: dict[str, float]
    seconds: float


def train(model: LoadedModel, config: TrainConfig, progress: bool = True,
          on_step: Callable[[int, Metrics], None] | None = None) -> Trained:
    """Seeded and deterministic for a given machine and thread count; `model` is trained in place."""
    started = time.monotonic()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    lm, mimi = model.lm, model.mimi
    voice_codes = speak_and_encode(mimi, [(AGENT_VOICE_TEXT, AGENT_VOICE, 1.0)])[0].codes[:, :VOICE_FRAMES]
    corpus: Corpus = synthesise_corpus(mimi, "train", config.train_questions, config.train_chatter, config.seed)
    initial = lm._get_initial_token()[0, :, 0].cpu()
    assembler = Assembler(model.tokenizer, model.span, list(lm.delays), initial,
                          VoicePrompt("agent", codes=voice_codes), steady_silence(mimi))
    pad_column = assembler.quiet(1)[:, 0]
    params = prepare_for_training(lm, config.context)
    lm.train()
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: learning_rate_factor(s, config))
    rng = random.Random(config.seed)
    running = Metrics()
    bar = tqdm(range(1, config.steps + 1), desc="train", disable=not progress, file=sys.stderr, mininterval=2.0)
    for step in bar:
        sequences = [assembler.conversation(rng, corpus, "train", config.max_gap, rng.randint(1, config.max_turns),
                                            config.window)
                     for _ in range(config.batch_size)]
        columns, weights = batch(sequences, pad_column)
        loss, logits = text_loss(lm, columns, weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            running.update(batch_metrics(logits.detach(), columns, weights, sequences, model.span.ret_id,
                                         float(loss)), step)
        bar.set_postfix(running.postfix(), refresh=False)
        if on_step is not None:
            on_step(step, running)
    lm.eval()
    state = {k: v.detach().clone().contiguous() for k, v in lm.state_dict().items()}
    return Trained(state, voice_codes, asdict(running), time.monotonic() - started)
