"""The offline demo world: personas, tools, seeded memories, the demo model and the scripted `cyrene demo` conversation."""
