"""A run's step logs from Kubernetes: ``python -m pipelines.run logs RUN_ID [--step NAME] [--follow]``.

KFP's v2 API has no log endpoint: each task of the run names the pod that ran it (``run_details.task_details[].
pod_name``), and the step's own output is that pod's ``main`` container (KFP v2's executor). The logs are read with
the Kubernetes client (the kubeconfig's user, or the pod's service account), from ``--namespace`` (multi-user
Kubeflow: the profile's; default ``kubeflow``, where single-user KFP runs its steps), each line once, ``[pod] line``
(``components.kube.PodLogFollower``, which the train step's launcher follows its job with). ``--follow`` polls the run
and its pods until the run ends.
"""

from __future__ import annotations

import argparse
import os
import time

from pipelines.errors import UsageError, exit_code
from pipelines.kfp_client import FINAL_STATES, connect, get_run, tasks_of

STEP_CONTAINER = "main"  # KFP v2's executor container in every step's pod


def step_pods(run, step: str | None) -> list[tuple[str, str]]:
    """``(step name, pod name)`` of the run's tasks that ran in a pod, in start order; only ``step``'s when named
    (UsageError listing the steps when the run has none by that name)."""
    tasks = [(t.display_name or t.task_id, t.pod_name) for t in tasks_of(run) if getattr(t, "pod_name", None)]
    if step is None:
        return tasks
    chosen = [(name, pod) for name, pod in tasks if name == step]
    if not chosen:
        names = ", ".join(dict.fromkeys(name for name, _ in tasks)) or "none yet"
        raise UsageError(f"run {run.run_id} has no step {step!r} that ran in a pod; its steps: {names}")
    return chosen


def show_logs(kfp_, run_id: str, *, step: str | None, follow: bool, namespace: str, interval: float, out=print) -> int:
    """Print the steps' logs (``--follow``: until the run ends); the exit code (0)."""
    from kubernetes import client as k8s
    from kubernetes.config import ConfigException

    from components.kube import PodLogFollower, load_api_client

    try:
        core = k8s.CoreV1Api(load_api_client())
    except ConfigException as exc:
        raise UsageError(
            f"logs reads the steps' pods with the Kubernetes client and found no cluster access ({exc}); point "
            "KUBECONFIG at the cluster"
        ) from None
    follower = PodLogFollower(core, namespace, STEP_CONTAINER, out=out)
    while True:
        run = get_run(kfp_, run_id)
        pods = []
        for _, name in step_pods(run, step):
            try:
                pods.append(core.read_namespaced_pod(name, namespace))
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
                out(f"[{name}] (pod gone: its log went with it)")
        follower.poll(pods)
        if not follow or run.state in FINAL_STATES:
            return 0
        time.sleep(interval)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.run logs", description=(__doc__ or "").split("\n")[0])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--step", help="only this step's log (its name as the KFP UI shows it, e.g. train-model)")
    p.add_argument("--follow", action="store_true", help="keep printing new lines until the run ends")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between polls with --follow (default: 5)")
    p.add_argument(
        "--host", default=os.environ.get("KFP_HOST"), help="KFP API endpoint (default: $KFP_HOST); token: $KFP_TOKEN"
    )
    p.add_argument("--namespace", help="where the steps' pods run (multi-user: your profile's; default: kubeflow)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.run logs ...``; the exit code (2 for bad input, 1 for a server's refusal, 130 stopped)."""
    args = make_parser().parse_args(argv)

    def show() -> int:
        kfp_ = connect(args.host, args.namespace)
        namespace = args.namespace or kfp_.namespace or "kubeflow"
        return show_logs(
            kfp_, args.run_id, step=args.step, follow=args.follow, namespace=namespace, interval=args.interval
        )

    try:
        return exit_code(show)
    except KeyboardInterrupt:
        return 130
