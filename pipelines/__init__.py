"""The pipeline, its presets and entry points (compile, run, submit, local)."""

# The pipeline's name: in the compiled YAML, the KFP UI, and kfp.local's run folders (``<name>-<timestamp>``).
PIPELINE_NAME = "llm-finetune"
