"""A Katib ``Experiment`` (kubeflow.org/v1beta1) whose trials are the run's own training job, cut short.

    errors = check_search(search_space, trials=12, parallel_trials=2, max_failed_trials=3, algorithm="tpe",
                          method="lora")
    experiment = experiment_manifest(name=experiment_name_for(run_id), namespace=ns, training_job=job,
                                     trials_dir=trials_dir_for(run_id), search_space=search_space, trials=12,
                                     parallel_trials=2, max_failed_trials=3, algorithm="tpe", trial_steps=50,
                                     method="lora", seed=42)
    best = best_trial(experiment_as_read_back)          # its parameters, by setting name, for the final run

Each trial runs the PyTorchJob or TrainJob the launcher builds (``training_job_for_run``): the same image, pods,
volumes, placement and queue. Only the trainer container's command differs: Katib substitutes a trial's values only
into the template's text, so ``python -m components.hpo.trial`` (components/hpo/trial.py) takes them as arguments,
writes the trial's own config and output folder, and execs the unchanged ``torchrun ... -m components.train.trainer``
on it. The objective is the trainer's ``eval_loss``, minimised, which Katib's StdOut collector reads from the primary
pod's output (``METRICS_FORMAT``). docs/hpo.md says why each choice, and what the StdOut collector implies.
"""

from __future__ import annotations

import copy
import math
import re

from kubeflow.training.constants import constants as kfc

from components.hpo.space import (  # noqa: F401 (the search's rules, re-exported for katib.check_search & co.)
    ALGORITHMS,
    SCALES,
    SEARCHABLE,
    _grid_size,
    check_search,
    typed_search_space,
)
from components.kube import DNS1035_LABEL, RUN_ID_LABEL, job_name_for
from components.paths import MODEL_MOUNT, run_dir
from components.train.launcher import trainjob

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1beta1", "experiments", "Experiment"
TRIAL_PLURAL = "trials"
# Katib labels every Trial with its Experiment's name: list them with this label selector.
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"

OBJECTIVE = "eval_loss"
TRAIN_LOSS = "loss"
# Katib's StdOut collector takes group 1 of a match as the metric's name and group 2 as its value (Go RE2; the
# same in Python's re). The first reads the trainer's final ``metrics {...}`` line (a Python dict's repr, common.py),
# the second its progress lines (callbacks.py). ``nan``/``inf`` do not match: such a trial has no objective.
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
METRICS_FORMAT = [rf"'({OBJECTIVE})': ({_NUMBER})", rf"\| ({TRAIN_LOSS}) ({_NUMBER}) \|"]

# The trainer config calls one of them differently (components/train/config.py: a float < 1 is a ratio).
TRAINER_FIELD = {"warmup_ratio": "warmup_steps"}
# What every trial sets besides its parameters, by trainer field: its length, and no checkpoints.
TRIAL_FIELDS = {"max_steps": int, "save_strategy": str}
# Katib's admission webhook refuses an Experiment name longer than this.
KATIB_MAX_NAME = 40
# Katib names a trial "<experiment>-<8 random characters>" (suggestionclient.go) and the trial's job after it; an
# example of the 8 for messages.
_TRIAL_SUFFIX_EXAMPLE = "x7k2p9qd"
# The Trainer names a TrainJob's JobSet after it, and JobSet's admission webhook refuses a JobSet whose longest pod
# name plus a 6-character suffix passes this (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go); the Trainer
# then only records a TrainJobResourcesCreationFailed event.
MAX_POD_NAME = 63


def longest_trial_pod_name(experiment: str, num_nodes: int) -> str:
    """The pod name JobSet's webhook checks for a trial of ``experiment`` run as a TrainJob of ``num_nodes`` nodes:
    ``<jobset>-<replicated job>-<last job index>-<last pod index>`` plus ``-abcde`` (``placement.GenPodName``); the
    torch runtimes have one replicated job, ``node`` (``trainjob.NODE``), of one replica with a pod per node."""
    return f"{experiment}-{_TRIAL_SUFFIX_EXAMPLE}-{trainjob.NODE}-0-{num_nodes - 1}-abcde"


