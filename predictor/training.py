"""Training the neural predictor on traces, and scoring any predictor on a held-out trace.

Examples: every prefix of every workflow's agent path (the empty one too, so
``predict([])`` learns how workflows start) -> its next K agents, END-padded
once the workflow ended; steps after the last request of a workflow that
never ended are unknown and carry no loss. The semantic input is the
``prompt_hidden`` of the request that ends the prefix, when it has one.

Evaluation replays a trace in order, as the policy sees it: at each request
the predictor first observes the transition it reveals, then forecasts the
workflow's new state; an end event is observed as END. Online predictors thus
score prequentially (predict, then learn), and a frozen one simply predicts.
Every state after a request is scored (the empty path is trained on, not
scored: every predictor sees it before a workflow's first request). Per step k: top-1 accuracy (the row's most likely outcome is what came k
requests later, END included) and log-loss ``-ln max(p, 1e-6)`` (the floor
keeps an outcome a predictor ruled out at ln 1e6 ~= 13.8 instead of infinity).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from agentcache.predictor.base import END, Predictor
from agentcache.trace import End, Request, Trace

if TYPE_CHECKING:
    from agentcache.predictor.neural import NeuralConfig, NeuralPredictor

PROBABILITY_FLOOR = 1e-6
UNKNOWN = -100  # target index of a step the trace does not reveal (no loss)


@dataclass(frozen=True)
class WorkflowPath:
    agents: tuple[str, ...]
    hiddens: tuple[tuple[float, ...] | None, ...]  # each request's prompt_hidden
    ended: bool

    def future(self, called: int, horizon: int) -> tuple[str | None, ...]:
        """The K agents after the first `called` requests: END once ended, None where the trace does not say."""
        after_last = END if self.ended else None
        n = len(self.agents)
        return tuple(self.agents[called + k] if called + k < n else after_last for k in range(horizon))


@dataclass(frozen=True)
class Example:
    path: tuple[str, ...]
    hidden: tuple[float, ...] | None
    targets: tuple[str | None, ...]


def workflow_paths(trace: Trace) -> dict[str, WorkflowPath]:
    """Each workflow's agents in request order, by workflow id in order of first appearance."""
    agents: dict[str, list[str]] = {}
    hiddens: dict[str, list[tuple[float, ...] | None]] = {}
    for r in trace.requests:
        agents.setdefault(r.workflow, []).append(r.agent)
        hiddens.setdefault(r.workflow, []).append(r.prompt_hidden)
    ended = trace.ended_workflows
    return {w: WorkflowPath(tuple(agents[w]), tuple(hiddens[w]), w in ended) for w in agents}


def training_examples(traces: Iterable[Trace], horizon: int) -> list[Example]:
    examples = []
    for trace in traces:
        for wf in workflow_paths(trace).values():
            for called in range(len(wf.agents) + 1):
                targets = wf.future(called, horizon)
                if targets[0] is not None:
                    hidden = wf.hiddens[called - 1] if called else None
                    examples.append(Example(wf.agents[:called], hidden, targets))
    return examples


# ---------------------------------------------------------------- evaluation


@dataclass
class Evaluation:
    predictor: str
    horizon: int
    states: int  # workflow states forecast (one after each request)
    top1: list[float]  # per step k = 1..K
    log_loss: list[float]
    infer_ms: float  # mean wall time of one predict() call
    infer_cpu_ms: float  # mean CPU time of the calling thread per predict(): immune to other processes' load

    def to_json(self) -> dict:
        """The fields as JSON values; a step no forecast could be scored at (nan) becomes null."""
        return {k: _finite(v) for k, v in asdict(self).items()}


def _finite(value: Any) -> Any:
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def warm_up(predictor: Predictor, traces: Iterable[Trace]) -> None:
    """Let an online predictor observe whole traces, in order, before it is scored."""
    for trace in traces:
        _replay(predictor, trace, forecast=False)


def evaluate(predictor: Predictor, trace: Trace, name: str | None = None) -> Evaluation:
    """Replay `trace` through `predictor` (observe, then predict) and score every forecast."""
    forecasts, wall_s, cpu_s = _replay(predictor, trace, forecast=True)
    futures = workflow_paths(trace)
    horizon = predictor.horizon
    hits, losses, counts = [0] * horizon, [0.0] * horizon, [0] * horizon
    for workflow, called, rows in forecasts:
        for k, (row, actual) in enumerate(zip(rows, futures[workflow].future(called, horizon))):
            if actual is None:
                continue
            counts[k] += 1
            hits[k] += max(row, key=row.__getitem__) == actual
            losses[k] -= math.log(max(row.get(actual, 0.0), PROBABILITY_FLOOR))
    return Evaluation(
        predictor=name or predictor.name,
        horizon=horizon,
        states=len(forecasts),
        top1=[h / c if c else math.nan for h, c in zip(hits, counts)],
        log_loss=[s / c if c else math.nan for s, c in zip(losses, counts)],
        infer_ms=1000.0 * wall_s / len(forecasts) if forecasts else math.nan,
        infer_cpu_ms=1000.0 * cpu_s / len(forecasts) if forecasts else math.nan,
    )


