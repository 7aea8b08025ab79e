"""The LLM post-training pipeline: validate -> prepare -> train each stage (cpt, sft, dpo) -> evaluate -> (gate) ->
deploy -> publish (cluster).

``build_pipeline("cluster")`` is what ``compiled/llm_finetune.yaml`` holds: steps mount the data and
model claims, reference the HF token Secret, and the evaluate step gets GPUs, /dev/shm and node
placement. ``build_pipeline("local", workspace)`` is the same graph with the same components for
kfp.local, the volumes replaced by workspace folders (kfp.local ignores platform settings anyway).

On the cluster an exit handler (notify_run) posts the run's outcome to the webhook in ``alert_webhook_secret``;
the compiled pipeline then has no outputs of its own (KFP allows none from inside an exit handler): the tasks'
outputs are in the UI. The parameters are the settings model's (components/settings/): each plain setting, then
``advanced_settings`` for the rest; their defaults are the ``qwen3-30b-a3b-full`` preset, the seeds' reference job.
validate_inputs turns them into the resolved ``settings`` every later step reads.
"""

import inspect
from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import Metrics, pipeline_context

from components.data.component import list_data_shards, prepare_data_shard, prepare_dataset
from components.deploy.component import deploy_model, skip_deployment
from components.evaluate.component import evaluate_model
from components.hpo.component import search_hyperparameters
from components.observe.alerts import WEBHOOK_URL_ENV
from components.observe.component import notify_run
from components.paths import DATA_MOUNT, MODEL_MOUNT
from components.publish.component import publish_model
from components.secrets import HF_TOKEN_KEY, JUDGE_API_KEY, LANGFUSE_KEYS, WEBHOOK_SECRET_KEY
from components.security import RUN_AS_GROUP, RUN_AS_USER
from components.stages import STAGES
from components.train.component import base_model, skip_stage, train_model
from components.validate.component import validate_inputs
from components.variants.component import compare_variants, list_variants, variant_result, variant_stages
from pipelines import PIPELINE_NAME
from pipelines.derive import pipeline_docstring, pipeline_parameters

DESCRIPTION = "Fine-tune an LLM with PyTorchJob, evaluate it, serve it with KServe + vLLM."
PARAMETER_NAMES = [name for name, _, _, _ in pipeline_parameters()]
SHM_SIZE = "64Gi"


class Outputs(NamedTuple):
    model_uri: str
    metrics: Metrics
    passed: bool
    reason: str
    endpoint: str
    smoke_reply: str


def build_pipeline(target: str = "cluster", workspace: str | None = None, variants_parallel: int = 1):
    """The pipeline function for ``target`` ``"cluster"`` (volumes at /mnt/...) or ``"local"`` (under ``workspace``);
    at most ``variants_parallel`` variants train at once (KFP fixes a loop's parallelism when it compiles)."""
    if target == "cluster":
        data_root, model_root = DATA_MOUNT, MODEL_MOUNT
    elif target == "local" and workspace:
        data_root, model_root = f"{workspace}/data", f"{workspace}/models"
    else:
        raise ValueError(f"target {target!r}: use 'cluster', or 'local' with a workspace folder")
    cluster = target == "cluster"

    def llm_finetune(*arguments):
        # KFP passes one channel per parameter, in the order of the signature set below (the settings model's).
        p = dict(zip(PARAMETER_NAMES, arguments, strict=True))
        if not cluster:
            # Steps inside an exit handler cannot return the pipeline's outputs, which the local run reports from;
            # locally pipelines.run prints the outcome itself, so the local variant is the steps alone.
            return _steps(p, cluster, data_root, model_root, variants_parallel)
        # The exit handler posts how the run ended (alert_webhook_secret), whatever step failed.
        with dsl.ExitHandler(_notify_run(p, data_root, model_root), name="Run"):
            _steps(p, cluster, data_root, model_root, variants_parallel)
        _run_as_non_root(pipeline_context.Pipeline.get_default_pipeline().tasks.values())

    # KFP reads the parameters from the signature: one per setting, built from the settings model.
    llm_finetune.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=kind)
            for name, kind, default, _ in pipeline_parameters()
        ],
        return_annotation=inspect.Signature.empty if cluster else Outputs,
    )
    llm_finetune.__doc__ = pipeline_docstring(DESCRIPTION)
    llm_finetune = dsl.pipeline(name=PIPELINE_NAME, description=DESCRIPTION)(llm_finetune)
    return llm_finetune


