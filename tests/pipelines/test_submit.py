"""pipelines.submit through the real kfp.Client against a fake KFP v2beta1 API (tests/fakes/kfp_api.py).

Nothing in kfp.Client or in pipelines.submit is mocked: every assertion is about the HTTP requests that
reached the fake, whose request validation follows the real swagger spec in tests/reference/kfp/.
"""

# No `from __future__ import annotations`: kfp's @dsl.component needs real annotation objects.
import contextlib
import json
import re
import socket
import time
from pathlib import Path

import kfp.client.client
import pytest
import urllib3
from kfp import compiler, dsl

from pipelines.errors import UsageError
from pipelines.schedule import validate_cron
from pipelines.submit import Submission, submit
from tests.fakes.kfp_api import API, running_fake_kfp

PARAMS = {"message": "hello from the test", "repeats": 3}
SIX_FIELD_FORM = "second minute hour day-of-month month day-of-week"


@dsl.component(base_image="python:3.11-slim")
def echo(message: str, repeats: int) -> str:
    """Repeat a message: the one step of the test pipeline."""
    return message * repeats


@dsl.pipeline(name="submit-test")
def one_step_pipeline(message: str = "hi", repeats: int = 1):
    """A tiny real pipeline with two runtime parameters."""
    echo(message=message, repeats=repeats)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("compiled") / "submit_test.yaml"
    compiler.Compiler().compile(one_step_pipeline, str(path))
    return str(path)


@pytest.fixture(autouse=True)
def isolated_kfp_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep the developer's KFP settings out: they would change which requests kfp.Client makes."""
    for name in (
        "KF_PIPELINES_SA_TOKEN_PATH",
        "KF_PIPELINES_UI_ENDPOINT",
        "KF_PIPELINES_ENDPOINT",
        "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME",
        "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME",
    ):
        monkeypatch.delenv(name, raising=False)
    # kfp.Client reads a default namespace from ~/.config/kfp/context.json (path fixed at import).
    monkeypatch.setattr(kfp.client.client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "context.json"))


