"""Fallback models: the next model tried at once when the persona's model fails for good."""
