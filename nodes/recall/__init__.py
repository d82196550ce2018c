"""Conversation recall: the session's archived messages, searched every round, the most relevant reaching the memory block with their date and speaker."""
