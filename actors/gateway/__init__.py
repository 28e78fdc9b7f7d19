"""The HTTP gateway process: the OpenAI-compatible API mapped onto protocol v1."""
