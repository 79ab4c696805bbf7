"""The spoken set of `bench retrieval --spoken`, scored on its text as written: every item is answered, bare and
wrapped, so that what the benchmark loses is what Whisper mishears, not what the router fails to find."""

from benchmarks import spoken_questions


def test_every_item_is_answered_from_its_text() -> None:
    result = spoken_questions.score(spoken_questions.said(), None, 2.5)
    wrong = [row for row in result["rows"] if not row["right"]]
    assert not wrong, wrong
    assert set(result["accuracy"]) == {"time_in_place", "date", "arithmetic", "unit_conversion", "knowledge_base"}
    assert result["total"] == {"bare": "20/20", "wrapped": "20/20"}
