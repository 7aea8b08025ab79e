"""The pipeline's arguments as KFP hands them to its first step."""

from components.settings import split_arguments
from pipelines import params as P


def reference_arguments(**overrides) -> dict:
    """The pipeline's arguments for the reference preset: what KFP hands validate_inputs."""
    params = P.resolve("qwen3-30b-a3b-full", overrides=[f"{k}={v}" for k, v in overrides.items()])
    return split_arguments(params)
