"""`bench span` and `bench batch` run the real architectures of the random and tiny-checkpoint profiles on a CPU:
`moshi-7b` at the tiny widths (its 32000-entry text head and tokenizer, 16 codebooks, delays) and reduced context,
`tiny-personaplex` with its 16 depformer codebooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import batch_ticks, span_latency
from server.settings import ServerSettings

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("profile", [["moshi-7b", "--reduced"], ["tiny-personaplex"]], ids=lambda p: p[0])
def test_bench_span_and_batch_run(tmp_path: Path, profile: list[str]) -> None:
    common = [*profile, "--device", "cpu", "--context", "32"]
    assert span_latency.main(["--profile", *common, "--frames", "0,8", "--repeats", "2", "--stepwise-repeats", "1",
                              "--exit-trials", "2", "--json", str(tmp_path / "span.json")]) == 0
    assert batch_ticks.main(["--profile", *common, "--sessions", "1,2", "--ticks", "4", "--rounds", "1",
                             "--span-frames", "4", "--json", str(tmp_path / "batch.json")]) == 0
    span = json.loads((tmp_path / "span.json").read_text())
    batch = json.loads((tmp_path / "batch.json").read_text())
    assert span["profile"] == batch["profile"] == profile[0]
    assert [row["frames"] for row in span["rows"]] == [0, 8] and span["rows"][1]["max_abs_logit_diff"] < 1e-4
    assert [row["sessions"] for row in batch["rows"]] == [1, 2]
    assert span["exit"]["trials"] == 2 and span["exit"]["exit_sample"]["runs"] == 2


def test_benches_size_rings_as_the_server_and_can_skip_the_stepwise_reference(tmp_path: Path) -> None:
    served = ServerSettings().max_span_frames
    common = ["--profile", "tiny", "--device", "cpu", "--context", "32"]
    assert span_latency.main([*common, "--frames", "0,8", "--repeats", "2", "--no-stepwise", "--exit-trials", "1",
                              "--json", str(tmp_path / "span.json")]) == 0
    assert batch_ticks.main([*common, "--sessions", "1", "--ticks", "2", "--rounds", "1", "--span-frames", "4",
                             "--json", str(tmp_path / "batch.json")]) == 0
    span = json.loads((tmp_path / "span.json").read_text())
    batch = json.loads((tmp_path / "batch.json").read_text())
    assert span["max_span_frames"] == batch["max_span_frames"] == served
    assert all("stepwise_plus_step" not in row and "speedup" not in row for row in span["rows"])
    with pytest.raises(SystemExit):
        span_latency.main([*common, "--frames", f"0,{served + 1}"])
