"""``python -m pipelines.run --render DIR``: everything a cluster run would create, written to files.

Touches nothing: no KFP request, no Kubernetes request. The manifests come from the same builders the
steps call at run time, with a placeholder run id (on the cluster it is the KFP run id).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

RENDER_RUN_ID = "render-preview"


def render(params: dict, out_dir: Path, namespace: str = "default") -> list[Path]:
    """Write the compiled pipeline, the resolved settings (``params``: every setting by name), the trainer config
    and the manifests; return the paths."""
    from components.paths import DATA_MOUNT, MODEL_MOUNT, pvc_uri, run_dir
    from components.settings import Settings
    from components.train.config import build_trainer_config
    from pipelines.compile import compile_pipeline

    out_dir.mkdir(parents=True, exist_ok=True)
    written = [compile_pipeline(out_dir / "llm_finetune.yaml")]
    written.append(_write(out_dir / "params.yaml", yaml.safe_dump(params, sort_keys=True, allow_unicode=True)))

    s = Settings.from_flat(params)
    train_dir = os.path.join(run_dir(MODEL_MOUNT, RENDER_RUN_ID), "train")
    cfg = build_trainer_config(
        s.train,
        dataset_path=os.path.join(run_dir(DATA_MOUNT, RENDER_RUN_ID), "dataset"),
        output_dir=train_dir,
        use_cpu=s.cluster.train_backend == "local",
        model_cache_dir=f"{DATA_MOUNT}/cache",
    )
    written.append(_write(out_dir / "train_config.json", json.dumps(cfg, indent=2, sort_keys=True)))

    if s.cluster.train_backend != "local":
        from components.train.launch import training_job_for_run

        job = training_job_for_run(s.cluster, run_id=RENDER_RUN_ID, namespace=namespace,
                                   config_path=os.path.join(train_dir, "train_config.json"))
        written.append(_write(out_dir / f"{job['kind'].lower()}.yaml", yaml.safe_dump(job, sort_keys=False)))
    if s.deploy.deploy_backend.startswith("kserve"):
        from components.deploy.inference_service import inference_service_for_run

        isvc = inference_service_for_run(
            s.deploy, s.cluster, run_id=RENDER_RUN_ID, namespace=namespace,
            storage_uri=pvc_uri(s.cluster.model_pvc, MODEL_MOUNT, os.path.join(train_dir, "final")))
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
