"""`bench levelling` runs, and what it reports is where the leveller brings each input level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import user_levelling
from server.wire.leveller import TARGET_LUFS


def test_bench_levelling_reports_cost_and_the_level_reached(tmp_path: Path) -> None:
    out = tmp_path / "levelling.json"
    assert user_levelling.main(["--levels=-40,-12", "--seconds", "8", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [row["target_in_lufs"] for row in result["rows"]] == [-40.0, -12.0]
    for row in result["rows"]:
        assert row["lufs_in"] == pytest.approx(row["target_in_lufs"], abs=1.0)
        assert row["lufs_out"] == pytest.approx(TARGET_LUFS, abs=1.0)
        assert row["frames"] == 100 and row["cpu_us"] > 0 and row["peak_out"] <= 0.95
    assert result["machine"]["cpu_count"] and len(result["load_average"]) == 3
