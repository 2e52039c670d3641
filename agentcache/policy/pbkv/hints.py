"""What the app's framework tells pbkv (issue 53), kept apart from what pbkv learns.

- An app's plan is the prior of its workflows' forecasts (agentcache.policy.pbkv.prior), from the app's first
  workflow. A workflow's app is the one its first request names (none: the default app, "").
- A `next` event replaces the forecast of the workflow's next step until the call arrives
  (Forecasts.told); it needs no state here.
- An `agent_done` event: the pair's latest path in the workflow will not be read again. It loses the pair's
  value, and a node of it whose every active pair is done is keyed as retired (``all_done``), until the agent
  calls again in the workflow. Its older paths (superseded, worth nothing to the pair already) stay as they were:
  the framework spoke of the context the agent has now.
"""

from __future__ import annotations

from collections import OrderedDict

from agentcache.policy.nodes import NO_LATEST, Latest, NodeTags
from agentcache.policy.pauses import Pauses
from agentcache.policy.pbkv.demand import Demand
from agentcache.policy.pbkv.forecasts import Forecasts
from agentcache.policy.pbkv.keys import EvictionKeys
from agentcache.policy.pbkv.prior import Prior
from agentcache.policy.pbkv.timing import Timing
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.predictor.base import AgentCoverage
from agentcache.tags import Tags, WorkflowKey
from agentcache.trace.model import Plan

DEFAULT_APP = ""  # the app of requests that name none
MAX_PLANS = 1024  # apps whose plan is kept; the least recently told go first


class Hints:
    """The apps' plans, each active workflow's app (where it has a plan), and the done pairs; what a hint changes
    in the policy's other parts."""

    def __init__(
        self,
        registry: WorkflowRegistry,
        timing: Timing,
        forecasts: Forecasts,
        demand: Demand,
        keys: EvictionKeys,
        pauses: Pauses,
        latest: dict[WorkflowKey, dict[str, Latest]],
    ) -> None:
        self.registry, self.timing, self.forecasts, self.demand = registry, timing, forecasts, demand
        self.keys, self.pauses, self.latest = keys, pauses, latest
        self.priors: OrderedDict[str, Prior] = OrderedDict()
        self.prior_of: dict[WorkflowKey, Prior] = {}  # active workflow -> its app's prior (apps with a plan)
        # active workflow -> its app: a plan may reach the server just after the first request it plans for
        self.app_of: dict[WorkflowKey, str] = {}
        # active workflow -> its agents whose latest paths are done, each with that path's stamp
        self.done: dict[WorkflowKey, dict[str, int]] = {}
        self.coverage = AgentCoverage("plan", "the apps' plans")

    def plan(self, app: str, plan: Plan, horizon: int) -> None:
        """The app's plan (a newer one replaces it; what the policy learned of the app stays)."""
        before = self.priors.pop(app, None)
        prior = self.priors[app] = Prior(plan, horizon, self.coverage, before.seen if before is not None else None)
        if len(self.priors) > MAX_PLANS:
            self.priors.popitem(last=False)
        for workflow, named in self.app_of.items():  # its workflows already running: from their next step on
            if named == app:
                self.prior_of[workflow] = prior

    def heard(self, tags: Tags, first: bool) -> bool:
        """A request (its workflow's `first`, which names the workflow's app); whether its agent's paths were done
        (they are read as any now)."""
        if first:
            app = self.app_of[tags.key] = tags.app_identity or DEFAULT_APP
            if self.priors:
                prior = self.priors.get(app)
                if prior is not None:
                    self.prior_of[tags.key] = prior
            return False
        return bool(self.done) and self.called(tags.key, tags.identity)

    def retired(self, workflow: WorkflowKey) -> None:
        self.prior_of.pop(workflow, None)
        self.app_of.pop(workflow, None)
        self.done.pop(workflow, None)

    def told_next(self, workflow: WorkflowKey, agents: tuple[str, ...], now: float) -> None:
        """The framework decided who makes the workflow's next call: its forecast says so until the call."""
        state = self.registry.get(workflow)
        if state is None or not state.path:
            return
        if now > self.timing.now:
            self.timing.now = now
        self.forecasts.told(state, agents, self.prior_of.get(workflow))
        pauses = self.pauses
        if workflow in pauses.open or workflow in pauses.returned:
            self.forecasts.paused(workflow, pauses.waiting(workflow))
        self.demand.update(state)

    def agent_done(self, workflow: WorkflowKey, agent: str) -> None:
        """The pair's latest path in the (active) workflow will not be read again: valued as retired until it
        calls again. An agent with no path there has nothing to value."""
        latest = self.latest.get(workflow, NO_LATEST).get(agent)
        if latest is not None:
            self.done.setdefault(workflow, {})[agent] = latest.stamp
            self.keys.invalidate(self.keys.nodes_of.get(workflow))

    def called(self, workflow: WorkflowKey, agent: str) -> bool:
        """The agent calls again in the workflow: its new path is read as any; whether it was done."""
        done = self.done.get(workflow)
        if done is None or agent not in done:
            return False
        del done[agent]
        if not done:
            del self.done[workflow]
        return True

    def all_done(self, t: NodeTags, active: dict[WorkflowKey, WorkflowState]) -> bool:
        """Whether every active workflow's pairs on `t` are done and `t` is on their done paths (and one is such),
        so `t` is as retired."""
        seen = False
        for workflow, agents in t.workflows.items():
            if workflow not in active:
                continue
            done = self.done.get(workflow)
            if done is None:
                return False
            for agent, stamp in agents.items():
                if done.get(agent) != stamp:
                    return False
            seen = True
        return seen
