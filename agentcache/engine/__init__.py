"""The engine layer: the policy core adapted to SGLang's cache classes, and nothing else.

Both the server plugin (``agentcache.server_ext``, inside SGLang's scheduler)
and the replay (``agentcache.replay``, SGLang's cache driven from a trace) run
this code, so the replay measures exactly what the server runs. It imports
SGLang and the policy core; nothing here imports the plugin or the replay.
"""
