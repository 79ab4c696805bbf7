"""A calibration kept on disk is read back by a later start with the same model, machine and settings, and only then."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from frontend_model.engine.costs import PrefillCost, TickCost
from frontend_model.loading.loader import load_model
from server.app import routes
from server.app.kept_calibration import CalibrationKey, keep, read_kept
from tests.e2e.servers import in_process_server, pinned_settings

KEY = CalibrationKey(model="tiny | tiny (random weights) | ", machine="cpu: x86_64 x2", torch="2.13.0", threads=1,
                     tick_sizes=[1, 2], tick_limit_s=0.06, max_span_frames=640, off=[])
COST = TickCost({1: 0.031, 2: 0.045}, PrefillCost(0.02, {1: 0.05, 640: 0.2}, {512: 0.15, 1: 0.03}), memory_slots=2)


def test_a_kept_calibration_is_read_back_as_it_was_measured(tmp_path: Path) -> None:
    keep(tmp_path / "kept", KEY, COST)
    assert read_kept(tmp_path / "kept", KEY) == COST
    assert [p.suffix for p in (tmp_path / "kept").iterdir()] == [".json"]  # nothing half-written left beside it


@pytest.mark.parametrize("change", [{"machine": "cuda:0: NVIDIA H100"}, {"model": "moshi | moshiko | kyutai/x"},
                                    {"threads": 2}, {"torch": "2.11.0"}, {"tick_sizes": [1, 2, 4]},
                                    {"max_span_frames": 320}, {"tick_limit_s": 0.09}, {"off": ["step_graphs"]}])
def test_a_calibration_is_not_read_back_for_another_model_machine_or_settings(tmp_path: Path,
                                                                               change: dict[str, object]) -> None:
    keep(tmp_path, KEY, COST)
    assert read_kept(tmp_path, KEY.model_copy(update=change)) is None


def test_a_kept_calibration_that_does_not_read_is_measured_again_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / KEY.file_name()).write_text('{"key": {"model": "tiny"}, "tick_s": {"1": "fast"}}')
    with caplog.at_level(logging.WARNING):
        assert read_kept(tmp_path, KEY) is None
    assert "does not read" in caplog.text and "measuring again" in caplog.text
    keep(tmp_path, KEY, COST)  # the next measurement takes its place
    assert read_kept(tmp_path, KEY) == COST


def test_a_folder_that_cannot_be_written_costs_a_warning_not_the_start(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        keep(tmp_path / "file", KEY, COST)
    assert "could not keep the calibration" in caplog.text


def test_a_second_start_reads_the_first_starts_calibration_instead_of_measuring(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = pinned_settings(recordings=False, max_sessions=2, asr=False, calibration_cache=tmp_path)
    with in_process_server(settings, load_model("tiny")) as first:
        assert first.state.batcher is not None and first.state.optimisations is not None
        measured = first.state.batcher.cost
        assert first.state.optimisations.status()["calibration"] == "active"
    assert len(list(tmp_path.glob("*.json"))) == 1

    def measure(*_: object) -> TickCost:
        raise AssertionError("measured again")

    monkeypatch.setattr(routes, "calibrate_costs", measure)
    with in_process_server(settings.model_copy(update={"port": pinned_settings().port}), load_model("tiny")) as second:
        assert second.state.batcher is not None and second.state.optimisations is not None
        assert second.state.batcher.cost.tick_s == measured.tick_s
        assert second.state.batcher.cost.prefill.span_s == measured.prefill.span_s
        assert second.state.optimisations.status()["calibration"] == "active"
