"""The Pod Security Standards' checks, for pod specs rendered offline: does a pod pass ``baseline`` / ``restricted``?

    violations(pod)               # [] when the pod (Kubernetes JSON: {"metadata": ..., "spec": ...}) passes restricted
    violations(pod, "baseline")

The controls and their allowed values are the standard's, as Kubernetes defines them:
https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the Baseline and Restricted tables), and as the
Pod Security Admission controller enforces them for a namespace labelled ``pod-security.kubernetes.io/enforce``
(kubernetes/kubernetes ``staging/src/k8s.io/pod-security-admission/policy/check_*.go``, whose comments carry the
tables' text). Each check below names its control. Restricted is every baseline control plus its own. The
version-specific relaxations for user-namespaced pods (``hostUsers: false``) are not modelled: our pods never ask
for them, so the stricter reading applies.
"""

from __future__ import annotations

LEVELS = ("baseline", "restricted")

# Capabilities (baseline): what may be added, the container runtimes' default set.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
# SELinux (baseline): allowed seLinuxOptions.type values; user and role must be unset.
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Sysctls (baseline): the safe, namespaced set.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
# Volume Types (restricted): the only volume sources allowed.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SECCOMP_RESTRICTED = {"RuntimeDefault", "Localhost"}
APPARMOR_TYPES = {"RuntimeDefault", "Localhost"}


def containers(spec: dict) -> list[dict]:
    """Every container the standard checks: containers, initContainers and ephemeralContainers."""
    return [*spec.get("containers", []), *spec.get("initContainers", []), *spec.get("ephemeralContainers", [])]


def _sc(container: dict) -> dict:
    return container.get("securityContext") or {}


def _baseline(metadata: dict, spec: dict) -> list[str]:
    found = []
    pod_sc = spec.get("securityContext") or {}
    # Host Namespaces: spec.hostNetwork, spec.hostPID, spec.hostIPC: false or undefined.
    found += [f"Host Namespaces: spec.{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    # HostProcess: windowsOptions.hostProcess false or undefined (pod and containers).
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        found.append("HostProcess: pod windowsOptions.hostProcess=true")
    for c in containers(spec):
        sc, name = _sc(c), c.get("name")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"HostProcess: container {name}")
        # Privileged Containers: securityContext.privileged false or undefined.
        if sc.get("privileged"):
            found.append(f"Privileged Containers: container {name} is privileged")
        # Capabilities: add only from the default set.
        extra = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if extra:
            found.append(f"Capabilities: container {name} adds {sorted(extra)}")
        # Host Ports: hostPort 0 or undefined.
        if any(p.get("hostPort") for p in c.get("ports") or []):
            found.append(f"Host Ports: container {name} sets a hostPort")
        # /proc Mount Type: Default or undefined.
        if sc.get("procMount") not in (None, "Default"):
            found.append(f"/proc Mount Type: container {name} sets procMount={sc['procMount']}")
        # Probes / Lifecycle Hooks (v1.34+): no host field in httpGet or tcpSocket handlers.
        for where in ("livenessProbe", "readinessProbe", "startupProbe"):
            handler = c.get(where) or {}
            if any((handler.get(kind) or {}).get("host") for kind in ("httpGet", "tcpSocket")):
                found.append(f"Probes / Lifecycle Hooks: container {name} {where} sets a host")
        for hook in ((c.get("lifecycle") or {}).get(k) or {} for k in ("postStart", "preStop")):
            if any((hook.get(kind) or {}).get("host") for kind in ("httpGet", "tcpSocket")):
                found.append(f"Probes / Lifecycle Hooks: container {name} lifecycle hook sets a host")
    # HostPath Volumes: undefined.
    found += [f"HostPath Volumes: volume {v['name']}" for v in spec.get("volumes") or [] if "hostPath" in v]
    # AppArmor: RuntimeDefault or Localhost (field), runtime/default or localhost/* (annotation), or undefined.
    for key, value in (metadata.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            found.append(f"AppArmor: annotation {key}={value}")
    for who, sc in [("pod", pod_sc), *((f"container {c.get('name')}", _sc(c)) for c in containers(spec))]:
        if sc.get("appArmorProfile") and sc["appArmorProfile"].get("type") not in APPARMOR_TYPES:
            found.append(f"AppArmor: {who} appArmorProfile.type={sc['appArmorProfile'].get('type')}")
        # SELinux: type from the allowed set; user and role undefined.
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            found.append(f"SELinux: {who} seLinuxOptions={se}")
        # Seccomp (baseline): never Unconfined.
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"Seccomp: {who} seccompProfile.type=Unconfined")
    # Sysctls: only the safe set.
    found += [f"Sysctls: {s['name']}" for s in pod_sc.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]
    return found


def _restricted(spec: dict) -> list[str]:
    found = []
    pod_sc = spec.get("securityContext") or {}
    # Volume Types: configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret.
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"Volume Types: volume {v['name']} is {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_non_root = pod_sc.get("runAsNonRoot")
    if pod_non_root is False:
        found.append("Running as Non-root: pod sets runAsNonRoot=false")
    if pod_sc.get("runAsUser") == 0:
        found.append("Running as Non-root user: pod runAsUser=0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_RESTRICTED:
        found.append(f"Seccomp: pod seccompProfile.type={pod_seccomp}")
    for c in containers(spec):
        sc, name = _sc(c), c.get("name")
        # Privilege Escalation: allowPrivilegeEscalation must be false, explicitly.
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"Privilege Escalation: container {name} must set allowPrivilegeEscalation=false")
        # Running as Non-root: true at pod level (containers may leave it unset), or true in every container.
        if sc.get("runAsNonRoot") is False or (sc.get("runAsNonRoot") is None and pod_non_root is not True):
            found.append(f"Running as Non-root: pod or container {name} must set runAsNonRoot=true")
        # Running as Non-root user: runAsUser must not be 0.
        if sc.get("runAsUser") == 0:
            found.append(f"Running as Non-root user: container {name} runAsUser=0")
        # Seccomp: RuntimeDefault or Localhost, at pod level or in every container.
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if (seccomp is not None and seccomp not in SECCOMP_RESTRICTED) or (
            seccomp is None and pod_seccomp not in SECCOMP_RESTRICTED
        ):
            found.append(f"Seccomp: pod or container {name} must set seccompProfile.type RuntimeDefault or Localhost")
        # Capabilities: drop ALL; add nothing but NET_BIND_SERVICE.
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f'Capabilities: container {name} must drop ["ALL"]')
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"Capabilities: container {name} adds {sorted(set(caps['add']) - {'NET_BIND_SERVICE'})}")
    return found


def violations(pod: dict, level: str = "restricted") -> list[str]:
    """Each control of ``level`` (``baseline`` or ``restricted``, which includes baseline) that ``pod`` breaks, as
    "Control: what" lines; empty when the pod would be admitted into a namespace enforcing ``level``."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r} is not one of {LEVELS}")
    metadata, spec = pod.get("metadata") or {}, pod["spec"]
    found = _baseline(metadata, spec)
    if level == "restricted":
        found += _restricted(spec)
    return found
