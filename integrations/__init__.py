"""Framework integrations: one decorator on the app's entry point, and the framework's own agent names.

    from agentcache.integrations.langgraph import workflow   # or .autogen, .crewai

    @workflow
    def run(task): ...

Every integration re-exports the SDK's `workflow` after teaching the SDK how
to read the framework's name for the agent making each LLM request (LangGraph
node, AutoGen agent, CrewAI role), which travels beside the agent's
fingerprint. Importing an integration never imports its framework: the name
is read from the framework's modules (and CrewAI's hook registered) only once
the app has loaded them.
"""
