"""Run the LLM fine-tuning pipeline: locally by default, on Kubeflow Pipelines with ``--host``.

    python -m pipelines.run                                   # local run of preset local-tiny (no cluster)
    python -m pipelines.run --host $KFP_HOST --preset qwen3-30b-a3b-full -p learning_rate=1e-5
    python -m pipelines.run --host $KFP_HOST --schedule "0 0 3 * * 0"   # recurring run, Sundays 03:00
    python -m pipelines.run --preset qwen3-30b-a3b-full --render out/   # write what would run, touch nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from pipelines.errors import UsageError


def make_parser() -> argparse.ArgumentParser:
    """The command line (``--help`` needs no cluster, no GPU and imports nothing heavy)."""
    p = argparse.ArgumentParser(prog="python -m pipelines.run", description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default=os.environ.get("KFP_HOST"),
                   help="KFP API endpoint (default: $KFP_HOST); without one the pipeline runs locally")
    p.add_argument("--preset", help="parameter preset (default: local-tiny locally, qwen3-30b-a3b-full with --host)")
    p.add_argument("--params", metavar="FILE", help="YAML file of parameter overrides")
    p.add_argument("-p", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help="override one parameter (repeatable), e.g. -p learning_rate=1e-5")
    p.add_argument("--schedule", metavar="CRON", help='create a recurring run (6-field cron, e.g. "0 0 3 * * 0")')
    p.add_argument("--experiment", default="llm-finetune", help="KFP experiment (default: llm-finetune)")
    p.add_argument("--namespace", help="KFP namespace (multi-user Kubeflow)")
    p.add_argument("--pipeline-name", default="llm-finetune", help="KFP pipeline to add a version to")
    p.add_argument("--run-name", help="run name (default: <preset>-<UTC time>)")
    p.add_argument("--render", metavar="DIR",
                   help="write the compiled pipeline, resolved parameters, trainer config and Kubernetes manifests; submit nothing")
    p.add_argument("--summary-json", metavar="FILE", help="write the outcome (status, model_uri, metrics, endpoint, wall_seconds)")
    p.add_argument("--workspace", default="workspace", help="local runs: folder for data, models and KFP outputs")
    p.add_argument("--keep-serving", action="store_true", help="local runs: leave the model server running")
    return p


def submit_run(args, params: dict, preset: str) -> dict:
    """Compile, upload a new pipeline version and start a run (or a recurring run) on ``args.host``."""
    from components.version import __version__
    from pipelines.compile import compile_pipeline
    from pipelines.submit import submit

    run_name = args.run_name or f"{preset}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(Path(tmp) / "llm_finetune.yaml")
        sub = submit(host=args.host, package_path=str(package), pipeline_name=args.pipeline_name, params=params,
                     experiment=args.experiment, run_name=run_name, namespace=args.namespace,
                     schedule=args.schedule, existing_token=os.environ.get("KFP_TOKEN"),
                     description=f"kubeflow-llm-post-training {__version__}, preset {preset}")
    print(f"created {sub.kind.replace('_', ' ')} {sub.id}: {sub.url}")
    return {"status": "submitted", "kind": sub.kind, "id": sub.id, "url": sub.url,
            "pipeline_id": sub.pipeline_id, "version_id": sub.version_id}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pipelines.run``; returns the exit code (2 for bad input)."""
    args = make_parser().parse_args(argv)
    try:
        return _main(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(args) -> int:
    from pipelines import params as P

    preset = args.preset or (P.CLUSTER_PRESET if args.host or args.render else P.LOCAL_PRESET)
    if args.schedule:
        from pipelines.submit import validate_cron

        validate_cron(args.schedule)
        if not args.host and not args.render:
            raise UsageError("--schedule creates a recurring run on Kubeflow Pipelines; pass --host URL or set KFP_HOST")
    overrides = args.overrides + (["keep_serving=true"] if args.keep_serving else [])
    params = P.resolve(preset, args.params, overrides)
    P.check(params)

    if args.render:
        from pipelines.render import render

        for path in render(params, Path(args.render), namespace=args.namespace or "default"):
            print(f"wrote {path}")
        return 0
    if args.host:
        summary = submit_run(args, params, preset)
    else:
        if params["train_backend"] != "local" or params["deploy_backend"] != "local":
            raise UsageError(
                f"preset {preset!r} runs on a cluster (train_backend={params['train_backend']}, "
                f"deploy_backend={params['deploy_backend']}); pass --host URL (or KFP_HOST) to submit it, "
                "or --render DIR to see what it would create"
            )
        from pipelines.local import run_locally

        workspace = Path(args.workspace).resolve()
        print(f"Running pipeline llm-finetune locally (kfp.local, preset {preset}); outputs under {workspace}", flush=True)
        summary = run_locally(params, workspace)
        _print_summary(summary)
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0 if summary["status"] in ("succeeded", "submitted") else 1


def _print_summary(s: dict) -> None:
    print("\n=== llm-finetune (local) ===")
    if s["status"] != "succeeded":
        print(f"status:   FAILED after {s['wall_seconds']}s\n{s['error']}")
        return
    m = s["metrics"]
    print(f"status:   succeeded in {s['wall_seconds']}s")
    print(f"model:    {s['model_uri']}")
    print(f"eval:     loss {m['base_eval_loss']:.4f} (base) -> {m['eval_loss']:.4f} (tuned), "
          f"perplexity {m['base_perplexity']:.1f} -> {m['perplexity']:.1f}, {int(m['tokens_evaluated'])} tokens")
    print(f"gate:     {'passed' if s['passed'] else 'not passed'}: {s['reason']}")
    print(f"endpoint: {s['endpoint'] or '(not deployed)'}")
    if s["endpoint"]:
        print(f"smoke:    {s['smoke_reply']!r}")


if __name__ == "__main__":
    sys.exit(main())
