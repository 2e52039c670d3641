"""Framework integrations: one decorator on the app's entry point, the framework's own agent names and tool calls.

    from agentcache.integrations.langgraph import workflow   # or .autogen, .crewai

    @workflow
    def run(task): ...

Every integration re-exports the SDK's `workflow` after teaching the SDK how
to read the framework's name for the agent making each LLM request (LangGraph
node, AutoGen agent, CrewAI role), which travels beside the agent's
fingerprint, and hooking the framework's own report of each tool call
(LangChain's tool callbacks, AgentChat's tool call events, CrewAI's tool
hooks), which the SDK sends as the agent's tool pause, and the framework's
plan and decisions (a LangGraph graph and its routers' answers, an AutoGen
team's speaker order, turn limit and choices, a CrewAI crew's tasks), which the
SDK sends as the app's plan, next agents and agents done. Importing an
integration never imports its framework: the name is read from the
framework's modules, and the hooks registered, only once the app has loaded
them.
"""
