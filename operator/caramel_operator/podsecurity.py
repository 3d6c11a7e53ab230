"""The Pod Security Standards' "restricted" profile (latest, baseline included), checked on a pod
spec before it is created.

A namespace that enforces "restricted" refuses a non-conforming pod with a 403 at creation; the
operator checks its own pods first, so that a worker template that weakens them fails the job
with InvalidSpec naming the field, instead of a gang that can never start. The rules are those
of Kubernetes' pod-security-admission `policy` package (one function per check there); no
Python library implements them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Capabilities "baseline" allows adding; "restricted" allows only NET_BIND_SERVICE.
RESTRICTED_ADDABLE_CAPABILITIES = {"NET_BIND_SERVICE"}
RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}
SECCOMP_ALLOWED = {"RuntimeDefault", "Localhost"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
}
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


@dataclass(frozen=True)
class Violation:
    field: str
    """Path within the pod spec, containers and volumes by name: containers[worker].securityContext.privileged."""
    rule: str
    """What "restricted" requires there."""

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


def restricted_violations(pod_spec: dict[str, Any], annotations: dict[str, str] | None = None) -> list[Violation]:
    """Every way the pod fails Pod Security "restricted"; empty when a restricted namespace admits it."""
    found: list[Violation] = []
    pod_security = pod_spec.get("securityContext") or {}
    containers = list(_containers(pod_spec))

    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            found.append(Violation(flag, "must be unset or false (host namespaces)"))
    if (pod_security.get("windowsOptions") or {}).get("hostProcess"):
        found.append(Violation("securityContext.windowsOptions.hostProcess", "must be unset or false"))
    for volume in pod_spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            found.append(
                Violation(f"volumes[{volume.get('name')}]", f"volume type {', '.join(sorted(kinds))} is not allowed "
                          f"(allowed: {', '.join(sorted(RESTRICTED_VOLUME_TYPES))})")
            )
    for sysctl in pod_security.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(Violation("securityContext.sysctls", f"sysctl {sysctl.get('name')} is not in the safe set"))
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/"):
            if value != "runtime/default" and not value.startswith("localhost/"):
                found.append(Violation(f"metadata.annotations[{key}]", "must be runtime/default or localhost/*"))
    found += _profile_checks("securityContext", pod_security)

    # Seccomp and runAsNonRoot may be set once for the pod, or on every container.
    pod_seccomp = (pod_security.get("seccompProfile") or {}).get("type")
    pod_non_root = pod_security.get("runAsNonRoot") is True
    for where, container in containers:
        security = container.get("securityContext") or {}
        base = f"{where}.securityContext"
        if security.get("privileged"):
            found.append(Violation(f"{base}.privileged", "must be unset or false"))
        if (security.get("windowsOptions") or {}).get("hostProcess"):
            found.append(Violation(f"{base}.windowsOptions.hostProcess", "must be unset or false"))
        if security.get("allowPrivilegeEscalation") is not False:
            found.append(Violation(f"{base}.allowPrivilegeEscalation", "must be false"))
        if security.get("procMount", "Default") != "Default":
            found.append(Violation(f"{base}.procMount", "must be unset or Default"))
        capabilities = security.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(Violation(f"{base}.capabilities.drop", "must include ALL"))
        added = set(capabilities.get("add") or []) - RESTRICTED_ADDABLE_CAPABILITIES
        if added:
            found.append(Violation(f"{base}.capabilities.add", f"may add only NET_BIND_SERVICE, not {', '.join(sorted(added))}"))
        seccomp = (security.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in SECCOMP_ALLOWED:
            found.append(Violation(f"{base}.seccompProfile.type", "must be RuntimeDefault or Localhost"))
        elif seccomp is None and pod_seccomp not in SECCOMP_ALLOWED:
            found.append(Violation(f"{base}.seccompProfile.type", "must be RuntimeDefault or Localhost, here or for the pod"))
        if security.get("runAsNonRoot") is False or (security.get("runAsNonRoot") is not True and not pod_non_root):
            found.append(Violation(f"{base}.runAsNonRoot", "must be true, here or for the pod"))
        found += _profile_checks(base, security)
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                found.append(Violation(f"{where}.ports[{port.get('name', port.get('containerPort'))}].hostPort", "must be unset or 0"))
        found += _host_in_handlers(where, container)
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_ALLOWED:
        found.append(Violation("securityContext.seccompProfile.type", "must be RuntimeDefault or Localhost"))
    return found


def _containers(pod_spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in CONTAINER_LISTS:
        for container in pod_spec.get(kind) or []:
            yield f"{kind}[{container.get('name')}]", container


def _profile_checks(base: str, security: dict[str, Any]) -> list[Violation]:
    """Checks that read the same way at pod and at container level."""
    found = []
    if security.get("runAsUser") == 0:
        found.append(Violation(f"{base}.runAsUser", "must not be 0 (root)"))
    apparmor = (security.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in SECCOMP_ALLOWED:
        found.append(Violation(f"{base}.appArmorProfile.type", "must be RuntimeDefault or Localhost"))
    selinux = security.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        found.append(Violation(f"{base}.seLinuxOptions.type", f"must be one of {', '.join(sorted(t for t in SELINUX_TYPES if t))}"))
    for field in ("user", "role"):
        if selinux.get(field):
            found.append(Violation(f"{base}.seLinuxOptions.{field}", "must be unset"))
    return found


def _host_in_handlers(where: str, container: dict[str, Any]) -> list[Violation]:
    """Probes and lifecycle hooks may not aim at another host (baseline, Kubernetes 1.34+)."""
    handlers = {probe: container.get(probe) for probe in PROBES}
    handlers |= {f"lifecycle.{hook}": (container.get("lifecycle") or {}).get(hook) for hook in ("postStart", "preStop")}
    return [
        Violation(f"{where}.{name}.{action}.host", "must be unset")
        for name, handler in handlers.items()
        for action in ("httpGet", "tcpSocket")
        if ((handler or {}).get(action) or {}).get("host")
    ]
