"""`contextspan serve`, `ask`, `infer` (flags mirror ServerSettings field by field), `client`, `health`, `train`,
`distil`, `bench ...`."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from server.ops.json_logging import configure_logging
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
        elif get_origin(info.annotation) is list:  # repeat the flag once per item
            item = get_args(info.annotation)[0]
            choices = get_args(item) if get_origin(item) is Literal else None
            parser.add_argument(flag, dest=name, action="append", type=str if choices else item, choices=choices,
                                default=None, help=f"{info.description or ''} (env CONTEXTSPAN_{name.upper()} as a "
                                "JSON list; repeatable)")
        elif get_origin(kind) is Literal:
            parser.add_argument(flag, dest=name, choices=get_args(kind), default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=Path if kind is Path else kind, default=None,
                                help=help_text)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    given = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields and v is not None}
    return ServerSettings(**given)


BENCHMARKS = {"load": "benchmarks.load_test", "span": "benchmarks.span_latency",
              "retrieval": "benchmarks.retrieval_latency", "batch": "benchmarks.batch_ticks", "soak": "benchmarks.soak",
              "faults": "benchmarks.fault_isolation", "qa": "benchmarks.qa", "levelling": "benchmarks.user_levelling",
              "behaviour": "benchmarks.behaviour", "copy": "benchmarks.copying",
              "layout": "benchmarks.checkpoint_layout", "kyutai": "benchmarks.kyutai_baseline",
              "frameworks": "benchmarks.realtime_frameworks", "window": "benchmarks.window",
              "resume": "benchmarks.resume", "asr": "benchmarks.asr_settings", "asks": "benchmarks.asking",
              "hear": "benchmarks.hearing", "gc": "benchmarks.gc_pause"}


def serve(settings: ServerSettings) -> int:
    from server.app.draining import DrainingServer
    from server.app.routes import create_app
    from server.guard.auth import public_bind_problem

    configure_logging(settings.log_level, settings.log_json)
    problem = public_bind_problem(settings.host, settings.api_keys, settings.allow_public_without_auth)
    if problem is not None:
        print(f"contextspan: {problem}", file=sys.stderr)
        return 2
    app = create_app(settings)
    server = DrainingServer(app, settings)
    server.run()
    return server.exit_code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="contextspan", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the real-time WebSocket server")
    add_settings_flags(serve_parser)
    ask_parser = commands.add_parser("ask", help="print, as JSON, the span the agent would inject for a question")
    ask_parser.add_argument("question")
    ask_parser.add_argument("--timezone", default=None, help="the asking user's IANA timezone")
    add_settings_flags(ask_parser)
    infer_parser = commands.add_parser("infer", help="run a WAV through the engine and the agent at the frame clock")
    infer_parser.add_argument("input", type=Path, help="audio file (any rate, mixed to 24 kHz mono)")
    infer_parser.add_argument("--out", type=Path, required=True, help="stereo WAV: left user, right agent")
    infer_parser.add_argument("--events", type=Path, default=None, help="JSON list of events with stream time")
    infer_parser.add_argument("--ret-frames", default="", help="comma-separated frames at which to act as <ret>")
    infer_parser.add_argument("--realtime", action="store_true", help="pace frames at 80 ms instead of flat out")
    add_settings_flags(infer_parser)
    bench = commands.add_parser("bench", help=f"benchmarks: {', '.join(f'`{name}`' for name in BENCHMARKS)}")
    bench.add_argument("which", choices=list(BENCHMARKS))
    commands.add_parser("client", help="say an audio file to a server: write the agent's voice, print its events")
    commands.add_parser("health", help="probe /healthz of the server running here, on the port it was told")
    commands.add_parser("train", help="train (or take from the cache) the tiny Context Spanning model: --out DIR")
    if argv[:1] == ["train"]:  # the trainer owns its flags
        from frontend_model.training.command import train_main

        return train_main(argv[1:])
    commands.add_parser("distil", help="distil (or take from the cache) the tiny codec from Whisper: --out DIR")
    if argv[:1] == ["distil"]:
        from frontend_model.training.codec.command import distil_main

        return distil_main(argv[1:])
    if argv[:1] == ["client"]:  # the client owns its flags, and needs no server settings
        from contextspan_client.cli import main as client_main

        return client_main(argv[1:])
    if argv[:1] == ["health"]:
        from server.ops.health import health_main

        return health_main(argv[1:])
    if argv[:1] == ["bench"] and len(argv) > 1 and argv[1] in BENCHMARKS:
        # The benchmark modules own their flags.
        return int(importlib.import_module(BENCHMARKS[argv[1]]).main(argv[2:]))
    args = parser.parse_args(argv)
    settings = settings_from_args(args)
    if args.command == "ask":
        from server.offline.ask import ask

        print(json.dumps(asyncio.run(ask(settings, args.question, args.timezone)), indent=2))
        return 0
    if args.command == "infer":
        from server.offline.infer import infer

        ret_frames = {int(f) for f in args.ret_frames.split(",") if f.strip()}
        return infer(settings, args.input, args.out, args.events, ret_frames, args.realtime)
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
