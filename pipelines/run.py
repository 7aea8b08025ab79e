"""Run the LLM fine-tuning pipeline: locally by default, on Kubeflow Pipelines with --host.

examples:
  python -m pipelines.run                                   # local run of preset local-tiny (no cluster)
  python -m pipelines.run --host $KFP_HOST --preset qwen3-30b-a3b-full -p learning_rate=1e-5
  python -m pipelines.run --host $KFP_HOST --schedule "0 0 3 * * 0"   # recurring run, Sundays 03:00
  python -m pipelines.run --preset qwen3-30b-a3b-full --render out/   # write what would run, touch nothing
  python -m pipelines.run --preset qwen3-30b-a3b-full --plan   # seconds per step, tokens/s, bottleneck, GPU-hours
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from components.estimate.plan_text import memory_text, plan_text
from components.settings import ADVANCED, specs, split_arguments
from components.validate.rules import warnings
from components.version import __version__, pin_errors
from pipelines import params as P
from pipelines.errors import UsageError, write_failure
from pipelines.schedule import validate_cron

# Each way of running imports its own machinery when it is taken: kfp (compile, submit, the local run) and the
# Kubernetes client (render) cost a second or more, which --help, --plan and a bad argument never pay.

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKSPACE = "workspace"
HELP_WIDTH = 100  # characters of help per parameter: one line each


class _FullHelp(argparse.Action):
    """``-h``: the options, then the presets and every parameter (built only when asked for)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.epilog = __doc__.split("\n", 2)[2] + "\n" + presets_help() + "\n" + parameters_help()
        parser.print_help()
        parser.exit()


def make_parser() -> argparse.ArgumentParser:
    """The command line (``--help`` needs no cluster, no GPU and imports nothing heavy)."""
    p = argparse.ArgumentParser(
        prog="python -m pipelines.run",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    p.add_argument("-h", "--help", action=_FullHelp, help="show this help, the presets and every parameter, and exit")
    p.add_argument(
        "--host",
        default=os.environ.get("KFP_HOST"),
        help="KFP API endpoint (default: $KFP_HOST); without one the pipeline runs locally",
    )
    p.add_argument("--preset", help="parameter preset (default: local-tiny locally, qwen3-30b-a3b-full with --host)")
    p.add_argument("--params", metavar="FILE", help="YAML file of parameter overrides")
    p.add_argument(
        "-p",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one parameter (repeatable), e.g. -p learning_rate=1e-5",
    )
    p.add_argument("--schedule", metavar="CRON", help='create a recurring run (6-field cron, e.g. "0 0 3 * * 0")')
    p.add_argument("--experiment", default="llm-finetune", help="KFP experiment (default: llm-finetune)")
    p.add_argument("--namespace", help="KFP namespace (multi-user Kubeflow)")
    p.add_argument("--pipeline-name", default="llm-finetune", help="KFP pipeline to add a version to")
    p.add_argument(
        "--service-account",
        default=P.RUNNER_SERVICE_ACCOUNT,
        help=f"ServiceAccount the run's steps run as (default: {P.RUNNER_SERVICE_ACCOUNT}, which manifests/ creates "
        "with the package's Role only; '' for KFP's default, e.g. default-editor)",
    )
    p.add_argument("--run-name", help="run name (default: <preset>-<UTC time>)")
    p.add_argument(
        "--render",
        metavar="DIR",
        help="write the compiled pipeline, resolved parameters, trainer config and Kubernetes manifests; "
        "submit nothing",
    )
    p.add_argument(
        "--plan",
        nargs="?",
        const="",
        metavar="STATS_JSON",
        help="print the run's plan (compute and communication per step, tokens/s per GPU, bottleneck, "
        "memory, wall time, GPU-hours) and exit; STATS_JSON: a prepared dataset's stats.json for its "
        "size",
    )
    p.add_argument(
        "--summary-json", metavar="FILE", help="write the outcome (status, model_uri, metrics, endpoint, wall_seconds)"
    )
    p.add_argument(
        "--workspace",
        default=DEFAULT_WORKSPACE,
        metavar="DIR",
        help="local runs: folder for data, models, reports and KFP outputs "
        f"(default: ./{DEFAULT_WORKSPACE}); each run's files are found under DIR/runs/<run id>/",
    )
    p.add_argument("--keep-serving", action="store_true", help="local runs: leave the model server running")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="local runs: also show kfp.local's own output (executor inputs, task outputs, warnings) and progress bars",
    )
    return p


