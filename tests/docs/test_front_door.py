"""The README stays a front door (read in five minutes, pointing at the documents that hold the details); every
document's links and anchors resolve; and the maps name only files and functions that exist, so that a map that has
drifted from the code fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_LIMIT_BYTES = 15_000
MAPS = ["README.md", "docs/architecture.md", "docs/engine.md", "benchmarks/README.md"]
DOCUMENTS = sorted({*MAPS, *(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md"))})
# A repository path in backticks: a folder of the project, then a file with an extension or a folder (trailing /).
PATH = re.compile(r"`((?:server|frontend_model|backend_agent|contextspan_client|benchmarks|web_client|docker|docs|"
                  r"scripts|tests)/[\w./-]*)`")
# A file and a name defined in it, side by side in backticks: "`server/wire/opus.py` `OpusDecoder.decode`".
PATH_AND_NAME = re.compile(r"`([\w/]+\.py)` `([A-Za-z_][\w.]*)`")


def test_the_readme_is_a_front_door_of_at_most_15_kb() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes: move details into docs/ or benchmarks/README.md"


def test_the_readme_links_every_document_a_reader_goes_on_to() -> None:
    links = set(re.findall(r"\]\(([^)#]+)", README.read_text()))
    assert {"docs/architecture.md", "docs/engine.md", "docs/operations.md", "docs/configuration.md",
            "docs/protocol.md", "docs/client.md", "benchmarks/README.md"} <= links


def test_the_configuration_table_lives_only_in_docs_configuration() -> None:
    assert "<!-- config-table" not in README.read_text()
    assert "| `--host` |" not in README.read_text()


@pytest.mark.parametrize("name", DOCUMENTS)
def test_relative_links_resolve(name: str) -> None:
    document = ROOT / name
    for target in re.findall(r"\]\((?!https?://|#)([^)#]+)", document.read_text()):
        assert (document.parent / target).exists(), f"{name} links to missing {target}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("name", DOCUMENTS)
def test_every_anchor_a_document_links_to_is_a_heading_there(name: str) -> None:
    document = ROOT / name
    for target, anchor in re.findall(r"\]\((?!https?://)([^)#]*)#([^)]+)\)", document.read_text()):
        linked = (document.parent / target) if target else document
        headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", linked.read_text(), re.M)}
        assert anchor in headings, f"{name} links to #{anchor} in {linked.name}, which has no such heading"


@pytest.mark.parametrize("name", MAPS)
def test_every_path_the_maps_name_exists(name: str) -> None:
    text = (ROOT / name).read_text()
    named = {path for path in PATH.findall(text) if "*" not in path}
    assert named, f"{name} names no files"
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"{name} names files that do not exist: {missing}"


def _member(item: ast.stmt) -> str | None:
    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
        return item.name
    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
        return item.target.id  # a dataclass or pydantic field
    return None


def _defined(source: str) -> set[str]:
    """Dotted names a module defines: functions and classes, and their methods and fields as Class.member."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names |= {f"{node.name}.{member}" for item in node.body if (member := _member(item))}
    return names


def test_every_function_the_architecture_names_is_defined_in_the_file_it_names() -> None:
    pairs = PATH_AND_NAME.findall((ROOT / "docs" / "architecture.md").read_text())
    assert len(pairs) >= 20, "the flows name their files and functions side by side"
    wrong = sorted(f"{path} {name}" for path, name in pairs if name not in _defined((ROOT / path).read_text()))
    assert not wrong, f"docs/architecture.md names functions its files do not define: {wrong}"


def test_every_method_the_architecture_names_belongs_to_its_class() -> None:
    """`Class.member` written without its file: the class is looked up among the packages' classes."""
    defined: set[str] = set()
    for package in ("server", "frontend_model", "backend_agent", "contextspan_client"):
        for source in (ROOT / package).rglob("*.py"):
            defined |= _defined(source.read_text())
    classes = {name for name in defined if "." not in name and name[:1].isupper()}
    named = set(re.findall(r"`([A-Z]\w*)\.(\w+)`", (ROOT / "docs" / "architecture.md").read_text()))
    checked = {(cls, member) for cls, member in named if cls in classes}
    assert len(checked) >= 20
    wrong = sorted(f"{cls}.{member}" for cls, member in checked if f"{cls}.{member}" not in defined)
    assert not wrong, f"docs/architecture.md names members its classes do not have: {wrong}"
