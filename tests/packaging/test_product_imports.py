"""Product code never imports `tests` (nor runs a module of it by name): what a wheel ships must work without the
test suite, which it does not contain. The model and the backend meet only in the server (docs/architecture.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("server", "frontend_model", "backend_agent", "contextspan_client", "benchmarks", "web_client")
TESTS_MODULE = re.compile(r"tests(\.\w+)*")
# Who may not import whom. Training is the exception: it trains on what serving does (the server's leveller, the
# built-in router's answers).
FORBIDDEN = {"frontend_model": {"server", "backend_agent"}, "backend_agent": {"server", "frontend_model"}}
TRAINING = ROOT / "frontend_model" / "training"


def imported(node: ast.AST) -> list[str]:
    """The absolute modules an import statement names (none for any other node)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def references_to_tests(source: str, filename: str) -> list[str]:
    """Imports of `tests` and module names such as "tests.e2e.faulty_server" (for `python -m` or importlib)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        names = imported(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and TESTS_MODULE.fullmatch(node.value):
            names = [node.value]
        found += [f"{filename}:{node.lineno}: {name}" for name in names if name.split(".")[0] == "tests"]
    return found


def test_the_check_finds_an_import_of_tests_and_a_module_name() -> None:
    source = "import tests.support.engine\nfrom tests.support import speech\nMODULE = 'tests.e2e.faulty_server'\n"
    assert len(references_to_tests(source, "example.py")) == 3
    assert references_to_tests("import testsuite\nNAME = 'tests'\nTEXT = 'see the tests.'\n", "x.py") == [
        "x.py:2: tests"]


def test_no_product_module_imports_tests() -> None:
    modules = [path for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(modules) > 100  # the product's modules were found
    offenders = [ref for path in modules for ref in references_to_tests(path.read_text(), str(path.relative_to(ROOT)))]
    assert offenders == []


def test_the_model_and_the_backend_import_neither_the_server_nor_each_other_training_aside() -> None:
    offenders = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(TRAINING):
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
                          for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
                          for name in imported(node) if name.split(".")[0] in forbidden]
    assert offenders == []


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """Which product modules each one imports, wherever the import stands (deferred, under TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {}
    for name, source in modules.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(source)):
            named = imported(node)
            if isinstance(node, ast.ImportFrom) and node.module:
                named = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            graph[name] |= {other for other in named if other in modules and other != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while (top := stack.pop()) != module:
                component.append(top)
            if component:
                found.append(sorted([module, *component]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_circle_check_finds_a_deferred_and_a_type_only_circle() -> None:
    modules = {"a": "from b import f\n", "b": "def f():\n    from a import g\n",
               "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from d import X\n", "d": "import c\n",
               "e": "import a\n"}
    assert circles(import_graph(modules)) == [["a", "b"], ["c", "d"]]


def test_no_product_modules_import_each_other_in_a_circle() -> None:
    modules = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path.read_text()
               for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))}
    assert circles(import_graph(modules)) == []
