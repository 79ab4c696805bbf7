"""The knowledge base finds documents from questions that share only some of their words."""

from pathlib import Path

import pytest

from backend_agent.tools.base import ToolError
from backend_agent.tools.knowledge_base import KnowledgeBase, content_words, make_tool, split_passages

DOCUMENTS = {
    "museum.md": "# City Museum\n\nThe City Museum opens at 9 am and closes at 5 pm, Tuesday to Sunday. "
    "It is closed on Mondays. Entry is free for children under twelve.\n\n## Tickets\n\n"
    "Adult tickets cost 12 euros. Students pay 8 euros.",
    "library.txt": "The public library is open from 10 am on weekdays. Books may be borrowed for 3 weeks.",
    "parking.txt": "Parking in the garage on Elm Street costs 3 euros per hour. The garage never closes.",
    "pool.md": "# Swimming pool\n\nThe outdoor pool is heated from May to September. Lanes are reserved for "
    "swimming lessons on Saturday mornings.",
}


@pytest.fixture
def knowledge(tmp_path: Path) -> KnowledgeBase:
    for name, text in DOCUMENTS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    kb = KnowledgeBase()
    assert kb.index_folder(tmp_path) == len(DOCUMENTS)
    return kb


@pytest.mark.parametrize(
    ("question", "source"),
    [
        ("When does the museum open?", "museum.md"),
        ("How much does an adult ticket cost?", "museum.md"),
        ("Is the swimming pool heated in winter?", "pool.md"),
        ("How long can I borrow books from the library?", "library.txt"),
        ("Where can I park my car overnight?", "parking.txt"),
    ],
)
def test_partial_word_overlap_ranks_the_right_document_first(
    knowledge: KnowledgeBase, question: str, source: str
) -> None:
    found = knowledge.search(question)
    assert found, question
    assert found[0].source == source


def test_tool_returns_best_passage_and_source(knowledge: KnowledgeBase) -> None:
    result = make_tool(knowledge).run({"query": "When does the museum open?"})
    assert result.source == "museum.md"
    assert "opens at 9 am" in result.text
    assert "Students" not in result.text  # the passage, not the whole document
    with pytest.raises(ToolError):
        make_tool(knowledge).run({"query": "tell me a joke"})


def test_notes_belong_to_their_user(knowledge: KnowledgeBase) -> None:
    knowledge.add_note("ada", "My dentist appointment is on Friday at 3 pm.")
    assert knowledge.search("when is my dentist appointment", user_id="ada")[0].source == "note"
    assert knowledge.search("when is my dentist appointment", user_id="bob") == []
    assert knowledge.search("when is my dentist appointment") == []


def test_reindexing_a_document_replaces_it() -> None:
    kb = KnowledgeBase()
    kb.add_document("hours.txt", "The shop opens at 8 am.")
    kb.add_document("hours.txt", "The shop opens at 10 am.")
    assert [p.text for p in kb.search("when does the shop open")] == ["The shop opens at 10 am."]


def test_one_incidental_word_is_not_a_match() -> None:
    kb = KnowledgeBase()
    kb.add_document("trains.txt", "The last train to the airport leaves at midnight.")
    assert kb.search("do you know any good italian restaurants near the airport") == []
    assert kb.search("when does the last train to the airport leave")[0].source == "trains.txt"


def test_passages_and_content_words() -> None:
    text = "# Title\n\nOne. Two. Three. Four.\n\n- Five is a bullet."
    assert split_passages(text, sentences_per_passage=3) == [
        "Title: One. Two. Three.",
        "Title: Four.",
        "Title: Five is a bullet.",
    ]
    assert content_words("When does the Museum open, the museum?") == ["museum", "open"]
    assert content_words('"; DROP TABLE passages; --') == ["drop", "table", "passages"]
