"""A Knative canary's last step, after the deploy step gave the new revision ``canary_traffic_percent`` of the traffic
(its gates passed at 0% first: components/deploy/rollout.py):

    python -m pipelines.run promote RUN_ID --namespace NS     # every request to the new revision
    python -m pipelines.run rollback RUN_ID --namespace NS    # every request back to the previous revision

The run's InferenceServices are those KServe serves with its run id label (``pipelines.kubeflow.org/run-id``), in
the namespace the run deployed to. ``promote`` removes ``canaryTrafficPercent`` (KServe then routes all of the
traffic to the latest revision), ``rollback`` sets it to 0 (all of it to the previous rolled-out revision, the new
one kept, reachable by its ``latest`` tag). A Standard-mode service has no second revision: the deploy step promoted
it once a candidate of it had passed, and going back is deploying the earlier model again. Each waits until KServe
reports the service Ready for the change (``--timeout``).
"""

from __future__ import annotations

import argparse
import time

from pipelines.errors import UsageError, exit_code

ACTIONS = {"promote": None, "rollback": 0}  # the canaryTrafficPercent each sets (None: removed)


def run_services(custom, namespace: str, run_id: str) -> list[dict]:
    """The InferenceServices of run ``run_id`` in ``namespace``: those carrying its run id label."""
    from components.deploy.manifest import GROUP, PLURAL, VERSION
    from components.deploy.rollout import CANDIDATE_LABEL
    from components.kube import RUN_ID_LABEL

    found = custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=f"{RUN_ID_LABEL}={run_id}"
    )
    return [s for s in found.get("items", []) if not s["metadata"].get("labels", {}).get(CANDIDATE_LABEL)]


def shift(custom, service: dict, action: str, *, timeout: float, poll: float = 2.0) -> str:
    """Move ``service``'s traffic as ``action`` says and wait until KServe has it Ready for that; one line."""
    from components.deploy.manifest import GROUP, PLURAL, VERSION

    meta, predictor = service["metadata"], service["spec"]["predictor"]
    what = f"InferenceService {meta['namespace']}/{meta['name']}"
    if "canaryTrafficPercent" not in predictor:
        raise UsageError(
            f"{what} has no canary to {action} (no canaryTrafficPercent: it serves one revision); "
            + (
                "nothing to do"
                if action == "promote"
                else "going back means deploying the earlier model again (the deploy step gates it first)"
            )
        )
    share = predictor["canaryTrafficPercent"]
    patched = custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        meta["namespace"],
        PLURAL,
        meta["name"],
        {"spec": {"predictor": {"canaryTrafficPercent": ACTIONS[action]}}},
    )
    generation, deadline = patched["metadata"].get("generation"), time.monotonic() + timeout
    while True:
        current = custom.get_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"])
        status = current.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
        if status.get("observedGeneration") == generation and ready:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not Ready {timeout:.0f}s after the {action}: kubectl describe isvc")
        time.sleep(poll)
    moved = "all of the traffic to the latest revision" if action == "promote" else "all of the traffic back"
    return f"{what}: {moved} (was {share}% on the latest revision)"


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.run promote|rollback", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=sorted(ACTIONS))
    p.add_argument("run_id", metavar="RUN_ID", help="the KFP run whose deployment to promote or roll back")
    p.add_argument("--namespace", default="kubeflow", help="where the run deployed (default: kubeflow)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for Ready (default: 300)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.run promote|rollback RUN_ID``; the exit code (2 for bad input, 1 for a refusal)."""
    args = make_parser().parse_args(argv)
    return exit_code(lambda: _main(args))


def _main(args) -> int:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from kubernetes.config import ConfigException

    from components.kube import load_api_client

    try:
        custom = client.CustomObjectsApi(load_api_client())
        services = run_services(custom, args.namespace, args.run_id)
        if not services:
            raise UsageError(
                f"no InferenceService of run {args.run_id} in namespace {args.namespace}: pass --namespace where it "
                "deployed (kubectl get isvc -A -l pipelines.kubeflow.org/run-id=RUN_ID)"
            )
        for service in services:
            print(shift(custom, service, args.action, timeout=args.timeout))
    except ConfigException as exc:
        raise UsageError(f"{args.action} needs cluster access ({exc}); point KUBECONFIG at the cluster") from None
    except ApiException as exc:
        raise RuntimeError(f"Kubernetes refused the {args.action} (HTTP {exc.status}: {exc.reason})") from None
    return 0
