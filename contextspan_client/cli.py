"""`contextspan client FILE`: the client library's command line (the server's CLI hands `client ...` to it)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import sphn

from contextspan_client.client import FAST_LEAD_S, ClientError, Reply, converse, session_token
from frontend_model.frame import SAMPLE_RATE
from server.wire import protocol as p


def main(argv: Sequence[str]) -> int:
    """`contextspan client FILE`: say a recording to a server, write the agent's voice, print text and events."""
    parser = argparse.ArgumentParser(prog="contextspan client", description=main.__doc__)
    parser.add_argument("input", type=Path, help="audio file (any rate, mixed to 24 kHz mono)")
    parser.add_argument("--url", default="http://127.0.0.1:8998", help="the server's base URL")
    parser.add_argument("--token", default=None, help="a session token from POST /api/token")
    parser.add_argument("--api-key", default=None, help="or an operator API key, traded for a token first")
    parser.add_argument("--out", type=Path, default=Path("reply.wav"), help="the agent's voice, 24 kHz mono WAV")
    parser.add_argument("--fast", action="store_true", help=f"send up to {FAST_LEAD_S:g} s ahead of real time")
    parser.add_argument("--tail-s", type=float, default=3.0, help="silence after the file, for the agent's answer")
    parser.add_argument("--catch-up-s", type=float, default=10.0,
                        help="after the tail, wait at most this long for the voice of every frame sent (a busy server)")
    for name in ("persona", "voice", "user"):
        parser.add_argument(f"--{name}", default=None, help=f"the `{name}` query parameter")
    args = parser.parse_args(argv)
    query = {name: value for name in ("persona", "voice", "user") if (value := getattr(args, name)) is not None}

    def show(event: p.ServerEvent) -> None:
        print(event.model_dump_json(exclude_none=True), flush=True)

    async def run() -> Reply:
        token = args.token or (await session_token(args.url, args.api_key) if args.api_key else None)
        return await converse(args.url, args.input, token=token, lead_s=FAST_LEAD_S if args.fast else 0,
                              tail_s=args.tail_s, catch_up_s=args.catch_up_s, on_event=show, **query)

    try:
        reply = asyncio.run(run())
    except ClientError as exc:
        print(f"contextspan client: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    sphn.write_wav(str(args.out), reply.audio, SAMPLE_RATE)
    print(f"agent: {reply.text.strip()}", file=sys.stderr)
    print(f"wrote {reply.audio.size / SAMPLE_RATE:.2f} s of the agent's voice to {args.out}", file=sys.stderr)
    return 0
