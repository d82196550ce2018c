"""Thinking: per-persona thinking knobs, and a model's thinking kept out of the user's stream."""
