"""Estimators that need no cluster and no GPU: the memory fit per GPU and pod (``memory``) and the plan of a run
(``plan``: seconds per step, tokens/s, the bottleneck, wall time). validate_inputs refuses what does not fit and
``python -m pipelines.run --plan`` prints the plan; the method is written up in docs/plan.md and docs/memory.md."""
