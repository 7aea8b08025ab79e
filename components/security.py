"""Who the package's pods run as, and the security context that lets them into a namespace enforcing the Pod Security
Standards' ``restricted`` profile (https://kubernetes.io/docs/concepts/security/pod-security-standards/).

Every pod that writes the two claims runs as the same user and group, ``RUN_AS_USER``:``RUN_AS_GROUP``, the user
the images declare (``USER 1000:1000`` in images/*/Dockerfile): a file one step writes is one the next step may
rewrite. The trainer pods (components/train/launcher/pods.py), the serving pods
(components/deploy/manifest.py) and the pipeline's steps (pipelines/llm_finetune.py) take their settings
from here.
"""

from __future__ import annotations

# A numeric user: the kubelet can only verify runAsNonRoot against a numeric image user.
RUN_AS_USER = 1000
RUN_AS_GROUP = 1000
# The claims' group: where the volume plugin supports ownership management (block-backed and most CSI volumes; not
# NFS), the kubelet makes the volume's files group-owned by it, once (OnRootMismatch: only when the root differs).
FS_GROUP = RUN_AS_GROUP


def pod_security_context(*, fs_group: bool = False) -> dict:
    """The pod-level security context (Kubernetes JSON): non-root user and group, the runtime's seccomp profile, and
    with ``fs_group`` the claims' group."""
    context = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_GROUP,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if fs_group:
        context.update(fsGroup=FS_GROUP, fsGroupChangePolicy="OnRootMismatch")
    return context


def container_security_context(*, user: bool = False, ipc_lock: bool = False) -> dict:
    """The container-level security context (Kubernetes JSON): no privilege escalation, every capability dropped,
    non-root, the runtime's seccomp profile (the checks ``restricted`` makes of each container, also where the
    pod-level context is not ours), and with ``user`` the user and group too (where the pod level cannot carry them:
    Knative admits no pod-level security context unless its kubernetes.podspec-securitycontext feature is on).
    ``ipc_lock`` adds IPC_LOCK back, which InfiniBand/RoCE verbs need to pin memory: only a namespace enforcing the
    ``privileged`` level admits it (``baseline`` and ``restricted`` forbid adding it)."""
    context = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], **({"add": ["IPC_LOCK"]} if ipc_lock else {})},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if user:
        context.update(runAsUser=RUN_AS_USER, runAsGroup=RUN_AS_GROUP)
    return context