def _steps(p: dict, cluster: bool, data_root: str, model_root: str, variants_parallel: int) -> Outputs:
    """The pipeline's steps, from its parameters ``p``: validate, prepare, for each variant its stages and its
    evaluation, the comparison and its gate, deploy."""
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    validate = validate_inputs(**p).set_display_name("Validate inputs").set_caching_options(False)
    settings = validate.outputs["settings"]  # every setting, resolved and checked: what each later step reads
    shard, prepare = _prepare_data(settings, data_root, run_id)
    # Settings chosen by short trials on the sft data (hpo_trials; {} at once when it is 0): the sft stage uses them.
    search = (
        search_hyperparameters(
            dataset=prepare.outputs["dataset"],
            settings=settings,
            data_root=data_root,
            model_root=model_root,
            run_id=run_id,
        )
        .set_display_name("Search hyper-parameters (Katib / Optuna)")
        .set_caching_options(False)
    )

    # Each variant (variants; a run without any is its own one item) trains the stage chain under its own run id
    # (folders and job names), and is evaluated on the run's held-out split; at most variants_parallel at once.
    # An iteration reads everything from its item (components/variants/__init__.py says why).
    variants = (
        list_variants(settings=settings, run_id=run_id, tuned=search.outputs["Output"])
        .set_display_name("Variants")
        .set_caching_options(False)
    )
    with dsl.ParallelFor(variants.output, parallelism=variants_parallel, name="Each variant") as variant:
        stages = _train_stages(variant, prepare, cluster, data_root, model_root)
        evaluate, result = _evaluate_variant(variant, stages, prepare, data_root)
    compare = (
        compare_variants(results=dsl.Collected(result.output))
        .set_display_name("Compare variants")
        .set_caching_options(False)
    )
    deploy, skipped = _deploy_if_passed(p, compare, cluster, run_id)

    if cluster:
        # Platform settings take pipeline parameters (not a step's output): these settings are plain.
        _attach_cluster_resources(p, [shard, prepare, *stages.preps], [search, *stages.trains], [evaluate])
        _attach_watching(p, stages.trains, [evaluate], deploy)
    return Outputs(
        model_uri=compare.outputs["model_uri"],
        metrics=compare.outputs["metrics"],
        passed=compare.outputs["passed"],
        reason=compare.outputs["reason"],
        endpoint=dsl.OneOf(deploy.outputs["endpoint"], skipped.output),
        smoke_reply=dsl.OneOf(deploy.outputs["smoke_reply"], skipped.output),
    )


def _prepare_data(settings, data_root: str, run_id: str) -> tuple[dsl.PipelineTask, dsl.PipelineTask]:
    """The data preparation fan-out: the shards' loop, then the sft data step that joins them; returns the loop's
    shard task and the data step."""
    # data_shards pods tokenize slices of the sft (and cpt) files at once; each data step then joins its stage's
    # shards (components/data/shards.py). With data_shards=1 the loop's one item does nothing.
    shard_items = list_data_shards(settings=settings).set_display_name("Data shards").set_caching_options(False)
    with dsl.ParallelFor(shard_items.output, name="Each data shard") as item:
        shard = (
            prepare_data_shard(item=item, data_root=data_root, run_id=run_id)
            .set_display_name("Prepare data shard")
            .set_caching_options(False)
        )
    # The sft data's eval split is what evaluation scores, whichever stages run.
    prepare = (
        prepare_dataset(
            settings=settings,
            stage="sft",
            data_root=data_root,
            run_id=run_id,
        )
        .after(shard)
        .set_display_name("Prepare dataset")
        .set_caching_options(False)
    )
    return shard, prepare


class _Stages(NamedTuple):
    """One variant's stage chain: the model it ends with, and its data and training tasks (one per slot)."""

    model: dsl.OneOf
    model_uri: dsl.OneOf
    preps: list[dsl.PipelineTask]
    trains: list[dsl.PipelineTask]


