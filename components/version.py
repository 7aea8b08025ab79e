"""The package version and the container images built from it.

Component code and its image never drift apart: the image tags below are derived from the package
version, and `images/*/Dockerfile` install exactly this version (tests/test_images.py checks it).
Override the registry with the ``LLM_PIPELINES_REGISTRY`` environment variable at compile time, and pin the images
by digest with ``LLM_PIPELINES_COMPONENTS_DIGEST`` and ``LLM_PIPELINES_TRAINER_DIGEST``.
"""

import os
import re

__version__ = "0.1.0"

REGISTRY = os.environ.get("LLM_PIPELINES_REGISTRY", "ghcr.io/kubeflow-llm-post-training")

# Pinning by digest: with the digests the registry reported for the pushed images in these variables at compile
# time, the compiled YAML names each image as tag@digest, which container runtimes pull by the digest (a tag can be
# pushed over; a digest cannot).
COMPONENTS_DIGEST_ENV = "LLM_PIPELINES_COMPONENTS_DIGEST"
TRAINER_DIGEST_ENV = "LLM_PIPELINES_TRAINER_DIGEST"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _pinned(image: str, env: str) -> str:
    digest = os.environ.get(env, "")
    return f"{image}@{digest}" if digest else image


def pin_errors() -> list[str]:
    """One line per digest variable set to something that is not a sha256 digest (the CLIs that compile refuse)."""
    return [
        f"{env}={value!r} is not an image digest: set it to the sha256:<64 hex digits> the registry reports for the "
        "pushed image (`crane digest IMAGE`, `docker buildx imagetools inspect IMAGE`), or unset it"
        for env in (COMPONENTS_DIGEST_ENV, TRAINER_DIGEST_ENV)
        if (value := os.environ.get(env)) and not _DIGEST.fullmatch(value)
    ]


# The image every KFP component runs in (launcher, evaluation, deploy). It has CUDA torch: evaluate_model runs the
# 30B preset's evaluation on GPUs in it (images/components/Dockerfile).
COMPONENTS_IMAGE = _pinned(f"{REGISTRY}/components:{__version__}", COMPONENTS_DIGEST_ENV)
# The image the training job's pods run: CUDA PyTorch, DeepSpeed, flash-attention, this package.
TRAINER_IMAGE = _pinned(f"{REGISTRY}/trainer:{__version__}", TRAINER_DIGEST_ENV)
