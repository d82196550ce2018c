"""Vision: images in the user's message, described for a model that cannot see them (the `resolve_vision` node)."""
