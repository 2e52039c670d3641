"""`agentcache demo`: the bundled server, concurrent multi-agent workflows, SGLang's own caches against agentcache.

Two small agent apps written against the plain `openai` SDK (apps.py) run concurrently against the bundled
SGLang server, the same workflows for every policy: `lru` (SGLang's default) and `lfu` as plain SGLang with
`--radix-eviction-policy`, `session-lfu` as plain SGLang's session cache (`--enable-session-radix-cache`, each
workflow a session, closed at its end), and `pbkv` as the plugin with the apps wrapped in the agentcache SDK's
one decorator, whose end events all reach the server before the next run. Every policy's server starts once,
all side by side, and each run gets an empty cache (run.py); summary.py says what the runs showed.
"""
