"""Kubernetes object names and resource quantities: the rules a setting that names an object or sizes a pod must
keep, without the Kubernetes client (the validate step checks settings with them before anything talks to a
cluster; components/kube.py and the memory fit use them too)."""

from __future__ import annotations

import re

# Kubernetes object names: claims and secrets are DNS-1123 subdomains; InferenceService names become
# Service/host names, so they must be DNS-1035 labels (start with a letter) of at most 63 characters.
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def name_error(field: str, value: str, pattern: re.Pattern, limit: int, what: str) -> str | None:
    """The error for a setting that is not a valid Kubernetes name (``what``), with a corrected suggestion."""
    if len(value) <= limit and pattern.match(value):
        return None
    suggestion = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")[:limit] or "my-name"
    return (
        f"{field}={value!r} is not a valid Kubernetes {what} (lowercase letters, digits, '-', at most {limit}); "
        f"e.g. {suggestion!r}"
    )


# Label keys and values (k8s.io/apimachinery pkg/util/validation/validation.go): a key is a qualified name, an
# optional DNS-1123 subdomain prefix of at most 253 characters and "/", then a name of at most 63 characters
# (IsQualifiedName); a value is empty or such a name (IsValidLabelValue). Node selectors and tolerations hold them.
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_key_error(field: str, key) -> str | None:
    """The error for a label key (of a node selector, a toleration) the API server rejects, or None."""
    if isinstance(key, str):
        prefix, slash, name = key.rpartition("/")
        prefix_ok = not slash or (len(prefix) <= 253 and DNS1123_SUBDOMAIN.fullmatch(prefix))
        if prefix_ok and len(name) <= 63 and QUALIFIED_NAME.fullmatch(name):
            return None
    return (
        f"{field}: key {key!r} is not a Kubernetes label key (an optional DNS subdomain prefix and '/', then at "
        "most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit), e.g. "
        "'nvidia.com/gpu.product'"
    )


def label_value_error(field: str, key, value) -> str | None:
    """The error for a label value the API server rejects (node selectors: strings only), or None."""
    if isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.fullmatch(value):
        return None
    return (
        f"{field}: {key}={value!r} is not a Kubernetes label value (a string of at most 63 letters, digits, '-', "
        "'_' or '.', beginning and ending with a letter or digit; or empty), e.g. 'NVIDIA-H100-80GB-HBM3'"
    )


# An image reference, in the grammar of the distribution project's reference package (distribution/reference,
# regexp.go: ReferenceRegexp), which container runtimes parse image names with: [domain[:port]/]path[:tag][@digest],
# path components lowercase, a name of at most 255 characters (NameTotalLengthMax).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[(?:[a-fA-F0-9:]+)\])"
IMAGE_REFERENCE = re.compile(
    rf"^(?P<name>(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?$"
)


def image_error(field: str, value: str) -> str | None:
    """The error for an image reference a container runtime cannot parse, or None."""
    match = IMAGE_REFERENCE.fullmatch(value)
    if match and len(match.group("name")) <= 255:
        return None
    return (
        f"{field}={value!r} is not an image reference ([registry[:port]/]repository[:tag][@sha256:digest], the "
        "repository in lowercase), e.g. 'ghcr.io/my-org/llm-trainer:0.4.0'"
    )


# A Kubernetes resource quantity (k8s.io/apimachinery pkg/api/resource): a non-negative decimal number and a binary
# (Ki..Ei), decimal (n, u, m, k, M..E) or exponent suffix.
QUANTITY = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][-+]?\d+)?$")
QUANTITY_FACTORS = {
    **{s: 1024**i for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
    **{s: 1000**i for i, s in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
    **{"": 1, "n": 1e-9, "u": 1e-6, "m": 1e-3},
}


def quantity(value: str) -> float | None:
    """A Kubernetes quantity's value (``"128Gi"``: bytes; ``"500m"``: 0.5), or None when it is not one."""
    match = QUANTITY.match(str(value).strip())
    if not match:
        return None
    number, suffix = match.group(1), match.group(3) or ""
    if suffix[:1] in ("e", "E") and suffix not in QUANTITY_FACTORS:
        return float(number) * 10 ** int(suffix[1:])
    return float(number) * QUANTITY_FACTORS[suffix]


# The tags of a stage's MLflow run (the trainer sets them; the publish step finds the run by them).
TRACKER_RUN_TAG, TRACKER_STAGE_TAG = "kfp_run_id", "stage"


def tracker_run_id(run_id: str, stage: str) -> str:
    """The experiment tracker's run id for one stage of one pipeline run (W&B's ``WANDB_RUN_ID``): the trainer's pods
    log into it, restarts resume it, and the publish step adds the evaluation to it. W&B takes letters, digits, ``-``
    and ``_``, at most 64 (wandb's run id check); a longer id is shortened by its hash, not cut."""
    import hashlib

    key = re.sub(r"[^A-Za-z0-9_-]", "-", f"{run_id}-{stage}")
    return key if len(key) <= 64 else f"{key[:47]}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