def _replay(predictor: Predictor, trace: Trace, *, forecast: bool) -> tuple[list[tuple[str, int, list]], float, float]:
    """Observe every transition in trace order; with `forecast`, predict each new state and time it (wall, CPU)."""
    paths: dict[str, list[str]] = {}
    forecasts = []
    wall_s = cpu_s = 0.0
    for event in trace.events:
        if isinstance(event, Request):
            path = paths.setdefault(event.workflow, [])
            predictor.observe(tuple(path), event.agent)
            path.append(event.agent)
            if forecast:
                wall, cpu = time.perf_counter(), time.thread_time()
                rows = predictor.predict(tuple(path), event.prompt_hidden)
                wall_s += time.perf_counter() - wall
                cpu_s += time.thread_time() - cpu
                forecasts.append((event.workflow, len(path), rows))
        elif isinstance(event, End):
            predictor.observe(tuple(paths.pop(event.workflow, ())), END)
    return forecasts, wall_s, cpu_s


# ---------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 40
    batch_size: int = 64
    lr: float = 3e-3
    unk_rate: float = 0.02  # share of path tokens replaced by UNK, so unknown agents get a learned embedding
    seed: int = 0


def train_neural(
    traces: Sequence[Trace],
    horizon: int = 3,
    train: TrainConfig = TrainConfig(),
    config: NeuralConfig | None = None,
    progress: bool = True,
) -> tuple[NeuralPredictor, list[float]]:
    """Fit a NeuralPredictor to `traces` with Adam on the per-step log-loss; returns it and each epoch's mean loss.

    Deterministic for a given seed: CPU, one thread (batches this small run several times slower on
    more threads), shuffling and UNK replacement drawn from one seeded generator.
    """
    import torch

    from agentcache.predictor.neural import NeuralConfig, NeuralPredictor, one_thread

    if train.epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {train.epochs}")
    examples = training_examples(traces, horizon)
    if not examples:
        raise ValueError("no training examples: the traces have no requests")
    with one_thread():
        torch.manual_seed(train.seed)
        predictor = NeuralPredictor.from_paths(
            [wf.agents for trace in traces for wf in workflow_paths(trace).values()],
            horizon,
            _hidden_dim(examples),
            config or NeuralConfig(),
        )
        losses = _fit(predictor, examples, train, progress)
    return predictor, losses


def _fit(predictor: NeuralPredictor, examples: Sequence[Example], train: TrainConfig, progress: bool) -> list[float]:
    """The training loop: Adam over shuffled mini-batches; returns each epoch's mean loss."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentcache.predictor.neural import START_ID, UNK_ID, compose_hazards

    net = predictor.net
    tokens, lengths, semantic = predictor.encode([e.path for e in examples], [e.hidden for e in examples])
    output_index = {o: i for i, o in enumerate(predictor.outputs)}
    targets = torch.tensor([[output_index[y] if y is not None else UNKNOWN for y in e.targets] for e in examples])
    if semantic is not None:
        present = semantic[semantic[:, -1] > 0, :-1]
        net.hidden_mean.copy_(present.mean(dim=0))
        net.hidden_std.copy_(present.std(dim=0, unbiased=False).clamp(min=1e-6))
    generator = torch.Generator().manual_seed(train.seed)
    optimiser = torch.optim.Adam(net.parameters(), lr=train.lr)
    epoch_losses = []
    net.train()
    columns = (TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), disable=not progress) as bar:
        task = bar.add_task("loss -", total=train.epochs)
        for _ in range(train.epochs):
            total, batches = 0.0, 0
            for batch in torch.randperm(len(examples), generator=generator).split(train.batch_size):
                batch_tokens = tokens[batch]
                unknown = (torch.rand(batch_tokens.shape, generator=generator) < train.unk_rate) & (
                    batch_tokens > START_ID
                )
                hazards = net(
                    batch_tokens.masked_fill(unknown, UNK_ID),
                    lengths[batch],
                    semantic[batch] if semantic is not None else None,
                )
                log_rows = compose_hazards(hazards)
                loss = torch.nn.functional.nll_loss(
                    log_rows.reshape(-1, log_rows.shape[-1]), targets[batch].reshape(-1), ignore_index=UNKNOWN
                )
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                total += loss.item()
                batches += 1
            epoch_losses.append(total / batches)
            bar.update(task, advance=1, description=f"loss {epoch_losses[-1]:.4f}")
    net.eval()
    return epoch_losses


def _hidden_dim(examples: Sequence[Example]) -> int:
    """The length every prompt_hidden shares (0 when none has one)."""
    dims = {len(e.hidden) for e in examples if e.hidden is not None}
    if len(dims) > 1:
        raise ValueError(f"prompt_hidden vectors of different lengths in the training traces: {sorted(dims)}")
    return dims.pop() if dims else 0
