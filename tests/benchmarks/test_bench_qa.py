"""`bench qa`: the reference's set formats are read, the judge is right on what it must accept and refuse, and the
whole protocol (espeak-ng -> Whisper -> backend -> judged span) runs on the project's small set with the router and
with the bundled SmolLM2 side by side. Scores are measured by the bench, not asserted, except that the questions the
built-in tools answer are answered whatever LLM is configured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import qa


def test_every_sample_file_reads_back_in_its_format(tmp_path: Path) -> None:
    paths = qa.write_sample(tmp_path)
    kinds = {}
    for path in paths:
        kind, items = qa.read_set(path)
        kinds[kind] = items
    assert set(kinds) == set(qa.KINDS)
    assert kinds["triviaqa"][0].golds == ("Mars", "Planet Mars", "mars")
    assert kinds["gsm8k"][1].golds == ("84",) and kinds["gsm8k"][1].numeric
    assert kinds["math"][1].question == "A box holds two hundred and fifty pens. What is 250 divided by 4?"
    assert kinds["halueval"][0].golds == ("George Orwell",) and kinds["webq"][0].golds == ("France",)


@pytest.mark.parametrize(("name", "kind"), [("LLaMA-Questions.jsonl", "llamaq"), ("webq_test.jsonl", "webq"),
                                            ("svamp.jsonl", "math"), ("gsm8k-test.jsonl", "gsm8k")])
def test_a_sets_kind_comes_from_its_file_name(name: str, kind: str) -> None:
    assert qa.kind_of(Path(name)) == kind


def test_a_file_of_unknown_format_or_a_bad_row_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pass --kind"):
        qa.kind_of(Path("questions.jsonl"))
    bad = tmp_path / "webq.jsonl"
    bad.write_text('{"question": "where is Rome?", "answers": ["Italy"]}\n{"text": "no question"}\n')
    with pytest.raises(ValueError, match=r"webq.jsonl:2: not a webq row"):
        qa.read_set(bad)


@pytest.mark.parametrize(("golds", "numeric", "span", "right"), [
    (("Mars",), False, "Mars is known as the Red Planet.", True),
    (("Mars",), False, "Marseille is in France.", False),
    (("eight",), False, "A spider has 8 legs.", True),
    (("George Orwell",), False, "The novel was written by George Orwell in 1949.", True),
    (("84",), True, "12 times 7 is 84.", True),
    (("84",), True, "12 times 7 is 85.", False),
    (("62.5",), True, "250 divided by 4 is 62.5.", True),
    (("180",), True, None, False),
])  # fmt: skip
def test_the_judge_finds_a_gold_answer_in_the_span_and_nothing_else(golds: tuple[str, ...], numeric: bool,
                                                                    span: str | None, right: bool) -> None:
    assert qa.judge(qa.Item("q", golds, numeric), span) is right


@pytest.mark.slow
def test_bench_qa_runs_the_sample_set_with_the_router_and_smollm2_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "qa.json"
    subprocess.run([sys.executable, "-m", "server.cli", "bench", "qa", "--sample", str(tmp_path / "sets"), "--llama",
                    "--timeout", "10", "--json", str(out)], check=True, timeout=900)
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert list(runs) == ["router", "llm smollm2"]
    for run in runs.values():
        assert set(run["sets"]) == set(qa.KINDS)
        assert all({"n", "ref", "0.8s", "1.04s"} <= set(row) for row in run["sets"].values())
    tools = ("arithmetic", "unit_conversion", "time_in_place", "date")
    by_tool = [(r, m) for r, m in zip(runs["router"]["rows"], runs["llm smollm2"]["rows"], strict=True)
               if r["tool"] in tools]
    assert len(by_tool) >= 3, "the math questions heard are answered by the arithmetic tool"
    assert all(r["span"] == m["span"] and r["right"] == m["right"] for r, m in by_tool), by_tool
