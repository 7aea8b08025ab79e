"""The container runtime of the rehearsal's kubelet: set up one pod's view of the machine, then exec its command.

    unshare --pid --fork --kill-child=SIGKILL --mount-proc --uts --propagation private \\
        python -I -S tests/rehearsal/container.py SPEC.json

runs as PID 1 of a fresh PID, mount and UTS namespace (so killing it kills every process of the pod, as a
container's cgroup does) and, from ``SPEC.json`` written by the kubelet (tests/rehearsal/cluster.py):

1. sets the hostname to the pod's (``spec.hostname`` or the pod name), as Kubernetes does;
2. mounts an empty tmpfs over each of ``rootfs_dirs`` (``/mnt``: an image's ``/mnt`` is empty), then each
   volume at its ``mountPath``: claims as bind mounts of their folders, ``emptyDir`` (``medium: Memory``)
   as tmpfs;
3. hides the launcher's install and the claims' host folders under empty tmpfs (``hide``), binding back only
   ``keep`` (the dependency folders the trainer image borrows, tests/rehearsal/image.py);
4. changes to the working directory and ``execve``\\s ``command + args`` exactly as given, with exactly the
   given environment, ``command[0]`` looked up on the container's own ``PATH`` as runc does. No shell.

Standard library only, started with ``-I -S``: nothing of the development environment is imported here.
"""

import json
import os
import socket
import subprocess
import sys


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _which(name: str, path: str) -> str | None:
    if "/" in name:
        return name
    for folder in path.split(":"):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    socket.sethostname(spec["hostname"])
    for folder in spec["rootfs_dirs"]:
        _mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", folder)
    for m in spec["mounts"]:
        os.makedirs(m["target"], exist_ok=True)
        if m["kind"] == "tmpfs":
            _mount("-t", "tmpfs", "-o", m.get("options") or "mode=1777", "tmpfs", m["target"])
        else:
            _mount("--bind", m["source"], m["target"])
            if m.get("read_only"):
                _mount("-o", "remount,bind,ro", m["target"])
    staged = []
    for i, path in enumerate(spec["keep"]):
        stage = os.path.join(spec["staging"], str(i))
        os.makedirs(stage, exist_ok=True)
        _mount("--bind", path, stage)
        staged.append((stage, path))
    for path in spec["hide"]:
        _mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", path)
    for stage, path in staged:
        os.makedirs(path, exist_ok=True)
        _mount("--bind", stage, path)
    os.chdir(spec["working_dir"])
    argv = spec["command"] + spec["args"]
    env = dict(spec["env"])
    executable = _which(argv[0], env.get("PATH", ""))
    if executable is None:
        # runc's wording; the kubelet reports the container as StartError with exit code 128.
        print(f'exec: "{argv[0]}": executable file not found in $PATH', file=sys.stderr, flush=True)
        sys.exit(128)
    os.execve(executable, argv, env)


if __name__ == "__main__":
    main(sys.argv[1])
