"""Request and response guards around each model call."""
