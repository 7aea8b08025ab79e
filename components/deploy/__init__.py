"""deploy: serve the tuned model (KServe + vLLM on a cluster, `transformers serve` locally) and smoke-test it."""