def presets_help() -> str:
    """The presets, each with the first line of its file's opening comment."""
    lines = ["presets (--preset NAME):"]
    for name in P.preset_names():
        first = (P.PRESETS_DIR / f"{name}.yaml").read_text().splitlines()[0]
        lines.append(f"  {name:<22} {first.lstrip('# ').strip() if first.startswith('#') else ''}")
    lines.append(
        f"  (default: {P.LOCAL_PRESET} without a KFP host, {P.CLUSTER_PRESET} with --host, --render or --plan)"
    )
    return "\n".join(lines) + "\n"


def parameters_help() -> str:
    """Every setting on one line, by step: name, type, default, the first sentence of its help."""
    rows = []
    for spec in specs().values():
        default = json.dumps(spec.default) if isinstance(spec.default, (dict, list, str)) else spec.default
        rows.append((spec.group, f"{spec.name}: {spec.type.__name__} = {default}", _first_sentence(spec.help)))
    width = min(max(len(r[1]) for r in rows), 48)
    lines = [
        "parameters (-p NAME=VALUE, or NAME: VALUE lines in a --params YAML file; defaults before any preset;",
        f"those marked * are inside the pipeline's {ADVANCED} parameter in the KFP UI):",
    ]
    advanced = {name for name, spec in specs().items() if not spec.plain}
    group = None
    for (step, sig, text), name in zip(rows, specs(), strict=True):
        if step != group:
            lines.append(f" {step}:")
            group = step
        mark = "*" if name in advanced else " "
        lines.append(f" {mark}{sig:<{width}}  {text}".rstrip())
    return "\n".join(lines) + "\n"


def _first_sentence(text: str) -> str:
    """The first sentence of ``text``, at most ``HELP_WIDTH`` characters."""
    first = re.split(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<=\.)\s", text, maxsplit=1)[0]
    return first if len(first) <= HELP_WIDTH else first[:HELP_WIDTH].rsplit(" ", 1)[0] + " ..."


def submit_run(args, params: dict, preset: str) -> dict:
    """Compile, upload a new pipeline version and start a run (or a recurring run) on ``args.host``."""
    from pipelines.compile import compile_pipeline
    from pipelines.submit import submit

    run_name = args.run_name or f"{preset}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(Path(tmp) / "llm_finetune.yaml", variants_parallel=params["variants_parallel"])
        sub = submit(
            host=args.host,
            package_path=str(package),
            pipeline_name=args.pipeline_name,
            service_account=args.service_account,
            params=split_arguments(params),
            experiment=args.experiment,
            run_name=run_name,
            namespace=args.namespace,
            schedule=args.schedule,
            existing_token=os.environ.get("KFP_TOKEN"),
            description=f"kubeflow-llm-post-training {__version__}, preset {preset}",
        )
    print(f"created {sub.kind.replace('_', ' ')} {sub.id}: {sub.url}")
    return {
        "status": "submitted",
        "kind": sub.kind,
        "id": sub.id,
        "url": sub.url,
        "pipeline_id": sub.pipeline_id,
        "version_id": sub.version_id,
    }