# Room in every trial's TrainJob pod names for up to 1000 nodes (``experiment_manifest`` checks the job's own node
# count); 37, so a trial's PyTorchJob name (37 + 9) also stays within its 52 (kube.MAX_JOB_NAME).
MAX_EXPERIMENT_NAME = MAX_POD_NAME - len(longest_trial_pod_name("", 1000))
TRIAL_NAME_PARAMETER = "trialName"  # camelCase: no setting is named so
# What the search step adds to a failed trial's Trial object (not a Katib field): ``{"pod", "cause", "lines"}``, the
# pod to blame and its last log lines, read before the Experiment and with it the trial's pods are deleted.
LOG_TAIL = "logTail"
TRIAL_TAIL_LINES = 20


def search_failed(failed: int, max_failed_trials: int) -> bool:
    """Whether ``failed`` failed trials end a search allowed ``max_failed_trials`` (maxFailedTrialCount).

    Katib's rule, which the local search follows too: an Experiment fails once its failed trials (Failed or
    MetricsUnavailable: no objective) are not 0 and reach maxFailedTrialCount (kubeflow/katib
    ``pkg/controller.v1beta1/experiment/util/status_util.go``, since v0.14). So 0 and 1 both end the search at its
    first failure.
    """
    return failed > 0 and failed >= max_failed_trials


def experiment_name_for(run_id: str) -> str:
    """``hpo-<run id>``: deterministic (a retried step finds its Experiment), a DNS-1035 label of at most
    ``MAX_EXPERIMENT_NAME`` characters, so that every trial's pods get names JobSet accepts; a longer one keeps its
    start and an 8-character hash of the whole run id (a KFP run id, a 36-character UUID, always is)."""

    return job_name_for(run_id, "hpo", max_length=MAX_EXPERIMENT_NAME)


def trials_dir_for(run_id: str, root: str = MODEL_MOUNT) -> str:
    """Where the trials write on the model volume: ``<root>/runs/<run id>/hpo/<trial name>/``."""
    return f"{run_dir(root, run_id)}/hpo"


# What sh -c leaves alone in an argument (Katib joins the primary container's argv with spaces, unquoted).
_SHELL_SAFE = re.compile(r"^[\w./:=@%+,-]+$")
_PLACEHOLDER = re.compile(r"\$\{trialParameters\.\w+\}")


def _katib_number(kind: type, value) -> str:
    return str(int(value)) if kind is int else repr(float(value))


def _parameter(name: str, spec: dict) -> dict:
    """One Katib ParameterSpec (feasibleSpace values are strings)."""
    kind = SEARCHABLE[name]
    if "values" in spec:
        return {
            "name": name,
            "parameterType": "categorical" if kind is str else "discrete",
            "feasibleSpace": {"list": [v if kind is str else _katib_number(kind, v) for v in spec["values"]]},
        }
    space = {
        "min": _katib_number(kind, spec["min"]),
        "max": _katib_number(kind, spec["max"]),
        "distribution": "logUniform" if spec.get("scale") == "log" else "uniform",
    }
    if "step" in spec:
        space["step"] = _katib_number(kind, spec["step"])
    return {"name": name, "parameterType": "int" if kind is int else "double", "feasibleSpace": space}


# -- the trial template ------------------------------------------------------------------------------------------


def _trainer_containers(job: dict) -> list[dict]:
    """The containers (or TrainJob ``trainer``) that run the trainer's command in ``job``."""
    if job.get("kind") == trainjob.KIND:
        return [job["spec"]["trainer"]]
    if job.get("kind") == kfc.PYTORCHJOB_KIND:
        return [
            c
            for spec in job["spec"]["pytorchReplicaSpecs"].values()
            for c in spec["template"]["spec"]["containers"]
            if c["name"] == kfc.PYTORCHJOB_CONTAINER
        ]
    raise ValueError(f"training_job must be a {kfc.PYTORCHJOB_KIND} or a {trainjob.KIND}, got {job.get('kind')!r}")


