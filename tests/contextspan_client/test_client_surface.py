"""The client library's public surface is what `__all__` says, pinned here (as httpx pins its own): a name leaving
it, or a helper slipping in unlisted, fails. It carries no test harness and importing it never imports torch."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import contextspan_client

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = [
    "CLOSES", "FAST_LEAD_S", "REFUSALS", "AudioChunk", "BadMessages", "ClientError", "ConnectionLost", "Conversation",
    "Forbidden", "GoingAway", "MessageTooBig", "NoHandshake", "PolicyViolation", "Received", "Refused", "Reply",
    "ServerError", "SessionClosed", "TextPiece", "TooManyConnections", "TryAgain", "Unauthorized", "chat_address",
    "chat_url", "close_error", "connect", "converse", "decode_event_text", "load_wav", "protocol", "refusal_error",
    "session_token",
]
SUBMODULES = {"cli", "client"}  # the implementation modules, reachable as attributes once imported
HARNESS = {"stream", "StreamResult", "start_server", "stop_server", "free_port", "speak", "DRAIN_LIMIT_S"}


def test_the_public_surface_is_exactly_the_pinned_all() -> None:
    assert contextspan_client.__all__ == PUBLIC
    assert all(hasattr(contextspan_client, name) for name in PUBLIC)


def test_every_public_name_of_the_package_is_listed_in_all() -> None:
    public = {name for name in vars(contextspan_client) if not name.startswith("_")} - SUBMODULES
    assert public == set(PUBLIC)
    assert isinstance(contextspan_client.protocol, types.ModuleType)
    assert contextspan_client.protocol.__name__ == "server.wire.protocol"


def test_the_library_carries_no_test_harness() -> None:
    from contextspan_client import cli, client

    for module in (contextspan_client, client, cli):
        assert HARNESS.isdisjoint(vars(module)), module.__name__


def test_importing_the_client_never_imports_torch_and_only_the_wire_protocol_of_the_server() -> None:
    """What docs/client.md promises an app that installs the client alone."""
    code = ("import json, sys, contextspan_client, contextspan_client.cli\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in\n"
            "    ('torch', 'moshi', 'server', 'frontend_model', 'backend_agent', 'benchmarks'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          cwd=ROOT)
    assert json.loads(done.stdout) == ["frontend_model", "frontend_model.compile_policy", "frontend_model.frame",
                                       "server", "server.wire", "server.wire.protocol"]


def test_the_documented_examples_import_only_public_names() -> None:
    blocks = [block for doc in ("client.md", "mobile.md") for block in
              re.findall(r"```python\n(.*?)```", (ROOT / "docs" / doc).read_text(), re.S)]
    imported = [(node.module, alias.name) for block in blocks for node in ast.walk(ast.parse(block))
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("contextspan_client")
                for alias in node.names]
    assert {name for _, name in imported} >= {"connect", "converse", "session_token", "protocol"}
    assert all(module == "contextspan_client" and name in PUBLIC for module, name in imported), imported
