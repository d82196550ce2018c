"""Tool calls: which tools are offered, the `dispatch_tools` node, the caller's hooks, the round limit and replies fit to store."""
