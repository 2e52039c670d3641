"""PBKV-style multi-step neural predictor: one forward pass, all K rows.

Inputs of a workflow state (its path of agents so far, oldest first):

- h_cur: a GraphSAGE embedding of the current agent over the empirical
  transition graph of the training traces, ``h' = relu(W [h; mean_out(h); mean_in(h)])``
  per layer, the means weighted by transition counts (successors, predecessors);
- h_path: multi-head dot-product attention from h_cur over the last `max_path`
  agents (START first when the whole path fits), each its graph embedding plus a
  learned embedding of its distance from the end of the path;
- h_len: a learned embedding of the whole path's length (lengths beyond the
  longest seen in training share the last one), so counts past the window survive;
- h_txt: the request's semantic vector (``prompt_hidden``), standardised, with a
  presence flag; zeros when absent. A model trained on traces without any
  ignores the vectors it is given.

An MLP maps ``[h_cur; h_path; h_len; h_txt]`` to K softmaxes q_k over agents + END,
read as *hazards*: q_k is the step-k distribution given the workflow still runs
then. Rows are composed to be unconditional with END absorbing,

    s_k = prod_{j<=k} (1 - q_j(END)),  row_k(a) = s_{k-1} q_k(a),  row_k(END) = 1 - s_k,

and trained on exactly these rows' per-step log-loss (training.py). Agents are
fixed at training time; an unknown agent maps to UNK, whose embedding training
learns by replacing a few path tokens with UNK.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from agentcache.atomic import atomic_write
from agentcache.predictor.base import DEFAULT_HORIZON, END, START, Forecast, Predictor

PAD, UNK = "<PAD>", "<UNK>"
PAD_ID, UNK_ID, START_ID = 0, 1, 2  # input token ids; agents follow
FILE_FORMAT = 1


@dataclass(frozen=True)
class NeuralConfig:
    dim: int = 32  # width of every embedding
    heads: int = 2  # attention heads over the path
    sage_layers: int = 2
    mlp_hidden: int = 128
    max_path: int = 16  # agents of the path the attention sees (the latest ones)


class ForecastNet(nn.Module):
    """The network: token ids, path lengths and semantic vectors in, hazard logits [B, K, agents + END] out."""

    def __init__(
        self,
        config: NeuralConfig,
        transitions: torch.Tensor,
        n_outputs: int,
        horizon: int,
        hidden_dim: int,
        max_length: int,
    ):
        super().__init__()
        d = config.dim
        self.horizon, self.n_outputs, self.max_length = horizon, n_outputs, max_length
        self.register_buffer("out_mean", _row_normalised(transitions))  # successors' weights
        self.register_buffer("in_mean", _row_normalised(transitions.T))  # predecessors' weights
        self.node = nn.Embedding(transitions.shape[0], d)
        self.sage = nn.ModuleList(nn.Linear(3 * d, d) for _ in range(config.sage_layers))
        self.position = nn.Embedding(config.max_path, d)
        self.length = nn.Embedding(max_length + 1, d)
        if d % config.heads:
            raise ValueError(f"dim {d} is not a multiple of heads {config.heads}")
        self.heads = config.heads
        self.hidden_dim = hidden_dim
        self.register_buffer("hidden_mean", torch.zeros(hidden_dim))
        self.register_buffer("hidden_std", torch.ones(hidden_dim))
        self.semantic = nn.Linear(hidden_dim + 1, d) if hidden_dim else None  # +1: the presence flag
        features = 4 * d if hidden_dim else 3 * d
        self.mlp = nn.Sequential(
            nn.Linear(features, config.mlp_hidden), nn.ReLU(), nn.Linear(config.mlp_hidden, horizon * n_outputs)
        )

    def node_embeddings(self) -> torch.Tensor:
        """GraphSAGE over the transition graph: every input token's embedding, [tokens, dim]."""
        h = self.node.weight
        for layer in self.sage:
            h = torch.relu(layer(torch.cat([h, self.out_mean @ h, self.in_mean @ h], dim=-1)))
        return h

    def forward(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        hidden: torch.Tensor | None,
        nodes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hazard logits [B, K, agents + END]: tokens [B, L] right-aligned (PAD on the left), lengths [B],
        hidden [B, H+1] (presence flag last). compose_hazards() turns them into rows.

        `nodes` are node_embeddings() when the caller keeps them (a frozen model); computed here otherwise.
        """
        nodes = self.node_embeddings() if nodes is None else nodes
        # position row P-1-t means "t steps before the end": the last L rows line up with right-aligned tokens
        path = nodes[tokens] + self.position.weight[-tokens.shape[1] :]
        current = nodes[tokens[:, -1]]
        present = None if tokens.shape[0] == 1 else tokens != PAD_ID  # a lone row is never padded
        length = self.length.weight[lengths.clamp(max=self.max_length)]
        features = [current, attend(current, path, present, self.heads), length]
        if self.semantic is not None:
            vectors = (hidden[:, :-1] - self.hidden_mean) / self.hidden_std * hidden[:, -1:]
            features.append(self.semantic(torch.cat([vectors, hidden[:, -1:]], dim=-1)))
        return self.mlp(torch.cat(features, dim=-1)).view(-1, self.horizon, self.n_outputs)


def attend(current: torch.Tensor, path: torch.Tensor, present: torch.Tensor | None, heads: int) -> torch.Tensor:
    """Multi-head dot-product attention of the current agent over the path: current [B, d], path [B, L, d] -> [B, d].

    No projections: the embeddings are learned for this use, each head reads its own slice of them, and
    the output projection would only be folded into the MLP's first layer. `present` is False at padding.
    """
    batch, length, dim = path.shape
    query = current.view(batch, heads, 1, dim // heads)
    keys = path.view(batch, length, heads, dim // heads).transpose(1, 2)
    mask = None if present is None else present[:, None, None, :]
    return functional.scaled_dot_product_attention(query, keys, keys, attn_mask=mask).reshape(batch, dim)


def compose_hazards(logits: torch.Tensor) -> torch.Tensor:
    """Per-step hazard logits [B, K, O] (END last) -> unconditional log rows with END absorbing.

    log row_k(a) = log s_{k-1} + log q_k(a) and log row_k(END) = logsumexp_{j<=k}(log s_{j-1} + log q_j(END)),
    which equals log(1 - s_k) without ever subtracting probabilities.
    """
    log_q = torch.log_softmax(logits, dim=-1)
    log_alive = torch.logsumexp(log_q[..., :-1], dim=-1)  # log(1 - q_k(END))
    log_survival = torch.cumsum(log_alive, dim=-1)
    log_before = torch.cat([torch.zeros_like(log_survival[:, :1]), log_survival[:, :-1]], dim=-1)  # log s_{k-1}
    agents = log_before.unsqueeze(-1) + log_q[..., :-1]
    ended = torch.logcumsumexp(log_before + log_q[..., -1], dim=-1)
    return torch.cat([agents, ended.unsqueeze(-1)], dim=-1)


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread inside the block, then restore the caller's setting.

    This model's ops are tiny: on more threads each becomes an OpenMP region, and under CPU
    contention a forecast measured 10-40x slower (milliseconds instead of a fraction of one).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _row_normalised(counts: torch.Tensor) -> torch.Tensor:
    totals = counts.sum(dim=1, keepdim=True)
    return torch.where(totals > 0, counts / totals.clamp(min=1e-12), torch.zeros_like(counts))


class NeuralPredictor(Predictor):
    """Wraps a ForecastNet with its vocabulary; `predict` runs one state through it, on one thread.

    `observe` is a no-op: the model is trained offline (training.py) and frozen in
    the policy, where a per-transition gradient step would cost more than the
    forecast and drift without a held-out check. Retrain on fresh traces instead.
    Frozen also means the node embeddings are computed once, at the first forecast.
    """

    name = "neural"
    learns_online = False

    def __init__(
        self,
        agents: Sequence[str],
        transitions: torch.Tensor,
        horizon: int = DEFAULT_HORIZON,
        hidden_dim: int = 0,
        max_length: int = 64,
        config: NeuralConfig = NeuralConfig(),
    ):
        super().__init__(horizon)
        if len(set(agents)) != len(agents) or {PAD, UNK, START, END} & set(agents):
            raise ValueError("agents must be distinct and must not use the reserved names PAD, UNK, START or END")
        self.agents = list(agents)
        self.outputs = self.agents + [END]
        self.token_of = {a: i + START_ID + 1 for i, a in enumerate(self.agents)}
        self.config = config
        self.net = ForecastNet(config, transitions, len(self.outputs), horizon, hidden_dim, max_length)
        self.net.eval()
        self._nodes: torch.Tensor | None = None  # the frozen net's node embeddings, computed at the first predict
        self.source = "the neural model"

    def knows(self, agent: str) -> bool:
        return agent in self.token_of

    def known_agents(self) -> list[str]:
        return self.agents

    @classmethod
    def from_paths(
        cls,
        paths: Sequence[Sequence[str]],
        horizon: int = DEFAULT_HORIZON,
        hidden_dim: int = 0,
        config: NeuralConfig = NeuralConfig(),
    ) -> NeuralPredictor:
        """An untrained predictor whose vocabulary and transition graph come from workflows' agent paths."""
        agents = sorted({a for path in paths for a in path})
        if not agents:
            raise ValueError("no agents to learn from: the training traces have no requests")
        n_tokens = START_ID + 1 + len(agents)
        index = {a: i + START_ID + 1 for i, a in enumerate(agents)}
        transitions = torch.zeros(n_tokens, n_tokens)
        for path in paths:
            tokens = [START_ID] + [index[a] for a in path]
            for a, b in zip(tokens, tokens[1:]):
                transitions[a, b] += 1.0
        max_length = max(len(p) for p in paths)
        return cls(agents, transitions, horizon, hidden_dim, max_length, config)

    @property
    def hidden_dim(self) -> int:
        return self.net.hidden_dim

    # -- encoding

    def encode(
        self, paths: Sequence[Sequence[str]], hiddens: Sequence[Sequence[float] | None]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Token ids [B, L] (the last `max_path` of START + path, PAD-left), lengths [B], semantic input [B, H+1]."""
        window = self.config.max_path
        rows = []
        for path in paths:
            tokens = [START_ID] + [self.token_of.get(a, UNK_ID) for a in path[-window:]]
            rows.append(tokens[-window:])
        width = max(len(r) for r in rows)
        tokens = torch.tensor([[PAD_ID] * (width - len(r)) + r for r in rows], dtype=torch.long)
        lengths = torch.tensor([len(p) for p in paths], dtype=torch.long)
        if not self.hidden_dim:
            return tokens, lengths, None
        semantic = torch.zeros(len(paths), self.hidden_dim + 1)
        for i, vector in enumerate(hiddens):
            if vector is not None:
                if len(vector) != self.hidden_dim:
                    raise ValueError(f"prompt_hidden has {len(vector)} numbers; this model takes {self.hidden_dim}")
                semantic[i, :-1] = torch.tensor(vector, dtype=torch.float32)
                semantic[i, -1] = 1.0
        return tokens, lengths, semantic

    # -- the Predictor interface

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        with one_thread(), torch.inference_mode():
            if self._nodes is None:
                self._nodes = self.net.node_embeddings()
            hazards = torch.softmax(self.net(*self.encode([path], [hidden]), self._nodes)[0], dim=-1).tolist()
        return self.compose_rows(hazards)

    def compose_rows(self, hazards: list[list[float]]) -> Forecast:
        """compose_hazards() in probability space, for one state: cheaper than tensors at this size."""
        rows: Forecast = []
        survival, ended = 1.0, 0.0
        for q in hazards:
            row = {agent: survival * p for agent, p in zip(self.agents, q)}
            ended += survival * q[-1]
            survival *= 1.0 - q[-1]
            row[END] = ended
            rows.append(row)
        return rows

    # -- files

    def save(self, path: str | Path) -> None:
        """One .pt file: state dict, vocabulary and configuration; written whole or not at all (a server starts
        from it, and a kill mid-write must leave the old file, not a torn one)."""
        with atomic_write(path, "wb") as fh:
            torch.save(
                {
                    "format": FILE_FORMAT,
                    "agents": self.agents,
                    "horizon": self.horizon,
                    "hidden_dim": self.hidden_dim,
                    "max_length": self.net.max_length,
                    "config": asdict(self.config),
                    "state_dict": self.net.state_dict(),
                },
                fh,
            )

    @classmethod
    def load(cls, path: str | Path) -> NeuralPredictor:
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise ValueError(f"no neural predictor file at {path}") from None
        except Exception as exc:
            raise ValueError(f"{path} is not a neural predictor file ({exc.__class__.__name__})") from None
        if not isinstance(saved, dict) or saved.get("format") != FILE_FORMAT:
            raise ValueError(f"{path} is not a neural predictor file of format {FILE_FORMAT}")
        try:
            state = saved["state_dict"]
            predictor = cls(
                saved["agents"],
                torch.zeros_like(state["out_mean"]),
                saved["horizon"],
                saved["hidden_dim"],
                saved["max_length"],
                NeuralConfig(**saved["config"]),
            )
            predictor.net.load_state_dict(state)
        except (KeyError, TypeError, RuntimeError) as exc:
            raise ValueError(f"{path} is a damaged neural predictor file ({exc.__class__.__name__}: {exc})") from None
        predictor.source = f"the neural model {path}"
        return predictor
