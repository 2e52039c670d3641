from agentcache import compiled

compiled.install()  # the policy core from its compiled build where one matches the sources (agentcache/compiled.py)
