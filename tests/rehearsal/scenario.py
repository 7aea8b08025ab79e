"""One rehearsal scenario, run by tests/test_rehearsal.py inside a private mount namespace:

    unshare --mount --propagation private python -m tests.rehearsal.scenario SCENARIO.json

It sets the machine up as the cluster would be and runs the KFP train step's own function
(``train_model.python_func``) against it:

1. the claims: ``llm-data`` holds the prepared dataset (``runs/<run id>/dataset``, what prepare_dataset
   writes) and the Hugging Face cache with the base model filed under a Hub id (tests/hf_cache.py), and
   ``llm-models`` starts empty; both are mounted at /mnt/data and /mnt/models, as the pipeline mounts them on
   the train step (``kubernetes.mount_pvc``);
2. a hosts file over /etc/hosts (the cluster's DNS), a ``FakeKubeAPI`` with a kubeconfig pointing at it (so
   the launcher's ``load_api_client()`` finds it as it finds a real one), and the cluster behind it
   (tests/rehearsal/cluster.py);
3. ``train_model.python_func`` with the pipeline's defaults and the rehearsal's sizes: it writes the trainer
   config, renders the PyTorchJob or TrainJob, runs the launcher and reads the metrics. Two things are changed
   in this process, both for this machine: ``build_trainer_config`` gets ``use_cpu=True`` (no GPUs: gloo,
   fp32), and ``run_training_job`` polls every ``POLL_SECONDS`` instead of 10 s;
4. a probe container with the job's image, env and mounts reports where ``components`` is imported from and
   whether the repository is visible;
5. everything a test asserts on goes to the result JSON; the launcher's output is this process's output.

A watchdog ends the scenario after ``timeout_seconds`` with what it has (outcome ``timeout``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

MODEL_ID = "rehearsal-org/tiny-qwen3"
NAMESPACE = "default"  # components.kube.current_namespace() outside a pod
POLL_SECONDS = 1.0
PROBE = """
import json, os, socket
out = {"hostname": socket.gethostname(), "mnt": sorted(os.listdir("/mnt")), "cwd": os.getcwd(),
       "repo_visible": os.path.exists(os.path.join(REPO, "components")), "error": None, "components": None}
try:
    import components
    out["components"] = components.__file__
except Exception as exc:
    out["error"] = repr(exc)
print("PROBE " + json.dumps(out))
"""


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


# What the rehearsal sets; every other setting is the pipeline's default (components/settings/).
REHEARSAL_PARAMETERS = dict(
    model_name_or_path=MODEL_ID,
    method="full",
    max_seq_length=128,
    num_nodes=2,
    gpus_per_node=1,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=1,
    learning_rate=3e-3,
    deepspeed_config="zero3",
    save_total_limit=2,
    # A logged train loss is the mean since the previous log; a resumed run restarts that window at its checkpoint.
    # Logging at every checkpoint step keeps the windows of a resumed and an uninterrupted run the same.
    logging_steps=5,
    # The fake kubelet runs every pod in this machine's one network namespace, where only one of the two pods' local
    # rank 0 could bind the trainer's metrics port; on a cluster each pod has its own network and both serve it.
    # The metrics are rehearsed by tests/observe/test_training_run_observed.py (a real Prometheus scraping torchrun).
    metrics_port=0,
)


def train_step_arguments(cfg: dict, dataset, model) -> dict:
    """The train step's inputs as the cluster pipeline passes them: its defaults, the rehearsal's sizes, the run."""
    from components.paths import DATA_MOUNT, MODEL_MOUNT
    from components.settings import defaults
    from components.validate.rules import check

    settings = {
        **defaults(),
        **REHEARSAL_PARAMETERS,
        "max_steps": cfg["max_steps"],
        "save_steps": cfg["save_steps"],
        "train_backend": cfg["backend"],
    }
    # What validate_inputs hands the step: settings it has checked (the memory fit of a Hub id it has no
    # architecture for is skipped, as on the cluster).
    errors = check(settings)
    if errors:
        raise ValueError(f"the rehearsal's settings are invalid: {errors}")
    # What the pipeline's base_model step hands the first stage: the base model by name.
    return {
        "settings": settings,
        "stage": "sft",
        "tuned": {},
        "dataset": dataset,
        "base_model_path": MODEL_ID,
        "model": model,
        "data_root": DATA_MOUNT,
        "model_root": MODEL_MOUNT,
        "run_id": cfg["run_id"],
    }


def call_train_step(arguments: dict):
    """``train_model.python_func`` with the pipeline's arguments."""
    from components.train.component import train_model

    return train_model.python_func(**arguments)


