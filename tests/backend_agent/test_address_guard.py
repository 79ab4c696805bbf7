"""The HTTP tools never reach loopback, private, link-local, multicast, reserved or unspecified
addresses; the adapters are exercised against a local fake only with loopback explicitly allowed."""

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from backend_agent.tools.base import ToolError
from backend_agent.tools.http_adapters import (
    BlockedAddressError,
    guarded_get,
    is_public_address,
    make_weather_tool,
    make_web_search_tool,
    resolve_public,
)

BLOCKED = [
    "127.0.0.1", "127.1.2.3", "::1", "10.0.0.1", "10.255.255.255", "172.16.0.1", "172.31.255.254",
    "192.168.1.1", "169.254.169.254", "fe80::1", "fe80::1%eth0", "fc00::1", "fd12:3456::1",
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "0.0.0.0", "::", "224.0.0.1",
    "239.255.255.250", "ff02::1",
    "240.0.0.1", "255.255.255.255", "100.64.0.1", "192.0.2.1", "198.18.0.1", "2001:db8::1", "2002:7f00:1::",
    "2002:a00:1::", "::127.0.0.1", "localhost", "not-an-ip",
]  # fmt: skip
PUBLIC = ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:93.184.216.34"]


@pytest.mark.parametrize("address", BLOCKED)
def test_blocked_addresses(address: str) -> None:
    assert not is_public_address(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses(address: str) -> None:
    assert is_public_address(address)


def test_loopback_only_when_allowed() -> None:
    for address in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        assert is_public_address(address, allow_loopback=True)
    for address in ("10.0.0.1", "169.254.169.254", "0.0.0.0"):
        assert not is_public_address(address, allow_loopback=True)


def test_hostname_resolving_to_loopback_is_refused() -> None:
    with pytest.raises(BlockedAddressError):
        resolve_public("localhost", 80)


def fake_resolver(answers: list[str]):
    def resolve(host: str, port: int, **_: object) -> list[tuple]:
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in answers]  # fmt: skip

    return resolve


def test_resolution_needs_every_answer_public() -> None:
    assert resolve_public("example.com", 443, resolver=fake_resolver(["93.184.216.34"])) == "93.184.216.34"
    with pytest.raises(BlockedAddressError):
        resolve_public("rebind.example", 443, resolver=fake_resolver(["93.184.216.34", "10.0.0.5"]))
    with pytest.raises(BlockedAddressError):
        resolve_public("empty.example", 443, resolver=fake_resolver([]))


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1/", "http://[::1]:8080/", "http://169.254.169.254/latest", "http://localhost/",
            "http://10.1.2.3/", "http://[::ffff:127.0.0.1]/", "file:///etc/passwd", "ftp://93.184.216.34/"]
)  # fmt: skip
def test_guarded_get_refuses_before_connecting(url: str) -> None:
    with pytest.raises(BlockedAddressError):
        guarded_get(url, timeout_s=0.5)


class _FakeApi(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/weather/"):
            body, kind = b"Tokyo: +8\xc2\xb0C, light rain", "text/plain; charset=utf-8"
        elif self.path.startswith("/search"):
            body = json.dumps(
                {"results": [{"title": "T", "content": "The answer is 42.", "url": "https://a.example/x"}]}
            )
            body, kind = body.encode(), "application/json"
        else:
            self.send_response(302)
            self.send_header("Location", "http://10.0.0.1/")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_adapters_against_a_local_fake(fake_api: str) -> None:
    weather = make_weather_tool(f"{fake_api}/weather/{{place}}", timeout_s=2, allow_loopback=True)
    result = weather.run({"place": "Tokyo"})
    assert result.text == "Tokyo: +8°C, light rain"
    search = make_web_search_tool(fake_api, timeout_s=2, allow_loopback=True)
    result = search.run({"query": "meaning of life"})
    assert (result.text, result.source) == ("The answer is 42.", "https://a.example/x")
    with pytest.raises(ToolError, match="302"):
        guarded_get(f"{fake_api}/redirect", allow_loopback=True)


def test_adapters_refuse_the_local_fake_by_default(fake_api: str) -> None:
    with pytest.raises(BlockedAddressError):
        make_weather_tool(f"{fake_api}/weather/{{place}}").run({"place": "Tokyo"})
    with pytest.raises(BlockedAddressError):
        make_web_search_tool(fake_api).run({"query": "anything"})
