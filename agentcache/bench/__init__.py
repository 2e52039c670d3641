"""`agentcache bench`: a workload as real concurrent requests against the bundled server, once per policy, fairly.

Fair means what a timing on a shared machine needs to be believed:

- every run starts a fresh server (nothing learned or cached carries over) and warms it up with
  requests that share nothing with the workload, then empties its cache;
- policies run in alternating order over the repetitions (forward, then backward, ...), so no policy
  always runs first on a cold machine or last on a hot one;
- each figure is the median over repetitions with its min and max, and ratios are taken per
  repetition, between runs that ran next to each other.

SGLang's own strategies run exactly as a user would run them: a plain SGLang server, without the
agentcache plugin, started with ``--radix-eviction-policy NAME`` (``lru`` is SGLang's default); its
session cache (``session-lru``, ``session-lfu``) is that server with ``--enable-session-radix-cache`` too.
agentcache's policies run on the server with the plugin (``agentcache serve``).

A trace (format v1) drives the requests: each workflow is a coroutine that sends its requests in
order, at the trace's (scaled) send times but never before its previous request finished, through
``/generate`` with token ids made from the segments (the same content id always gives the same ids)
and streamed, so the time to the first token is measured. End events go to the plugin's control route;
with SGLang's session cache each workflow is a session (its requests carry it as the top-level
``session_id``) and its End closes it (``POST /close_session``); a plain server without sessions hears
none. The model's own output replaces the trace's outputs,
so output reuse does not carry over: prompts are reused, generated text is not.

Figures per run: hit rate and prompt tokens the server computed (from the server's own usage
report per request), time to first token and request latency (median over the run's requests), and
the run's completion time (first request sent to last answer).

On the plugin, ``--client-form`` names each request's workflow (and ends it) in other clients' forms too
(SGLang's session_id and agent_hints, Dynamo's headers or nvext, coding agents' session headers, ...): a run
each, ``POLICY via FORM``, to set against ours (``forms``).

The modules, by job: ``workload`` turns a trace into timed, streamed requests; ``forms`` writes a request's
workflow in each client's form;
``runs`` holds a run's figures and their medians over repetitions; ``runner``
starts the fresh servers and measures each (repetition, policy); ``progress``
shows where a bench is while it runs; ``report`` says it in sentences and a plot.
"""
