"""LangChain middleware in the loop: `AgentMiddleware` hooks run inside `call_model` and
`dispatch_tools`, and their `state_schema` keys join the session state."""
