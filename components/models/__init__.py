"""Base models: resolving a model reference, and the tiny offline Qwen3 the local run trains."""
