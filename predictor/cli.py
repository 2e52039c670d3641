"""The predictor subcommands of the `agentcache` CLI: `train` and `eval-predictor`.

agentcache/cli.py adds them with ``register(sub)``. A bad input (missing file,
malformed trace, bad predictor spec) prints one line to stderr and exits with
status 2, like the other subcommands' usage errors.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentcache.predictor.base import DEFAULT_HORIZON
from agentcache.trace import Trace, read_trace

USAGE_ERROR = 2
console = Console(stderr=True)


class InputError(Exception):
    """A bad argument or input file; the handler prints it as one line and returns 2."""


def register(sub: argparse._SubParsersAction) -> None:
    """Add `train` and `eval-predictor` to the `agentcache` subcommands."""
    _add_train(sub)
    _add_eval(sub)


def _add_train(sub: argparse._SubParsersAction) -> None:
    from agentcache.predictor.training import TrainConfig

    d = TrainConfig()
    p = sub.add_parser(
        "train",
        help="train the neural predictor on traces (CPU)",
        description="Train the PBKV-style neural predictor on workflow traces, on CPU, and save it as one .pt file.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="training traces (trace format v1)")
    p.add_argument("-o", "--output", required=True, help="model file to write (.pt)")
    p.add_argument("--epochs", type=int, default=d.epochs, help="passes over the examples (default %(default)s)")
    p.add_argument(
        "--horizon", type=int, default=DEFAULT_HORIZON, help="K, the steps forecast at once (default %(default)s)"
    )
    p.add_argument(
        "--seed", type=int, default=d.seed, help="seed of initialisation and shuffling (default %(default)s)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=lambda args: _guarded("train", _run_train, args))


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval-predictor",
        help="score a predictor's K-step forecasts on a trace",
        description=(
            "Replay a trace through a predictor (observe each transition, then forecast the new state) and report "
            "per-step top-1 accuracy and log-loss, and the time per forecast."
        ),
    )
    p.add_argument("trace", help="the held-out trace to score on")
    p.add_argument(
        "--predictor", required=True, help="markov | markov-n:N | static | neural:MODEL.pt | noise:LAMBDA:<spec>"
    )
    p.add_argument("--train", nargs="+", default=[], metavar="TRACE", help="traces an online predictor observes first")
    p.add_argument("--horizon", type=int, default=DEFAULT_HORIZON, help="K for markov and static (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(run=lambda args: _guarded("eval-predictor", _run_eval, args))


def _guarded(command: str, handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except InputError as exc:
        console.print(f"agentcache {command}: {exc}", style="red", soft_wrap=True, markup=False, highlight=False)
        return USAGE_ERROR


def output_problem(path: str) -> str | None:
    """Why a command could not write the file `path` at its end (checked at its start), or None: a folder given as
    the file, or a folder that does not exist."""
    target = Path(path)
    if target.is_dir():
        return "is a directory"
    return None if target.parent.is_dir() else "no such directory"


def _read(paths: list[str]) -> list[Trace]:
    traces = []
    for path in paths:
        try:
            traces.append(read_trace(path))
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror or exc}") from None
        except ValueError as exc:  # TraceError (file:line: field: problem), or bytes that are not UTF-8
            raise InputError(str(exc) if str(exc).startswith(path) else f"{path}: {exc}") from None
    return traces


def _run_train(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError("training needs torch: pip install 'agentcache[predictor]'") from None
    from agentcache.predictor.training import TrainConfig, train_neural

    if args.epochs < 1 or args.horizon < 1:
        raise InputError("--epochs and --horizon must be >= 1")
    problem = output_problem(args.output)
    if problem is not None:
        raise InputError(f"-o {args.output}: {problem}")
    traces = _read(args.traces)
    try:
        predictor, losses = train_neural(
            traces, args.horizon, TrainConfig(epochs=args.epochs, seed=args.seed), progress=not args.quiet
        )
        predictor.save(args.output)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"-o {args.output}: {exc.strerror or exc}") from None
    console.print(
        f"wrote {args.output}: {len(predictor.agents)} agents, K={predictor.horizon}, "
        f"semantic vectors {'of ' + str(predictor.hidden_dim) if predictor.hidden_dim else 'none'}, "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} epochs",
        soft_wrap=True,
        markup=False,
    )
    return 0


def _run_eval(args: argparse.Namespace) -> int:
    from agentcache.predictor import PredictorSpec
    from agentcache.predictor.training import evaluate, warm_up

    if args.horizon < 1:
        raise InputError("--horizon must be >= 1")
    (trace,) = _read([args.trace])
    if not trace.requests:
        raise InputError(f"{args.trace}: no requests to forecast")
    training = _read(args.train)
    try:
        predictor = PredictorSpec.parse(args.predictor).build(trace.meta.call_graph, horizon=args.horizon)
    except ValueError as exc:
        raise InputError(f"--predictor: {exc}") from None
    warm_up(predictor, training)
    result = evaluate(predictor, trace, args.predictor)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    table = Table(title=Text(args.predictor))
    table.add_column("k", justify="right")
    table.add_column("top-1", justify="right")
    table.add_column("log-loss", justify="right")
    for k, (top1, loss) in enumerate(zip(result.top1, result.log_loss), start=1):
        table.add_row(str(k), f"{top1:.3f}", f"{loss:.3f}")
    out = Console()
    out.print(table)
    out.print(
        f"{args.trace}: {result.states} workflow states, "
        f"{result.infer_ms:.3f} ms per forecast ({result.infer_cpu_ms:.3f} ms CPU)",
        soft_wrap=True,
        markup=False,
    )
    return 0