# What follows a submitted run, in pipelines/runs.py: ``python -m pipelines.run status RUN_ID`` hands over to it
# (``schedules``: to pipelines/schedules.py, ``logs``: to pipelines/logs.py, ``promote`` and ``rollback``: to
# pipelines/traffic.py).
RUN_COMMANDS = ("status", "wait", "list", "cancel", "cleanup", "schedules", "logs", "promote", "rollback")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pipelines.run``; returns the exit code (2 for bad input)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "schedules":
        from pipelines import schedules

        return schedules.main(argv[1:])
    if argv and argv[0] == "logs":
        from pipelines import logs

        return logs.main(argv[1:])
    if argv and argv[0] in ("promote", "rollback"):
        from pipelines import traffic

        return traffic.main(argv)
    if argv and argv[0] in RUN_COMMANDS:
        from pipelines import runs

        return runs.main(argv)
    args = make_parser().parse_args(argv)
    try:
        return _main(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(args) -> int:
    preset = args.preset or (P.CLUSTER_PRESET if args.host or args.render or args.plan is not None else P.LOCAL_PRESET)
    if args.schedule:
        validate_cron(args.schedule)
        if not args.host and not args.render:
            raise UsageError(
                "--schedule creates a recurring run on Kubeflow Pipelines; pass --host URL or set KFP_HOST"
            )
    if (args.host or args.render) and (errors := pin_errors()):
        raise UsageError(errors[0])
    overrides = args.overrides + (["keep_serving=true"] if args.keep_serving else [])
    params = P.resolve(preset, args.params, overrides)
    P.check(params)
    for warning in warnings(params):
        print(f"warning: {warning}", file=sys.stderr)
    if args.plan is not None:
        try:
            print(plan_text(params, args.plan or None))
        except ValueError as e:
            raise UsageError(str(e)) from None
        return 0

    if args.render:
        from pipelines.render import render

        for path in render(params, Path(args.render), namespace=args.namespace or "default"):
            print(f"wrote {path}")
        if memory := memory_text(params):  # what each stage's job holds per GPU, by validate_inputs' fit
            print(memory)
        return 0
    failed = None  # the record of a local run's failed step
    if args.host:
        summary = submit_run(args, params, preset)
    else:
        if params["train_backend"] != "local" or params["deploy_backend"] != "local":
            raise UsageError(
                f"preset {preset!r} runs on a cluster (train_backend={params['train_backend']}, "
                f"deploy_backend={params['deploy_backend']}); pass --host URL (or KFP_HOST) to submit it, "
                "or --render DIR to see what it would create"
            )
        workspace = make_workspace(args.workspace)
        from pipelines.local_runner import run_locally

        print(
            f"Running pipeline llm-finetune locally (kfp.local, preset {preset}); outputs under {workspace}"
            f"{'' if args.verbose else ' (--verbose shows everything kfp.local prints)'}",
            flush=True,
        )
        summary = run_locally(params, workspace, verbose=args.verbose)
        failed = failed_step_of(summary, workspace)
        if failed is not None:
            summary["error"] = f"{failed['step']}: {failed['error']}"
        print_summary(summary)
        if failed is not None and failed.get("bad_input"):
            # Bad input a step met (a broken row, say): its own line last, as for the input checked before the run.
            print(f"error: {summary['error']}", file=sys.stderr)
    if args.summary_json:
        try:
            Path(args.summary_json).write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        except OSError as e:
            print(f"error: --summary-json: {write_failure(e, args.summary_json)}", file=sys.stderr)
            return 1
    if summary["status"] == "cancelled":
        return 128 + signal.Signals[summary["signal"]]  # as a shell reports a command a signal ended
    if summary["status"] in ("succeeded", "submitted"):
        return 0
    return 2 if failed is not None and failed.get("bad_input") else 1


def make_workspace(path: str) -> Path:
    """The local run's workspace folder, made if missing; UsageError naming ``--workspace`` when it cannot be."""
    workspace = Path(path).resolve()
    try:
        workspace.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(
            f"--workspace {path} is a file, not a folder: name a folder for the run's files (--workspace DIR; "
            "it is made if missing), or move the file"
        ) from None
    except OSError as e:
        raise UsageError(
            f"--workspace {path}: cannot make the folder ({e.strerror or e}): name a folder you can write to "
            "(--workspace DIR)"
        ) from None
    return workspace


def failed_step_of(summary: dict, workspace: Path) -> dict | None:
    """The record of the step that failed a local run (components/observe/outcome.py: its step name, its error, and
    whether that is bad input), from the run's folders on the workspace's volumes; None for a run that succeeded or
    failed in a step that records nothing."""
    if summary["status"] == "succeeded" or not summary.get("run_id"):
        return None
    from components.observe.outcome import failed_step

    return failed_step([str(workspace / "data"), str(workspace / "models")], summary["run_id"])


def print_summary(s: dict) -> None:
    """The local run's outcome: what the numbers are, and where everything is."""
    print("\n=== llm-finetune (local) ===")
    run = f"run {s['run_id']}: everything is under {s['run_dir']}" if s["run_dir"] else "no run folder was made"
    if s["status"] != "succeeded":
        ended = f"cancelled ({s['signal']})" if s["status"] == "cancelled" else "FAILED"
        print(f"status:      {ended} after {s['wall_seconds']}s ({run})\n{s['error']}")
        if s.get("disk"):
            print(f"disk:        {s['disk']}")
        if s["kfp_dir"]:
            print(f"kfp:         {s['kfp_dir']}")
        _print_write_errors(s)
        return
    m, t = s["metrics"], s["training"]
    print(f"status:      succeeded in {s['wall_seconds']}s ({run})")
    print(
        f"eval:        held-out loss per label token {m['base_eval_loss']:.4f} (base) -> {m['eval_loss']:.4f} "
        f"(tuned), perplexity {m['base_perplexity']:.1f} -> {m['perplexity']:.1f}, "
        f"over {int(m['tokens_evaluated'])} label tokens"
    )
    print(f"gate:        {'passed' if s['passed'] else 'not passed'}: {s['reason']}")
    if t:
        print(
            f"training:    {t['global_step']} optimizer steps; last logged train loss {t['final_train_loss']:.4f} "
            "(the mean over its logging window; the curve is in the evaluation report)"
        )
    print(f"model:       {s['model_uri']}")
    for name, path in s["reports"].items():
        print(f"{'reports:' if name == next(iter(s['reports'])) else '':<13}{path}")
    if s["tensorboard"]:
        print(f"tensorboard: tensorboard --logdir {s['tensorboard']}")
    if s.get("mlflow"):
        print(f"mlflow:      MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri file:{s['mlflow']}")
    if s["server_log"]:
        print(f"server log:  {s['server_log']}")
    if s["endpoint"]:
        state = (
            "still serving" if s["keep_serving"] else "stopped after the smoke test; --keep-serving keeps it running"
        )
        print(f"endpoint:    {s['endpoint']} ({state})")
        if s.get("temp_dir"):
            print(f"temp files:  {s['temp_dir']} (the kept server's; remove the folder once the server is stopped)")
        print(f"smoke:       {s['smoke_reply']!r}")
        if lat := s.get("latency"):
            print(
                f"latency:     time to first token {lat['ttft_seconds_p50']:.2f} s (p50; max "
                f"{lat['ttft_seconds_max']:.2f} s), {lat['output_tokens_per_second']:.0f} output tokens/s over "
                f"{lat['requests']} concurrent requests (gates: max_ttft_seconds, min_output_tokens_per_second)"
            )
        if s["base_model"] == "builtin:tiny-qwen3":
            print(
                "             (the laptop model is a 4-layer, 1M-parameter Qwen3 trained for a minute on CPU: it "
                "answers in fragments; <?> marks bytes of a character it did not finish)"
            )
    else:
        print("endpoint:    (not deployed)")
    _print_write_errors(s)


def _print_write_errors(s: dict) -> None:
    for i, error in enumerate(s.get("write_errors", [])):
        print(f"{'not written:' if i == 0 else '':<13}{error}")


if __name__ == "__main__":
    sys.exit(main())
