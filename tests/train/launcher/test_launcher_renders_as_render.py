"""``python -m components.train.launcher --dry-run`` and ``python -m pipelines.run --render`` give the same training
job for the same settings (issue 38: the launcher built its job from 30 flags of its own and rendered no NCCL
environment, RDMA, IPC_LOCK, pod resources, proxies, pull Secrets or tracking Secret). The launcher reads the
``params.yaml`` that --render writes, through its own argv."""

from __future__ import annotations

import pytest
import yaml

from components.train.launcher.__main__ import main as launcher
from pipelines import params as P
from pipelines.render import RENDER_RUN_ID, render

NS = "team-llm"
CLUSTER_EXTRAS = [
    "rdma_resource=rdma/ib",
    "rdma_per_pod=8",
    "ipc_lock=true",
    'nccl_env={"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN"}',
    "https_proxy=http://proxy.corp:3128",
    "no_proxy=.svc,.cluster.local",
    'image_pull_secrets=["regcred"]',
    "tracking_secret=llm-tracking",
    "trainer_cpu_request=32",
    "trainer_memory_request=900Gi",
    "trainer_shm_size=64Gi",
]


@pytest.mark.parametrize(
    ("preset", "overrides", "stage"),
    [
        ("qwen3-30b-a3b-full", [], "sft"),
        ("qwen3-30b-a3b-full", CLUSTER_EXTRAS, "sft"),
        ("qwen3-30b-a3b-lora", [*CLUSTER_EXTRAS, "train_backend=trainjob"], "sft"),
        ("qwen3-32b-qlora", ["queue_name=h100", 'node_selector={"pool": "h100"}'], "sft"),
        ("qwen3-30b-a3b-full", ['stages=["sft", "dpo"]', "dpo_dataset_source=org/prefs"], "dpo"),
    ],
)
def test_the_launchers_dry_run_is_the_rendered_job(preset, overrides, stage, tmp_path, capsys):
    params = P.resolve(preset, overrides=overrides)
    rendered = tmp_path / "render"
    render(params, rendered, namespace=NS)
    suffix = "" if stage == "sft" else f"-{stage}"
    (job_file,) = [p for p in rendered.glob(f"*job{suffix}.yaml") if p.name.startswith(("pytorchjob", "trainjob"))]
    capsys.readouterr()
    launcher(["--run-id", RENDER_RUN_ID, "--stage", stage, "--params", str(rendered / "params.yaml")]
             + ["--namespace", NS, "--dry-run"])  # fmt: skip
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == yaml.safe_load(job_file.read_text())
    if "ipc_lock=true" in overrides:  # what the launcher's flags never rendered is there
        text = yaml.safe_dump(printed)
        for wanted in ("IPC_LOCK", "rdma/ib", "regcred", "NCCL_IB_HCA", "proxy.corp", "llm-tracking", "900Gi"):
            assert wanted in text, wanted


def test_settings_by_p_alone_need_no_file_and_bad_ones_are_one_line(tmp_path, capsys):
    launcher(["--run-id", "r1", "-p", "num_nodes=2", "-p", "gpus_per_node=4", "--namespace", NS, "--dry-run"])
    job = yaml.safe_load(capsys.readouterr().out)
    assert job["kind"] == "PyTorchJob" and job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    for argv, message in [
        (["-p", "num_nodez=2"], "unknown parameter 'num_nodez'; did you mean 'num_nodes'?"),
        (["-p", "num_nodes=two"], "parameter 'num_nodes' expects int"),
        (["--params", str(tmp_path / "missing.yaml")], "--params"),
        (["--stage", "dpo"], "--stage dpo: the run's stages are ['sft']"),
        (["-p", "train_backend=local"], "train_backend=local trains on this machine"),
        (["-p", "train_backend=trainjob", "-p", "min_nodes=1"], "min_nodes with train_backend=trainjob"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            launcher(["--run-id", "r1", "--namespace", NS, "--dry-run", *argv])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err and err.count("\n") == 1, (argv, err)
