"""Prompt-cache breakpoints at the end of the stable part of a request."""
