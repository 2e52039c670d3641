"""Carrying the current workflow (and agent name) into work submitted to a thread pool."""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any

from agentcache_sdk._workflow import WorkflowContext, agent_name_var, workflow_var

# Python 3.14's InterpreterPoolExecutor is a ThreadPoolExecutor whose tasks run in another interpreter,
# where a closure over this one's objects cannot go.
_INTERPRETER_POOL = getattr(concurrent.futures, "InterpreterPoolExecutor", ())


def carry_into_thread_pools() -> None:
    """Run work submitted to a thread pool from inside a workflow in that workflow, under the same agent name.

    Executor threads do not inherit context variables. As OpenTelemetry's threading instrumentation
    does for its context, this wraps `ThreadPoolExecutor.submit` (which `map`, `loop.run_in_executor`
    and `asyncio.to_thread` go through), carrying only the SDK's own variables and only inside a
    workflow. Idempotent (done when agentcache_sdk is imported).
    """
    submit = concurrent.futures.ThreadPoolExecutor.submit
    if getattr(submit, "carries_agentcache_workflow", False):
        return

    @functools.wraps(submit)
    def submit_in_workflow(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        ctx = workflow_var.get()
        if ctx is not None and not isinstance(self, _INTERPRETER_POOL):
            fn = _in_workflow(fn, ctx, agent_name_var.get())
        return submit(self, fn, *args, **kwargs)

    submit_in_workflow.carries_agentcache_workflow = True  # type: ignore[attr-defined]
    concurrent.futures.ThreadPoolExecutor.submit = submit_in_workflow  # type: ignore[method-assign]


def _in_workflow(fn: Callable[..., Any], ctx: WorkflowContext, name: str | None) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        # Set and reset in the worker thread's own context: the thread serves other work after this task.
        workflow_token, name_token = workflow_var.set(ctx), agent_name_var.set(name)
        try:
            return fn(*args, **kwargs)
        finally:
            agent_name_var.reset(name_token)
            workflow_var.reset(workflow_token)

    return run
