"""`contextspan serve` and `contextspan bench {load,span}`: flags mirror ServerSettings field by field."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from server.settings import ServerSettings


def _flag_type(annotation: Any) -> Any:
    if get_origin(annotation) is Literal:
        return annotation
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field; unset flags fall back to CONTEXTSPAN_* env vars, then the defaults."""
    for name, info in ServerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind = _flag_type(info.annotation)
        help_text = f"{info.description or ''} (env CONTEXTSPAN_{name.upper()}, default {info.default})"
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        elif get_origin(kind) is Literal:
            parser.add_argument(flag, dest=name, choices=get_args(kind), default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=Path if kind is Path else kind, default=None,
                                help=help_text)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    given = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields and v is not None}
    return ServerSettings(**given)


def serve(settings: ServerSettings) -> int:
    import uvicorn

    from server.app import create_app

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
        ws_max_size=settings.max_message_bytes, ws="websockets-sansio", lifespan="on",
    )
    uvicorn.Server(config).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="contextspan", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the real-time WebSocket server")
    add_settings_flags(serve_parser)
    bench = commands.add_parser("bench", help="benchmarks: `load` (server load test), `span` (span latency)")
    bench.add_argument("which", choices=["load", "span"])
    if argv[:1] == ["bench"] and len(argv) > 1:
        # The benchmark modules own their flags.
        module = {"load": "benchmarks.load_test", "span": "benchmarks.span_latency"}.get(argv[1])
        if module is not None:
            return int(importlib.import_module(module).main(argv[2:]))
    args = parser.parse_args(argv)
    return serve(settings_from_args(args))


if __name__ == "__main__":
    sys.exit(main())
