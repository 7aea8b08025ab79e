"""The same training job as a Kubeflow Trainer v2 ``TrainJob`` (trainer.kubeflow.org/v1alpha1).

The cluster's ``torch-distributed`` ClusterTrainingRuntime supplies the JobSet (one replicated job
``node`` whose container is ``node``); the TrainJob fills in the image, ``torchrun`` command,
``numNodes``, ``numProcPerNode`` and ``resourcesPerNode``, and a ``runtimePatches`` entry adds what the
runtime cannot know: the claims, ``/dev/shm``, node placement, labels and the Istio opt-out. The trainer
controller injects ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
``PET_MASTER_PORT`` into the ``node`` container, as the v1 operator does for ``pytorch``.

Built as a plain dict checked against the CRD (tests/test_trainjob.py): the ``kubeflow`` SDK that
models it ships its own ``kubeflow/__init__.py`` beside kubeflow-training's, and one of the two
packages then shadows the other's ``kubeflow`` namespace.
"""

from __future__ import annotations

from kubeflow.training.constants import constants as kfc
from kubernetes import client as k8s

from components.train.launcher.pods import trainer_pod_template
from components.kube import RUN_ID_LABEL, job_name_for
from components.train.launcher.pytorchjob import validate_job

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
RUNTIME = "torch-distributed"
# The replicated job and container of the torch runtimes, where the controller injects the PET_* variables.
NODE = "node"
# Who owns our entry in spec.runtimePatches (entries are a map keyed by manager).
PATCH_MANAGER = "llm-post-training.kubeflow.org/launcher"
# JobSet labels every pod with its JobSet's name, which is the TrainJob's; the Job controller labels
# each pod with its completion index, which the torch runtime makes the node rank.
POD_SELECTOR_LABEL = "jobset.sigs.k8s.io/jobset-name"
NODE_RANK_LABEL = "batch.kubernetes.io/job-completion-index"


def build_trainjob(*, name: str, namespace: str, image: str, config_path: str, num_nodes: int,
                   gpus_per_node: int, data_pvc: str, model_pvc: str, hf_token_secret: str,
                   node_selector: dict, tolerations: list, labels: dict, affinity: dict | None = None,
                   shm_size: str = "64Gi", cpu: str = "16", memory: str = "128Gi", nccl_env: dict | None = None,
                   runtime: str = RUNTIME, active_deadline_seconds: int | None = None,
                   queue_name: str = "", tracking_secret: str = "") -> dict:
    """The TrainJob manifest (a plain dict): the PyTorchJob's pods, run by the Trainer v2 controller.

    Args:
        name, namespace, image, config_path, num_nodes, gpus_per_node, data_pvc, model_pvc, hf_token_secret,
        node_selector, tolerations, labels, affinity, shm_size, cpu, memory, nccl_env, tracking_secret: as for
            ``build_pytorchjob``; every node runs the same ``torchrun`` command.
        runtime: the ClusterTrainingRuntime to run on (its replicated job and container must be ``node``).
        active_deadline_seconds: the controller fails the job once it has run this long; None: no limit.
        queue_name: Kueue LocalQueue (label ``kueue.x-k8s.io/queue-name``); empty: no Kueue.

    Gang scheduling, priority, restarts and the finished-job TTL are the runtime's policy in Trainer
    v2, not the TrainJob's; ``run_training_job(cleanup=...)`` deletes finished jobs.

    Raises:
        ValueError: naming the field, for an invalid name, image, node or GPU count, or deadline.
    """
    validate_job(name, image, num_nodes, gpus_per_node)
    if not runtime:
        raise ValueError("runtime must name a ClusterTrainingRuntime, e.g. torch-distributed")
    if active_deadline_seconds is not None and active_deadline_seconds < 1:
        raise ValueError(f"active_deadline_seconds must be >= 1 (or None: no limit), got {active_deadline_seconds}")
    template = trainer_pod_template(
        container_name=NODE, image=image, nnodes=str(num_nodes), gpus_per_node=gpus_per_node,
        config_path=config_path, hf_token_secret=hf_token_secret, nccl_env=nccl_env, cpu=cpu, memory=memory,
        data_pvc=data_pvc, model_pvc=model_pvc, shm_size=shm_size, labels=labels, node_selector=node_selector,
        tolerations=tolerations, affinity=affinity, tracking_secret=tracking_secret,
    )
    container, pod = template.spec.containers[0], template.spec
    # Trainer v2 owns the container: the TrainJob sets its image, command, env and resources in spec.trainer,
    # and the runtime patch (merged by container name) adds only what the trainer fields cannot hold.
    pod_spec = {
        "nodeSelector": pod.node_selector,
        "tolerations": pod.tolerations,
        "affinity": pod.affinity,
        "volumes": pod.volumes,
        "terminationGracePeriodSeconds": pod.termination_grace_period_seconds,
        "containers": [{"name": container.name, "volumeMounts": container.volume_mounts}],
    }
    pod_template = {
        "metadata": {"labels": template.metadata.labels, "annotations": template.metadata.annotations},
        "spec": {k: v for k, v in pod_spec.items() if v is not None},
    }
    job_labels = dict(labels)
    if queue_name:
        job_labels[kfc.LOCAL_QUEUE_LABEL] = queue_name
    spec = {
        "runtimeRef": {"name": runtime},
        "trainer": {
            "image": container.image,
            "command": container.command,
            "args": container.args,
            "env": container.env,
            "numNodes": num_nodes,
            "numProcPerNode": gpus_per_node,
            "resourcesPerNode": {"requests": container.resources.requests, "limits": container.resources.limits},
        },
        "runtimePatches": [{
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                {"name": NODE, "template": {"spec": {"template": pod_template}}},
            ]}}},
        }],
    }
    if active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = active_deadline_seconds
    job = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
           "metadata": {"name": name, "namespace": namespace, "labels": job_labels}, "spec": spec}
    return k8s.ApiClient().sanitize_for_serialization(job)


def trainjob_for_run(*, run_id: str, namespace: str, config_path: str, trainer_image: str, num_nodes: int,
                     gpus_per_node: int, data_pvc: str, model_pvc: str, hf_token_secret: str,
                     node_selector: dict, tolerations: list, stage: str = "sft", **options) -> dict:
    """The TrainJob of one KFP run, from the pipeline's parameter names (mirrors ``pytorchjob_for_run``).

    ``options`` are ``build_trainjob``'s keyword parameters (affinity, resources, NCCL, runtime,
    active_deadline_seconds, queue_name).
    """
    return build_trainjob(
        name=job_name_for(run_id, stage), namespace=namespace, image=trainer_image, config_path=config_path,
        num_nodes=num_nodes, gpus_per_node=gpus_per_node, data_pvc=data_pvc, model_pvc=model_pvc,
        hf_token_secret=hf_token_secret, node_selector=node_selector, tolerations=tolerations,
        labels={RUN_ID_LABEL: run_id}, **options,
    )
