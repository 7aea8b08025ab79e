"""The launcher outside KFP: the training job of one run and stage from the pipeline's own settings; print it or run
it to the end.

    python -m components.train.launcher --run-id RUN --params my.yaml -p num_nodes=2 -p gpus_per_node=8 [--dry-run]
    python -m components.train.launcher --run-id RUN --params pipelines/presets/qwen3-30b-a3b-full.yaml --stage sft

It takes the same settings as ``python -m pipelines.run`` (a YAML file of ``name: value``, a preset's shape or the
``params.yaml`` that ``--render`` writes, then ``-p name=value``; every setting by the name docs/settings.md lists) and
renders the same job as ``--render`` (``components.train.launcher.job.training_job_for_run``, the stage's own nodes
and GPUs over the run's). What it does with the job (create or re-attach, follow, re-run, raise) is ``job``'s, with
the settings' ``job_cleanup``, ``job_restarts``, ``pending_timeout_seconds``, ``stall_timeout_seconds`` and GPU watch
(``prometheus_url``, ``gpu_util_threshold``, ``gpu_util_window_seconds``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import yaml

from components.kube import current_namespace, job_name_for
from components.paths import MODEL_MOUNT, run_dir
from components.settings import Settings
from components.settings_input import SettingsInputError, parse_override, read_params_file, resolve_layers
from components.stages import STAGES, job_groups, stage_folder
from components.train.launcher.job import check_limits, run_training_job, trainer_network, training_job_for_run
from components.train.launcher.trainjob import TRAINER_VERSIONS, installed_trainer_version


def make_parser() -> argparse.ArgumentParser:
    first, _, rest = (__doc__ or "").partition("\n\n")
    p = argparse.ArgumentParser(
        prog="python -m components.train.launcher",
        description=first,
        epilog=rest,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run-id", required=True, help="KFP run id; names the job (<stage>-<run id>)")
    p.add_argument("--stage", choices=STAGES, default="sft", help="the stage whose job to render (default sft)")
    p.add_argument("--params", metavar="FILE", help="YAML of settings by name (a preset, or --render's params.yaml)")
    p.add_argument(
        "-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="one setting; repeat; wins over FILE"
    )
    p.add_argument("--namespace", help="default: this pod's namespace, else 'default'")
    p.add_argument(
        "--config-path",
        help="trainer config as the pods see it (default: where the train step writes it, "
        f"{MODEL_MOUNT}/runs/<run id>/<stage folder>/train_config.json)",
    )
    p.add_argument(
        "--trainer-version",
        choices=sorted(TRAINER_VERSIONS),
        help="the Kubeflow Trainer release to render a TrainJob for (v2.2: v2.2 or later); default: the cluster's, "
        "read from the TrainJob schema it publishes (v2.2 with --dry-run)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the manifest as YAML and touch nothing")
    return p


def settings_of(args) -> Settings:
    """The run's settings: the defaults, ``--params``, then each ``-p`` (SettingsInputError names a bad one)."""
    layers = [read_params_file(args.params)] if args.params else []
    layers.append(dict(parse_override(text) for text in args.param))
    return Settings.from_flat(resolve_layers(layers))


def main(argv: list[str] | None = None) -> None:
    """Build the job from the settings; print it (``--dry-run``) or run it to the end."""
    args = make_parser().parse_args(argv)
    try:
        s = settings_of(args)
        if args.stage not in s.stages.stages:
            raise ValueError(f"--stage {args.stage}: the run's stages are {list(s.stages.stages)} (the setting stages)")
        groups = job_groups(s, args.stage)
        if s.job.train_backend == "local":
            raise ValueError(
                "train_backend=local trains on this machine, with no job to launch: python -m pipelines.run; "
                "set train_backend=pytorchjob or trainjob"
            )
        namespace = args.namespace or current_namespace()
        config_path = args.config_path or os.path.join(
            run_dir(MODEL_MOUNT, args.run_id), stage_folder(args.stage), "train_config.json"
        )
        version = args.trainer_version
        if version is None and s.job.train_backend == "trainjob" and not args.dry_run:
            version = installed_trainer_version()
        manifest = training_job_for_run(
            *groups,
            run_id=args.run_id,
            namespace=namespace,
            config_path=config_path,
            stage=args.stage,
            trainer_version=version,
        )
    except (SettingsInputError, ValueError, RuntimeError) as exc:  # RuntimeError: a Trainer this cannot render for
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.dry_run:
        print(yaml.safe_dump(manifest, sort_keys=False), end="")
        return
    from components.observe.gpu_watch import gpu_watch_for

    limits: dict[str, Any] = dict(
        cleanup=s.scheduling.job_cleanup,
        job_restarts=s.scheduling.job_restarts,
        pending_timeout_seconds=s.scheduling.pending_timeout_seconds,
        stall_timeout_seconds=s.observability.stall_timeout_seconds,
    )
    try:
        check_limits(**limits)
        with trainer_network(manifest, model_root=None):  # as the train step does: the job's NetworkPolicy first
            watch = gpu_watch_for(s.observability, namespace, job_name_for(args.run_id, args.stage))
            result = run_training_job(manifest, **limits, watch=watch)
    except ValueError as exc:  # a bad limit, refused before anything was created
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
