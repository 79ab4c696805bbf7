"""docs/protocol.asyncapi.yaml describes exactly the protocol that server/wire/protocol.py and the server speak.

Mobile and web client authors work from the spec alone, so every event the server can send (with its fields),
every kind byte, close code, error code and query parameter must be in it, and nothing that the server lacks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from server.session.realtime_wire import NOT_THE_CLIENTS_FAULT
from server.wire import protocol as p
from server.wire import realtime as rt
from tests.support.openai_realtime import server_event_models

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "docs" / "protocol.asyncapi.yaml"
SERVER_SOURCES = "\n".join(f.read_text() for f in sorted((ROOT / "server").rglob("*.py")))


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return yaml.safe_load(SPEC_PATH.read_text())


def _pointer(ref: str) -> list[str]:
    assert ref.startswith("#/"), ref
    return ref[2:].split("/")


def _messages(spec: dict[str, Any], action: str, channel: str = "chat") -> list[dict[str, Any]]:
    """The messages of every operation on `channel` with this action (send: server -> client), resolved."""
    found = []
    for operation in spec["operations"].values():
        assert _deref(spec, operation["channel"]) in spec["channels"].values()
        if operation["action"] == action and _deref(spec, operation["channel"]) is spec["channels"][channel]:
            found += [_deref(spec, m) for m in operation["messages"]]
    return found


def _deref(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = spec
        for part in _pointer(node["$ref"]):
            target = target[part]
        node = target
    return node


def _json_payloads(spec: dict[str, Any], action: str, channel: str = "chat") -> dict[str, dict[str, Any]]:
    payloads = {}
    for message in _messages(spec, action, channel):
        if message["contentType"] == "application/json":
            payload = _deref(spec, message["payload"])
            payloads[payload["properties"]["type"]["const"]] = payload
    return payloads


def _event_classes() -> list[type[p.ServerEvent]]:
    """Every ServerEvent subclass at any depth that carries a `type` Literal: what the server can send."""
    found, todo = [], list(p.ServerEvent.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "type" in cls.model_fields and get_args(cls.model_fields["type"].annotation):
            found.append(cls)
    return found


def _type_const(cls: type[BaseModel]) -> str:
    (value,) = get_args(cls.model_fields["type"].annotation)
    return value


def _always_sent(cls: type[BaseModel]) -> set[str]:
    """Events are encoded with exclude_none: a field is always on the wire unless it can be None (or is `type`)."""
    return {name for name, f in cls.model_fields.items()
            if f.is_required() or f.get_default(call_default_factory=True) is not None} | {"type"}


def test_every_server_event_is_in_the_spec_and_vice_versa(spec: dict[str, Any]) -> None:
    classes = {_type_const(cls): cls for cls in _event_classes()}
    assert set(classes) == set(_json_payloads(spec, "send"))
    # The discriminated union that clients decode with covers the same set.
    assert {_type_const(cls) for cls in get_args(get_args(p.Event)[0])} == set(classes)


@pytest.mark.parametrize("cls", _event_classes(), ids=_type_const)
def test_event_fields_and_required_fields_match(spec: dict[str, Any], cls: type[p.ServerEvent]) -> None:
    payload = _json_payloads(spec, "send")[_type_const(cls)]
    assert set(payload["properties"]) == set(cls.model_fields)
    assert set(payload["required"]) == _always_sent(cls)
    assert payload["additionalProperties"] is False


def test_client_messages_match(spec: dict[str, Any]) -> None:
    payloads = _json_payloads(spec, "receive")
    classes = get_args(get_args(p.ClientMessage)[0])
    assert set(payloads) == {_type_const(cls) for cls in classes}
    for cls in classes:
        payload = payloads[_type_const(cls)]
        assert set(payload["properties"]) == set(cls.model_fields)
        assert set(payload["required"]) == {name for name, f in cls.model_fields.items() if f.is_required()}
    profile = _deref(spec, payloads[_type_const(p.SessionUpdate)]["properties"]["profile"])
    assert set(profile["properties"]) == set(p.UserProfile.model_fields)
    inject = payloads[_type_const(p.SpanInject)]["properties"]["text"]
    assert inject["maxLength"] == p.MAX_APP_SPAN_CHARS


def test_every_kind_byte_is_in_the_spec(spec: dict[str, Any]) -> None:
    def kinds(action: str) -> set[int]:
        return {m["x-kind"] for m in _messages(spec, action) if "x-kind" in m}

    assert kinds("send") | kinds("receive") == {kind.value for kind in p.Kind}
    assert kinds("send") == {p.Kind.HANDSHAKE, p.Kind.AUDIO, p.Kind.TEXT}
    assert kinds("receive") == {p.Kind.AUDIO}  # anything else a client sends gets error `unexpected_kind`


def test_every_close_code_and_refusal_reason_is_in_the_spec(spec: dict[str, Any]) -> None:
    documented = spec["channels"]["chat"]["x-close-codes"]
    constants = {value for name, value in vars(p).items() if name.startswith("CLOSE_")}
    assert {c["code"] for c in documented} == constants
    reasons = set(re.findall(r'close_reason\(\s*"([a-z_]+)"', SERVER_SOURCES))
    assert reasons and reasons <= {r.strip() for c in documented for r in c.get("error", "").split("|")}


def test_every_error_code_is_in_the_spec(spec: dict[str, Any]) -> None:
    codes = set(re.findall(r'ProtocolError\(\s*"([a-z_]+)"', SERVER_SOURCES))
    documented = _json_payloads(spec, "send")["error"]["properties"]["code"]["examples"]
    assert codes and codes == set(documented)


def test_every_query_parameter_is_in_the_spec(spec: dict[str, Any]) -> None:
    used = set(re.findall(r'(?:query|query_params)\.get\(\s*"([a-z_]+)"', SERVER_SOURCES))
    used |= set(p.SamplingQuery.model_fields)  # parsed as one pydantic model
    documented = spec["channels"]["chat"]["bindings"]["ws"]["query"]["properties"]
    assert used and used == set(documented)


def test_realtime_client_events_match(spec: dict[str, Any]) -> None:
    documented = set(_json_payloads(spec, "receive", "realtime"))
    assert documented == set(rt.CLIENT_TYPES)


def test_every_realtime_server_event_its_fields_and_its_beta_name_are_in_the_spec(spec: dict[str, Any]) -> None:
    (message,) = _messages(spec, "send", "realtime")
    documented = {e["type"]: e for e in message["x-server-events"]}
    models = server_event_models()
    extensions = {rt.EXTENSION_PREFIX + _type_const(cls) for cls in get_args(rt.SpanEvent)}
    assert set(documented) == set(models) | extensions
    for name, cls in models.items():
        assert documented[name]["fields"] == [f for f in cls.model_fields if f not in ("type", "event_id")], name
    assert {ga: e["x-beta-name"] for ga, e in documented.items() if "x-beta-name" in e} == rt.BETA_NAMES
    assert set(message["payload"]["properties"]["type"]["enum"]) == set(documented)


def test_every_realtime_error_code_is_in_the_spec(spec: dict[str, Any]) -> None:
    """What a Realtime client can get: the wire's own codes, and those of the session they share with /api/chat,
    less the conditions that are not the client's fault (never `error` on /v1/realtime)."""
    shared = [ROOT / "server" / "session" / name for name in ("session.py", "client_tools.py")]
    codes = set(re.findall(r'RealtimeError\(\s*"([a-z_]+)"', SERVER_SOURCES))
    codes |= {code for f in shared for code in re.findall(r'(?:ProtocolError\(|code=)\s*"([a-z_]+)"', f.read_text())}
    documented = {c["code"] for c in spec["channels"]["realtime"]["x-error-codes"]}
    # Profiles come only through /api/chat's session.update, and only /api/chat locks the persona.
    assert codes - {"bad_profile", "persona_locked"} - NOT_THE_CLIENTS_FAULT == documented
