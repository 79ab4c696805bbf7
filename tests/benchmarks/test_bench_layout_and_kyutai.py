"""`bench layout` writes the Context Spanning layout at Moshi 7B's architecture (reduced width on a CPU), loads it
through the checkpoint path and serves it as a session would, one-pass equal to stepwise after the persona prefix;
`bench kyutai` steps moshi's own `LMGen` with Mimi as Kyutai's server does. The GPU check runs both at full width."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import checkpoint_layout, kyutai_baseline

pytestmark = pytest.mark.slow


def test_bench_layout_serves_the_context_spanning_layout_through_the_checkpoint_path(tmp_path: Path) -> None:
    assert checkpoint_layout.main(["--device", "cpu", "--reduced", "--dir", str(tmp_path), "--frames", "4,12",
                                   "--steps", "3", "--repeats", "2", "--equivalence-frames", "8",
                                   "--json", str(tmp_path / "layout.json")]) == 0
    result = json.loads((tmp_path / "layout.json").read_text())
    assert result["layout"] == "contextspan" and result["reduced"] is True
    arch = result["architecture"]
    assert (arch["text_card"], arch["depformer_codebooks"], arch["stepped_codebooks"]) == (32000, 16, 8)
    assert result["voices"] and result["prefix_frames"] > 100  # the default persona after an 8 s voice
    assert [s["prefill"] for s in result["sessions"]] == ["one-pass", "chunked"]
    for session in result["sessions"]:
        assert [r["frames"] for r in session["spans"]] == [4, 12]
        assert session["frames_written"] == result["prefix_frames"] + 3 + 2 * (4 + 12) + 2 * 2
    check = result["equivalence"]
    assert check["passed"] and check["same_sample_one_pass_vs_stepwise"] and check["same_sample_chunked_vs_one_pass"]
    assert max(check[k] for k in ("prefix_one_pass_vs_stepwise", "one_pass_vs_stepwise", "prefix_chunked_vs_one_pass",
                                  "chunked_vs_one_pass")) < 1e-4
    assert not any(tmp_path.glob("layout-*")), "the written checkpoint is removed after"


def test_bench_kyutai_times_moshis_own_frame_loop(tmp_path: Path) -> None:
    assert kyutai_baseline.main(["--profile", "moshi-7b", "--reduced", "--device", "cpu", "--frames", "3",
                                 "--json", str(tmp_path / "kyutai.json")]) == 0
    result = json.loads((tmp_path / "kyutai.json").read_text())
    assert result["frame"]["runs"] == 3 and result["sessions"] == 1 and result["graphs"] is False
    assert result["frames_per_s"] == pytest.approx(1000 / result["frame"]["mean_ms"])