def patch_for_this_machine() -> None:
    """The two deliberate deviations from the cluster run (module docstring, step 3)."""
    import components.train.config as config
    import components.train.launcher.job as launch
    import components.train.launcher.job_setup as job_setup
    import components.train.launcher.run as train_run

    build = config.build_trainer_config

    @functools.wraps(build)
    def build_on_cpu(*args, **kwargs):
        return build(*args, **{**kwargs, "use_cpu": True})

    run = launch.run_training_job

    @functools.wraps(run)
    def run_polling_faster(manifest, **kwargs):
        return run(manifest, **{"poll_seconds": POLL_SECONDS, **kwargs})

    for module, name, new in (
        (config, "build_trainer_config", build_on_cpu),
        (launch, "run_training_job", run_polling_faster),
    ):
        setattr(module, name, new)
        for step in (train_run, job_setup):  # should the step's modules ever import it at module level
            if hasattr(step, name):
                setattr(step, name, new)


def probe(spec_path: Path, repo: str) -> dict:
    """Run the probe in a container set up exactly as the pod whose spec is at ``spec_path``."""
    from tests.rehearsal import cluster as cluster_mod

    spec = json.loads(spec_path.read_text())
    spec.update(command=["python", "-c", f"REPO = {repo!r}\n" + PROBE], args=[])
    path = spec_path.with_name("probe.json")
    path.write_text(json.dumps(spec))
    cmd = [
        *cluster_mod.orphan_guard(),
        "unshare",
        "--pid",
        "--fork",
        "--kill-child=SIGKILL",
        "--mount-proc",
        "--uts",
        "--propagation",
        "private",
        sys.executable,
        "-I",
        "-S",
        str(cluster_mod.CONTAINER),
        str(path),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    if line is None:
        return {"error": f"probe exited {proc.returncode}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"}
    return json.loads(line[len("PROBE ") :])


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(cfg: dict, claims: dict, api, cluster, state: dict) -> dict:
    """The scenario's outcome and everything the test asserts on."""
    train = claims["llm-models"] / "runs" / cfg["run_id"] / "train"
    plural = "/pytorchjobs" if cfg["backend"] == "pytorchjob" else "/trainjobs"
    with api.lock:
        posts = [r.body for r in api.requests if r.method == "POST" and r.path.endswith(plural)]
        deletes = [r.path for r in api.requests if r.method == "DELETE" and plural in r.path]
    final = train / "final"
    return {
        **state,
        "trainer_config": read_json(train / "train_config.json"),
        "metrics": read_json(train / "metrics.json"),
        "model_card": read_json(final / "model.json"),
        "final_dir": str(final),
        "final_files": sorted(p.name for p in final.iterdir()) if final.is_dir() else [],
        "checkpoints": sorted(p.name for p in train.glob("checkpoint-*")),
        "complete_checkpoints": sorted(p.parent.name for p in train.glob("checkpoint-*/COMPLETE")),
        "creates": len(posts),
        "deletes": len(deletes),
        "manifest": posts[0] if posts else None,
        "pods": cluster.pod_report(),
        "evictions": cluster.evictions,
        "cluster_events": cluster.events,
        "cluster_error": cluster.error,
        "elapsed_seconds": round(time.monotonic() - state["started"], 1),
    }


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    workdir, fixtures = Path(cfg["workdir"]), Path(cfg["fixtures"])
    # The kubernetes client reads KUBECONFIG when imported; the file is written once the API server is up.
    kubeconfig = workdir / "kubeconfig"
    os.environ["KUBECONFIG"] = str(kubeconfig)
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)  # not in a pod: load_incluster_config() must fail
    claims = {"llm-data": workdir / "claims" / "llm-data", "llm-models": workdir / "claims" / "llm-models"}
    for folder in claims.values():
        folder.mkdir(parents=True)
    # What is on the data claim before the train step runs: the prepared dataset and the Hub cache.
    shutil.copytree(fixtures / "data", claims["llm-data"] / "runs" / cfg["run_id"] / "dataset")
    from tests.helpers.hf_cache import add_to_hub_cache

    add_to_hub_cache(claims["llm-data"] / "cache" / "huggingface" / "hub", MODEL_ID, fixtures / "base")

    # The train step's pod: the claims at the standard mounts, the cluster's names in /etc/hosts.
    from components.paths import DATA_MOUNT, MODEL_MOUNT

    mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", "/mnt")
    for claim, target in (("llm-data", DATA_MOUNT), ("llm-models", MODEL_MOUNT)):
        os.makedirs(target)
        mount("--bind", str(claims[claim]), target)
    from tests.rehearsal.cluster import FakeCluster, HostsFile
    from tests.rehearsal.image import TrainerImage

    hosts = HostsFile(workdir / "hosts")
    mount("--bind", str(hosts.path), "/etc/hosts")

    from tests.fakes.k8s_api import FakeKubeAPI

    image = TrainerImage(
        venv=Path(cfg["image"]["venv"]),
        site_packages=Path(cfg["image"]["site_packages"]),
        wheel=Path(cfg["image"]["wheel"]),
        deps=tuple(cfg["image"]["deps"]),
    )
    state = {
        "scenario": cfg["name"],
        "outcome": None,
        "error": None,
        "outputs": None,
        "probe": None,
        "started": time.monotonic(),
    }
    result_path = Path(cfg["result"])
    with FakeKubeAPI() as api:
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "rehearsal",
                    "clusters": [{"name": "rehearsal", "cluster": {"server": api.client.configuration.host}}],
                    "users": [{"name": "rehearsal", "user": {}}],
                    "contexts": [
                        {
                            "name": "rehearsal",
                            "context": {"cluster": "rehearsal", "user": "rehearsal", "namespace": NAMESPACE},
                        }
                    ],
                }
            )
        )
        cluster = FakeCluster(
            api,
            workdir=workdir,
            claims=claims,
            image=image,
            hosts=hosts,
            hide=[cfg["repo"], workdir / "claims"],
            node_env={"HF_HUB_OFFLINE": "1"},
        ).start()
        if cfg.get("evict_worker_after_first_checkpoint"):
            first_checkpoint = claims["llm-models"] / "runs" / cfg["run_id"] / "train" / "checkpoint-*" / "COMPLETE"
            cluster.evict_when(str(first_checkpoint), role="worker", graceful=bool(cfg.get("graceful_eviction")))

        def timeout():
            state.update(outcome="timeout", error=f"the scenario did not finish within {cfg['timeout_seconds']}s")
            print(f"rehearsal: {state['error']}; stopping the cluster", flush=True)
            cluster.stop()
            result_path.write_text(json.dumps(collect(cfg, claims, api, cluster, state), indent=2, default=str))
            os._exit(3)

        watchdog = threading.Timer(cfg["timeout_seconds"], timeout)
        watchdog.daemon = True
        watchdog.start()
        from kfp.dsl import Dataset, Model

        artifacts = workdir / "artifacts"
        dataset = Dataset(
            name="dataset",
            uri=str(artifacts / "dataset"),
            metadata={
                "path": f"{DATA_MOUNT}/runs/{cfg['run_id']}/dataset",
                "pvc": "llm-data",
                "uri": f"pvc://llm-data/runs/{cfg['run_id']}/dataset",
            },
        )
        model = Model(name="model", uri=str(artifacts / "model"))
        patch_for_this_machine()
        try:
            outputs = call_train_step(train_step_arguments(cfg, dataset, model))
            state.update(
                outcome="succeeded",
                outputs={
                    "model_uri": outputs.model_uri,
                    "job_name": outputs.job_name,
                    "metadata": dict(model.metadata),
                },
            )
        except BaseException as exc:  # SystemExit too: the launcher exits 143 on SIGTERM
            traceback.print_exc()
            state.update(outcome="raised", error=f"{type(exc).__name__}: {exc}")
        watchdog.cancel()
        print(f"rehearsal: train step {state['outcome']}", flush=True)
        specs = sorted((workdir / "pods").glob("*/spec.json"))
        if specs:
            try:
                state["probe"] = probe(specs[0], cfg["repo"])
            except Exception as exc:
                state["probe"] = {"error": f"probe failed: {exc!r}"}
        cluster.stop()
        result_path.write_text(json.dumps(collect(cfg, claims, api, cluster, state), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
