"""The launcher: create (or re-attach to) the PyTorchJob, follow it to the end, report or raise.

    python -m components.train.launch --run-id RUN --config-path /mnt/models/runs/RUN/train/train_config.json \\
        --num-nodes 2 --gpus-per-node 8 --data-pvc llm-data --model-pvc llm-models [--dry-run]

A launcher is never fire-and-forget: the job's name comes from the run id, so a retried launcher pod finds
the job it created instead of starting a second one; pods that cannot start (bad image, missing config,
no GPUs free) fail the step in minutes rather than hours; every pod's log lines are printed once, prefixed
with the pod name; a failure raises with the job's reason and the end of the Master's log; cancelling the
KFP run (SIGTERM) deletes the job. Transient API errors (5xx, 429, dropped connections) are retried.

The API retries, pod start checks and log following live in components/kube.py, shared with the deployer.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from contextlib import contextmanager

from kubeflow.training.constants import constants as kfc
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import PodLogFollower, call_api, load_api_client, unstartable_pod_reason

FAILURE_TAIL_LINES = 20
_GROUP, _VERSION, _PLURAL = kfc.GROUP, kfc.VERSION, kfc.PYTORCHJOB_PLURAL


class _Cancelled(BaseException):
    """SIGTERM arrived: KFP cancelled the run (a BaseException so no ``except Exception`` swallows it)."""


@contextmanager
def _sigterm_cancels():
    """Turn SIGTERM into ``_Cancelled`` while the block runs; restore the previous handler afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the clean-up
        raise _Cancelled()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # None: the previous handler was not installed from Python; the default is what it did.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _condition(job: dict, kind: str) -> dict | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _latest_state(job: dict) -> str:
    true = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    return true[-1]["type"] if true else "Pending"


def run_pytorchjob(manifest: dict, *, poll_seconds: float = 10.0, timeout_seconds: float | None = None,
                   pending_timeout_seconds: float = 900.0, api_client=None) -> dict:
    """Create the PyTorchJob in ``manifest`` (or re-attach to it), follow it to the end and report.

    Args:
        manifest: from ``build_pytorchjob``; its name and namespace identify the job.
        poll_seconds: interval between status, pod and log polls.
        timeout_seconds: give up (and delete the job) after this long; None waits for as long as it runs.
        pending_timeout_seconds: how long a pod may stay Unschedulable before the job is given up.
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.

    Returns:
        ``{"name", "namespace", "state": "Succeeded", "reason", "message"}`` from the job's condition.

    Raises:
        RuntimeError: the job failed (its reason, message and the Master's last log lines), or a pod cannot
            start (the container's or the scheduler's reason; the job is deleted to free what it holds).
        TimeoutError: ``timeout_seconds`` passed (the job is deleted).
        SystemExit: 143 after SIGTERM, once the job is deleted.
    """
    api_client = api_client or load_api_client()
    custom, core = k8s.CustomObjectsApi(api_client), k8s.CoreV1Api(api_client)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    retry_delay = min(1.0, poll_seconds)
    ref = (_GROUP, _VERSION, namespace, _PLURAL)

    def delete_job(why: str) -> None:
        print(f"deleting PyTorchJob {namespace}/{name}: {why}", flush=True)
        try:
            call_api(custom.delete_namespaced_custom_object, *ref, name, retry_delay=retry_delay,
                     body=k8s.V1DeleteOptions(propagation_policy="Background"))
        except ApiException as exc:
            if exc.status != 404:
                raise

    logs = PodLogFollower(core, namespace, kfc.PYTORCHJOB_CONTAINER, out=lambda s: print(s, flush=True),
                          retry_delay=retry_delay)
    master = f"{name}-{kfc.REPLICA_TYPE_MASTER.lower()}-0"  # the operator's pod naming
    selector = f"{kfc.JOB_NAME_LABEL}={name}"
    unschedulable_since: dict = {}
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    state = None
    with _sigterm_cancels():
        try:
            try:
                call_api(custom.create_namespaced_custom_object, *ref, manifest, retry_delay=retry_delay)
                print(f"created PyTorchJob {namespace}/{name}", flush=True)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # The launcher pod was retried (or a dropped response hid our own create): same run, same job.
                print(f"PyTorchJob {namespace}/{name} already exists: re-attaching to it", flush=True)
            while True:
                try:
                    job = call_api(custom.get_namespaced_custom_object, *ref, name, retry_delay=retry_delay)
                except ApiException as exc:
                    if exc.status == 404:
                        raise RuntimeError(f"PyTorchJob {namespace}/{name} was deleted while it ran") from None
                    raise
                # Status before logs: once the job reports an end, the logs fetched after it are complete.
                pods = call_api(core.list_namespaced_pod, namespace, label_selector=selector,
                                retry_delay=retry_delay).items
                pods.sort(key=lambda p: (p.metadata.name != master, p.metadata.name))
                logs.poll(pods)
                if state != _latest_state(job):
                    state = _latest_state(job)
                    print(f"PyTorchJob {namespace}/{name}: {state}", flush=True)
                if done := _condition(job, kfc.JOB_CONDITION_SUCCEEDED):
                    return {"name": name, "namespace": namespace, "state": kfc.JOB_CONDITION_SUCCEEDED,
                            "reason": done.get("reason", ""), "message": done.get("message", "")}
                if failed := _condition(job, kfc.JOB_CONDITION_FAILED):
                    tail = logs.tail(master, FAILURE_TAIL_LINES)
                    raise RuntimeError(
                        f"PyTorchJob {namespace}/{name} failed: {failed.get('reason', '')}: {failed.get('message', '')}"
                        + (f"\nlast {FAILURE_TAIL_LINES} lines of {master}:\n{tail}" if tail else "")
                    )
                if why := unstartable_pod_reason(pods, unschedulable_since, pending_timeout_seconds):
                    delete_job(why)
                    raise RuntimeError(f"PyTorchJob {namespace}/{name} cannot start: {why}")
                if deadline is not None and time.monotonic() > deadline:
                    delete_job(f"still {state} after {timeout_seconds:.0f}s")
                    raise TimeoutError(f"PyTorchJob {namespace}/{name} did not finish within {timeout_seconds:.0f}s "
                                       f"(last state {state})")
                time.sleep(poll_seconds)
        except _Cancelled:
            delete_job("the run was cancelled (SIGTERM)")
            raise SystemExit(128 + signal.SIGTERM) from None


