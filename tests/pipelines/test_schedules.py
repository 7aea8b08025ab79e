"""``python -m pipelines.run schedules list|pause|resume|delete`` (issue 40): the recurring runs ``--schedule`` makes,
managed on KFP with submit's host, token and namespace, against the fake KFP API with every request checked against
the vendored v2beta1 swagger."""

from __future__ import annotations

import pytest

from pipelines.run import main as run_main

pytestmark = pytest.mark.usefixtures("isolated_kfp_client", "token")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = run_main(["schedules", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _operations(api) -> list[str]:
    return [api.operation_of(r) for r in api.requests if not r.path.endswith("/healthz")]


def test_list_shows_each_schedule_with_its_status_and_trigger(capsys, kfp_api):
    nightly = kfp_api.add_recurring_run(display_name="nightly-sft")
    weekly = kfp_api.add_recurring_run(
        display_name="weekly-eval",
        status="DISABLED",
        mode="DISABLE",
        trigger={"cron_schedule": {"cron": "0 0 3 * * 0"}},
    )
    code, out, _ = _run(capsys, "list", "--host", kfp_api.url)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["SCHEDULE_ID", "STATUS", "TRIGGER", "CREATED", "NAME"]
    assert any(nightly["recurring_run_id"] in ln and "ENABLED" in ln and "0 0 2 * * *" in ln for ln in lines)
    assert any(weekly["recurring_run_id"] in ln and "DISABLED" in ln and "weekly-eval" in ln for ln in lines)
    assert _operations(kfp_api) == ["RecurringRunService_ListRecurringRuns"]


def test_pause_resume_and_delete_change_the_schedule_on_kfp(capsys, kfp_api):
    schedule_id = kfp_api.add_recurring_run(display_name="nightly-sft")["recurring_run_id"]
    code, out, _ = _run(capsys, "pause", schedule_id, "--host", kfp_api.url)
    assert code == 0 and out.strip() == f"schedule {schedule_id} (nightly-sft): DISABLED (0 0 2 * * *)"
    assert kfp_api.recurring_runs[schedule_id]["status"] == "DISABLED"
    code, out, _ = _run(capsys, "resume", schedule_id, "--host", kfp_api.url)
    assert code == 0 and "ENABLED" in out and kfp_api.recurring_runs[schedule_id]["status"] == "ENABLED"
    code, out, _ = _run(capsys, "delete", schedule_id, "--host", kfp_api.url)
    assert code == 0 and "deleted; the runs it started are kept" in out and not kfp_api.recurring_runs
    assert "RecurringRunService_DisableRecurringRun" in _operations(kfp_api)
    assert "RecurringRunService_EnableRecurringRun" in _operations(kfp_api)
    assert _operations(kfp_api)[-1] == "RecurringRunService_DeleteRecurringRun"


def test_bad_input_is_one_line_and_exit_2(capsys, kfp_api):
    code, _, err = _run(capsys, "pause", "--host", kfp_api.url)
    assert code == 2 and "schedules pause needs a SCHEDULE_ID" in err and err.count("\n") == 1
    code, _, err = _run(capsys, "delete", "no-such-schedule", "--host", kfp_api.url)
    assert code == 2 and "schedule 'no-such-schedule' not found" in err and err.count("\n") == 1
    assert not any(r.method == "DELETE" for r in kfp_api.requests)