def _primary(job: dict) -> tuple[str, dict]:
    """The container and pod labels of node rank 0, whose output holds rank 0's metrics line."""
    if job["kind"] == trainjob.KIND:
        # JobSet's replicated job and the Job's completion index, which the torch runtime makes the node rank.
        return trainjob.NODE, {"jobset.sigs.k8s.io/replicatedjob-name": trainjob.NODE, trainjob.NODE_RANK_LABEL: "0"}
    if kfc.REPLICA_TYPE_MASTER in job["spec"]["pytorchReplicaSpecs"]:
        return kfc.PYTORCHJOB_CONTAINER, {kfc.JOB_ROLE_LABEL: kfc.JOB_ROLE_MASTER}
    # An elastic job has Workers only; Worker 0 hosts the rendezvous and node rank 0.
    return kfc.PYTORCHJOB_CONTAINER, {
        kfc.REPLICA_TYPE_LABEL: kfc.REPLICA_TYPE_WORKER.lower(),
        kfc.REPLICA_INDEX_LABEL: "0",
    }


def _trial_command(
    command: list[str], args: list[str], trial_dir: str, trial_steps: int, parameters: list[str]
) -> tuple[list[str], list[str]]:
    """The trial's command and args: the trial entry point, then the job's own command on the trial's config."""
    if "--config" not in args[:-1]:
        raise ValueError(f"the training job's trainer command has no --config FILE: {command + args}")
    at = args.index("--config") + 1
    base_config, trial_config = args[at], f"{trial_dir}/train_config.json"
    overrides = ["--max_steps", str(trial_steps), "--save_strategy", "no"]
    for name in parameters:
        overrides += [f"--{TRAINER_FIELD.get(name, name)}", f"${{trialParameters.{name}}}"]
    trainer = [*command, *args[:at], trial_config, *args[at + 1 :]]
    return (
        ["python", "-m", "components.hpo.trial"],
        ["--base-config", base_config, "--trial-dir", trial_dir, *overrides, "--", *trainer],
    )


