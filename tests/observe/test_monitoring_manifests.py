"""manifests/monitoring/ against the real prometheus-operator CRDs, the dashboard's and rules' queries against the
metric names that exist, and the training pods' scrape wiring against the PyTorchJob and TrainJob CRDs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.kube import RUN_ID_LABEL
from components.train.launcher.pods import METRICS_PORT_NAME
from components.train.launcher.pytorchjob import pytorchjob_for_run
from components.train.launcher.trainjob import TRAINER_V2_1, TRAINER_V2_2, trainjob_for_run
from components.train.trainer.metrics import METRIC_NAMES
from tests.helpers.crd_schema import crd_errors

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
CRDS = Path(__file__).resolve().parent / "crds"  # prometheus-operator v0.93 (crds/README.md)

# What the other exporters publish, by name. DCGM exporter: etc/default-counters.csv of NVIDIA/dcgm-exporter
# (DCGM_FI_DEV_GPU_UTIL "GPU utilization (in %)", DCGM_FI_DEV_FB_USED "Framebuffer memory used (in MiB)").
# kube-state-metrics: docs/metrics/workload/pod-metrics.md of kubernetes/kube-state-metrics (kube_pod_status_phase,
# kube_pod_labels, kube_pod_container_status_restarts_total).
DCGM = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}
KUBE_STATE_METRICS = {"kube_pod_status_phase", "kube_pod_labels", "kube_pod_container_status_restarts_total"}
KNOWN = set(METRIC_NAMES) | DCGM | KUBE_STATE_METRICS
PROMQL_WORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords, label lists,
    matchers, strings, durations or Grafana's variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, templates)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges: [$__range], [15m]
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", expr)  # label lists
    expr = re.sub(r"\$\w+", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        following = expr[match.end() :].lstrip()[:1]
        if following == "(" or match.group() in PROMQL_WORDS:
            continue  # a function or an aggregation, a keyword
        names.add(match.group())
    return names


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((MONITORING / name).read_text()) if d]


def dashboard_queries() -> list[str]:
    dash = json.loads((MONITORING / "dashboard.json").read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return queries


def rule_expressions() -> list[str]:
    (rule,) = documents("prometheusrule.yaml")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def test_metric_name_extraction_finds_each_name_and_nothing_else():
    assert metric_names(
        'avg by (pod) (DCGM_FI_DEV_GPU_UTIL * on (namespace, pod) group_left (run_id) llm_train_info{run_id="$run_id"})'
    ) == {"DCGM_FI_DEV_GPU_UTIL", "llm_train_info"}
    assert metric_names("time() - llm_train_x > 15 * 60 and rate(foo_total[5m]) > 0") == {"llm_train_x", "foo_total"}
    assert metric_names("label_values(llm_train_info, run_id)") == {"llm_train_info", "run_id"}


def test_dashboard_queries_read_only_metrics_that_are_exported():
    queries = dashboard_queries()
    assert queries
    for query in queries:
        names = metric_names(query) - {"run_id"}  # label_values' label argument
        assert names, query
        assert names <= KNOWN, f"{query}: {sorted(names - KNOWN)} exported by neither the trainer, DCGM nor KSM"
    read = set().union(*(metric_names(q) for q in queries))
    # The issue's panels: DCGM's GPU utilisation and memory, loss, tokens/s, MFU, ETA, restarts.
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "llm_train_loss",
        "llm_train_tokens_per_second_per_device",
        "llm_train_mfu",
        "llm_train_eta_seconds",
        "kube_pod_container_status_restarts_total",
    } <= read


def test_alert_rules_read_only_metrics_that_are_exported():
    for expr in rule_expressions():
        assert metric_names(expr) <= KNOWN, expr


def test_podmonitor_and_prometheusrule_match_the_operators_crds():
    (monitor,) = documents("podmonitor.yaml")
    (rule,) = documents("prometheusrule.yaml")
    assert crd_errors(monitor, str(CRDS / "monitoring.coreos.com_podmonitors.yaml")) == []
    assert crd_errors(rule, str(CRDS / "monitoring.coreos.com_prometheusrules.yaml")) == []
    broken = {**monitor, "spec": {**monitor["spec"], "podMetricEndpoints": []}}  # a typo the API server would prune
    assert crd_errors(broken, str(CRDS / "monitoring.coreos.com_podmonitors.yaml"))


def test_podmonitor_selects_the_training_pods_by_their_label_and_port_name():
    (monitor,) = documents("podmonitor.yaml")
    assert monitor["spec"]["selector"]["matchExpressions"] == [{"key": RUN_ID_LABEL, "operator": "Exists"}]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == METRICS_PORT_NAME


def kustomize(path: Path) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    proc = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_kustomization_builds_the_monitors_rules_and_dashboard_in_one_namespace():
    built = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(MONITORING)}
    assert set(built) == {
        ("PodMonitor", "llm-trainer"),
        ("PrometheusRule", "llm-training"),
        ("ConfigMap", "llm-training-dashboard"),
    }
    assert len({d["metadata"]["namespace"] for d in built.values()}) == 1
    dashboard = built[("ConfigMap", "llm-training-dashboard")]
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}  # the Grafana sidecar's label
    assert json.loads(dashboard["data"]["llm-training.json"])["uid"] == "llm-training"


# -- the training pods ------------------------------------------------------------------------------------------

JOB = dict(
    run_id="run-1",
    namespace="team",
    config_path="/mnt/models/runs/run-1/train/train_config.json",
    trainer_image="trainer:1",
    num_nodes=2,
    gpus_per_node=8,
    data_pvc="d",
    model_pvc="m",
    hf_token_secret="hf-token",
    node_selector={},
    tolerations=[],
    metrics_port=9410,
    langfuse_secret="llm-langfuse",
)
ANNOTATIONS = {"prometheus.io/scrape": "true", "prometheus.io/port": "9410", "prometheus.io/path": "/metrics"}


def env_of(container_env: list) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container_env}


def test_pytorchjob_pods_declare_the_metrics_port_and_scrape_annotations():
    job = pytorchjob_for_run(**JOB)
    assert crd_errors(job, "kubeflow.org_pytorchjobs.yaml") == []
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        template = spec["template"]
        assert ANNOTATIONS.items() <= template["metadata"]["annotations"].items()
        (container,) = template["spec"]["containers"]
        assert container["ports"] == [{"name": "metrics", "containerPort": 9410}]
        env = env_of(container["env"])
        assert env["TRAINER_METRICS_PORT"] == "9410"
        assert env["TRAINER_RUN_ID"] == "run-1" and env["TRAINER_JOB_NAME"] == "sft-run-1"
        for key in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_HOST"):
            assert env[key] == {"secretKeyRef": {"name": "llm-langfuse", "key": key, "optional": True}}


@pytest.mark.parametrize("version", [TRAINER_V2_2, TRAINER_V2_1])
def test_trainjob_pods_carry_the_annotations_and_environment(version):
    job = trainjob_for_run(**JOB, trainer_version=version)
    crd = {TRAINER_V2_2: "", TRAINER_V2_1: "v2.1.0/"}[version] + "trainer.kubeflow.org_trainjobs.yaml"
    assert crd_errors(job, crd) == []
    if version == TRAINER_V2_2:
        (patch,) = job["spec"]["runtimePatches"]
        (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        metadata = replicated["template"]["spec"]["template"]["metadata"]
    else:
        (override,) = job["spec"]["podTemplateOverrides"]
        metadata = override["metadata"]
    assert ANNOTATIONS.items() <= metadata["annotations"].items()
    assert env_of(job["spec"]["trainer"]["env"])["TRAINER_METRICS_PORT"] == "9410"


def test_metrics_port_0_renders_no_port_and_no_annotations():
    job = pytorchjob_for_run(**{**JOB, "metrics_port": 0})
    template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert "prometheus.io/scrape" not in template["metadata"]["annotations"]
    assert "ports" not in template["spec"]["containers"][0]
