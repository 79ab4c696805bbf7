"""`contextspan health`: the container's HEALTHCHECK, probing the port the server was really told to use.

A HEALTHCHECK written against `CONTEXTSPAN_PORT` marks a container started as `serve --port 8999` unhealthy while it
serves. Here the serving process's own argv and environment are read back from /proc and resolved as the server
resolves them (flag over `CONTEXTSPAN_*` variable over default), so the probe goes where the server listens.
"""

from __future__ import annotations

import argparse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from server.settings import ServerSettings

PROBE_TIMEOUT_S = 4.0


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def health_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "", "localhost") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/healthz"


def serve_address(argv: list[str], environ: Mapping[str, str]) -> Listen | None:
    """Where a `contextspan serve ...` command line listens, or None when `argv` is not one."""
    if "serve" not in argv:
        return None
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    flags, _ = parser.parse_known_args(argv[argv.index("serve") + 1:])
    fields = ServerSettings.model_fields
    host = flags.host or environ.get("CONTEXTSPAN_HOST") or fields["host"].default
    port = flags.port if flags.port is not None else int(environ.get("CONTEXTSPAN_PORT", fields["port"].default))
    return Listen(host, port)


def processes(pids: Iterable[int] | None = None,
              proc: Path = Path("/proc")) -> Iterable[tuple[list[str], dict[str, str]]]:
    """(argv, environment) of the given processes, or of every process this user may read."""
    entries = [proc / str(pid) for pid in pids] if pids is not None else proc.iterdir()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            raw = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        yield argv, dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)


def find_server(candidates: Iterable[tuple[list[str], dict[str, str]]]) -> Listen | None:
    """The first `contextspan serve` (console script or `python -m server.cli`) among the processes."""
    for argv, environ in candidates:
        if any(Path(a).name == "contextspan" or a == "server.cli" for a in argv[:3]):
            listen = serve_address(argv, environ)
            if listen is not None:
                return listen
    return None


def health_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="contextspan health", description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, default=None, help="the serving process (default: the first found)")
    args = parser.parse_args(argv)
    defaults = ServerSettings.model_fields
    found = find_server(processes(None if args.pid is None else [args.pid]))
    listen = found or Listen(defaults["host"].default, defaults["port"].default)
    try:
        with urllib.request.urlopen(listen.health_url, timeout=PROBE_TIMEOUT_S) as response:
            ok = response.status == 200
    except OSError as exc:
        print(f"contextspan health: {listen.health_url}: {exc}")
        return 1
    print(f"contextspan health: {listen.health_url}: {'ok' if ok else 'not ok'}")
    return 0 if ok else 1
