"""Preflight (components/validate/preflight.py) of what this service account may do, by SelfSubjectAccessReview:
what the launcher, the deployer, the search step, the run's TensorBoard and the grpo stage's vLLM server call."""

from __future__ import annotations

from kubernetes import client as k8s

from components.kube import call_api

# What the launcher (components/train/launcher/job.py) and deployer (components/deploy/rollout.py)
# call, as (verb, group, resource, subresource); manifests/rbac/role.yaml grants exactly these.
# Every training job's NetworkPolicy (components/train/launcher/job.py::trainer_network): created before the job,
# deleted after it (read first by the exit handler, which deletes only what carries the run's id).
JOB_NETWORK_ACCESS = [
    ("create", "networking.k8s.io", "networkpolicies", ""),
    ("get", "networking.k8s.io", "networkpolicies", ""),
    ("delete", "networking.k8s.io", "networkpolicies", ""),
]
LAUNCHER_ACCESS = {
    "pytorchjob": [
        ("create", "kubeflow.org", "pytorchjobs", ""),
        ("get", "kubeflow.org", "pytorchjobs", ""),
        ("delete", "kubeflow.org", "pytorchjobs", ""),
        *JOB_NETWORK_ACCESS,
    ],
    "trainjob": [
        ("create", "trainer.kubeflow.org", "trainjobs", ""),
        ("get", "trainer.kubeflow.org", "trainjobs", ""),
        ("delete", "trainer.kubeflow.org", "trainjobs", ""),
        *JOB_NETWORK_ACCESS,
    ],
}
POD_ACCESS = [("list", "", "pods", ""), ("get", "", "pods", "log")]
# The train step creates the run's Tensorboard (components/observe/tensorboard.py) when `tensorboard` is on.
TENSORBOARD_ACCESS = [("create", "tensorboard.kubeflow.org", "tensorboards", "")]
# Without Kubeflow's Tensorboard controller it creates a Deployment and a Service instead, and the exit handler
# deletes them.
TENSORBOARD_SERVER_ACCESS = [
    ("create", "apps", "deployments", ""),
    ("get", "apps", "deployments", ""),  # the exit handler reads each object's run label before deleting it
    ("delete", "apps", "deployments", ""),
    ("create", "", "services", ""),
    ("get", "", "services", ""),
    ("delete", "", "services", ""),
]
# The grpo stage's own vLLM server (components/train/launcher/generation_server.py): the train step creates it, reads
# its Deployment until it is ready (and lists its pods: POD_ACCESS), deletes it, and so may the exit handler.
GRPO_SERVER_ACCESS = [
    ("create", "networking.k8s.io", "networkpolicies", ""),
    ("get", "networking.k8s.io", "networkpolicies", ""),
    ("delete", "networking.k8s.io", "networkpolicies", ""),
    ("create", "", "configmaps", ""),
    ("get", "", "configmaps", ""),
    ("delete", "", "configmaps", ""),
    ("create", "apps", "deployments", ""),
    ("get", "apps", "deployments", ""),
    ("delete", "apps", "deployments", ""),
    ("create", "", "services", ""),
    ("get", "", "services", ""),
    ("delete", "", "services", ""),
    ("create", "", "secrets", ""),  # the server's token, owned by its NetworkPolicy (vllm_server.weight_sync_secret)
]
# The search step (components/hpo/follow.py) when hpo_trials > 0: its Experiment and the Experiment's Trials.
SEARCH_ACCESS = [
    ("create", "kubeflow.org", "experiments", ""),
    ("get", "kubeflow.org", "experiments", ""),
    ("delete", "kubeflow.org", "experiments", ""),
    ("list", "kubeflow.org", "trials", ""),
]
DEPLOYER_ACCESS = [
    ("create", "serving.kserve.io", "inferenceservices", ""),
    ("get", "serving.kserve.io", "inferenceservices", ""),
    ("patch", "serving.kserve.io", "inferenceservices", ""),
    ("delete", "serving.kserve.io", "inferenceservices", ""),
]


def access_problems(authz: k8s.AuthorizationV1Api, namespace: str, wanted: list[tuple]) -> list[str]:
    problems = []
    for verb, group, resource, subresource in wanted:
        review = k8s.V1SelfSubjectAccessReview(
            spec=k8s.V1SelfSubjectAccessReviewSpec(
                resource_attributes=k8s.V1ResourceAttributes(
                    namespace=namespace, verb=verb, group=group, resource=resource, subresource=subresource or None
                )
            )
        )
        if not call_api(authz.create_self_subject_access_review, review).status.allowed:
            what = f"{resource}/{subresource}" if subresource else resource
            problems.append(
                f"this service account may not {verb} {what}{'.' + group if group else ''} in {namespace}: "
                "apply manifests/rbac (kubectl apply -k manifests/) for the pipeline runner"
            )
    return problems


def tensorboard_problem(authz: k8s.AuthorizationV1Api, namespace: str) -> str | None:
    """Without Kubeflow's Tensorboard controller: whether this account may create and delete the Deployment and
    Service that serve the run's TensorBoard instead (components/observe/tensorboard.py); one message for all."""
    if not (denied := access_problems(authz, namespace, TENSORBOARD_SERVER_ACCESS)):
        return None
    what = ", ".join(p.removeprefix("this service account may not ").partition(" in ")[0] for p in denied)
    return (
        "tensorboard=true: this cluster serves no tensorboards.tensorboard.kubeflow.org (no Kubeflow Tensorboard "
        "controller), so the train step serves TensorBoard from a Deployment and a Service and the exit handler "
        f"deletes them, but this service account may not {what} in {namespace}: apply manifests/rbac (kubectl "
        "apply -k manifests/) for the pipeline runner, or set tensorboard=false"
    )
