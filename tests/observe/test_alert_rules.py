"""The alert rules and their route with the real parts: promtool checks and unit-tests every rule
(tests/observe/rules_test.yaml: firing and silent cases), Prometheus 2.42 scrapes a live trainer endpoint and answers
through its HTTP API, and a NaN loss it scrapes fires the rule, which Alertmanager 0.25 (manifests/monitoring/
alertmanager.yml) delivers to a local Slack-compatible webhook in Slack's format."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from components.train.trainer.metrics import MetricsCallback, TrainerMetrics
from tests.fakes.webhook import TOKEN_PATH, Hook

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
RULES_TEST = Path(__file__).with_name("rules_test.yaml")
WEBHOOK_FILE = "/etc/alertmanager/secrets/llm-alerts/ALERT_WEBHOOK_URL"


def rules_file() -> str:
    """The PrometheusRule's groups as a Prometheus rules file (what the operator writes for Prometheus)."""
    (rule,) = [d for d in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text()) if d]
    return yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False)


def test_promtool_checks_and_unit_tests_every_rule(promtool, tmp_path):
    (tmp_path / "rules.yaml").write_text(rules_file())
    shutil.copy(RULES_TEST, tmp_path / "rules_test.yaml")
    check = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 4 rules found" in check.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", "rules_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every rule has a firing case and a silent one.
    cases = [c for t in yaml.safe_load(RULES_TEST.read_text())["tests"] for c in t["alert_rule_test"]]
    (rule,) = [d for d in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text()) if d]
    for name in (r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]):
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), f"{name} never fires in a test"
        assert any(c["alertname"] == name and not c["exp_alerts"] for c in cases), f"{name} never stays silent"


def test_promtool_test_fails_when_a_rule_is_changed(promtool, tmp_path):
    # The unit tests can fail: with the idle threshold at 20% the 25%-busy pod no longer alerts.
    (tmp_path / "rules.yaml").write_text(rules_file().replace("< 50", "< 20"))
    shutil.copy(RULES_TEST, tmp_path / "rules_test.yaml")
    tested = subprocess.run(
        [promtool, "test", "rules", "rules_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode != 0 and "LLMTrainingGPUIdle" in tested.stdout + tested.stderr


def until(check, timeout: float = 30.0, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(every)


@pytest.fixture
def trainer_endpoint():
    """A trainer's metrics endpoint, serving as in a pod (its callback driven through a few steps)."""
    metrics = TrainerMetrics("sft", "run-7", "sft-run-7", "0")
    metrics.serve(0, addr="127.0.0.1")
    callback = MetricsCallback(metrics)
    yield metrics, callback
    metrics.close()


def state(step: int):
    from types import SimpleNamespace

    return SimpleNamespace(global_step=step, max_steps=40)


def prometheus_config(target: str, **extra) -> dict:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "llm-trainer", "static_configs": [{"targets": [target]}]}],
        **extra,
    }


@pytest.mark.slow  # a real Prometheus: its first scrape answers ~5 s after it starts
def test_prometheus_scrapes_the_trainer_and_answers_through_its_api(start_prometheus, trainer_endpoint):
    metrics, callback = trainer_endpoint
    callback.on_train_begin(None, state(0), None)
    for step in range(1, 4):
        callback.on_step_end(None, state(step), None)
    callback.on_log(
        None, state(3), None, logs={"loss": 1.75, "learning_rate": 2e-5, "tokens_per_second_per_device": 900.0}
    )
    prometheus = start_prometheus(prometheus_config(metrics.url.split("/")[2]))

    def query(q: str) -> list:
        answer = prometheus.api("/api/v1/query?query=" + urllib.parse.quote(q))
        assert answer["status"] == "success"
        return answer["data"]["result"]

    result = until(lambda: query("llm_train_loss"))
    assert result, f"no llm_train_loss scraped; targets: {prometheus.api('/api/v1/targets')}"
    (series,) = result
    assert series["metric"] == {
        "__name__": "llm_train_loss",
        "instance": metrics.url.split("/")[2],
        "job": "llm-trainer",
        "run_id": "run-7",
        "stage": "sft",
        "job_name": "sft-run-7",
        "node_rank": "0",
    }
    assert float(series["value"][1]) == 1.75
    callback.on_step_end(None, state(4), None)
    assert until(lambda: [s for s in query("llm_train_step") if s["value"][1] == "4"])
    assert query('llm_train_step{run_id="run-7"} < llm_train_max_steps')  # the stall rule's guard holds


