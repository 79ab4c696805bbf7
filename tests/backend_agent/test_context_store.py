"""The context store round-trips profiles, turns and tool results, and bounds the working context."""

import threading
from itertools import count
from pathlib import Path

import pytest
from pydantic import ValidationError

from backend_agent.context_store import ContextStore, Profile
from backend_agent.tools.base import ToolResult


@pytest.fixture
def store() -> ContextStore:
    ticks = count(1000)
    return ContextStore(":memory:", clock=lambda: float(next(ticks)))


def test_profile_round_trip(store: ContextStore) -> None:
    assert store.get_profile("ada") == Profile(user_id="ada")
    profile = Profile(user_id="ada", name="Ada", location="Paris", timezone="Europe/Paris", language="fr",
                      notes=["allergic to nuts"])  # fmt: skip
    store.save_profile(profile)
    store.add_note("ada", "prefers metric units")
    expected = profile.model_copy(update={"notes": [*profile.notes, "prefers metric units"]})
    assert store.get_profile("ada") == expected
    store.save_profile(profile.model_copy(update={"name": "Ada L.", "notes": []}))
    assert store.get_profile("ada").name == "Ada L."
    assert store.get_profile("ada").notes == []
    with pytest.raises(ValidationError):
        Profile(user_id="x", timezone="Mars/Olympus")


def test_turns_and_tool_results_round_trip(store: ContextStore) -> None:
    store.add_turn("ada", "s1", "user", "What is 12 times 7?")
    store.record_tool_result("ada", "s1", "arithmetic", {"expression": "12 times 7"},
                             ToolResult("12 times 7 is 84.", "arithmetic"))  # fmt: skip
    store.add_turn("ada", "s1", "agent", "That's 84.")
    store.add_turn("ada", "s2", "user", "Other session")
    turns = store.turns("s1")
    assert [(t.role, t.text) for t in turns] == [
        ("user", "What is 12 times 7?"),
        ("tool", "arithmetic: 12 times 7 is 84. (source: arithmetic)"),
        ("agent", "That's 84."),
    ]
    assert [t.timestamp for t in turns] == sorted(t.timestamp for t in turns)
    assert [t.text for t in store.turns("s1", limit=1)] == ["That's 84."]
    [record] = store.tool_results("s1")
    assert (record.tool, record.arguments, record.text, record.source) == (
        "arithmetic", {"expression": "12 times 7"}, "12 times 7 is 84.", "arithmetic"
    )  # fmt: skip


def test_persists_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "context.sqlite"
    first = ContextStore(path)
    first.save_profile(Profile(user_id="ada", name="Ada"))
    first.add_turn("ada", "s1", "user", "hello")
    first.close()
    second = ContextStore(path)
    assert second.get_profile("ada").name == "Ada"
    assert [t.text for t in second.turns("s1")] == ["hello"]


def test_working_context_contents(store: ContextStore) -> None:
    store.save_profile(Profile(user_id="ada", name="Ada", timezone="Europe/Paris", notes=["likes tea"]))
    for i in range(20):
        store.add_turn("ada", "s1", "user" if i % 2 == 0 else "agent", f"turn {i}")
    text = store.working_context("ada", "s1", max_turns=4, max_chars=10_000)
    assert text.splitlines() == [
        "User profile: name Ada; timezone Europe/Paris.",
        "Notes:",
        "- likes tea",
        "Conversation:",
        "user: turn 16",
        "agent: turn 17",
        "user: turn 18",
        "agent: turn 19",
    ]


@pytest.mark.parametrize("max_chars", [0, 1, 20, 60, 120, 300, 1000])
def test_working_context_is_bounded(store: ContextStore, max_chars: int) -> None:
    store.save_profile(Profile(user_id="ada", name="Ada", notes=[f"note {i} " + "n" * 30 for i in range(10)]))
    for i in range(50):
        store.add_turn("ada", "s1", "user", f"turn {i} " + "t" * 40)
    text = store.working_context("ada", "s1", max_turns=30, max_chars=max_chars)
    assert len(text) <= max_chars
    if max_chars >= 120:
        assert "turn 49" in text  # the latest turn survives longest
        assert "turn 20 " not in text  # older than max_turns


def test_thread_safe(store: ContextStore) -> None:
    def write(worker: int) -> None:
        for i in range(50):
            store.add_turn("ada", "s1", "user", f"{worker}-{i}")
            store.working_context("ada", "s1")

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store.turns("s1")) == 200


def test_forget_user_removes_everything_of_that_user_only() -> None:
    store = ContextStore(":memory:")
    for user in ("anon-1", "ada"):
        store.save_profile(Profile(user_id=user, name="X"))
        store.add_note(user, "note")
        store.add_turn(user, f"s-{user}", "user", "hello")
        store.record_tool_result(user, f"s-{user}", "date", {}, ToolResult("Monday", "clock"))
    store.forget_user("anon-1")
    assert store.turns("s-anon-1") == [] and store.tool_results("s-anon-1") == []
    assert store.get_profile("anon-1").name is None and store.get_profile("anon-1").notes == []
    assert len(store.turns("s-ada")) == 2 and store.get_profile("ada").name == "X"
