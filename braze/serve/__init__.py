"""Serving: the engine that runs many sequences on one model (``engine.py``) and the
OpenAI-compatible HTTP server in front of it."""
