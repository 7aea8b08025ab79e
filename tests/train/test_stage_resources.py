"""Nodes and GPUs per stage (``stage_settings.<stage>.num_nodes`` / ``.gpus_per_node``, components/stages.py): the
automation guide's CPT on 4 GPUs and SFT on 2. Each stage's job is rendered with its own replicas, GPU limits and
torchrun processes (checked against the real PyTorchJob and TrainJob CRDs, tests/reference/crds), validated by the
run's own rules, fitted in memory, planned and checked against the cluster's GPU nodes, each message naming the
stage's setting."""

from __future__ import annotations

import pytest
import yaml

from components.estimate.plan_text import plan_text
from components.estimate.training_plan import architecture, plan
from components.settings import Settings
from components.stages import job_groups, stage_job, stage_overrides, stage_train_settings
from components.train.launcher.job import training_job_for_run
from components.validate.preflight import preflight
from components.validate.rules import check
from pipelines import params as P
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import NS, PARAMS, ready_cluster
from tests.helpers.crd_schema import crd_errors
from tests.helpers.repo import run_cli

RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
CRDS = {"pytorchjob": "kubeflow.org_pytorchjobs.yaml", "trainjob": "trainer.kubeflow.org_trainjobs.yaml"}
GUIDE = {"cpt": {"num_nodes": 1, "gpus_per_node": 4}, "sft": {"gpus_per_node": 2}}


def lora(**over) -> dict:
    """The LoRA preset (2 x 8 H100) training cpt then sft, with ``over``."""
    return {
        **P.resolve("qwen3-30b-a3b-lora"),
        "stages": ["cpt", "sft"],
        "cpt_dataset_source": "builtin:domain-text",
        **over,
    }


def only(errors: list[str], setting: str) -> str:
    named = [e for e in errors if setting in e]
    assert len(named) == 1, errors
    return named[0]


# -- the stage's job ----------------------------------------------------------------------------------------------