def experiment_manifest(
    *,
    name: str,
    namespace: str,
    training_job: dict,
    trials_dir: str,
    search_space: dict,
    trials: int,
    parallel_trials: int,
    max_failed_trials: int,
    algorithm: str,
    trial_steps: int,
    method: str,
    seed: int,
) -> dict:
    """The Katib Experiment that searches ``search_space`` with short runs of ``training_job``.

    Args:
        name: the Experiment's name (``experiment_name_for``): a DNS-1035 label of at most 40 characters (Katib's
            limit) that leaves room in its trials' TrainJob pod names (``longest_trial_pod_name``).
        namespace: where it runs: the training job's namespace (claims, Secret, queue).
        training_job: the PyTorchJob or TrainJob dict ``training_job_for_run`` returns for this run; it is
            copied, not changed. Its trainer command must read ``--config FILE`` (the run's trainer config, which
            must exist on the model volume when the trials start).
        trials_dir: the trials' folder as the pods see it (``trials_dir_for``); trial T writes
            ``<trials_dir>/<T>/`` (train_config.json, metrics.json, tensorboard/, final/).
        search_space, trials, parallel_trials, max_failed_trials, algorithm, method: as ``check_search`` takes
            them (maxTrialCount, parallelTrialCount, maxFailedTrialCount, algorithmName).
        trial_steps: optimizer steps per trial (the trainer's max_steps), at least 1.
        seed: the algorithm's random_state, so that a re-created Experiment suggests the same trials.

    Returns:
        The Experiment as a plain dict: objective ``eval_loss`` minimised (the last value each trial prints),
        the trainer's loss curve as an additional metric, the StdOut collector with ``METRICS_FORMAT``,
        ``resumePolicy: Never`` (the suggestion service goes away with the search) and the trial template
        (trial parameters ``${trialParameters.<setting>}`` plus ``trialName`` = ``${trialSpec.Name}``; ``retain``:
        a finished trial's job and pods stay until the Experiment is deleted, for their logs).

    Raises:
        ValueError: the ``check_search`` errors, one per line, or a bad name, trial_steps or training job.
    """
    errors = check_search(
        search_space,
        trials=trials,
        parallel_trials=parallel_trials,
        max_failed_trials=max_failed_trials,
        algorithm=algorithm,
        method=method,
    )
    errors += _name_errors(name, training_job)
    if trial_steps < 1:
        errors.append(f"hpo_trial_steps must be >= 1 (optimizer steps per trial), got {trial_steps}")
    if errors:
        raise ValueError("\n".join(errors))
    parameters = list(search_space)
    trial_spec = _trial_spec(training_job, trials_dir, trial_steps, parameters)
    labels = trial_spec["metadata"].get("labels") or {}
    metadata: dict = {"name": name, "namespace": namespace}
    if RUN_ID_LABEL in labels:
        metadata["labels"] = {RUN_ID_LABEL: labels[RUN_ID_LABEL]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "objective": {
                "type": "minimize",
                "objectiveMetricName": OBJECTIVE,
                "additionalMetricNames": [TRAIN_LOSS],
                # eval_loss is printed once, at the end; the loss worth reporting is the last one, not the lowest.
                "metricStrategies": [{"name": OBJECTIVE, "value": "latest"}, {"name": TRAIN_LOSS, "value": "latest"}],
            },
            # Every algorithm here takes random_state (Sobol's sequence ignores it: it has no randomness).
            "algorithm": {
                "algorithmName": algorithm,
                "algorithmSettings": [{"name": "random_state", "value": str(seed)}],
            },
            "parallelTrialCount": parallel_trials,
            "maxTrialCount": trials,
            "maxFailedTrialCount": max_failed_trials,
            "resumePolicy": "Never",
            "parameters": [_parameter(n, search_space[n]) for n in parameters],
            "metricsCollectorSpec": {
                "collector": {"kind": "StdOut"},
                "source": {"filter": {"metricsFormat": list(METRICS_FORMAT)}},
            },
            "trialTemplate": _trial_template(trial_spec, parameters),
        },
    }


def _name_errors(name: str, training_job: dict) -> list[str]:
    """What is wrong with the Experiment's ``name``: not a DNS-1035 label within Katib's limit, or too long for its
    trials' TrainJob pod names."""
    if not DNS1035_LABEL.match(name) or len(name) > KATIB_MAX_NAME:
        return [
            f"name {name!r} must be a DNS-1035 label of at most {KATIB_MAX_NAME} characters; "
            "use experiment_name_for(run_id)"
        ]
    if (
        training_job.get("kind") == trainjob.KIND
        and len(longest := longest_trial_pod_name(name, training_job["spec"]["trainer"]["numNodes"])) > MAX_POD_NAME
    ):
        return [
            f"name {name!r} leaves no room for its trials' pod names: a trial's TrainJob pod would be named "
            f"like {longest!r} ({len(longest)} characters, at most {MAX_POD_NAME}); use "
            "experiment_name_for(run_id)"
        ]
    return []


def _trial_spec(training_job: dict, trials_dir: str, trial_steps: int, parameters: list[str]) -> dict:
    """A copy of ``training_job`` as each trial runs it: without its name and namespace, its trainer commands
    running ``trial_steps`` steps with the trial's values of ``parameters`` into its folder under ``trials_dir``."""
    trial_spec = copy.deepcopy(training_job)
    # Katib names each trial's job after the trial, in the Experiment's namespace; its webhook refuses both here.
    labels = trial_spec["metadata"].get("labels") or {}
    trial_spec["metadata"] = {"labels": labels} if labels else {}
    trial_dir = f"{trials_dir.rstrip('/')}/${{trialParameters.{TRIAL_NAME_PARAMETER}}}"
    for container in _trainer_containers(trial_spec):
        container["command"], container["args"] = _trial_command(
            container["command"], container["args"], trial_dir, trial_steps, parameters
        )
        argv = container["command"] + container["args"]
        unsafe = [a for a in argv if not _SHELL_SAFE.match(_PLACEHOLDER.sub("x", a))]
        if unsafe:
            raise ValueError(
                f"the trial command has arguments sh would interpret {unsafe}: Katib's StdOut collector "
                "runs it through sh -c; use paths and names of letters, digits and ./_-"
            )
    return trial_spec


