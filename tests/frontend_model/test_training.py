"""The training data follows the sequence convention with the server's own span blocks; the same seed gives the
same data; the cache key follows every input; a short training writes a checkpoint the normal path loads, once
per key."""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import torch

from backend_agent.request import Answered, Request
from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from benchmarks.harness.testset import word_edits
from frontend_model.engine.codec import FrameCodec
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.span.build import build_prefix, build_span
from frontend_model.span.voice_prompt import VoicePrompt
from frontend_model.training import checkpoint as training_checkpoint
from frontend_model.training import command as training_command
from frontend_model.training.checkpoint import REPORT, VOICE_NAME, base_checkpoint, cache_key, trained_checkpoint
from frontend_model.training.codec.distil import CodecConfig
from frontend_model.training.data import (
    ABSTAIN_REPLY,
    LATER_LEAD,
    LEAD_FRAMES,
    PAD_WEIGHT,
    RET_OFFSETS,
    RET_WEIGHT,
    ROOM_TAKES,
    TRAINED_PERSONA,
    Assembler,
    Corpus,
    Question,
    Utterance,
    batch,
    later_in_session,
    ret_after,
    served_silence,
    speak_and_encode,
    synthesise_corpus,
)
from frontend_model.training.recipes import (
    _APP_SLOTS,
    _APP_TEMPLATES,
    _FOLLOW_UPS,
    _TEMPLATES,
    HELD_OUT_VOICES,
    TRAIN_VOICES,
    app_text,
    draw_exchange,
    draw_follow_up,
    follow_up_kinds,
)
from frontend_model.training.served import PROFILES, as_served, room
from frontend_model.training.speech import Voice
from frontend_model.training.trainer import VOICE_FRAMES, Batches, TrainConfig, learning_rate_factor, slipped
from tests.e2e.test_behaviour_e2e import APP_TEXTS


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    """The base the default recipe trains: random, hearing through the distilled codec."""
    return load_model("contextspan", str(base_checkpoint(TrainConfig())), device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def corpus(model: LoadedModel) -> Corpus:
    return synthesise_corpus(model.mimi, "train", questions=6, chatter=2, seed=0)


_ASSEMBLERS: dict[tuple[int, int], tuple[LoadedModel, VoicePrompt | None, Assembler]] = {}


def assembler(model: LoadedModel, voice: VoicePrompt | None = None) -> Assembler:
    """One per model and voice: each encodes a session track of every noise profile (seconds of Mimi), and draws
    nothing of its own (the conversation's generator does). The cache holds the model and voice, so ids stay theirs."""
    key = (id(model), id(voice))
    if key not in _ASSEMBLERS:
        _ASSEMBLERS[key] = (model, voice, Assembler.for_model(model, voice))
    return _ASSEMBLERS[key][2]


def test_a_training_turn_has_ret_after_the_question_then_the_served_span_block_then_the_answer(
    model: LoadedModel, corpus: Corpus
) -> None:
    """The block is what the server writes: a tool's answer behind the tool prefix, the abstain span, or an app's
    text as pushed (no question, no `<ret>`); the agent then says the answer (or the abstain reply), not the prefix."""
    span, contract = model.span, model.span.contract
    kinds = set()
    for seed in range(40):
        sequence = assembler(model).conversation(random.Random(seed), corpus, max_gap=8, turns=1)
        text, weights = sequence.columns[0], sequence.weights
        for ret in sequence.ret_columns:
            assert int(text[ret]) == span.ret_id and weights[ret] == RET_WEIGHT
        for answer in sequence.answer_columns:
            close = answer[0] - 1
            assert int(text[close]) == span.close_id and weights[close] == 0
            opened = int((text[:close] == span.open_id).nonzero()[-1])
            block = sequence.columns[:, opened:close + 1]
            said = model.tokenizer.decode([int(i) for i in text[list(answer)]])
            assert torch.all(weights[list(answer)] == 1.0)
            kind = "abstain" if said == ABSTAIN_REPLY else "tool" if sequence.ret_columns else "app"
            served = {"abstain": contract.abstain_text, "tool": contract.span_text(said, tool_result=True),
                      "app": said}[kind]
            kinds.add(kind)
            rebuilt = build_span(served, model.tokenizer, span, 64)
            assert rebuilt.block is not None and torch.equal(block, rebuilt.block.tokens), "the serving block"
            if kind != "app":
                assert opened > sequence.ret_columns[0], "the span arrives after <ret>"
        live = (weights > 0) & (text == span.text_pad_id)
        assert torch.all(weights[live] == PAD_WEIGHT)
    assert kinds == {"tool", "abstain", "app"}


def test_questions_put_ret_one_to_four_frames_after_their_speech_ends(model: LoadedModel, corpus: Corpus) -> None:
    rng = random.Random(0)
    assert {ret_after(rng, 40) for _ in range(200)} == {41, 42, 43, 44}
    question = corpus.questions[0].utterance
    assert question.codes.shape[1] > question.speech_frames + max(RET_OFFSETS), "the codec's decay stays with it"


def test_a_persona_prefix_carries_no_loss_and_the_voice_prompt_is_on_the_agent_rows(
    model: LoadedModel, corpus: Corpus
) -> None:
    voice = VoicePrompt("agent", codes=torch.arange(24).reshape(8, 3) + 100)
    a = assembler(model, voice)
    prefixed = [a.conversation(random.Random(seed), corpus, 8, 1) for seed in range(40)]
    # Column j + 1 reads the agent's semantic code of frame j and its acoustic codes of frame j - 1.
    with_voice = [s for s in prefixed
                  if torch.equal(s.columns[1, 1:3], voice.codes[0, 0:2]) and torch.equal(s.columns[2:9, 2],
                                                                                        voice.codes[1:, 0])]
    assert with_voice, "some conversations start with the voice prompt"
    for sequence in with_voice:
        assert torch.all(sequence.weights[:3] == 0)


def test_the_same_seed_gives_the_same_data_and_another_seed_other_data(model: LoadedModel) -> None:
    first = synthesise_corpus(model.mimi, "train", 3, 1, seed=5)
    again = synthesise_corpus(model.mimi, "train", 3, 1, seed=5)
    other = synthesise_corpus(model.mimi, "train", 3, 1, seed=6)
    assert [q.utterance.text for q in first.questions] == [q.utterance.text for q in again.questions]
    assert all(torch.equal(a.utterance.codes, b.utterance.codes)
               for a, b in zip(first.questions, again.questions, strict=True))
    assert [q.utterance.text for q in first.questions] != [q.utterance.text for q in other.questions]
    a = assembler(model)
    one = a.conversation(random.Random(1), first, 8, 1)
    two = a.conversation(random.Random(1), again, 8, 1)
    assert torch.equal(one.columns, two.columns) and torch.equal(one.weights, two.weights)


def test_held_out_questions_and_voices_are_not_the_training_ones() -> None:
    train = {draw_exchange(random.Random(i), "train").question for i in range(300)}
    held = {draw_exchange(random.Random(i), "held_out").question for i in range(300)}
    assert not train & held
    assert not set(TRAIN_VOICES) & set(HELD_OUT_VOICES)


def template_words(template: str) -> list[str]:
    return template.replace(",", "").split()


def test_no_training_sentence_is_a_held_out_one_with_one_word_changed_added_or_dropped() -> None:
    assert word_edits(template_words("so what time is it now"), template_words("what time is it right now")) == 2
    held = [template_words(t) for kind in _TEMPLATES["held_out"].values() for t in kind]
    for kind in _TEMPLATES["train"].values():
        for template in kind:
            assert min(word_edits(template_words(template), h) for h in held) >= 2, template


def instance_of(template: str, sentence: str) -> bool:
    """Whether `template` with some words of its slots is `sentence` (case aside, as app_text capitalises)."""
    def slot(match: re.Match[str]) -> str:
        return "(?:" + "|".join(map(re.escape, _APP_SLOTS[match[1].lower()])) + ")"

    pattern = re.sub(r"\\\{(\w+)\\\}", slot, re.escape(template))
    return re.fullmatch(pattern, sentence, flags=re.IGNORECASE) is not None


def test_apps_spans_are_notifications_whose_held_out_shapes_are_the_app_push_tests_sentences_only() -> None:
    assert instance_of("Your {thing} leaves at {time}.", "Your bus leaves at half past two.")
    assert not instance_of("Your {thing} leaves at {time}.", "Your bus leaves at noon.")
    train = {app_text(random.Random(i), "train") for i in range(2000)}
    assert len(train) > 1500 and not train & {app_text(random.Random(i), "held_out") for i in range(300)}
    for sentence in APP_TEXTS:
        assert [t for t in _APP_TEMPLATES["held_out"] if instance_of(t, sentence)], sentence
        assert not [t for t in _APP_TEMPLATES["train"] if instance_of(t, sentence)], sentence
    held = [template_words(t) for t in _APP_TEMPLATES["held_out"]]
    for template in _APP_TEMPLATES["train"]:
        assert min(word_edits(template_words(template), h) for h in held) >= 2, template


@pytest.mark.parametrize("split", ["train", "held_out"])
def test_the_built_in_router_answers_every_question_of_both_splits(split: str) -> None:
    router = Router(build_catalogue(clock=lambda: datetime(2026, 12, 2, 9, 30, tzinfo=UTC)))
    questions = {draw_exchange(random.Random(i), split).question for i in range(600)}
    assert len(questions) > 100
    assert not [q for q in questions if router.answer(q) is None]


def test_speech_from_two_voices_encodes_to_different_codes(model: LoadedModel) -> None:
    one, two = speak_and_encode(model.mimi, [("what time is it in Paris", Voice("en-us"), 1.0),
                                             ("what time is it in Paris", Voice("en-gb+f3", 170, 70), 1.0)])
    assert one.speech_frames > 5 and two.speech_frames > 5
    frames = min(one.codes.shape[1], two.codes.shape[1])
    assert not torch.equal(one.codes[:, :frames], two.codes[:, :frames])


def test_a_later_utterance_is_said_after_the_room_and_any_earlier_words() -> None:
    own = np.ones(30 * FRAME_SAMPLES + 5, np.float32)
    earlier = np.full(100 * FRAME_SAMPLES, 0.5, np.float32)  # longer than most leads: the lead makes room for it
    for seed in range(20):
        for before in (None, earlier):
            pcm, lead = later_in_session(random.Random(seed), own, before)
            start = (lead - LEAD_FRAMES) * FRAME_SAMPLES
            assert np.array_equal(pcm[start:], own)
            if before is None:
                assert LATER_LEAD[0] <= lead <= LATER_LEAD[1] and not pcm[:start].any()
            else:
                assert np.array_equal(pcm[:len(before)], before) and not pcm[len(before):start].any()
                assert start >= len(before) + 4 * FRAME_SAMPLES


def test_words_said_later_in_a_session_reach_the_codec_otherwise(model: LoadedModel) -> None:
    """The codec's transformer reads seconds back: the same words said into a session that has heard other words and
    the room encode to other codes, over as many frames."""
    lines = [("what time is it in Paris", Voice("en-us"), 1.0), ("I like this song a lot", Voice("en-gb"), 1.0)]
    early = speak_and_encode(model.mimi, lines, profiles=[2, 2], seed=1)
    later = speak_and_encode(model.mimi, lines, profiles=[2, 2], seed=1, later=1.0)
    for one, other in zip(early, later, strict=True):
        assert abs(one.speech_frames - other.speech_frames) <= 1
        frames = min(one.codes.shape[1], other.codes.shape[1])
        assert not torch.equal(one.codes[:, :frames], other.codes[:, :frames])


def test_utterances_come_back_in_the_order_of_their_lines_each_encoded_as_alone(model: LoadedModel) -> None:
    """Lines are encoded in order of length (short clips padded little); each still gets its own codes."""
    lines = [("could you tell me what time it is in Paris right now", Voice("en-us"), 1.0),
             ("hmm", Voice("en-gb"), 1.0), ("okay, thanks", Voice("en-us"), 1.0)]
    together = speak_and_encode(model.mimi, lines, batch_size=2, profiles=[1, 2, 3], seed=4)
    assert [u.text for u in together] == [text for text, _, _ in lines]
    assert [u.profile for u in together] == [1, 2, 3]
    assert together[0].speech_frames > together[2].speech_frames > together[1].speech_frames
    (alone,) = speak_and_encode(model.mimi, lines[:1], profiles=[1], seed=4)
    assert torch.equal(alone.codes, together[0].codes) and torch.equal(alone.after, together[0].after)


def test_batches_drawn_in_a_worker_process_are_the_batches_drawn_inline(model: LoadedModel, corpus: Corpus) -> None:
    config = TrainConfig(copy_steps=1, steps=2, batch_size=2)
    batches = Batches(assembler(model), corpus, config)

    def drawn(workers: int) -> list[tuple[torch.Tensor, ...]]:
        loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=workers)
        return [(columns, read, weights) for columns, read, weights, _ in loader]

    inline, worker = drawn(0), drawn(1)
    assert len(inline) == 3
    assert all(torch.equal(x, y) for one, other in zip(inline, worker, strict=True)
               for x, y in zip(one, other, strict=True))


