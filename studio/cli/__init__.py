"""`cyrene`, the command line: turns, sessions, memory, and `cyrene studio`."""
