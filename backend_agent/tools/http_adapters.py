"""Weather and web-search tools backed by HTTP APIs (off unless their URL is configured).

The URL comes from configuration, but the host is still resolved and checked before every request: an
agent that fetches on a user's behalf must never be turned against the box's own network (loopback,
private ranges, link-local cloud metadata, ...). The request then goes to the checked address itself
(host header and TLS name kept), so a second DNS answer cannot swap in a private one, and redirects are
not followed.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from backend_agent.tools.base import Tool, ToolError, ToolResult, required_str

MAX_RESPONSE_BYTES = 256 * 1024
MAX_ANSWER_CHARS = 400

Resolver = Callable[..., Sequence[tuple[Any, ...]]]  # socket.getaddrinfo's shape


class BlockedAddressError(ToolError):
    """The URL points at an address the agent must not reach."""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped ::ffff:a.b.c.d, 6to4 or Teredo), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    return ip.teredo[1] if ip.teredo is not None else None


def is_public_address(address: str, *, allow_loopback: bool = False) -> bool:
    """True when `address` (an IP literal) is a public unicast address; loopback passes only when
    `allow_loopback` (tests against a local fake). Not an IP literal: False."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return is_public_address(str(embedded), allow_loopback=allow_loopback)
    if ip.is_loopback:
        return allow_loopback
    blocked = (
        ip.is_private or ip.is_link_local or ip.is_multicast or ip.is_reserved or ip.is_unspecified
        or not ip.is_global
    )  # fmt: skip
    return not blocked


def resolve_public(
    host: str, port: int, *, allow_loopback: bool = False, resolver: Resolver = socket.getaddrinfo
) -> str:
    """Resolve `host` and return an address to connect to; refuse if any address it resolves to is not
    public (a name with one private answer is not trusted)."""
    try:
        infos = resolver(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise BlockedAddressError(f"cannot resolve '{host}'") from error
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise BlockedAddressError(f"'{host}' has no address")
    for address in addresses:
        if not is_public_address(address, allow_loopback=allow_loopback):
            raise BlockedAddressError(f"'{host}' resolves to a non-public address ({address})")
    return addresses[0]


def guarded_get(
    url: str,
    *,
    params: dict[str, str] | None = None,
    timeout_s: float = 2.0,
    allow_loopback: bool = False,
    resolver: Resolver = socket.getaddrinfo,
) -> str:
    """GET `url` after the address check, pinned to the checked address; the body as text (bounded)."""
    target = httpx.URL(url, params=params)
    if target.scheme not in ("http", "https") or not target.host:
        raise BlockedAddressError(f"only http and https URLs are allowed, not '{url}'")
    port = target.port or (443 if target.scheme == "https" else 80)
    address = resolve_public(target.host, port, allow_loopback=allow_loopback, resolver=resolver)
    request_headers = {"Host": target.netloc.decode("ascii"), "Accept": "application/json, text/plain"}
    try:
        with (
            httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client,
            client.stream(
                "GET", target.copy_with(host=address), headers=request_headers,
                extensions={"sni_hostname": target.host},
            ) as response,
        ):  # fmt: skip
            if response.status_code != 200:
                raise ToolError(f"the service answered HTTP {response.status_code}")
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise ToolError("the service's answer is too large")
            return body.decode(response.encoding or "utf-8", errors="replace")
    except httpx.HTTPError as error:
        raise ToolError(f"the service could not be reached: {type(error).__name__}") from error


def _short(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    return text[:MAX_ANSWER_CHARS].rsplit(" ", 1)[0] + "…"


def make_weather_tool(
    url_template: str, *, timeout_s: float = 2.0, allow_loopback: bool = False,
    resolver: Resolver = socket.getaddrinfo,
) -> Tool:  # fmt: skip
    """A `weather` tool for a plain-text weather API whose URL has a `{place}` slot, for example
    "https://wttr.in/{place}?format=3"."""
    if "{place}" not in url_template:
        raise ValueError("the weather URL needs a {place} slot")

    def run(args: dict[str, Any]) -> ToolResult:
        place = required_str(args, "place")
        url = url_template.replace("{place}", quote(place, safe=""))
        body = guarded_get(url, timeout_s=timeout_s, allow_loopback=allow_loopback, resolver=resolver)
        if not body.strip():
            raise ToolError("the weather service gave no answer")
        return ToolResult(text=_short(body), source=url_template.split("{place}", 1)[0])

    return Tool(
        name="weather",
        description="Current weather in a place.",
        parameters={
            "type": "object",
            "properties": {"place": {"type": "string", "description": "a city or region"}},
            "required": ["place"],
        },
        run=run,
    )


def make_web_search_tool(
    base_url: str, *, timeout_s: float = 2.0, allow_loopback: bool = False,
    resolver: Resolver = socket.getaddrinfo,
) -> Tool:  # fmt: skip
    """A `web_search` tool for a SearXNG-style JSON API: GET {base_url}/search?q=...&format=json, answered
    with the first result's snippet and URL."""
    endpoint = base_url.rstrip("/") + "/search"

    def run(args: dict[str, Any]) -> ToolResult:
        query = required_str(args, "query")
        body = guarded_get(
            endpoint, params={"q": query, "format": "json"}, timeout_s=timeout_s,
            allow_loopback=allow_loopback, resolver=resolver,
        )  # fmt: skip
        try:
            results = json.loads(body).get("results") or []
        except (ValueError, AttributeError) as error:
            raise ToolError("the search service's answer is not JSON") from error
        for result in results:
            if isinstance(result, dict) and (result.get("content") or result.get("title")):
                text = str(result.get("content") or result.get("title"))
                return ToolResult(text=_short(text), source=str(result.get("url") or endpoint))
        raise ToolError("the web search found nothing")

    return Tool(
        name="web_search",
        description="Search the web and return the best result's snippet with its URL.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to search for"}},
            "required": ["query"],
        },
        run=run,
    )
