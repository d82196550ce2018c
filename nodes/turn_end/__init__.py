"""The end of a turn: `finish_turn` reports it and records the mood it produced."""
