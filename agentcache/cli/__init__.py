"""The `agentcache` command line: one module per command, loaded once the command is known.

`main` imports nothing beyond the standard library until it knows the command, so `agentcache --help` is
instant and works on the base install; a command whose extra is not installed says which to install.
Each command module has `configure(parser)`, which gives the command's parser its description, arguments and
`run` (what the command does: 0 on success, 2 on a usage error).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

USAGE_ERROR = 2


@dataclass(frozen=True)
class Command:
    module: str
    help: str
    extras: tuple[str, ...]  # what it needs beyond the base install, most likely missing first


# In the order `agentcache --help` lists them. The predictor's module adds both its commands at once.
COMMANDS = {
    "gen": Command("agentcache.cli.gen", "generate a synthetic workflow trace", ("cli",)),
    "replay": Command(
        "agentcache.cli.replay", "replay a trace through SGLang's radix cache per policy", ("cli", "server")
    ),
    "serve": Command("agentcache.cli.serve", "start SGLang with the agentcache plugin", ("server", "cli")),
    "make-model": Command(
        "agentcache.cli.make_model",
        "write a small random-weight model with a locally trained tokenizer",
        ("server", "cli"),
    ),
    "demo": Command(
        "agentcache.cli.demo",
        "run concurrent multi-agent workflows against the bundled server, SGLang's strategies vs pbkv, measured fairly",
        ("cli", "server"),
    ),
    "bench": Command(
        "agentcache.cli.bench",
        "live benchmark: a workload as real requests against the bundled server, per policy, measured fairly",
        ("cli", "server"),
    ),
    "train": Command("agentcache.predictor.cli", "train the neural predictor on traces (CPU)", ("cli", "predictor")),
    "eval-predictor": Command(
        "agentcache.predictor.cli", "score a predictor's K-step forecasts on a trace", ("cli", "predictor")
    ),
}
PREDICTOR_MODULE = "agentcache.predictor.cli"  # adds its commands itself: `register(subparsers)`

# The top-level modules each extra installs that agentcache imports (pyproject.toml's optional dependencies, and
# what SGLang brings with it).
EXTRA_MODULES = {
    "cli": frozenset({"rich", "matplotlib", "numpy", "openai", "mypy_extensions"}),
    "server": frozenset({"sglang", "sglang_router", "prometheus_client", "torch", "transformers", "tokenizers"}),
    "predictor": frozenset({"torch"}),
}
# The server extra installs SGLang for GPU machines; on a CPU-only machine the repository's setup script does.
EXTRA_NOTES = {"server": " (without a GPU: bash scripts/setup.sh)"}


def missing_extra(command: str, exc: ModuleNotFoundError) -> str | None:
    """What to say where `command` could not import a module: the extra to install; None for a module that no
    extra provides (a bug, to be shown whole)."""
    root = (exc.name or "").partition(".")[0]
    for extra in COMMANDS[command].extras:
        if root in EXTRA_MODULES[extra]:
            return (
                f"agentcache {command} needs the '{extra}' extra (no module named '{root}'):"
                f" pip install 'agentcache[{extra}]'{EXTRA_NOTES.get(extra, '')}"
            )
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command listed with its help; `command`'s parser (and only its) configured in full."""
    parser = argparse.ArgumentParser(
        prog="agentcache", description="Workflow-aware KV-cache management for multi-agent LLM serving."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    predictor_chosen = command is not None and COMMANDS[command].module == PREDICTOR_MODULE
    for name, spec in COMMANDS.items():
        if predictor_chosen and spec.module == PREDICTOR_MODULE:
            if name not in sub.choices:  # the first of them: `register` adds them all
                importlib.import_module(PREDICTOR_MODULE).register(sub)
            continue
        p = sub.add_parser(name, help=spec.help)
        if name == command:
            importlib.import_module(spec.module).configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from agentcache.engine.sglang_warnings import ignore_sglang_gpu_only_warnings

    ignore_sglang_gpu_only_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    # The top-level parser takes no option but --help: the command is the first word that is no option.
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None  # argparse answers: the usage, or the list of commands
    try:
        args = build_parser(command).parse_args(argv)
        return _run(args)
    except ModuleNotFoundError as exc:
        missing = missing_extra(command, exc) if command else None
        if missing is None:
            raise
        print(missing, file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    from agentcache.cli.common import UsageError, console

    try:
        return args.run(args)
    except UsageError as exc:
        console.print(f"agentcache {args.command}: {exc}", style="red", soft_wrap=True, markup=False, highlight=False)
        return USAGE_ERROR