def _gpu_limits(job: dict) -> dict[str, tuple[int, str]]:
    """Replica type (or TrainJob) -> (pods, GPUs per pod)."""
    if job["kind"] == "PyTorchJob":
        return {
            kind: (spec["replicas"], spec["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            for kind, spec in job["spec"]["pytorchReplicaSpecs"].items()
        }
    trainer = job["spec"]["trainer"]
    return {"TrainJob": (trainer["numNodes"], trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"])}


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_each_stage_job_has_its_own_pods_gpus_and_torchrun_processes(backend):
    s = Settings.from_flat(lora(train_backend=backend, stage_settings=GUIDE))
    jobs = {
        stage: training_job_for_run(
            *job_groups(s, stage),
            run_id=RUN_ID,
            namespace=NS,
            config_path="/mnt/models/runs/r1/train/c.json",
            stage=stage,
        )
        for stage in ("cpt", "sft")
    }
    for job in jobs.values():
        assert crd_errors(job, CRDS[backend]) == []
    if backend == "pytorchjob":
        assert _gpu_limits(jobs["cpt"]) == {"Master": (1, "4")}  # one node: a lone Master
        assert _gpu_limits(jobs["sft"]) == {"Master": (1, "2"), "Worker": (1, "2")}  # the run's 2 nodes, 2 GPUs each
        assert [j["spec"]["nprocPerNode"] for j in jobs.values()] == ["4", "2"]
    else:
        assert _gpu_limits(jobs["cpt"]) == {"TrainJob": (1, "4")}
        assert _gpu_limits(jobs["sft"]) == {"TrainJob": (2, "2")}
        assert [j["spec"]["trainer"]["numProcPerNode"] for j in jobs.values()] == [4, 2]
    # The trainer's settings never see the job's shape: it reads its world size from torchrun.
    assert "num_nodes" not in stage_overrides(s, "cpt")
    assert stage_train_settings(s, "cpt", "base").model.model_name_or_path == "base"


def test_render_writes_each_stage_job_and_the_search_trials_on_the_sft_stage_gpus(tmp_path):
    result = run_cli(
        "pipelines.run",
        "--preset",
        "qwen3-30b-a3b-lora",
        "-p",
        'stages=["cpt","sft"]',
        "-p",
        "cpt_dataset_source=builtin:domain-text",
        "-p",
        'stage_settings={"cpt": {"num_nodes": 1, "gpus_per_node": 4}, "sft": {"gpus_per_node": 2}}',
        "-p",
        "hpo_trials=2",
        "--render",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    cpt = yaml.safe_load((tmp_path / "pytorchjob-cpt.yaml").read_text())
    sft = yaml.safe_load((tmp_path / "pytorchjob.yaml").read_text())
    assert crd_errors(cpt, CRDS["pytorchjob"]) == [] and crd_errors(sft, CRDS["pytorchjob"]) == []
    assert _gpu_limits(cpt) == {"Master": (1, "4")}
    assert _gpu_limits(sft) == {"Master": (1, "2"), "Worker": (1, "2")}
    # Katib's trials train the sft stage: its job, its GPUs.
    trial = yaml.safe_load((tmp_path / "experiment.yaml").read_text())["spec"]["trialTemplate"]["trialSpec"]
    assert _gpu_limits(trial) == _gpu_limits(sft)


def test_a_local_stage_runs_its_own_number_of_processes(monkeypatch, tmp_path):
    from components.train.launcher import local_torchrun, run

    started = []
    monkeypatch.setattr(local_torchrun, "run_torchrun", lambda path, n, env: started.append(n))
    s = Settings.from_flat({**P.resolve("local-tiny"), "stage_settings": {"sft": {"gpus_per_node": 1}}})
    cfg = {"report_to": []}
    for stage in ("cpt", "sft"):
        run._train_here(s, cfg, "c.json", stage=stage, model_root=str(tmp_path), run_id="r")
    assert started == [s.job.gpus_per_node, 1]


# -- validation: the run's rules, naming the stage's setting ------------------------------------------------------


def test_a_stage_may_set_its_nodes_and_gpus_and_the_run_stays_valid():
    assert check(lora(stage_settings=GUIDE)) == []


@pytest.mark.parametrize(
    "over,expect",
    [
        ({"gpus_per_node": 0}, "stage_settings.cpt: gpus_per_node=0 must be >= 1"),
        ({"num_nodes": "two"}, "stage_settings.cpt: num_nodes must be a int, got 'two'"),
        ({"num_nodes": 1.5}, "stage_settings.cpt: num_nodes must be a int"),
        ({"replicas": 2}, "stage_settings.cpt: ['replicas'] are not training settings"),
    ],
)
def test_a_stage_nodes_and_gpus_are_checked_as_the_run_ones_are(over, expect):
    errors = check(lora(stage_settings={"cpt": over}))
    assert any(e.startswith(expect) for e in errors), errors


def test_a_stage_asking_more_gpus_than_a_node_of_the_product_holds_is_named():
    errors = check(lora(stage_settings={"cpt": {"gpus_per_node": 16}}))
    error = only(errors, "a node with nvidia.com/gpu.product")
    assert error.startswith("stage_settings.cpt.gpus_per_node=16: a node with nvidia.com/gpu.product=")
    assert "use stage_settings.cpt.gpus_per_node <= 8 (use more stage_settings.cpt.num_nodes)" in error


def test_a_local_stage_has_one_node():
    local = {**P.resolve("local-tiny"), "stage_settings": {"sft": {"num_nodes": 2}}}
    error = only(check(local), "stage_settings.sft.num_nodes")
    assert error.startswith("stage_settings.sft.num_nodes=2 with train_backend=local")


def test_elastic_min_nodes_above_a_stage_nodes_is_named():
    error = only(check(lora(min_nodes=2, stage_settings=GUIDE)), "min_nodes")
    assert error.startswith("min_nodes=2 is more than stage_settings.cpt.num_nodes=1")


def test_a_stage_that_does_not_fit_on_its_own_gpus_names_them():
    # Full fine-tuning of the 30B MoE on 1 x 4 GPUs: the run's 2 x 8 fit it, the stage's own do not.
    values = {
        **P.resolve("qwen3-30b-a3b-full"),
        "stages": ["cpt", "sft"],
        "cpt_dataset_source": "builtin:domain-text",
        "stage_settings": {"cpt": {"num_nodes": 1, "gpus_per_node": 4}},
    }
    (error,) = check(values)
    assert error.startswith(
        "stage cpt on stage_settings.cpt.num_nodes=1 x stage_settings.cpt.gpus_per_node=4 GPUs: full fine-tuning"
    )
    assert "raise stage_settings.cpt.num_nodes (now 1)" in error
    assert check({**values, "stage_settings": {}}) == []


def test_the_grpo_batch_holds_whole_groups_over_the_grpo_stage_gpus():
    values = {
        **P.resolve("qwen3-30b-a3b-lora"),
        "stages": ["sft", "grpo"],
        "grpo_dataset_source": "builtin:arithmetic",
        "grpo_num_generations": 8,
    }
    assert not [e for e in check(values) if "grpo_num_generations" in e]  # 1 x 4 x 16 GPUs = 64 completions
    one = {"grpo": {"num_nodes": 1, "gpus_per_node": 1}}  # 1 x 4 x 1 = 4: not whole groups of 8
    assert "x 1 = 4" in only(check({**values, "stage_settings": one}), "grpo_num_generations")


# -- the plan: each stage on its own GPUs ------------------------------------------------------------------------


def test_the_plan_lists_each_stage_with_its_own_gpus_and_gpu_hours():
    values = lora(stage_settings=GUIDE)
    s = Settings.from_flat(values)
    config = architecture(s.model.model_name_or_path)
    cpt, sft = plan(s, config, stage="cpt"), plan(s, config, stage="sft")
    assert (cpt.num_nodes, cpt.gpus_per_node, sft.num_nodes, sft.gpus_per_node) == (1, 4, 2, 2)
    assert cpt.gpu_hours == pytest.approx(cpt.wall_s * 4 / 3600)
    text = plan_text(values)
    assert text.startswith("plan: lora fine-tuning of Qwen/Qwen3-30B-A3B-Thinking-2507-FP8, 2 x 2 GPUs")  # sft's
    lines = {
        line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.split()[0][-1:] == ":"
    }
    assert (
        lines["cpt:"]
        .strip()
        .startswith(
            "cpt:      1 x 4 GPUs (stage_settings.cpt.num_nodes, stage_settings.cpt.gpus_per_node), "
            f"{cpt.steps:,} optimizer steps"
        )
    )
    assert f"{cpt.gpu_hours:,.1f} GPU-hours" in lines["cpt:"]
    assert lines["sft:"].strip().startswith("sft:      2 x 2 GPUs (stage_settings.sft.gpus_per_node)")
    assert f"{cpt.gpu_hours + sft.gpu_hours:,.1f} GPU-hours over 2 stages" in lines["total:"]


def test_a_single_stage_on_the_run_gpus_keeps_the_plan_as_it_was():
    text = plan_text(P.resolve("qwen3-30b-a3b-lora"))
    assert "stages:" not in text and "total:" not in text


# -- preflight: the cluster's GPU nodes, before any GPU -----------------------------------------------------------


def test_preflight_names_a_stage_asking_more_gpus_per_node_than_the_nodes_offer():
    with FakeKubeAPI() as api:
        ready_cluster(api)  # two H100 nodes of 8 GPUs
        client = api.client
        ok = preflight({**PARAMS, "stage_settings": {"sft": {"num_nodes": 1, "gpus_per_node": 4}}}, client, NS)
        (problem,) = preflight({**PARAMS, "stage_settings": {"sft": {"gpus_per_node": 16}}}, client, NS)
    assert ok == []
    assert problem.startswith(
        "num_nodes=2 x stage_settings.sft.gpus_per_node=16: only 0 of 2 nodes matching node_selector"
    )
    assert "check node_selector, tolerations and stage_settings.sft.gpus_per_node" in problem


def test_preflight_checks_each_stage_job_once():
    params = {
        **PARAMS,
        "stages": ["cpt", "sft", "dpo"],
        "stage_settings": {"cpt": {"num_nodes": 3}, "dpo": {"num_nodes": 1, "gpus_per_node": 8}},
    }
    with FakeKubeAPI() as api:
        ready_cluster(api)
        problems = preflight(params, api.client, NS)
    assert problems == [
        "stage_settings.cpt.num_nodes=3 x gpus_per_node=8: only 2 of 2 nodes matching node_selector "
        f"{PARAMS['node_selector']} are schedulable, tolerated and have >= 8 allocatable nvidia.com/gpu; check "
        "node_selector, tolerations and gpus_per_node against kubectl get nodes -L nvidia.com/gpu.product"
    ]


def test_kfp_doubles_come_back_as_whole_numbers_for_the_job():
    # KFP carries settings as a protobuf Struct: the stage's 4 arrives as 4.0; the pods and torchrun need "4".
    s = Settings.from_flat(lora(stage_settings={"cpt": {"num_nodes": 1.0, "gpus_per_node": 4.0}}))
    c = stage_job(s, "cpt")
    assert (c.num_nodes, c.gpus_per_node) == (1, 4) and isinstance(c.gpus_per_node, int)
    assert check(lora(stage_settings={"cpt": {"num_nodes": 1.0, "gpus_per_node": 4.0}})) == []
