"""Manage runs on Kubeflow Pipelines: status, wait, list, cancel, and clean up finished runs and their folders.

examples:
  python -m pipelines.runs status RUN_ID                 # the run's state and each step's
  python -m pipelines.runs wait RUN_ID --timeout 12h     # stream step states; exit with the run's outcome
  python -m pipelines.runs list --experiment llm-finetune --state FAILED
  python -m pipelines.runs cancel RUN_ID
  python -m pipelines.runs cleanup --older-than 7d       # dry run: what would be deleted
  python -m pipelines.runs cleanup --older-than 7d --yes # delete the runs' folders on the claims, then the runs

The host, token and namespace are submit's: --host (default $KFP_HOST), $KFP_TOKEN or KFP's service-account token
file, --namespace for multi-user Kubeflow. Exit codes: 0 done (wait: the run SUCCEEDED), 1 the run FAILED (wait) or
a cleanup Job failed, 3 the run was CANCELED or SKIPPED (wait), 124 wait's --timeout passed, 130 wait interrupted
(the run goes on), 2 bad input (unknown run, bad duration, no host).

cleanup deletes, for each finished run (SUCCEEDED, FAILED, CANCELED, SKIPPED) it selects, the run's folders on the
two claims (runs/<run id>/ and its variants' runs/<run id>-<variant>/ on the data_pvc and model_pvc the run was
given) with one Kubernetes Job in --namespace (default: kubeflow, where single-user KFP runs the steps) that mounts
the claims, then the run itself from KFP. Nothing is deleted without --yes. A run still going is refused; a run
whose model the run's InferenceService (serving_name) still serves is kept. --keep-folders deletes only the runs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

from pipelines import cleanup
from pipelines.errors import UsageError, exit_code
from pipelines.kfp_client import (
    FINAL_STATES,
    STATES,
    Kfp,
    _step,
    _when,
    connect,
    describe,
    failure_of,
    get_run,
    list_runs,
    tasks_of,
)

EXIT_FAILED, EXIT_CANCELED, EXIT_TIMEOUT, EXIT_INTERRUPTED = 1, 3, 124, 130
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# wait outlasts an API server restart or a gateway's 503s for this long before it gives up.
RETRY_WINDOW_SECONDS = 300.0


# ------------------------------------------------------------------------------------------------ input


def parse_duration(text: str, option: str, *, bare_unit: str = "") -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` (a bare number counts in ``bare_unit``; without one it is refused);
    UsageError naming ``option`` otherwise."""
    match = _DURATION.fullmatch(text.strip().lower())
    unit = match.group(2) or bare_unit if match else ""
    if not match or not unit or float(match.group(1)) <= 0:
        raise UsageError(f"{option} {text!r} is not a duration; write a positive number and a unit, e.g. 7d, 12h, 30m")
    return timedelta(seconds=float(match.group(1)) * _UNITS[unit])


def _state(text: str) -> str:
    state = text.strip().upper().replace("CANCELLED", "CANCELED")
    if state not in STATES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a run state; use one of {', '.join(STATES)}")
    return state


# ------------------------------------------------------------------------------------------------ commands


