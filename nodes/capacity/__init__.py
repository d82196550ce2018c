"""Progressive capability: tiers of tools that wake on triggers."""
