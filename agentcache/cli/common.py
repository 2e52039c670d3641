"""What every `agentcache` command shares: its usage error, its console (stderr), and its early checks."""

from __future__ import annotations

from rich.console import Console

from agentcache.predictor.cli import output_problem
from agentcache.predictor.markov import DEFAULT_ORDER

console = Console(stderr=True)  # on stderr: a command's --json output alone goes to stdout
DEFAULT_PREDICTOR = f"markov-n:{DEFAULT_ORDER}"  # pbkv's own default forecaster


class UsageError(Exception):
    """A bad argument or input file: printed as one line, exit status 2."""


def check_server_flags(port: int, capacity: int | None, capacity_flag: str = "--capacity") -> None:
    """What a command that starts a server takes: said before SGLang starts (tens of seconds), not after as its
    traceback, or not at all (a port past 65535 was reported as served)."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be in 1-65535, got {port}")
    if capacity is not None and capacity < 1:
        raise UsageError(f"{capacity_flag} must be >= 1 token, got {capacity}")


def check_output(flag: str, path: str | None) -> None:
    """A file the command writes at its end, checked at its start: a missing folder made a whole run end in a
    traceback, and a folder given as the file was written beside it (matplotlib: `<folder>.png`)."""
    problem = None if path is None else output_problem(path)
    if problem is not None:
        raise UsageError(f"{flag} {path}: {problem}")


def live_policies(text: str, flag: str) -> list:
    """The policies `text` names, for a command that runs them on a live server (bench, demo): a usage error
    names `flag` for a name it does not know and for one that cannot run live."""
    from agentcache.bench.runner import live_refusal  # the live commands' module, not every command's
    from agentcache.policy import PolicyConfigError, parse_policies

    try:
        specs = parse_policies(text)
    except PolicyConfigError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    for spec in specs:
        refusal = live_refusal(spec)
        if refusal is not None:
            raise UsageError(f"{flag}: {refusal}")
    return specs