def _trial_template(trial_spec: dict, parameters: list[str]) -> dict:
    """The Experiment's ``trialTemplate``: ``trial_spec`` with its primary pod and container, its conditions, and the
    trial parameters (``trialName`` and each of ``parameters``)."""
    primary_container, primary_labels = _primary(trial_spec)
    done = "Complete" if trial_spec["kind"] == trainjob.KIND else "Succeeded"  # Katib's defaults for these kinds
    return {
        "primaryContainerName": primary_container,
        "primaryPodLabels": primary_labels,
        # Katib deletes a finished trial's job, and with it the only copy of its log, unless told to keep
        # it; the search step reads failed trials' logs, then deletes the Experiment (components/hpo/follow.py).
        "retain": True,
        "successCondition": f'status.conditions.#(type=="{done}")#|#(status=="True")#',
        "failureCondition": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
        "trialParameters": [
            {
                "name": TRIAL_NAME_PARAMETER,
                "reference": "${trialSpec.Name}",
                "description": "the trial's name: its folder under the trials directory",
            },
            *(
                {"name": n, "reference": n, "description": f"the trainer's {TRAINER_FIELD.get(n, n)}"}
                for n in parameters
            ),
        ],
        "trialSpec": trial_spec,
    }


# -- reading results back ------------------------------------------------------------------------------------


def setting_value(name: str, text: str):
    """A parameter value as Katib gives it (a string) converted to the setting's type (``SEARCHABLE``)."""
    kind = SEARCHABLE.get(name, str)
    if kind is str:
        return text
    number = float(text)
    if kind is int:
        if not number.is_integer():
            raise ValueError(f"{name}: {text!r} is not an integer")
        return int(number)
    return number


def _metric(observation: dict | None, name: str) -> float | None:
    for metric in (observation or {}).get("metrics") or []:
        if metric.get("name") == name:
            try:
                value = float(metric.get("latest", ""))
            except ValueError:  # "unavailable"
                return None
            return value if math.isfinite(value) else None
    return None


def _assignments(items) -> dict:
    return {a["name"]: setting_value(a["name"], a["value"]) for a in items or []}


_COUNTS = {
    "trials": "trials",
    "trialsSucceeded": "succeeded",
    "trialsFailed": "failed",
    "trialMetricsUnavailable": "metrics unavailable",
}


def best_trial(experiment: dict) -> dict:
    """The best trial so far, from the Experiment's ``status.currentOptimalTrial``.

    Returns:
        ``{"name", "parameters" (setting name -> value of the setting's type, ready for the final run's
        settings), "eval_loss", "loss"}``.

    Raises:
        ValueError: no trial has reported ``eval_loss`` yet, with the Experiment's trial counts.
    """
    status = experiment.get("status") or {}
    optimal = status.get("currentOptimalTrial") or {}
    if not optimal.get("bestTrialName"):
        counts = ", ".join(f"{word} {status[key]}" for key, word in _COUNTS.items() if key in status)
        raise ValueError(
            f"Experiment {experiment['metadata']['name']} has no best trial: no trial reported "
            f"{OBJECTIVE} ({counts or 'no trials yet'})"
        )
    return {
        "name": optimal["bestTrialName"],
        "parameters": _assignments(optimal.get("parameterAssignments")),
        OBJECTIVE: _metric(optimal.get("observation"), OBJECTIVE),
        TRAIN_LOSS: _metric(optimal.get("observation"), TRAIN_LOSS),
    }


