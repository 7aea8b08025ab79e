"""Katib on the fake API server: the Experiment a search step creates, and Katib's controller as scenario steps.

Katib is scripted per GET of the Experiment (``api.on_get("experiments", api.steps(...))``): it creates Trials
(labelled with the Experiment's name, as Katib does), moves them on, and keeps ``status.currentOptimalTrial`` as
its controller does. The fake server does not list custom objects; ``KatibAPI`` adds that for the Trials.
"""

from __future__ import annotations

from components.hpo import katib
from components.train.launcher.pytorchjob import pytorchjob_for_run
from tests.fakes.k8s_api import FakeKubeAPI

NS = "team-llm"
RUN_ID = "4d2c9b1e-7a3f-4e6d-8c5b-1f0a9e8d7c6b"
NAME = katib.experiment_name_for(RUN_ID)
SPACE = {"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"}}
T1, T2, T3 = (f"{NAME}-{suffix}" for suffix in ("aaaa1111", "bbbb2222", "cccc3333"))


class KatibAPI(FakeKubeAPI):
    """The fake API server plus a list of custom objects by label selector (Katib's Trials of one Experiment)."""

    def handle(self, method, path, query, body, content_type):
        answer = super().handle(method, path, query, body, content_type)
        parts = path.strip("/").split("/")
        collection = len(parts) == 6 and parts[0] == "apis" and parts[3] == "namespaces"
        if method != "GET" or answer is None or answer[0] != 404 or not collection:
            return answer  # served, failed on purpose or dropped: as the fake answered
        _, group, version, _, namespace, plural = parts
        wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv)
        with self.lock:
            items = [
                o
                for (g, v, p, ns, _), o in sorted(self.objects.items())
                if (g, v, p, ns) == (group, version, plural, namespace)
                and all((o["metadata"].get("labels") or {}).get(k) == want for k, want in wanted.items())
            ]
        return (
            200,
            {"apiVersion": f"{group}/{version}", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items},
            "application/json",
        )


def experiment(**over) -> dict:
    job = pytorchjob_for_run(
        run_id=RUN_ID,
        namespace=NS,
        config_path=f"/mnt/models/runs/{RUN_ID}/hpo/train_config.json",
        trainer_image="registry.example/trainer:0.1.0",
        num_nodes=2,
        gpus_per_node=8,
        data_pvc="llm-data",
        model_pvc="llm-models",
        hf_token_secret="hf-token",
        node_selector={},
        tolerations=[],
    )
    args = dict(
        name=NAME,
        namespace=NS,
        training_job=job,
        trials_dir=katib.trials_dir_for(RUN_ID),
        search_space=SPACE,
        trials=3,
        parallel_trials=2,
        max_failed_trials=1,
        algorithm="tpe",
        trial_steps=20,
        method="full",
        seed=42,
    )
    return katib.experiment_manifest(**{**args, **over})


# -- Katib's controller, as scenario steps for ``api.on_get("experiments", ...)`` ---------------------------------


def trial(name: str, lr: str, state: str, eval_loss: str | None = None, message: str = "") -> dict:
    """A Trial as Katib writes it: labelled with its Experiment, its values, its latest condition, its metrics."""
    conditions = [{"type": "Created", "status": "True", "reason": "TrialCreated"}]
    if state != "Created":
        conditions.append({"type": state, "status": "True", "reason": f"Trial{state}", "message": message})
    obj = {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Trial",
        "metadata": {"name": name, "namespace": NS, "labels": {katib.EXPERIMENT_LABEL: NAME}},
        "spec": {"parameterAssignments": [{"name": "learning_rate", "value": lr}]},
        "status": {"conditions": conditions},
    }
    if eval_loss is not None:
        obj["status"]["observation"] = {
            "metrics": [
                {"name": "eval_loss", "min": eval_loss, "max": eval_loss, "latest": eval_loss},
                {"name": "loss", "min": "1.9", "max": "3.1", "latest": "2.0"},
            ]
        }
    return obj


def katib_runs(api, *trials):
    """Katib's controller: the Experiment is Running and these Trials exist (created or moved on)."""

    def step(exp):
        for t in trials:
            api.put_object(katib.GROUP, katib.VERSION, katib.TRIAL_PLURAL, t)
        api.set_condition(exp, "Created", reason="ExperimentCreated")
        api.set_condition(exp, "Running", reason="ExperimentRunning", message="Experiment is running")
        optimal = [t for t in trials if t["status"].get("observation")]
        if optimal:
            best = min(optimal, key=lambda t: float(t["status"]["observation"]["metrics"][0]["latest"]))
            exp["status"]["currentOptimalTrial"] = {
                "bestTrialName": best["metadata"]["name"],
                "parameterAssignments": best["spec"]["parameterAssignments"],
                "observation": best["status"]["observation"],
            }

    return step


def katib_ends(api, state: str, reason: str, message: str, *trials):
    def step(exp):
        katib_runs(api, *trials)(exp)
        api.set_condition(exp, state, reason=reason, message=message)

    return step


def succeeds(api):
    """Two trials at once, then the third: T2 is the best; the Experiment reaches maxTrialCount."""
    done = [trial(T1, "3e-05", "Succeeded", "2.25"), trial(T2, "8.1e-05", "Succeeded", "1.75")]
    return [
        katib_runs(api, trial(T1, "3e-05", "Running"), trial(T2, "8.1e-05", "Running")),
        katib_runs(api, *done, trial(T3, "1.2e-05", "Running")),
        katib_ends(
            api,
            "Succeeded",
            "ExperimentMaxTrialsReached",
            "Experiment has succeeded because max trial count has reached",
            *done,
            trial(T3, "1.2e-05", "Succeeded", "2.5"),
        ),
    ]
