"""The SGLang plugin: agentcache inside an unmodified SGLang 0.5.23 server.

Loaded through the ``sglang.srt.plugins`` entry point (plugin.py). Importing
this package imports nothing from SGLang; its modules do.
"""