def _train_stages(variant, prepare: dsl.PipelineTask, cluster: bool, data_root: str, model_root: str) -> _Stages:
    """One variant's training: from its base model, a slot per possible stage (cpt, sft, dpo, ...), each preparing
    its stage's data and training, or passing the model on unchanged."""
    own = variant.settings
    slots = variant_stages(variant=variant).set_display_name("Stages").set_caching_options(False)
    base = base_model(settings=own).set_display_name("Base model")
    # One slot per possible stage; a slot runs when the item names a stage for it (the run's `stages`, in order),
    # trains from the model the previous slot ends with, and hands on its own (or, unused, that one).
    model, model_uri = base.output, base.output
    preps, trains = [], []
    for i in range(len(STAGES)):
        stage = slots.outputs[f"stage_{i + 1}"]
        with dsl.If(stage != "", name=f"stage-{i + 1}"):
            # After the sft data step: an sft stage prepares the same data again, from its cache.
            stage_data = (
                prepare_dataset(
                    settings=own,
                    stage=stage,
                    data_root=data_root,
                    run_id=variant.run_id,
                )
                .after(prepare)
                .set_display_name(f"Stage {i + 1}: prepare data")
                .set_caching_options(False)
            )
            train = (
                train_model(
                    dataset=stage_data.outputs["dataset"],
                    base_model_path=model,
                    settings=own,
                    stage=stage,
                    tuned=variant.tuned,
                    data_root=data_root,
                    model_root=model_root,
                    run_id=variant.run_id,
                )
                .set_display_name(f"Stage {i + 1}: train ({'PyTorchJob / TrainJob' if cluster else 'local torchrun'})")
                .set_caching_options(False)
            )
        with dsl.Else(name=f"no-stage-{i + 1}"):
            skip = skip_stage(previous=model, stage=f"{i + 1}").set_display_name(f"Stage {i + 1}: not run")
        model = dsl.OneOf(train.outputs["model_path"], skip.output)
        model_uri = dsl.OneOf(train.outputs["model_uri"], skip.output)
        trains.append(train)
        preps.append(stage_data)
    return _Stages(model, model_uri, preps, trains)


def _evaluate_variant(
    variant, stages: _Stages, prepare: dsl.PipelineTask, data_root: str
) -> tuple[dsl.PipelineTask, dsl.PipelineTask]:
    """One variant's evaluation, base vs tuned, and its result for the comparison; returns both tasks."""
    # Every variant on the same held-out tokens: the run's sft data.
    evaluate = (
        evaluate_model(
            dataset=prepare.outputs["dataset"],
            model_path=stages.model,
            settings=variant.settings,
            data_root=data_root,
        )
        .set_display_name("Evaluate base vs tuned")
        .set_caching_options(False)
    )
    result = (
        variant_result(
            variant=variant.variant,
            run_id=variant.run_id,
            model_path=stages.model,
            model_uri=stages.model_uri,
            settings=variant.settings,
            overrides=variant.overrides,
        )
        .after(evaluate)
        .set_display_name("Result")
    )
    return evaluate, result


def _deploy_if_passed(
    p: dict, compare: dsl.PipelineTask, cluster: bool, run_id: str
) -> tuple[dsl.PipelineTask, dsl.PipelineTask]:
    """The gate on the comparison: deploy the chosen model when its evaluation passed, else say why not; returns the
    deploy and the skip tasks."""
    with dsl.If(compare.outputs["passed"] == True, name="evaluation-passed"):  # noqa: E712 (a KFP condition)
        deploy = (
            deploy_model(
                model_path=compare.outputs["model_path"],
                settings=compare.outputs["settings"],
                run_id=run_id,
                serve=compare.outputs["serve"],
            )
            .set_display_name("Deploy (KServe + vLLM)" if cluster else "Deploy (local server)")
            .set_caching_options(False)
        )
        if cluster:  # it reads the evaluation's serving reference beside the model (components/models/logprobs.py)
            kubernetes.mount_pvc(deploy, pvc_name=p["model_pvc"], mount_path=MODEL_MOUNT)
            # The Model Registry, the Hub and the tracker (each optional: nothing set, nothing done); the Hub push
            # reads the model's files.
            publish = (
                publish_model(
                    model_path=compare.outputs["model_path"],
                    model_uri=compare.outputs["model_uri"],
                    settings=compare.outputs["settings"],
                    run_id=run_id,
                    endpoint=deploy.outputs["endpoint"],
                    metrics=compare.outputs["metrics"],
                    report=compare.outputs["report"],
                )
                .set_display_name("Publish (Model Registry, Hub, tracker)")
                .set_caching_options(False)
            )
            kubernetes.mount_pvc(publish, pvc_name=p["model_pvc"], mount_path=MODEL_MOUNT)
    with dsl.Else(name="evaluation-not-passed"):
        skipped = skip_deployment(reason=compare.outputs["reason"]).set_display_name("Skip deployment")
    return deploy, skipped