def test_slips_change_only_what_the_model_reads_of_its_answers_and_only_to_tokens_of_the_same_answer(
    model: LoadedModel, corpus: Corpus
) -> None:
    sequences = [assembler(model).conversation(random.Random(seed), corpus, 8, 1) for seed in range(12)]
    columns, _ = batch(sequences, assembler(model).quiet(1)[:, 0])
    answers = [s.answer_columns for s in sequences]
    read = slipped(columns, answers, 0.5, random.Random(0))
    changed = (read != columns).nonzero().tolist()
    assert changed, "some answer tokens slip"
    for i, row, column in changed:
        answer = next(a for a in answers[i] if column in a)
        assert row == 0 and int(read[i, 0, column]) in {int(columns[i, 0, c]) for c in answer}


def test_training_copies_apps_spans_first_then_learns_the_mix_each_phase_warming_up_and_decaying(
    model: LoadedModel, corpus: Corpus
) -> None:
    config = TrainConfig(copy_steps=4, steps=4, app_share=0.0, batch_size=8, warmup_steps=2)
    drawn = list(Batches(assembler(model), corpus, config))
    ret_id = model.span.ret_id
    copying, mix = drawn[:4], drawn[4:]
    assert all(not (columns[:, 0] == ret_id).any() for columns, _, _, _ in copying), "no question while copying"
    assert all(torch.equal(columns, read) for columns, read, _, _ in copying), "no slips while copying"
    assert sum(len(said) for _, _, _, answers in copying for said in answers) > 8 * 4 * 0.6, "mostly apps' spans"
    assert any((columns[:, 0] == ret_id).any() for columns, _, _, _ in mix), "questions in the mix"
    factors = [learning_rate_factor(step, config) for step in range(8)]
    assert factors[:4] == factors[4:] and factors[0] < factors[1] > factors[2] > factors[3]


