"""Talking to the Kubernetes API from inside a pipeline step."""

from __future__ import annotations

from pathlib import Path

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def current_namespace(default: str = "default") -> str:
    """The namespace this pod runs in (where KFP runs the user's steps), else ``default``."""
    try:
        return _SA_NAMESPACE.read_text().strip() or default
    except OSError:
        return default
