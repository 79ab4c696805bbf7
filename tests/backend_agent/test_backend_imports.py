"""backend_agent meets the rest of the system only through plain data (DESIGN.md, "Layout")."""

import ast
from pathlib import Path

import backend_agent

FORBIDDEN = ("server", "frontend_model")


def test_backend_agent_never_imports_server_or_frontend_model() -> None:
    offenders = []
    for path in Path(backend_agent.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path}: {name}" for name in names if name.split(".")[0] in FORBIDDEN]
    assert offenders == []
