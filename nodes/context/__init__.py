"""The round's context: the model view assembled fresh every round (layout, attribution, provider encoding) and the `assemble_context` node."""