@pytest.mark.slow  # a real Prometheus and Alertmanager: its first scrape answers ~5 s after it starts
def test_a_nan_loss_scraped_by_prometheus_reaches_the_webhook_through_alertmanager(
    start_prometheus, start_alertmanager, trainer_endpoint, tmp_path
):
    metrics, callback = trainer_endpoint
    callback.on_train_begin(None, state(0), None)
    with Hook() as hook:
        # The shipped route, reading the webhook URL from a file as from the mounted Secret; group_wait shortened
        # from 30 s so the test does not wait for it.
        url_file = tmp_path / "ALERT_WEBHOOK_URL"
        url_file.write_text(hook.url)
        config = (MONITORING / "alertmanager.yml").read_text()
        assert WEBHOOK_FILE in config
        config = config.replace(WEBHOOK_FILE, str(url_file)).replace("group_wait: 30s", "group_wait: 1s")
        alertmanager = start_alertmanager(config)
        prometheus = start_prometheus(
            prometheus_config(
                metrics.url.split("/")[2],
                rule_files=["rules.yaml"],
                alerting={"alertmanagers": [{"static_configs": [{"targets": [alertmanager.url.split("/")[2]]}]}]},
            ),
            files={"rules.yaml": rules_file()},
        )
        callback.on_log(None, state(2), None, logs={"loss": float("nan")})
        assert until(lambda: hook.requests, timeout=60), (
            f"nothing posted; Prometheus alerts: {prometheus.api('/api/v1/alerts')}; "
            f"Alertmanager log: {alertmanager.log.read_text()[-2000:]}"
        )
    post = hook.requests[0]
    assert post["path"] == TOKEN_PATH
    assert post["headers"]["Content-Type"].startswith("application/json")
    body = json.loads(post["body"])
    # Slack's incoming-webhook format, as Alertmanager's slack notifier sends it: attachments with title and text.
    (attachment,) = body["attachments"]
    assert attachment["title"] == (":rotating_light: LLMTrainingLossNaN: Run run-7 (stage sft) has a NaN training loss")
    assert attachment["text"].strip() == (
        "Job sft-run-7 logged a NaN or infinite loss; every later step is wasted GPU time."
    )
    assert attachment["color"] == "danger"


@pytest.mark.slow  # a real Prometheus: its first scrape answers ~5 s after it starts
def test_every_dashboard_query_parses_in_prometheus(start_prometheus, trainer_endpoint):
    """Prometheus itself parses each panel's query (Grafana's $run_id and $__range filled in as Grafana does)."""
    metrics, callback = trainer_endpoint
    callback.on_train_begin(None, state(0), None)
    prometheus = start_prometheus(prometheus_config(metrics.url.split("/")[2]))
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) == 10
    for query in queries:
        filled = query.replace("$run_id", "run-7").replace("$__range", "1h")
        answer = prometheus.api("/api/v1/query?query=" + urllib.parse.quote(filled))
        assert answer["status"] == "success", (query, answer)
    # The trainer's own panels have data once it is scraped.
    assert until(
        lambda: prometheus.api(
            "/api/v1/query?query="
            + urllib.parse.quote('max(llm_train_step{run_id="run-7"}) / max(llm_train_max_steps{run_id="run-7"})')
        )["data"]["result"]
    )