def _attach_cluster_resources(p: dict, preps, trains, evaluates) -> None:
    """Volumes, the HF token reference, GPUs, CPUs and placement from the parameters ``p``: what the steps need on
    Kubernetes."""
    data_pvc, model_pvc, hf_token_secret = p["data_pvc"], p["model_pvc"], p["hf_token_secret"]
    for task in (*preps, *trains, *evaluates):
        kubernetes.mount_pvc(task, pvc_name=data_pvc, mount_path=DATA_MOUNT)
    for task in (*trains, *evaluates):
        kubernetes.mount_pvc(task, pvc_name=model_pvc, mount_path=MODEL_MOUNT)
    for task in (*preps, *evaluates):
        # optional: public models and datasets need no token, and the pod must start without the Secret.
        kubernetes.use_secret_as_env(
            task, secret_name=hf_token_secret, secret_key_to_env={HF_TOKEN_KEY: "HF_TOKEN"}, optional=True
        )
        # Hub downloads land on the data volume once, not in every pod's ephemeral storage.
        task.set_env_variable("HF_HOME", f"{DATA_MOUNT}/cache/huggingface")
    # Tokenisation runs a worker per CPU (num_proc=0): the data steps and shards get data_cpu and data_memory.
    for prepare in preps:
        prepare.set_cpu_request(p["data_cpu"]).set_memory_request(p["data_memory"])
    for evaluate in evaluates:
        evaluate.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(p["eval_gpus"])
        evaluate.set_cpu_request("8").set_memory_request("64G").set_memory_limit("256G")
        kubernetes.empty_dir_mount(
            evaluate, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=SHM_SIZE
        )
        kubernetes.add_node_selector_json(evaluate, p["node_selector"])
        kubernetes.add_toleration_json(evaluate, p["tolerations"])


def _attach_watching(p: dict, trains, evaluates, deploy: dsl.PipelineTask) -> None:
    """The optional Secret references that watch the run (no Secret: no alert or trace): the launcher posts a job's
    idle GPUs to the run's webhook (prometheus_url); evaluation and deployment trace their generations to Langfuse;
    the judged evaluation reads its API key."""
    for train in trains:
        kubernetes.use_secret_as_env(
            train,
            secret_name=p["alert_webhook_secret"],
            secret_key_to_env={WEBHOOK_SECRET_KEY: WEBHOOK_URL_ENV},
            optional=True,
        )
    for task in (*evaluates, deploy):
        kubernetes.use_secret_as_env(
            task,
            secret_name=p["langfuse_secret"],
            secret_key_to_env={key: key for key in LANGFUSE_KEYS},
            optional=True,
        )
    for task in evaluates:  # the judged evaluation's API key (components/evaluate/judge.py), optional as well
        kubernetes.use_secret_as_env(
            task,
            secret_name=p["judge_api_key_secret"],
            secret_key_to_env={JUDGE_API_KEY: JUDGE_API_KEY},
            optional=True,
        )


def _notify_run(p: dict, data_root: str, model_root: str) -> dsl.PipelineTask:
    """The exit handler's task: it posts the run's outcome to the webhook in ``alert_webhook_secret``."""
    notify = (
        notify_run(
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            model_root=model_root,
            model_pvc=p["model_pvc"],
            data_root=data_root,
        )
        .set_display_name("Notify (run outcome)")
        .set_caching_options(False)
    )
    # The steps record how they ended on both volumes (components/observe/outcome.py).
    kubernetes.mount_pvc(notify, pvc_name=p["model_pvc"], mount_path=MODEL_MOUNT)
    kubernetes.mount_pvc(notify, pvc_name=p["data_pvc"], mount_path=DATA_MOUNT)
    # Optional: without the Secret (or its key) the run ends without an alert, and the pod still starts.
    kubernetes.use_secret_as_env(
        notify,
        secret_name=p["alert_webhook_secret"],
        secret_key_to_env={WEBHOOK_SECRET_KEY: WEBHOOK_URL_ENV},
        optional=True,
    )
    return notify


def _run_as_non_root(tasks) -> None:
    """Every step's pod runs as the images' non-root user (components/security.py), as the training and serving pods
    do: the steps and the trainer write the same claims. KFP's backend (2.16 and later) adds the rest of the Pod
    Security Standards' restricted profile to every step's pod (no privilege escalation, capabilities dropped,
    RuntimeDefault seccomp; backend/src/v2/compiler/argocompiler/security_context.go); kfp-kubernetes sets only
    the user, group and runAsNonRoot."""
    for task in tasks:
        kubernetes.set_security_context(task, run_as_user=RUN_AS_USER, run_as_group=RUN_AS_GROUP, run_as_non_root=True)