def wait(
    kfp_: Kfp,
    run_id: str,
    *,
    timeout: timedelta | None,
    interval: float = 10.0,
    out: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow the run until it ends, printing the run's and each task's state as it changes; the exit code.

    kfp.Client.wait_for_run_completion is not used: it does not count CANCELED as an end (it waits out its timeout on
    a cancelled run) and prints nothing on the way.
    """
    deadline = clock() + timeout.total_seconds() if timeout else None
    seen: dict[str, str] = {}
    run = get_run(kfp_, run_id)  # an unknown run, a bad token: at once
    while True:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        for task in tasks_of(run):
            if seen.get(task.task_id) != task.state:
                seen[task.task_id] = task.state
                out(f"{stamp}  {task.display_name or task.task_id}: {task.state}")
        if seen.get("") != run.state:
            seen[""] = run.state
            out(f"{stamp}  run {run.display_name}: {run.state}")
        if run.state in FINAL_STATES:
            break
        if deadline is not None and clock() >= deadline:
            out(f"timed out waiting: run {run_id} is still {run.state} ({kfp_.url(run_id)})")
            return EXIT_TIMEOUT
        sleep(interval if deadline is None else max(0.0, min(interval, deadline - clock())))
        run = _poll(kfp_, run_id, out=out, clock=clock, sleep=sleep)
    if run.state == "SUCCEEDED":
        out(f"run {run_id} succeeded ({kfp_.url(run_id)})")
        return 0
    if run.state == "FAILED":
        out(f"run {run_id} FAILED ({kfp_.url(run_id)})\n{failure_of(run)}")
        return EXIT_FAILED
    out(f"run {run_id} ended {run.state} ({kfp_.url(run_id)})")
    return EXIT_CANCELED


def _poll(kfp_: Kfp, run_id: str, *, out, clock, sleep, window: float = RETRY_WINDOW_SECONDS):
    """get_run for a long wait: a server or gateway that answers 5xx or drops the connection (an upgrade, a restart)
    is waited out for ``window`` seconds (a service-account token file is read again on every request: kfp's
    credentials hook)."""
    import kfp_server_api
    import urllib3

    since = None
    while True:
        try:
            return kfp_.client.get_run(run_id)
        except (kfp_server_api.ApiException, urllib3.exceptions.HTTPError) as exc:
            status = getattr(exc, "status", None)
            if since is None:
                since = clock()
                out(f"KFP at {kfp_.host} did not answer ({status or type(exc).__name__}); retrying for {window:.0f}s")
            if (status is not None and status < 500) or clock() - since >= window:
                with _step(kfp_, f"getting run {run_id}"):
                    raise
            sleep(min(10.0, window))


def cancel(kfp_: Kfp, run_id: str) -> str:
    """Ask KFP to terminate a run still going (its pods get SIGTERM; the launchers delete their jobs)."""
    run = get_run(kfp_, run_id)
    if run.state in FINAL_STATES or run.state == "CANCELING":
        return f"run {run_id} is already {run.state}; nothing to cancel"
    with _step(kfp_, f"terminating run {run_id}"):
        kfp_.client.terminate_run(run_id)
    return f"cancelling run {run_id} (was {run.state}); python -m pipelines.runs wait {run_id} follows it to the end"


# ------------------------------------------------------------------------------------------------ command line


def make_parser() -> argparse.ArgumentParser:
    """The command line (``--help`` imports neither kfp nor the Kubernetes client)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--host", default=os.environ.get("KFP_HOST"), help="KFP API endpoint (default: $KFP_HOST); token: $KFP_TOKEN"
    )
    common.add_argument("--namespace", help="KFP namespace (multi-user Kubeflow); also where cleanup's Job runs")
    p = argparse.ArgumentParser(
        prog="python -m pipelines.runs",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("status", parents=[common], help="the run's state and each step's")
    s.add_argument("run_id", metavar="RUN_ID")
    s = sub.add_parser("wait", parents=[common], help="follow a run to its end; exit 0 only if it succeeded")
    s.add_argument("run_id", metavar="RUN_ID")
    s.add_argument("--timeout", help="give up after this long (e.g. 12h, 90m; a bare number is seconds)")
    s.add_argument("--interval", type=float, default=10.0, help="seconds between polls (default: 10)")
    s = sub.add_parser("list", parents=[common], help="runs, newest first")
    s.add_argument("--experiment", help="only this experiment's runs")
    s.add_argument("--state", type=_state, help=f"only runs in this state ({', '.join(STATES)})")
    s.add_argument("--limit", type=int, default=20, help="at most this many (default: 20; 0: all)")
    s = sub.add_parser("cancel", parents=[common], help="terminate a run that is still going")
    s.add_argument("run_id", metavar="RUN_ID")
    s = sub.add_parser("cleanup", parents=[common], help="delete finished runs and their folders (dry run by default)")
    s.add_argument("run_ids", metavar="RUN_ID", nargs="*", help="finished runs to delete")
    s.add_argument("--older-than", help="also every finished run that ended longer ago than this (e.g. 7d)")
    s.add_argument("--experiment", help="with --older-than: only this experiment's runs")
    s.add_argument("--yes", action="store_true", help="delete; without it nothing is deleted (a dry run)")
    s.add_argument("--dry-run", action="store_true", help="print what would be deleted (the default without --yes)")
    s.add_argument("--keep-folders", action="store_true", help="delete only the runs from KFP, not their folders")
    s.add_argument("--image", help="image of the cleanup Job (default: the package's components image)")
    s.add_argument("--job-timeout", default="15m", help="how long the cleanup Job may take (default: 15m)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pipelines.runs``; returns the exit code (2 for bad input)."""
    args = make_parser().parse_args(argv)
    return exit_code(lambda: _main(args))


def _main(args) -> int:
    # Every argument is checked before the first request.
    timeout = parse_duration(args.timeout, "--timeout", bare_unit="s") if getattr(args, "timeout", None) else None
    older = parse_duration(args.older_than, "--older-than") if getattr(args, "older_than", None) else None
    if args.command == "cleanup":
        if args.yes and args.dry_run:
            raise UsageError("--yes and --dry-run contradict each other; pass one")
        if not args.run_ids and older is None:
            raise UsageError("cleanup needs RUN_ID arguments or --older-than (e.g. --older-than 7d)")
        job_timeout = parse_duration(args.job_timeout, "--job-timeout", bare_unit="s")
    kfp_ = connect(args.host, args.namespace)
    if args.command == "status":
        print(describe(kfp_, get_run(kfp_, args.run_id)))
        return 0
    if args.command == "wait":
        try:
            return wait(kfp_, args.run_id, timeout=timeout, interval=args.interval)
        except KeyboardInterrupt:
            print(f"stopped waiting; run {args.run_id} goes on", file=sys.stderr)
            return EXIT_INTERRUPTED
    if args.command == "list":
        runs = [r for r in list_runs(kfp_, args.experiment) if args.state is None or r.state == args.state]
        print_runs(runs[: args.limit] if args.limit > 0 else runs)
        return 0
    if args.command == "cancel":
        print(cancel(kfp_, args.run_id))
        return 0
    from components.version import COMPONENTS_IMAGE

    doomed, others = cleanup.select(kfp_, args.run_ids, older, args.experiment)
    if others:
        print(f"{others} finished run{'s' if others > 1 else ''} of other pipelines left alone")
    return cleanup.cleanup(
        kfp_,
        doomed,
        yes=args.yes,
        keep_folders=args.keep_folders,
        namespace=args.namespace or kfp_.namespace or "kubeflow",
        image=args.image or COMPONENTS_IMAGE,
        job_timeout=job_timeout.total_seconds(),
    )


def print_runs(runs: Iterable) -> None:
    rows = [(r.run_id, r.state or "-", _when(r.created_at), _when(r.finished_at), r.display_name) for r in runs]
    if not rows:
        print("no runs")
        return
    print(f"{'RUN ID':<36}  {'STATE':<9}  {'CREATED':<20}  {'FINISHED':<20}  NAME")
    for row in rows:
        print(f"{row[0]:<36}  {row[1]:<9}  {row[2]:<20}  {row[3]:<20}  {row[4]}")


if __name__ == "__main__":
    sys.exit(main())
