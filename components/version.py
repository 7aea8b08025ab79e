"""The package version and the container images built from it.

Component code and its image never drift apart: the image tags below are derived from the package
version, and `images/*/Dockerfile` install exactly this version (tests/test_images.py checks it).
Override the registry with the ``LLM_PIPELINES_REGISTRY`` environment variable at compile time.
"""

import os

__version__ = "0.1.0"

REGISTRY = os.environ.get("LLM_PIPELINES_REGISTRY", "ghcr.io/kubeflow-llm-post-training")

# The image every KFP component runs in (launcher, evaluation, deploy). It has CUDA torch: evaluate_model runs the
# 30B preset's evaluation on GPUs in it (images/components/Dockerfile).
COMPONENTS_IMAGE = f"{REGISTRY}/components:{__version__}"
# The image the training job's pods run: CUDA PyTorch, DeepSpeed, flash-attention, this package.
TRAINER_IMAGE = f"{REGISTRY}/trainer:{__version__}"
