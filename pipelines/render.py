"""``python -m pipelines.run --render DIR``: everything a cluster run would create, written to files.

Touches nothing: no KFP request, no Kubernetes request. The manifests come from the same builders the
steps call at run time, with a placeholder run id (on the cluster it is the KFP run id).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import yaml

RENDER_RUN_ID = "render-preview"


def render(params: dict, out_dir: Path, namespace: str = "default") -> list[Path]:
    """Write the compiled pipeline, the resolved parameters, the trainer config and the manifests; return the paths."""
    from components.paths import DATA_MOUNT, MODEL_MOUNT, pvc_uri, run_dir
    from components.train.config import build_trainer_config
    from pipelines.compile import compile_pipeline

    out_dir.mkdir(parents=True, exist_ok=True)
    written = [compile_pipeline(out_dir / "llm_finetune.yaml")]
    written.append(_write(out_dir / "params.yaml", yaml.safe_dump(params, sort_keys=True, allow_unicode=True)))

    train_dir = os.path.join(run_dir(MODEL_MOUNT, RENDER_RUN_ID), "train")
    trainer_kwargs = {k: params[k] for k in inspect.signature(build_trainer_config).parameters if k in params}
    cfg = build_trainer_config(
        **trainer_kwargs,
        dataset_path=os.path.join(run_dir(DATA_MOUNT, RENDER_RUN_ID), "dataset"),
        output_dir=train_dir,
        use_cpu=params["train_backend"] == "local",
        model_cache_dir=f"{DATA_MOUNT}/cache",
    )
    written.append(_write(out_dir / "train_config.json", json.dumps(cfg, indent=2, sort_keys=True)))

    if params["train_backend"] != "local":
        from components.train.launch import training_job_for_run

        job = training_job_for_run(
            run_id=RENDER_RUN_ID, namespace=namespace, config_path=os.path.join(train_dir, "train_config.json"),
            **{k: params[k] for k in ("train_backend", "affinity", "active_deadline_seconds", "queue_name",
                                      "priority_class", "gang_scheduling", "min_nodes", "max_restarts",
                                      "trainer_image", "num_nodes", "gpus_per_node", "data_pvc", "model_pvc",
                                      "hf_token_secret", "node_selector", "tolerations")},
        )
        written.append(_write(out_dir / f"{job['kind'].lower()}.yaml", yaml.safe_dump(job, sort_keys=False)))
    if params["deploy_backend"].startswith("kserve"):
        from components.deploy.inference_service import inference_service_for_run

        isvc = inference_service_for_run(
            run_id=RENDER_RUN_ID, namespace=namespace,
            storage_uri=pvc_uri(params["model_pvc"], MODEL_MOUNT, os.path.join(train_dir, "final")),
            **{k: params[k] for k in ("deploy_backend", "serving_name", "serving_gpus", "max_model_len",
                                      "node_selector", "tolerations", "deployment_mode", "canary_traffic_percent")},
        )
        written.append(_write(out_dir / "inferenceservice.yaml", yaml.safe_dump(isvc, sort_keys=False)))
    if params["deploy_backend"] == "kserve-vllm":
        from components.deploy.serving_runtime import SERVING_RUNTIME_FILE, serving_runtime_manifest

        # For clusters without KServe's built-in runtime; it ships in the source checkout (manifests/serving).
        if SERVING_RUNTIME_FILE.is_file():
            runtime = serving_runtime_manifest(namespace)
            written.append(_write(out_dir / "servingruntime.yaml", yaml.safe_dump(runtime, sort_keys=False)))
    return written


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
