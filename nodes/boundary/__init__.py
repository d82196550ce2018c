"""The boundary: what a run may bring in, checked once before any node runs."""
