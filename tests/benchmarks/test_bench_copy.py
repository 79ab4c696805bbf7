"""The copy bench sorts turns by what their span held, as training lays them out, and scores the trained model's own
answers: tool answers, which the released model says, come out said; a misaligned column would score them near 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.copying import KINDS, main
from frontend_model.training.data import ABSTAIN_REPLY

pytestmark = pytest.mark.slow


def test_bench_copy_scores_every_kind_of_span_on_the_trained_model(tmp_path: Path) -> None:
    out = tmp_path / "copy.json"
    assert main(["--turns", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {row["kind"]: row for row in report["kinds"]}
    assert set(rows) == set(KINDS) and all(row["turns"] == 3 for row in rows.values())
    assert rows["tool"]["tokens_teacher_forced"] >= 0.8 and rows["tool"]["words_in_order_greedy"] >= 0.6
    assert all(e["span"] == ABSTAIN_REPLY for e in rows["abstain"]["examples"])
    assert all(e["span"] and e["greedy"] and e["sampled"] for row in rows.values() for e in row["examples"])
    assert all(0 <= row["words_in_order_sampled"] <= 1 for row in rows.values())
    assert all(0 <= row["turns_said_exactly_sampled"] <= row["turns_at_pass_recall_sampled"] for row in rows.values())
    assert report["machine"]["cpu_count"]