def _state(trial: dict) -> tuple[str, str]:
    """The trial's latest true condition and its message (Created, Running, Succeeded, Failed, ...)."""
    true = [c for c in (trial.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    return (true[-1]["type"], true[-1].get("message", "")) if true else ("Pending", "")


def trial_summaries(trials: list[dict]) -> list[dict]:
    """One row per Trial object (kubeflow.org/v1beta1 ``trials``, listed with ``EXPERIMENT_LABEL=<name>``).

    Returns:
        ``{"name", "state", "message", "parameters", "eval_loss", "loss", "started", "finished", "log_tail"}`` per
        trial, best eval_loss first, then trials without one in creation order. Values missing are None or "";
        ``log_tail`` is the ``LOG_TAIL`` the search step added to a failed trial.
    """
    rows = []
    for trial in sorted(trials, key=lambda t: t["metadata"].get("creationTimestamp", "")):
        state, message = _state(trial)
        status = trial.get("status") or {}
        rows.append(
            {
                "name": trial["metadata"]["name"],
                "state": state,
                "message": message,
                "parameters": _assignments(trial.get("spec", {}).get("parameterAssignments")),
                OBJECTIVE: _metric(status.get("observation"), OBJECTIVE),
                TRAIN_LOSS: _metric(status.get("observation"), TRAIN_LOSS),
                "started": status.get("startTime", ""),
                "finished": status.get("completionTime", ""),
                "log_tail": trial.get(LOG_TAIL),
            }
        )
    return sorted(rows, key=lambda r: (r[OBJECTIVE] is None, r[OBJECTIVE] or 0.0))


def trials_markdown(experiment: dict, trials: list[dict]) -> str:
    """A Markdown report of the search for the KFP UI: the best trial, a table of every trial, then why each failed
    trial failed (its pod to blame and last log lines)."""
    rows = trial_summaries(trials)
    spec = experiment.get("spec") or {}
    names = [p["name"] for p in spec.get("parameters") or []]
    lines = [
        f"## Hyper-parameter search `{experiment['metadata']['name']}`",
        "",
        f"{spec.get('algorithm', {}).get('algorithmName', '?')} over {', '.join(names) or 'no parameters'}; "
        f"{len(rows)} of {spec.get('maxTrialCount', '?')} trials, objective {OBJECTIVE} (lower is better).",
        "",
    ]
    try:
        best = best_trial(experiment)
        chosen = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["parameters"].items())
        lines += [f"**Best:** `{best['name']}`: {OBJECTIVE} {best[OBJECTIVE]:.4f} with {chosen}.", ""]
    except ValueError as exc:
        lines += [f"**No best trial:** {exc}.", ""]
    lines += [
        "| trial | state | " + " | ".join(names) + f" | {OBJECTIVE} | last {TRAIN_LOSS} |",
        "|---|---|" + "---|" * len(names) + "---:|---:|",
    ]
    for r in rows:
        values = [
            f"{r['parameters'][n]:g}" if isinstance(r["parameters"].get(n), float) else str(r["parameters"].get(n, ""))
            for n in names
        ]
        state = r["state"] + (
            f": {r['message'][:120]}" if r["state"] not in ("Succeeded", "Running") and r["message"] else ""
        )
        losses = [f"{r[k]:.4f}" if r[k] is not None else "-" for k in (OBJECTIVE, TRAIN_LOSS)]
        lines.append("| " + " | ".join([f"`{r['name']}`", state.replace("|", "\\|"), *values, *losses]) + " |")
    failed = [r for r in rows if r["log_tail"]]
    if failed:
        lines += ["", "### Why trials failed"]
    for r in failed:
        tail = r["log_tail"]
        lines += ["", f"`{r['name']}`: {tail['cause']}"]
        if tail["lines"]:
            lines += ["", "```", *tail["lines"], "```"]
    return "\n".join(lines) + "\n"
