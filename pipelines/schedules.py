"""Recurring runs on Kubeflow Pipelines (what ``python -m pipelines.run --schedule CRON`` creates): list, pause,
resume, delete.

    python -m pipelines.run schedules list [--experiment NAME]
    python -m pipelines.run schedules pause|resume|delete SCHEDULE_ID

The same host, token and namespace as submit and the run commands (``pipelines.kfp_client.connect``). A paused schedule
starts no run until it is resumed (KFP's DisableRecurringRun / EnableRecurringRun: the runs it already started go
on); delete removes the schedule, not the runs it started.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from pipelines.errors import UsageError, exit_code
from pipelines.kfp_client import Kfp, _step, _when, all_pages, connect, get_or_usage

ACTIONS = ("pause", "resume", "delete")


def list_schedules(kfp_: Kfp, experiment: str | None = None) -> list:
    """Every recurring run (newest first) of ``experiment``, or of the namespace; all pages."""
    return all_pages(kfp_, "recurring_runs", kfp_.client.list_recurring_runs, experiment)


def cron_of(schedule) -> str:
    """The schedule's trigger as written: its 6-field cron, or its period."""
    trigger = getattr(schedule, "trigger", None)
    cron = getattr(getattr(trigger, "cron_schedule", None), "cron", None)
    if cron:
        return str(cron)
    period = getattr(getattr(trigger, "periodic_schedule", None), "interval_second", None)
    return f"every {period}s" if period else "-"


def print_schedules(schedules: list, out: Callable[[str], None] = print) -> None:
    rows = [
        (s.recurring_run_id, s.status or "-", cron_of(s), _when(s.created_at), s.display_name or "") for s in schedules
    ]
    if not rows:
        out("no schedules")
        return
    header = ("SCHEDULE_ID", "STATUS", "TRIGGER", "CREATED", "NAME")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        out("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)) + "  " + str(row[-1]))


def get_schedule(kfp_: Kfp, schedule_id: str):
    """The recurring run (kfp_server_api V2beta1RecurringRun); UsageError when the server has none by this id."""
    return get_or_usage(
        kfp_,
        f"reading schedule {schedule_id}",
        lambda: kfp_.client.get_recurring_run(schedule_id),
        f"schedule {schedule_id!r} not found on KFP at {kfp_.host}; python -m pipelines.run schedules list shows the "
        "schedules and their ids",
    )


def act(kfp_: Kfp, action: str, schedule_id: str) -> str:
    """Pause, resume or delete one schedule; the line that says what now holds. An unknown id is a UsageError."""
    schedule = get_schedule(kfp_, schedule_id)
    name = schedule.display_name or schedule_id
    if action == "delete":
        with _step(kfp_, f"deleting schedule {schedule_id}"):
            kfp_.client.delete_recurring_run(schedule_id)
        return f"schedule {schedule_id} ({name}) deleted; the runs it started are kept"
    call = kfp_.client.disable_recurring_run if action == "pause" else kfp_.client.enable_recurring_run
    with _step(kfp_, f"{action} schedule {schedule_id}"):
        call(schedule_id)
        schedule = kfp_.client.get_recurring_run(schedule_id)
    return f"schedule {schedule_id} ({name}): {schedule.status} ({cron_of(schedule)})"


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.run schedules", description=(__doc__ or "").split("\n")[0])
    p.add_argument("action", choices=("list", *ACTIONS), help="what to do")
    p.add_argument("schedule_id", metavar="SCHEDULE_ID", nargs="?", help="the schedule (pause, resume, delete)")
    p.add_argument("--experiment", help="list: only this experiment's schedules")
    p.add_argument(
        "--host", default=os.environ.get("KFP_HOST"), help="KFP API endpoint (default: $KFP_HOST); token: $KFP_TOKEN"
    )
    p.add_argument("--namespace", help="KFP namespace (multi-user Kubeflow)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.run schedules ...``; the exit code (2 for bad input, 1 for a server's refusal)."""
    args = make_parser().parse_args(argv)
    return exit_code(lambda: _main(args))


def _main(args) -> int:
    if (args.action == "list") == bool(args.schedule_id):
        raise UsageError(
            "schedules list takes no SCHEDULE_ID"
            if args.schedule_id
            else f"schedules {args.action} needs a SCHEDULE_ID (python -m pipelines.run schedules list shows them)"
        )
    kfp_ = connect(args.host, args.namespace)
    if args.action == "list":
        print_schedules(list_schedules(kfp_, args.experiment))
    else:
        print(act(kfp_, args.action, args.schedule_id))
    return 0