def _json_arg(text: str, kind: type, flag: str):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} is not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{flag} must be a JSON {'object' if kind is dict else 'list'}, got {text!r}")
    return value


def make_parser() -> argparse.ArgumentParser:
    """The launcher's command line."""
    from components.version import TRAINER_IMAGE

    p = argparse.ArgumentParser(prog="python -m components.train.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-id", required=True, help="KFP run id; names the job (sft-<run id>)")
    p.add_argument("--config-path", required=True, help="trainer config as the pods see it (under /mnt/models)")
    p.add_argument("--num-nodes", type=int, required=True, help="pods: 1 Master + N-1 Workers")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs and torchrun processes per pod")
    p.add_argument("--data-pvc", required=True, help="data claim, mounted at /mnt/data")
    p.add_argument("--model-pvc", required=True, help="model claim, mounted at /mnt/models")
    p.add_argument("--namespace", help="default: this pod's namespace, else 'default'")
    p.add_argument("--image", default=TRAINER_IMAGE, help=f"trainer image (default {TRAINER_IMAGE})")
    p.add_argument("--hf-token-secret", default="hf-token", help="Secret with key HF_TOKEN (optional)")
    p.add_argument("--node-selector", default="{}",
                   help='JSON object, e.g. \'{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}\'')
    p.add_argument("--tolerations", default="[]", help="JSON list of Kubernetes tolerations")
    p.add_argument("--dry-run", action="store_true", help="print the manifest as YAML and touch nothing")
    return p


def main(argv: list[str] | None = None) -> None:
    """Build the PyTorchJob from the command line; print it (``--dry-run``) or run it to the end."""
    import yaml

    from components.kube import current_namespace
    from components.train.pytorchjob import pytorchjob_for_run

    args = make_parser().parse_args(argv)
    try:
        manifest = pytorchjob_for_run(
            run_id=args.run_id,
            namespace=args.namespace or current_namespace(),
            config_path=args.config_path,
            trainer_image=args.image,
            num_nodes=args.num_nodes,
            gpus_per_node=args.gpus_per_node,
            data_pvc=args.data_pvc,
            model_pvc=args.model_pvc,
            hf_token_secret=args.hf_token_secret,
            node_selector=_json_arg(args.node_selector, dict, "--node-selector"),
            tolerations=_json_arg(args.tolerations, list, "--tolerations"),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.dry_run:
        print(yaml.safe_dump(manifest, sort_keys=False), end="")
        return
    try:
        result = run_pytorchjob(manifest)
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
