"""Kubernetes object names: the rules a setting that names an object must keep, without the Kubernetes client
(the validate step checks settings with them before anything talks to a cluster; components/kube.py uses them
too)."""

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