@pytest.fixture
def start_fake():
    """Start fake KFP servers with given knobs; all stop at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda **knobs: stack.enter_context(running_fake_kfp(**knobs))


@pytest.fixture
def kfp_api(start_fake):
    return start_fake()


def _submit(host: str, package: str, **overrides) -> Submission:
    arguments = dict(
        host=host,
        package_path=package,
        pipeline_name="submit-test",
        params=PARAMS,
        experiment="nightly",
        run_name="run-1",
    )
    return submit(**{**arguments, **overrides})


# --------------------------------------------------------------------------------------- runs


def test_first_submit_creates_pipeline_version_experiment_and_run(kfp_api, package):
    sub = _submit(kfp_api.url, package)

    assert sub.kind == "run"
    assert sub.url == f"{kfp_api.url}/#/runs/details/{sub.id}"
    [upload] = kfp_api.requests_to("POST", f"{API}/pipelines/upload")
    assert upload.query["name"] == ["submit-test"] and upload.form == {"uploadfile": "submit_test.yaml"}
    assert not kfp_api.requests_to("POST", f"{API}/pipelines/upload_version")
    assert kfp_api.requests_to("GET", f"{API}/pipelines/{sub.pipeline_id}/versions")
    [create_experiment] = kfp_api.requests_to("POST", f"{API}/experiments")
    assert create_experiment.json["display_name"] == "nightly"
    [create_run] = kfp_api.requests_to("POST", f"{API}/runs")
    assert create_run.json["pipeline_version_reference"] == {
        "pipeline_id": sub.pipeline_id,
        "pipeline_version_id": sub.version_id,
    }
    assert "pipeline_spec" not in create_run.json  # bound to the uploaded version, not an inline copy
    assert create_run.json["runtime_config"] == {"parameters": PARAMS}
    assert create_run.json["experiment_id"] == sub.experiment_id
    assert create_run.json["display_name"] == "run-1"
    [pipeline] = kfp_api.pipelines.values()
    assert pipeline["pipeline_id"] == sub.pipeline_id and pipeline["name"] == "submit-test"
    assert list(kfp_api.versions) == [sub.version_id]
    assert kfp_api.runs[sub.id]["runtime_config"]["parameters"] == PARAMS


def test_second_submit_adds_a_version_and_reuses_the_experiment(kfp_api, package):
    first = _submit(kfp_api.url, package)
    second = _submit(kfp_api.url, package, run_name="run-2")

    assert len(kfp_api.requests_to("POST", f"{API}/pipelines/upload")) == 1
    [upload_version] = kfp_api.requests_to("POST", f"{API}/pipelines/upload_version")
    assert upload_version.query["pipelineid"] == [first.pipeline_id]
    assert re.fullmatch(r"v\d+\.\d+\.\d+\S*-\d{8}-\d{6}", upload_version.query["name"][0])
    assert second.pipeline_id == first.pipeline_id and second.version_id != first.version_id
    assert second.experiment_id == first.experiment_id
    assert len(kfp_api.requests_to("POST", f"{API}/experiments")) == 1
    assert len(kfp_api.pipelines) == 1 and len(kfp_api.versions) == 2
    assert kfp_api.runs[second.id]["pipeline_version_reference"]["pipeline_version_id"] == second.version_id


def test_version_name_taken_in_the_same_second_gets_a_suffix(kfp_api, package):
    _submit(kfp_api.url, package)
    kfp_api.fail_once(f"{API}/pipelines/upload_version", status=409)

    sub = _submit(kfp_api.url, package)

    first_try, second_try = kfp_api.requests_to("POST", f"{API}/pipelines/upload_version")
    assert second_try.query["name"] == [first_try.query["name"][0] + "-2"]
    assert kfp_api.versions[sub.version_id]["name"] == second_try.query["name"][0]


def test_schedule_creates_an_enabled_recurring_run_of_the_new_version(kfp_api, package):
    sub = _submit(kfp_api.url, package, schedule="0 0 3 * * 0", description="weekly retrain")

    assert sub.kind == "recurring_run"
    assert sub.url == f"{kfp_api.url}/#/recurringrun/details/{sub.id}"
    assert not kfp_api.requests_to("POST", f"{API}/runs")
    [create] = kfp_api.requests_to("POST", f"{API}/recurringruns")
    body = create.json
    assert body["trigger"] == {"cron_schedule": {"cron": "0 0 3 * * 0"}}
    assert body["pipeline_version_reference"] == {"pipeline_id": sub.pipeline_id, "pipeline_version_id": sub.version_id}
    assert body["runtime_config"] == {"parameters": PARAMS}
    assert (body["mode"], int(body["max_concurrency"]), body["no_catchup"]) == ("ENABLE", 1, True)
    assert body["experiment_id"] == sub.experiment_id and body["description"] == "weekly retrain"
    assert kfp_api.recurring_runs[sub.id]["status"] == "ENABLED"


def test_namespace_goes_to_experiment_and_pipeline_on_multi_user_kfp(start_fake, package):
    kfp_api = start_fake(multi_user=True)

    sub = _submit(kfp_api.url, package, namespace="team-a")

    [list_experiments] = kfp_api.requests_to("GET", f"{API}/experiments")
    assert list_experiments.query["namespace"] == ["team-a"]
    [create_experiment] = kfp_api.requests_to("POST", f"{API}/experiments")
    assert create_experiment.json["namespace"] == "team-a"
    assert kfp_api.experiments[sub.experiment_id]["namespace"] == "team-a"
    [upload] = kfp_api.requests_to("POST", f"{API}/pipelines/upload")
    assert upload.query["namespace"] == ["team-a"]
    assert sub.id in kfp_api.runs


def test_multi_user_kfp_without_namespace_is_a_usage_error(start_fake, package):
    kfp_api = start_fake(multi_user=True)

    with pytest.raises(UsageError, match="multi-user.*namespace"):
        _submit(kfp_api.url, package)
    assert not kfp_api.pipelines and not kfp_api.experiments


def test_path_prefix_of_the_kubeflow_gateway_is_kept(start_fake, package):
    kfp_api = start_fake(path_prefix="/pipeline")

    sub = _submit(kfp_api.url + "/", package)

    assert sub.url == f"{kfp_api.url}/#/runs/details/{sub.id}" and "/pipeline/#/" in sub.url


# ----------------------------------------------------------------------------------- failures


def test_missing_path_prefix_names_the_prefix(start_fake, package):
    kfp_api = start_fake(path_prefix="/pipeline")
    root = kfp_api.url.removesuffix("/pipeline")

    with pytest.raises(UsageError, match=r"HTTP 404.*path prefix.*/pipeline") as error:
        _submit(root, package)
    assert root in str(error.value)


def test_unreachable_host_fails_fast(package):
    with socket.socket() as probe:  # a port nobody listens on once the socket is closed
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    host = f"http://127.0.0.1:{closed_port}"

    started = time.monotonic()
    with pytest.raises(UsageError, match="cannot reach KFP") as error:
        _submit(host, package)
    assert time.monotonic() - started < 10
    assert host in str(error.value) and "Connection refused" in str(error.value)


def test_host_that_accepts_but_never_answers_times_out_in_seconds(package):
    with socket.socket() as hung:  # the kernel completes the handshake; nobody ever reads or answers
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        host = f"http://127.0.0.1:{hung.getsockname()[1]}"

        started = time.monotonic()
        with pytest.raises(UsageError, match="cannot reach KFP .*Read timed out"):
            _submit(host, package)
        assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "status, message",
    [
        (302, "redirected the API request.*authentication required"),
        (403, r"authentication failed \(HTTP 403\)"),
        (503, r"unhealthy \(HTTP 503 on /apis/v2beta1/healthz\)"),
    ],
)
def test_healthz_answer_is_explained(kfp_api, package, status, message):
    kfp_api.fail_once(f"{API}/healthz", status=status)

    with pytest.raises(UsageError, match=message):
        _submit(kfp_api.url, package)
    assert [r.path for r in kfp_api.requests] == [f"{API}/healthz"]


def test_host_without_scheme_is_a_usage_error(package):
    with pytest.raises(UsageError, match="with scheme, e.g. http://localhost:8080"):
        _submit("localhost:8080", package)


def test_missing_package_is_reported_before_any_request(kfp_api, tmp_path):
    with pytest.raises(UsageError, match="does not exist; compile the pipeline first"):
        _submit(kfp_api.url, str(tmp_path / "nope.yaml"))
    assert kfp_api.requests == []


@pytest.mark.parametrize("token", [None, "wrong-token-1234"])
def test_missing_or_wrong_token_is_an_authentication_error(start_fake, package, token):
    kfp_api = start_fake(token="s3cret-token")

    with pytest.raises(UsageError, match=r"authentication failed \(HTTP 401\)") as error:
        _submit(kfp_api.url, package, existing_token=token)
    assert "KFP bearer token" in str(error.value)
    assert "s3cret-token" not in str(error.value) and "wrong-token-1234" not in str(error.value)
    assert not kfp_api.pipelines


def test_valid_token_is_sent_on_every_request(start_fake, package):
    kfp_api = start_fake(token="s3cret-token")

    _submit(kfp_api.url, package, existing_token="s3cret-token")

    assert {r.headers.get("authorization") for r in kfp_api.requests} == {"Bearer s3cret-token"}


def test_service_account_token_file_is_used_without_a_token(start_fake, package, monkeypatch, tmp_path):
    kfp_api = start_fake(token="projected-sa-token")
    token_file = tmp_path / "token"
    token_file.write_text("projected-sa-token")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token_file))

    sub = _submit(kfp_api.url, package)

    assert sub.id in kfp_api.runs
    assert {r.headers.get("authorization") for r in kfp_api.requests} == {"Bearer projected-sa-token"}


def test_unreadable_service_account_token_file_is_a_usage_error(kfp_api, package, monkeypatch, tmp_path):
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "absent"))

    with pytest.raises(UsageError, match="KF_PIPELINES_SA_TOKEN_PATH"):
        _submit(kfp_api.url, package)
    assert kfp_api.requests == []


def test_server_error_names_the_step_and_creates_no_run(kfp_api, package):
    kfp_api.fail_once(f"{API}/runs", status=500)

    with pytest.raises(UsageError, match=r"failed while creating run 'run-1'.*HTTP 500"):
        _submit(kfp_api.url, package)
    assert not kfp_api.runs


def test_file_that_is_not_a_compiled_pipeline_is_rejected_by_the_server(kfp_api, tmp_path):
    not_a_pipeline = tmp_path / "values.yaml"
    not_a_pipeline.write_text("learning_rate: 1.0e-5\n")

    with pytest.raises(UsageError, match=r"rejected uploading new pipeline.*HTTP 400.*pipeline spec"):
        _submit(kfp_api.url, str(not_a_pipeline))
    assert not kfp_api.pipelines


def test_parameter_the_pipeline_does_not_declare_is_rejected_by_the_server(kfp_api, package):
    with pytest.raises(UsageError, match=r"HTTP 400.*'learning_rate' is not declared"):
        _submit(kfp_api.url, package, params={"learning_rate": 1e-5})


# --------------------------------------------------------------------------------------- cron


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 3 * * 0",
        "0 0 9 ? * MON-FRI",
        "*/15 0-30/5 1,2,3 1-31/2 JAN-DEC SUN-SAT",
        "5/10 * * * * *",
        "0 30 2 1 */2 ?",
        "0 0 3 * * sun",
        "  0 0 3 * * 0  ",
        "@every 1h30m",
        "@every 90s",
        "@hourly",
        "@daily",
        "@midnight",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
    ],
)
def test_valid_cron_is_accepted(expression):
    validate_cron(expression)


@pytest.mark.parametrize(
    "expression, message",
    [
        ("0 3 * * 0", 'has 5 fields.*prepend a seconds field, e.g. "0 0 3 \\* \\* 0"'),
        ("60 0 3 * * 0", 'second field "60" has 60 outside 0-59'),
        ("0 */0 3 * * 0", 'minute field "\\*/0" has step "/0"'),
        ("0 0 24 * * 0", 'hour field "24" has 24 outside 0-23'),
        ("0 0 5-3 * * 0", 'hour field "5-3" has range 5-3 whose start is after its end'),
        ("0 0 3 0 * 0", 'day-of-month field "0" has 0 outside 1-31'),
        ("0 0 3 * FOO 0", 'month field "FOO" has "FOO" where 1-12 or JAN-DEC is expected'),
        ("0 0 3 * * 7", 'day-of-week field "7" has 7 outside 0-6 \\(0 is Sunday\\)'),
        ("0 0 3 * * MON,", 'day-of-week field "MON," has an empty list item'),
        ("garbage", "has 1 field but KFP cron has 6 fields"),
        ("every sunday at three", "has 4 fields but KFP cron has 6 fields"),
        ("", "schedule is empty"),
        ("@fortnightly", "not a known descriptor"),
    ],
)
def test_invalid_cron_names_the_field_and_shows_the_six_field_form(expression, message):
    with pytest.raises(UsageError, match=message) as error:
        validate_cron(expression)
    assert SIX_FIELD_FORM in str(error.value)


@pytest.mark.parametrize(
    "expression, message",
    [
        ("@every 1 hour", 'not a Go duration; write e.g. "@every 1h30m"'),
        ("@every 500ms", "at least 1s"),
        ("@every -1h", "at least 1s"),
    ],
)
def test_invalid_every_interval_shows_a_go_duration(expression, message):
    with pytest.raises(UsageError, match=message):
        validate_cron(expression)


@pytest.mark.parametrize("schedule", ["0 3 * * 0", "0 0 25 * * 0", "0 0 3 * SEPT 0", "garbage"])
def test_invalid_schedule_is_rejected_before_any_request(kfp_api, package, schedule):
    with pytest.raises(UsageError, match="schedule"):
        _submit(kfp_api.url, package, schedule=schedule)
    assert kfp_api.requests == []


# ------------------------------------------------------------------------------- the fake itself


def _post(url: str, path: str, body: dict) -> tuple[int, dict]:
    response = urllib3.request("POST", url + path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return response.status, response.json()


def test_fake_answers_unknown_fields_like_grpc_gateway(kfp_api):
    status, answer = _post(kfp_api.url, f"{API}/experiments", {"display_name": "e", "owner": "me"})

    assert status == 400
    assert answer["code"] == 3 and 'unknown field "owner"' in answer["message"]


def test_fake_requires_the_fields_the_spec_marks_required(kfp_api):
    status, answer = _post(kfp_api.url, f"{API}/experiments", {"description": "no name"})

    assert status == 400 and "display_name is required" in answer["message"]


def test_fake_checks_the_recurring_run_trigger(kfp_api):
    _, experiment = _post(kfp_api.url, f"{API}/experiments", {"display_name": "e"})
    recurring_run = {
        "display_name": "r",
        "experiment_id": experiment["experiment_id"],
        "mode": "ENABLE",
        "max_concurrency": "1",
        "pipeline_spec": {"root": {}},
        "runtime_config": {},
    }

    status, answer = _post(
        kfp_api.url, f"{API}/recurringruns", {**recurring_run, "trigger": {"cron_schedule": {"cron": "daily"}}}
    )
    assert status == 400 and "Schedule cron is not a supported format" in answer["message"]
    status, answer = _post(kfp_api.url, f"{API}/recurringruns", {**recurring_run, "trigger": {}})
    assert status == 400 and "exactly one of cron_schedule or periodic_schedule" in answer["message"]
    status, answer = _post(
        kfp_api.url,
        f"{API}/recurringruns",
        {**recurring_run, "trigger": {"cron_schedule": {"cron": "0 0 3 * * 0"}}, "max_concurrency": 11},
    )
    assert status == 400 and "at most 10" in answer["message"]


def test_runs_and_recurring_runs_name_the_packages_service_account(kfp_api, package):
    """The steps run as the account manifests/ creates (the package's Role only), not Kubeflow's default-editor."""
    from pipelines.params import RUNNER_SERVICE_ACCOUNT

    run = _submit(kfp_api.url, package, service_account=RUNNER_SERVICE_ACCOUNT)
    recurring = _submit(kfp_api.url, package, service_account=RUNNER_SERVICE_ACCOUNT, schedule="0 0 3 * * 0")
    [create_run] = kfp_api.requests_to("POST", f"{API}/runs")
    [create_recurring] = kfp_api.requests_to("POST", f"{API}/recurringruns")
    assert create_run.json["service_account"] == create_recurring.json["service_account"] == RUNNER_SERVICE_ACCOUNT
    assert kfp_api.runs[run.id]["service_account"] == RUNNER_SERVICE_ACCOUNT
    assert kfp_api.recurring_runs[recurring.id]["service_account"] == RUNNER_SERVICE_ACCOUNT
    # '' (the CLI's --service-account '') leaves the choice to KFP: the field is not sent
    _submit(kfp_api.url, package, run_name="run-3")
    assert "service_account" not in kfp_api.requests_to("POST", f"{API}/runs")[-1].json
