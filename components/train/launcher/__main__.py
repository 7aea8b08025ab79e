"""The launcher outside KFP: build the training job from the command line, print it or run it to the end.

    python -m components.train.launcher --run-id RUN --config-path /mnt/models/runs/RUN/train/train_config.json \\
        --num-nodes 2 --gpus-per-node 8 --data-pvc llm-data --model-pvc llm-models [--backend trainjob] \\
        [--job-restarts 2] [--pending-timeout 900] [--stall-timeout 2700] [--dry-run]

What it does with the job (create or re-attach, follow, re-run, raise) is ``components.train.launcher.job``'s.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from components.kube import current_namespace
from components.settings import ClusterSettings
from components.train.launcher.job import CLEANUP_POLICIES, run_training_job
from components.train.launcher.pytorchjob import pytorchjob_for_run
from components.train.launcher.trainjob import (
    TRAINER_V2_2,
    TRAINER_VERSIONS,
    installed_trainer_version,
    trainjob_for_run,
)


def _json_arg(text: str, kind: type, flag: str):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} is not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{flag} must be a JSON {'object' if kind is dict else 'list'}, got {text!r}")
    return value


def make_parser() -> argparse.ArgumentParser:
    """The launcher's command line (defaults: the pipeline's, from components.settings.ClusterSettings)."""
    d = ClusterSettings()

    p = argparse.ArgumentParser(prog="python -m components.train.launcher", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-id", required=True, help="KFP run id; names the job (sft-<run id>)")
    p.add_argument("--config-path", required=True, help="trainer config as the pods see it (under /mnt/models)")
    p.add_argument("--num-nodes", type=int, required=True, help="pods: 1 Master + N-1 Workers")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs and torchrun processes per pod")
    p.add_argument("--data-pvc", required=True, help="data claim, mounted at /mnt/data")
    p.add_argument("--model-pvc", required=True, help="model claim, mounted at /mnt/models")
    p.add_argument(
        "--backend",
        choices=("pytorchjob", "trainjob"),
        default="pytorchjob",
        help="PyTorchJob (Training Operator v1) or TrainJob (Trainer v2, runtime torch-distributed)",
    )
    p.add_argument("--namespace", help="default: this pod's namespace, else 'default'")
    p.add_argument("--image", default=d.trainer_image, help=f"trainer image (default {d.trainer_image})")
    p.add_argument("--hf-token-secret", default=d.hf_token_secret, help="Secret with key HF_TOKEN (optional)")
    p.add_argument(
        "--node-selector",
        default="{}",
        help='JSON object, e.g. \'{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}\'',
    )
    p.add_argument("--tolerations", default="[]", help="JSON list of Kubernetes tolerations")
    p.add_argument("--affinity", default="{}", help="JSON object: Kubernetes pod affinity")
    p.add_argument("--active-deadline-seconds", type=int, help="fail the job after running this long")
    p.add_argument("--queue-name", default="", help="Kueue LocalQueue to submit the job to")
    p.add_argument("--priority-class", default="", help="pods' PriorityClass (pytorchjob)")
    p.add_argument(
        "--gang-scheduling",
        action="store_true",
        help="schedulingPolicy.minAvailable = all pods, for Volcano/scheduler-plugins (pytorchjob)",
    )
    p.add_argument("--min-nodes", type=int, help="elastic job: run with min-nodes..num-nodes pods (pytorchjob)")
    p.add_argument("--max-restarts", type=int, default=d.max_restarts, help="restarts of an elastic job (pytorchjob)")
    p.add_argument("--cleanup", choices=CLEANUP_POLICIES, default=d.job_cleanup, help="delete the job when it ends")
    p.add_argument(
        "--job-restarts",
        type=int,
        default=d.job_restarts,
        metavar="N",
        help="re-run a job that failed for a retriable cause (eviction, preemption, lost node, "
        "rendezvous/NCCL) up to N times; it resumes from its last checkpoint "
        f"(default {d.job_restarts})",
    )
    p.add_argument(
        "--pending-timeout",
        type=float,
        default=float(d.pending_timeout_seconds),
        metavar="SECONDS",
        help="give up when a pod stays Unschedulable this long "
        f"(default {d.pending_timeout_seconds}: time for an autoscaler to add a GPU node; 0: at once)",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=float(d.stall_timeout_seconds),
        metavar="SECONDS",
        help="end the job and re-run it from its last checkpoint (a retriable failure) when its trainer makes no "
        f"optimizer step for this long (default {d.stall_timeout_seconds}; 0: not watched; needs --metrics-port)",
    )
    p.add_argument(
        "--trainer-version",
        choices=sorted(TRAINER_VERSIONS),
        help="the Kubeflow Trainer release to render the TrainJob for (v2.2: v2.2 or later); default: "
        "the cluster's, read from the TrainJob schema it publishes (v2.2 with --dry-run)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=d.metrics_port,
        metavar="PORT",
        help=f"port of the trainer's Prometheus metrics on each pod (default {d.metrics_port}; 0: none)",
    )
    p.add_argument(
        "--langfuse-secret",
        default=d.langfuse_secret,
        help="Secret with LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY, LANGFUSE_HOST (optional)",
    )
    p.add_argument(
        "--prometheus-url",
        default="",
        metavar="URL",
        help="Prometheus to read the job's GPU utilisation from while following it (empty: not watched)",
    )
    p.add_argument(
        "--gpu-util-threshold",
        type=float,
        default=d.gpu_util_threshold,
        metavar="PERCENT",
        help="alert (ALERT_WEBHOOK_URL) when the job's GPUs stay below this utilisation ...",
    )
    p.add_argument(
        "--gpu-util-window",
        type=float,
        default=float(d.gpu_util_window_seconds),
        metavar="SECONDS",
        help="... for this long",
    )
    p.add_argument("--dry-run", action="store_true", help="print the manifest as YAML and touch nothing")
    return p


def main(argv: list[str] | None = None) -> None:
    """Build the job from the command line; print it (``--dry-run``) or run it to the end."""
    args = make_parser().parse_args(argv)
    try:
        common = dict(
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
            affinity=_json_arg(args.affinity, dict, "--affinity"),
            active_deadline_seconds=args.active_deadline_seconds,
            queue_name=args.queue_name,
            metrics_port=args.metrics_port,
            langfuse_secret=args.langfuse_secret,
        )
        if args.backend == "pytorchjob":
            manifest = pytorchjob_for_run(
                **common,
                priority_class=args.priority_class,
                gang_scheduling=args.gang_scheduling,
                min_nodes=args.min_nodes,
                max_restarts=args.max_restarts,
            )
        else:
            v1_only = [
                flag
                for flag, used in [
                    ("--priority-class", args.priority_class),
                    ("--gang-scheduling", args.gang_scheduling),
                    ("--min-nodes", args.min_nodes is not None),
                ]
                if used
            ]
            if v1_only:
                raise ValueError(
                    f"{', '.join(v1_only)}: PyTorchJob only; with --backend trainjob the "
                    "ClusterTrainingRuntime sets scheduling and restart policy"
                )
            version = args.trainer_version or (TRAINER_V2_2 if args.dry_run else installed_trainer_version())
            manifest = trainjob_for_run(**common, trainer_version=version)
    except (ValueError, RuntimeError) as exc:  # RuntimeError: a Trainer this package cannot render for
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.dry_run:
        print(yaml.safe_dump(manifest, sort_keys=False), end="")
        return
    watch = None
    if args.prometheus_url:
        from components.observe.gpu_watch import GpuWatch

        watch = GpuWatch(
            args.prometheus_url,
            manifest["metadata"]["namespace"],
            manifest["metadata"]["name"],
            threshold=args.gpu_util_threshold,
            window_seconds=args.gpu_util_window,
            query_seconds=min(60.0, args.gpu_util_window / 4),
        )
    try:
        result = run_training_job(
            manifest,
            cleanup=args.cleanup,
            job_restarts=args.job_restarts,
            pending_timeout_seconds=args.pending_timeout,
            stall_timeout_seconds=args.stall_timeout,
            watch=watch,
        )
    except ValueError as exc:  # a bad limit, refused before anything was created
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
