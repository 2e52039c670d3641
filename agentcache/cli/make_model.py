"""`agentcache make-model`: a small random-weight model with a locally trained tokenizer, for the bundled server."""

from __future__ import annotations

import argparse

from agentcache.cli.common import console
from agentcache.server_ext.model import SIZES, make_model


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("output", help="directory to write")
    p.add_argument("--size", choices=sorted(SIZES), default="small", help="(default %(default)s)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path = make_model(args.output, args.size)
    console.print(f"wrote a {args.size} random-weight model to {path}", markup=False)
    return 0
