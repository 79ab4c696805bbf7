"""The span contract per layout: what span text and a prefix look like for the model each checkpoint was trained as."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from frontend_model.loading.checkpoint.errors import ModelLoadError
from frontend_model.loading.checkpoint.files import OWN_CONFIG
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.loading.tiny_files import write_tiny_checkpoint
from frontend_model.span.build import build_prefix, build_span
from frontend_model.span.contract import (
    ABSTAIN_TEXT,
    CONTEXT_SPANNING_PERSONA,
    CONTRACTS,
    TOOL_RESULT_PREFIX,
    SpanContract,
)

CONTEXT_SPANNING = CONTRACTS["contextspan"]


@pytest.fixture(scope="module")
def contextspan() -> LoadedModel:
    return load_model("tiny-contextspan", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def personaplex() -> LoadedModel:
    return load_model("tiny-personaplex", device="cpu", dtype=torch.float32)


def test_a_tool_answer_reads_behind_the_tool_result_prefix_only_for_context_spanning() -> None:
    assert TOOL_RESULT_PREFIX == "(tool result) "
    assert CONTEXT_SPANNING.span_text("It is nine.", tool_result=True) == "(tool result) It is nine."
    assert CONTEXT_SPANNING.span_text("Paris is in France.", tool_result=False) == "Paris is in France."
    for layout in ("kyutai", "personaplex"):
        assert CONTRACTS[layout].span_text("It is nine.", tool_result=True) == "It is nine."


def test_only_context_spanning_has_an_abstain_span() -> None:
    assert CONTEXT_SPANNING.abstain_text == ABSTAIN_TEXT == "(no information found)"
    assert CONTRACTS["kyutai"].abstain_text == CONTRACTS["personaplex"].abstain_text == ""


def test_the_context_spanning_persona_defaults_to_its_training_persona_and_names_the_user() -> None:
    assert CONTEXT_SPANNING.persona_text(None) == CONTEXT_SPANNING_PERSONA
    assert CONTEXT_SPANNING.persona_text(None, "Ada", "Lisbon") == (
        f"{CONTEXT_SPANNING_PERSONA} The user's name is Ada. The user is in Lisbon.")
    assert CONTEXT_SPANNING.persona_text("You are Bo, a chef.", None, " Lisbon ") == (
        "You are Bo, a chef. The user is in Lisbon.")
    assert CONTEXT_SPANNING.persona_text("", "Ada", "") == "The user's name is Ada."


def test_other_layouts_keep_the_persona_asked_for_and_no_user_sentences() -> None:
    for layout in ("kyutai", "personaplex"):
        assert CONTRACTS[layout].persona_text(None, "Ada", "Lisbon") == ""
        assert CONTRACTS[layout].persona_text("Be kind.", "Ada", "Lisbon") == "Be kind."


def test_the_default_voice_is_one_of_the_checkpoints_own_in_its_layouts_format(
        contextspan: LoadedModel, personaplex: LoadedModel) -> None:
    assert sorted(contextspan.voice_prompts) == ["tiny-codes", "tiny-embeddings"]
    assert contextspan.span.contract.voice_name(None, contextspan.voice_prompts) == "tiny-codes"
    assert personaplex.span.contract.voice_name(None, personaplex.voice_prompts) == "tiny-embeddings"
    assert contextspan.span.contract.voice_name("tiny-embeddings", contextspan.voice_prompts) == "tiny-embeddings"
    assert CONTRACTS["kyutai"].voice_name(None, contextspan.voice_prompts) is None
    assert CONTEXT_SPANNING.voice_name(None, {}) is None


def test_contextspan_json_changes_the_contract_of_its_checkpoint(tmp_path: Path) -> None:
    checkpoint = write_tiny_checkpoint("contextspan", tmp_path / "c")
    own = json.loads((checkpoint / OWN_CONFIG).read_text())
    changes = {"tool_prefix": "[tool] ", "abstain_text": "", "max_words": 12, "default_persona": "You are Bo.",
               "default_voice": "tiny-embeddings"}
    (checkpoint / OWN_CONFIG).write_text(json.dumps({**own, **changes}))
    model = load_model("contextspan", str(checkpoint), device="cpu")
    assert model.span.contract == dataclasses.replace(CONTEXT_SPANNING, **changes)
    assert model.span.contract.voice_name(None, model.voice_prompts) == "tiny-embeddings"
    (checkpoint / OWN_CONFIG).write_text(json.dumps({**own, "max_words": 0}))
    with pytest.raises(ModelLoadError, match="max_words"):
        load_model("contextspan", str(checkpoint), device="cpu")


def test_a_tool_answer_is_cut_to_forty_words_not_counting_the_prefix(contextspan: LoadedModel) -> None:
    words = [f"word{chr(97 + i % 26)}" for i in range(60)]
    text = CONTEXT_SPANNING.span_text(" ".join(words), tool_result=True)
    built = build_span(text, contextspan.tokenizer, contextspan.span, max_frames=2000)
    assert built.truncated and built.text == f"(tool result) {' '.join(words[:40])}"
    assert built.dropped_text.split() == words[40:]
    short = build_span(CONTEXT_SPANNING.span_text(" ".join(words[:40]), tool_result=True), contextspan.tokenizer,
                       contextspan.span, max_frames=2000)
    assert not short.truncated and short.text == f"(tool result) {' '.join(words[:40])}"


def test_other_layouts_do_not_cut_by_words(personaplex: LoadedModel) -> None:
    text = " ".join(f"word{chr(97 + i % 26)}" for i in range(60))
    built = build_span(text, personaplex.tokenizer, personaplex.span, max_frames=2000)
    assert not built.truncated and built.text == text


def text_row(model: LoadedModel, system_text: str, always: bool) -> list[int]:
    span = dataclasses.replace(model.span, contract=SpanContract(prefix_silences_always=always))
    prefix = build_prefix(system_text, model.tokenizer, span)
    assert prefix is not None
    tokens = prefix.block.tokens
    assert (tokens[1: 1 + span.agent_codebooks] == torch.tensor(span.silence_codes)[:, None]).all()
    assert (tokens[1 + span.agent_codebooks:] == torch.tensor(span.sine_codes)[:, None]).all()
    return tokens[0].tolist()


def test_the_familys_silences_run_with_no_voice_and_no_text(personaplex: LoadedModel) -> None:
    span = personaplex.span
    assert span.contract.prefix_silences_always and span.prefix_silence_frames == 6
    assert text_row(personaplex, "", always=True) == [span.text_pad_id] * 12
    system = personaplex.tokenizer.encode("<system> Be kind. <system>")
    assert text_row(personaplex, "Be kind.", always=True) == [span.text_pad_id] * 6 + system + [span.text_pad_id] * 6
    assert text_row(personaplex, "Be kind.", always=False) == system + [span.text_pad_id] * 6


def test_a_moshi_checkpoint_with_no_persona_and_no_voice_has_no_prefix(personaplex: LoadedModel) -> None:
    span = dataclasses.replace(personaplex.span, contract=CONTRACTS["kyutai"])
    assert build_prefix("", personaplex.tokenizer, span) is None


def test_context_spanning_runs_one_silence_frame_each_side(contextspan: LoadedModel) -> None:
    span = contextspan.span
    voice = contextspan.voice_prompts["tiny-codes"]
    prefix = build_prefix("", contextspan.tokenizer, span, voice, contextspan.lm.delays)
    assert prefix is not None and span.prefix_silence_frames == 1
    assert prefix.block.tokens[0].tolist() == [span.text_pad_id] * (voice.frames + 2)
    assert (prefix.block.tokens[1: 1 + span.agent_codebooks, : voice.frames] == voice.codes).all()
