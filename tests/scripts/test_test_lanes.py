"""scripts/test_lanes.py: which arguments run the suite in two lanes, and what the suite's exit code is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from test_lanes import NO_TESTS, names_tests, outcome  # noqa: E402


@pytest.mark.parametrize("args", [["tests/e2e"], ["-x", "tests/server/test_limits.py::test_x"],
                                  ["tests/frontend_model/test_loading.py", "-k", "hub"]])
def test_arguments_that_name_tests_run_one_pytest_as_given(args: list[str]) -> None:
    assert names_tests(args)


@pytest.mark.parametrize("args", [[], ["--durations=0"], ["-m", "not slow", "-x"], ["-k", "tests"],
                                  ["--deselect", "tests/e2e/test_browser.py"]])
def test_options_alone_run_the_whole_suite_in_two_lanes(args: list[str]) -> None:
    assert not names_tests(args)


@pytest.mark.parametrize(("codes", "code"), [([0, 0], 0), ([1, 0], 1), ([0, 1], 1), ([2, 1], 2),
                                             ([NO_TESTS, 0], 0), ([1, NO_TESTS], 1), ([NO_TESTS, NO_TESTS], NO_TESTS)])
def test_the_suite_fails_where_a_lane_fails_and_an_empty_lane_is_no_failure(codes: list[int], code: int) -> None:
    assert outcome(codes) == code