def test_the_cache_key_follows_hyper_parameters_and_seed_not_the_batch_workers() -> None:
    base = TrainConfig()
    assert cache_key(base) == cache_key(TrainConfig()) == cache_key(TrainConfig(workers=base.workers + 1))
    others = [TrainConfig(seed=1), TrainConfig(steps=base.steps + 1), TrainConfig(copy_steps=base.copy_steps + 1),
              TrainConfig(app_share=base.app_share / 2), TrainConfig(lr=base.lr / 2),
              TrainConfig(context=base.context + 1), TrainConfig(codec=None),
              TrainConfig(codec=CodecConfig(steps=1))]
    assert len({cache_key(base), *(cache_key(other) for other in others)}) == 1 + len(others)


def test_a_short_training_writes_a_context_spanning_checkpoint_loaded_once_per_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TrainConfig(copy_steps=1, steps=1, batch_size=2, train_questions=2, train_chatter=1, train_follow_ups=1,
                         context=40)
    threads = torch.get_num_threads()
    directory = trained_checkpoint(config, tmp_path, progress=False)
    assert torch.get_num_threads() == threads, "the caller's torch threads are its own again"
    loaded = load_model("contextspan", str(directory), device="cpu")
    assert loaded.layout == "contextspan" and not loaded.random_weights
    assert loaded.lm.context == 40 and VOICE_NAME in loaded.voice_prompts
    assert loaded.span.contract.persona_text(None) == TRAINED_PERSONA, "served with the persona it was trained with"
    assert (directory / REPORT).exists()
    agent = loaded.lm.n_q // 2
    assert all(float(emb.weight.detach().abs().sum()) == 0 for emb in list(loaded.lm.emb)[:agent])

    def must_not_train(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached checkpoint was trained again")

    monkeypatch.setattr(training_checkpoint, "train_into", must_not_train)
    assert trained_checkpoint(config, tmp_path, progress=False) == directory


def test_the_user_is_quiet_in_training_as_a_quiet_microphone_encodes_when_serving(model: LoadedModel) -> None:
    """Frame by frame from a session's start, through its first seconds and into a long silence: codes the model
    never saw in silence (the span placeholders, or one settled column) made it ask in silence or stop copying.
    Digital silence as served: through the client's Opus, the server's decoder and leveller, the streaming codec."""
    pcm = as_served(np.zeros(240 * FRAME_SAMPLES, np.float32))
    codec = FrameCodec(model.mimi)
    codec.open()
    try:
        served = torch.stack([codec.encode(pcm[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES]).cpu()
                              for i in range(240)], dim=1)
    finally:
        codec.close()
    a = assembler(model)
    trained = a.quiet(240)[1 + model.span.agent_codebooks:]
    # Training encodes the room at once, serving a frame at a time: float error apart, the same. Where a late residual
    # stage's two nearest codewords tie within it (1 frame of 240 here, in the last three codebooks), either may come.
    differ = trained != served
    assert not differ[0].any() and differ.float().mean() < 0.01, differ.nonzero().tolist()
    assert torch.equal(a.quiet(40, at=200)[1 + model.span.agent_codebooks:], served[:, 200:])


def test_the_train_command_trains_the_recipe_its_flags_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[TrainConfig] = []

    def cached(config: TrainConfig, cache_dir: Path | None, progress: bool) -> Path:
        asked.append(config)
        directory = tmp_path / "cached"
        directory.mkdir()
        (directory / REPORT).write_text(json.dumps({"cache_key": cache_key(config)}))
        return directory

    monkeypatch.setattr(training_command, "tiny_contextspan_checkpoint", cached)
    flags = ["--copy-steps", "4000", "--app-share", "0.12", "--slip", "0.2", "--random-codec", "--no-progress"]
    assert training_command.train_main(["--out", str(tmp_path / "out"), *flags]) == 0
    assert asked == [TrainConfig(copy_steps=4000, app_share=0.12, slip=0.2, codec=None)]
    assert json.loads((tmp_path / "out" / REPORT).read_text())["cache_key"] == cache_key(asked[0])


def test_noise_profiles_render_the_same_for_a_seed_and_each_room_differs(model: LoadedModel) -> None:
    """A room is seeded (the same codes for the same seed), its level is the profile's, and digital silence and the
    rooms reach the model as different codes: a room is levelled up as serving levels it."""
    assert PROFILES[0].rms == 0 and len({p.name for p in PROFILES}) == len(PROFILES) >= 4
    for profile in PROFILES[1:]:
        noise = room(profile, 48000, np.random.default_rng(3))
        assert np.array_equal(noise, room(profile, 48000, np.random.default_rng(3)))
        expected = np.hypot(profile.rms, profile.hum / np.sqrt(2))
        assert float(np.sqrt(np.mean(noise**2))) == pytest.approx(expected, rel=0.1)
    raw = room(PROFILES[2], 60 * FRAME_SAMPLES, np.random.default_rng(0))
    served = as_served(raw)
    assert np.sqrt(np.mean(served[-FRAME_SAMPLES * 20:] ** 2)) > 10 * np.sqrt(np.mean(raw**2)), "levelled up"
    tracks = [served_silence(model.mimi, 40, profile, seed=1) for profile in PROFILES[:3]]
    assert torch.equal(tracks[1], served_silence(model.mimi, 40, PROFILES[1], seed=1))
    assert not torch.equal(tracks[1], served_silence(model.mimi, 40, PROFILES[1], seed=2))
    assert not torch.equal(tracks[0], tracks[1]) and not torch.equal(tracks[1], tracks[2])


# A fake corpus's user codes, plus the profile: a question's, a follow-up's, chatter's, the room's after them, the
# first frame of a question (or follow-up) and of chatter.
TRACK, ASKED, FOLLOWED, SAID, AFTER, ASKS, SAYS = 1800, 1850, 1870, 1900, 1950, 1980, 1990
TAKE = 1700  # a track's second user codebook: which take of its room


def fake_corpus(model: LoadedModel, takes: int = 1) -> tuple[Assembler, Corpus]:
    """An assembler whose profiles' tracks (`takes` of each room) and a corpus whose utterances carry codes that say
    what they are."""
    user = model.lm.n_q - model.span.agent_codebooks

    def codes(value: int, frames: int) -> torch.Tensor:
        return torch.full((user, frames), value, dtype=torch.long)

    def utterance(value: int, profile: int, speech: int) -> Utterance:
        said = codes(value + profile, speech + 6)
        said[:, 0] = (SAYS if value == SAID else ASKS) + profile
        return Utterance(f"{value}", "fake", said, speech, profile, codes(AFTER + profile, 24))

    profiles = range(len(PROFILES))
    questions = tuple(Question(utterance(ASKED, p, 20 + p), kind) for p in profiles for kind in ("time", "math"))
    follow_ups = tuple(Question(utterance(FOLLOWED, p, 10), kind) for p in profiles for kind in ("time", "math"))
    chatter = tuple(utterance(SAID, p, 15) for p in profiles)
    lm = model.lm
    def take(profile: int, index: int) -> torch.Tensor:
        track = codes(TRACK + profile, 240)
        track[1] = TAKE + index
        return track

    tracks = tuple(tuple(take(p, t) for t in range(takes)) for p in profiles)
    assembler = Assembler(model.tokenizer, model.span, list(lm.delays), lm._get_initial_token()[0, :, 0].cpu(), None,
                          tracks)
    return assembler, Corpus("train", questions, chatter, follow_ups)


def test_a_conversation_is_in_one_profile_s_room_its_quiet_stretches_from_that_profile_s_track(
    model: LoadedModel
) -> None:
    assembler, corpus = fake_corpus(model)
    user = 1 + model.span.agent_codebooks  # the user's semantic row (no delay)
    seen = set()
    for seed in range(60):
        sequence = assembler.conversation(random.Random(seed), corpus, 8, 3)
        codes = {int(c) for c in sequence.columns[user]} - {model.span.sine_codes[0], assembler.initial[user]}
        profiles = {c % 10 for c in codes}
        assert len(profiles) == 1, codes
        profile = profiles.pop()
        seen.add(profile)
        assert TRACK + profile in codes
        assert codes <= {c + profile for c in (TRACK, ASKED, FOLLOWED, SAID, AFTER, ASKS, SAYS)}
    assert len(seen) >= 4


def test_a_conversation_hears_one_take_of_its_room_and_conversations_hear_every_take(model: LoadedModel) -> None:
    """A room's noise is drawn afresh: trained on one take of each room, the model learnt it by heart and asked 20-40
    times a minute in the same room drawn with another seed (`bench asks`)."""
    assembler, corpus = fake_corpus(model, takes=3)
    row = 2 + model.span.agent_codebooks  # the user's second codebook
    heard: dict[int, set[int]] = {}
    for seed in range(80):
        sequence = assembler.conversation(random.Random(seed), corpus, 8, 3)
        user = 1 + model.span.agent_codebooks
        codes = {int(c) for c in sequence.columns[user]} - {model.span.sine_codes[0], assembler.initial[user]}
        (profile,) = {c % 10 for c in codes}
        takes = {int(c) - TAKE for c in sequence.columns[row] if TAKE <= c < TAKE + 3}
        assert len(takes) == 1, takes
        heard.setdefault(profile, set()).update(takes)
    assert sum(len(takes) == 3 for takes in heard.values()) >= 3, heard


def test_a_room_has_several_takes_and_digital_silence_one(model: LoadedModel) -> None:
    tracks = assembler(model).tracks
    assert [len(takes) for takes in tracks] == [1 if p.rms <= 0 else ROOM_TAKES for p in PROFILES]
    assert all(not torch.equal(takes[0], takes[1]) for takes in tracks[1:])


def test_multi_turn_conversations_ret_after_every_question_and_never_after_chatter(model: LoadedModel) -> None:
    """Every `<ret>` is on a question's (or follow-up's) last frames; every question gets one; chatter none. Some
    conversations ask more than once, some follow up, some ask while the agent still answers."""
    assembler, corpus = fake_corpus(model)
    span = model.span
    user = 1 + span.agent_codebooks
    several = follow_up = barge_in = 0
    for seed in range(150):
        sequence = assembler.conversation(random.Random(seed), corpus, 8, 3)
        text, heard = sequence.columns[0].tolist(), [int(c) // 10 * 10 for c in sequence.columns[user]]
        questions = [i for i, h in enumerate(heard) if h == ASKS]
        assert len(sequence.ret_columns) == len(questions)
        for ret, start in zip(sequence.ret_columns, questions, strict=True):
            assert heard[ret] in (ASKED, FOLLOWED) and start < ret, "<ret> on the question's tail"
            assert SAYS not in heard[start:ret] and ASKS not in heard[start + 1:ret], "after its question, no other"
        assert not any(text[i] == span.ret_id for i, h in enumerate(heard) if h == SAID)
        several += len(questions) > 1
        follow_up += FOLLOWED in heard
        answered = {c for said in sequence.answer_columns for c in said}
        barge_in += any(heard[c] in (ASKED, FOLLOWED) for c in answered)
    assert several > 10 and follow_up > 5 and barge_in > 2, (several, follow_up, barge_in)


def test_a_window_keeps_the_persona_prefix_then_the_most_recent_frames(model: LoadedModel) -> None:
    """As a rolled window reads a long session: a window cut from the front would leave a conversation with no
    prefix, or a prefix followed at once by the middle of one, which training never showed (served, the model asked
    there)."""
    assembler, corpus = fake_corpus(model)
    window, cut, delays = 120, 0, model.lm.delays
    for seed in range(60):
        full = assembler.conversation(random.Random(seed), corpus, 8, 3)
        kept = assembler.conversation(random.Random(seed), corpus, 8, 3, window=window)
        assert kept.columns.shape[1] <= window
        prefix = int((full.weights > 0).nonzero()[0])
        if not full.ret_columns or full.columns.shape[1] <= window or prefix < 10:
            continue  # the room only (its length is drawn from the window), short, or no prefix
        cut += 1
        assert torch.equal(kept.columns[:, :prefix], full.columns[:, :prefix]), "the prefix is kept whole"
        recent = kept.columns.shape[1] - prefix
        differ = (kept.columns[:, -recent:] != full.columns[:, -recent:]).nonzero()
        # Then the most recent frames: but the first kept frame's delayed codebooks, which read the frame before it.
        assert len(set(differ[:, 1].tolist())) <= 1 and all(delays[row] > 0 for row in differ[:, 0].tolist())
        assert [r - full.columns.shape[1] for r in full.ret_columns if r >= full.columns.shape[1] - recent] == [
            r - kept.columns.shape[1] for r in kept.ret_columns]
    assert cut > 5, cut


def test_the_trained_default_persona_s_prefix_fits_well_inside_the_attention_context(model: LoadedModel) -> None:
    voice = VoicePrompt("agent", codes=torch.zeros(model.span.agent_codebooks, VOICE_FRAMES, dtype=torch.long))
    prefix = build_prefix(TRAINED_PERSONA, model.tokenizer, model.span, voice, list(model.lm.delays))
    assert prefix is not None and prefix.block.tokens.shape[1] <= 40 <= TrainConfig().context - 56
    persona = [assembler(model, voice).prefix(random.Random(seed)) for seed in range(40)]
    assert sum(p is not None and p.block.tokens.shape[1] == prefix.block.tokens.shape[1] for p in persona) > 10


def test_the_router_resolves_every_follow_up_from_the_question_answered_before_it() -> None:
    router = Router(build_catalogue(clock=lambda: datetime(2026, 12, 2, 9, 30, tzinfo=UTC)))
    rng = random.Random(0)
    for split in ("train", "held_out"):
        asked = 0
        while asked < 200:
            exchange = draw_exchange(rng, split)
            if exchange.kind not in follow_up_kinds(split):
                continue
            first = router.answer(exchange.question)
            assert first is not None
            follow = draw_follow_up(rng, split, exchange.kind)
            answered = Answered(exchange.question, first.tool, first.arguments, first.text)
            routed = router.route(Request((follow,), answered=(answered,)))
            assert routed.answer is not None and routed.answer.tool == first.tool, (exchange.question, follow)
            asked += 1
    held = [template_words(t) for kind in _FOLLOW_UPS["held_out"].values() for t in kind]
    for kind in _FOLLOW_UPS["train"].values():
        for template in kind:
            assert min(word_edits(template_words(template), h) for h in held) >= 2, template
