"""The `openai` SDK's own Realtime server-event types, to hold what `/v1/realtime` sends against, and ours.

The SDK parses what it receives leniently (`construct`); these validate strictly, field by field, with the model the
SDK has for the event's type: GA (`openai.types.realtime`) or beta (`openai.types.beta.realtime`).
"""

from __future__ import annotations

from typing import Any, get_args

from openai.types import realtime as ga
from openai.types.beta import realtime as beta
from pydantic import BaseModel

from server.wire.realtime import Dialect, ServerEvent


def _by_type(union: Any) -> dict[str, type[BaseModel]]:
    members = get_args(get_args(union)[0])  # Annotated[Union[...], discriminator]
    return {name: member for member in members for name in get_args(member.model_fields["type"].annotation)}


SDK_SERVER_EVENTS: dict[Dialect, dict[str, type[BaseModel]]] = {
    "ga": _by_type(ga.RealtimeServerEvent), "beta": _by_type(beta.RealtimeServerEvent)}


def as_sdk_event(event: dict[str, Any], dialect: Dialect = "ga") -> BaseModel:
    """The event validated by the SDK's model for its type; KeyError when the SDK has no server event of that type,
    pydantic's ValidationError when a field is missing or of the wrong shape."""
    return SDK_SERVER_EVENTS[dialect][event["type"]].model_validate(event)


def server_event_models() -> dict[str, type[ServerEvent]]:
    """Every server event model of ours (`server/wire/realtime.py`) by its GA type, extensions aside."""
    found, todo = {}, list(ServerEvent.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        found |= {name: cls for name in get_args(cls.model_fields["type"].annotation)}
    return found
