"""Follow a Katib ``Experiment`` to its end, as the launcher follows a training job (components/train/launcher/job.py).

    experiment, trials = run_experiment(manifest, trials_dir="/mnt/models/runs/RUN/hpo",
                                        pending_timeout_seconds=900)
    best = katib.best_trial(experiment)["parameters"]

The Experiment is named from the run id, so a retried step re-attaches to it (one that had failed is deleted and
created again). The follower polls it and ends every way out (succeeded, failed, a trial pod that cannot start, the
deadline, SIGTERM) by deleting the Experiment: Katib never stops the trials of a finished Experiment, and they hold
GPUs. Failed trials' last log lines go into the step's error and the report; each ended trial's ``final/`` export is
deleted from the model volume (trials are for their eval_loss). docs/hpo.md lists each way it ends and why.
"""

from __future__ import annotations

import re
import shutil
import time
from collections import Counter
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.hpo import katib
from components.jobs.failures import classify_failure
from components.jobs.kinds import DELETION_TIMEOUT_SECONDS, JobKind, job_kind
from components.kube import (
    RUN_ID_LABEL,
    CustomResourceRunner,
    PodLogFollower,
    call_api,
    true_condition,
    unstartable_pod_reason,
)

# Trial conditions after which the trial's job has ended and writes nothing more.
_ENDED = {"Succeeded", "Failed", "MetricsUnavailable", "EarlyStopped", "Killed"}
# Trials without an objective, whose logs say why (Katib counts both as failed).
_FAILED = ("Failed", "MetricsUnavailable")
# Katib's StdOut collector runs the primary pod's trainer as sh -c "<command> 1>file 2>&1 && ...", and this sidecar
# prints the file, each line behind a klog header (cmd/metricscollector/v1beta1/file-metricscollector/main.go).
METRICS_COLLECTOR = "metrics-logger-and-collector"
_KLOG_HEADER = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\s\]]+:\d+\] ")


class _TrialLogs:
    """The end of each failed trial's log, read once the trial is seen failed (``retain: true`` keeps its pods until
    the Experiment is deleted), with the pod to blame as the launcher would name it
    (components/jobs/failures.py): the trainer container's log, or, in the primary pod, the collector's."""

    def __init__(self, core, namespace: str, kind: JobKind, retry_delay: float):
        self._kind, self._namespace = kind, namespace
        self._trainer = PodLogFollower(core, namespace, kind.container, out=_quiet, retry_delay=retry_delay)
        self._collector = PodLogFollower(core, namespace, METRICS_COLLECTOR, out=_quiet, retry_delay=retry_delay)
        self.tails: dict = {}  # trial name -> katib.LOG_TAIL

    def _lines(self, pod_name: str) -> list[str]:
        return self._trainer.last_lines(pod_name) + [
            _KLOG_HEADER.sub("", line) for line in self._collector.last_lines(pod_name)
        ]

    def read(self, trial: dict, pods: list) -> None:
        """Read the failed ``trial``'s ``pods`` and keep the pod to blame, why, and its last lines."""
        name = trial["metadata"]["name"]
        if not pods:
            self.tails[name] = {
                "pod": None,
                "lines": [],
                "cause": f"no pod of trial {name} is left to read (kubectl -n {self._namespace} "
                f"describe {self._kind.kind.lower()} {name})",
            }
            return
        rank0 = self._kind.rank0(name, pods)
        pods = sorted(pods, key=lambda pod: (pod.metadata.name != rank0, pod.metadata.name))
        self._trainer.poll(pods)
        self._collector.poll(pods)
        condition = next(filter(None, (true_condition(trial, state) for state in _FAILED)), {})
        failure = classify_failure(condition, pods, self._kind.container, self._lines)
        pod = failure.pod or pods[0].metadata.name  # none to blame: rank 0 tells how far the trial got
        cause = failure.cause if failure.pod else f"pod {pod}: {failure.cause}"
        self.tails[name] = {"pod": pod, "cause": cause, "lines": self._lines(pod)[-katib.TRIAL_TAIL_LINES :]}

    def attach(self, trials: list[dict]) -> list[dict]:
        """``trials`` with each failed one's ``katib.LOG_TAIL``."""
        for trial in trials:
            if trial["metadata"]["name"] in self.tails:
                trial[katib.LOG_TAIL] = self.tails[trial["metadata"]["name"]]
        return trials


def _quiet(line: str) -> None:
    """Trials' pods are read for failure reports only: their lines are not printed."""


def remove_exports(trials_dir: str | Path, trial_names=None) -> None:
    """Delete ``<trials_dir>/<trial>/final`` for these trials (None: every trial folder)."""
    root = Path(trials_dir)
    folders = (
        [root / name for name in trial_names] if trial_names is not None else [p for p in root.glob("*") if p.is_dir()]
    )
    for final in (folder / "final" for folder in folders):
        if final.is_dir():
            shutil.rmtree(final, ignore_errors=True)
            print(f"deleted {final} (the trial has ended: its eval_loss is what the search keeps)", flush=True)


def _progress(experiment: dict, trials: list[dict]) -> str:
    """One line: the Experiment's state, its trial counts and the best eval_loss so far."""
    status = experiment.get("status") or {}
    true = [c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"]
    states = Counter(row["state"] for row in katib.trial_summaries(trials))
    counts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(states.items())) or "none yet"
    line = (
        f"{true[-1] if true else 'Pending'}; trials {len(trials)}/{experiment['spec'].get('maxTrialCount', '?')}: "
        f"{counts}"
    )
    try:
        best = katib.best_trial(experiment)
    except ValueError:
        return line
    values = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["parameters"].items())
    return f"{line}; best {katib.OBJECTIVE} {best[katib.OBJECTIVE]:.4f} ({best['name']}: {values})"


def _failure_report(what: str, failed: dict, trials: list[dict]) -> str:
    """The error for a failed Experiment: Katib's reason and each failed trial with its values and message, the pod
    to blame and its last lines."""
    lines = [f"{what} failed: {failed.get('reason', '')}: {failed.get('message', '')}"]
    bad = [r for r in katib.trial_summaries(trials) if r["state"] in _ENDED - {"Succeeded"}]
    for r in bad:
        values = ", ".join(f"{k}={v}" for k, v in r["parameters"].items())
        lines.append(f"  trial {r['name']} ({values}): {r['state']}: {r['message'] or 'no message'}")
        if tail := r["log_tail"]:
            lines.append(f"    cause: {tail['cause']}")
            if tail["lines"]:
                lines.append(f"    last {katib.TRIAL_TAIL_LINES} lines of {tail['pod']}:")
                lines += [f"      {line}" for line in tail["lines"]]
    if not trials:
        lines.append(
            "  no trial was created: check the Suggestion of the same name (kubectl describe suggestion) "
            "and its algorithm pod"
        )
    return "\n".join(lines)


def _spent(experiment: dict) -> str | None:
    """Why an Experiment found under our name cannot be re-attached to (a finished, failed one: re-attaching would
    only read its failure again, and a retried step could never succeed), or None."""
    if failed := true_condition(experiment, "Failed"):
        return f"it failed in an earlier attempt ({failed.get('reason', '')}: {failed.get('message', '')})"
    return None


def run_experiment(
    manifest: dict,
    *,
    trials_dir: str | None = None,
    poll_seconds: float = 30.0,
    timeout_seconds: float | None = None,
    pending_timeout_seconds: float = 900.0,
    on_created=None,
    api_client=None,
) -> tuple[dict, list[dict]]:
    """Create the Experiment in ``manifest`` (or re-attach to it), follow it to the end and return it with its Trials.

    Args:
        manifest: from ``katib.experiment_manifest``; its name and namespace identify the Experiment, its
            ``pipelines.kubeflow.org/run-id`` label finds the trials' pods.
        trials_dir: the trials' folder as this process sees it (the model volume's mount here); each ended
            trial's ``final/`` is deleted from it. None: leave the folders alone.
        poll_seconds: interval between polls of the Experiment, its Trials and their pods.
        timeout_seconds: give up (and delete the Experiment) after this long; None waits as long as it runs.
        pending_timeout_seconds: how long a trial pod may stay Unschedulable, a running trial may go without any
            pod, and the Experiment without any trial, before the search is given up (the Experiment is deleted).
        on_created: called with the Experiment as the API server returned it, once it exists (created or
            re-attached), so that the caller can record its identity before the long wait.
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.

    Returns:
        ``(experiment, trials)``: the Succeeded Experiment as last read (``katib.best_trial`` reads it; it is
        deleted since) and its Trial objects (``katib.trials_markdown`` reports them), each failed one with its
        ``katib.LOG_TAIL``.

    Raises:
        ValueError: a manifest that is not an Experiment, or a negative limit, before anything is created.
        RuntimeError: the Experiment failed (it is deleted; Katib's reason, each failed trial's values and
            message), was deleted while it ran, a trial pod cannot start, a trial got no pod or no trial appeared
            within ``pending_timeout_seconds``.
        TimeoutError: ``timeout_seconds`` passed (the Experiment is deleted).
        SystemExit: 143 after SIGTERM, once the Experiment is deleted.
    """
    if manifest.get("kind") != katib.KIND or manifest.get("apiVersion") != f"{katib.GROUP}/{katib.VERSION}":
        raise ValueError(
            f"manifest must be a {katib.GROUP}/{katib.VERSION} {katib.KIND}, got "
            f"{manifest.get('apiVersion')} {manifest.get('kind')}"
        )
    if poll_seconds <= 0 or pending_timeout_seconds < 0 or (timeout_seconds is not None and timeout_seconds < 0):
        raise ValueError(
            f"poll_seconds must be > 0 and the timeouts >= 0, got {poll_seconds}, "
            f"{pending_timeout_seconds}, {timeout_seconds}"
        )
    runner = CustomResourceRunner(
        manifest,
        katib.PLURAL,
        api_client=api_client,
        poll_seconds=poll_seconds,
        timeout_seconds=timeout_seconds,
        deletion_timeout_seconds=DELETION_TIMEOUT_SECONDS,
        controller="Katib's controller",
    )
    follower = _Follower(runner, manifest, trials_dir, pending_timeout_seconds, on_created)
    with runner.cancel_on_sigterm():
        try:
            runner.create(manifest, replace=_spent)
            result = runner.follow(follower.poll, describe=lambda experiment: follower.line)
            # Katib keeps the trials' jobs and pods (retain), and would keep those of trials still running: the
            # report has what it needs from them.
            runner.delete("the search is over; its trials' jobs and pods go with it")
            return result
        finally:
            if trials_dir is not None:
                remove_exports(trials_dir)


class _Follower:
    """One Experiment followed, poll by poll (``poll``): its progress printed when it changes, each ended trial's
    export deleted and each failed one's logs read, and the Experiment deleted (with the error) on each way out but
    success and the timeout, which ``runner`` handles."""

    def __init__(
        self,
        runner: CustomResourceRunner,
        manifest: dict,
        trials_dir: str | None,
        pending_timeout_seconds: float,
        on_created,
    ):
        self.runner, self.trials_dir, self.on_created = runner, trials_dir, on_created
        self.pending_timeout_seconds = pending_timeout_seconds
        self.custom, self.core = k8s.CustomObjectsApi(runner.api_client), k8s.CoreV1Api(runner.api_client)
        self.name, self.namespace, self.what = runner.name, runner.namespace, runner.what
        self.retry_delay = runner.retry_delay
        self.started = time.monotonic()
        # The trials' pods: the run's label (on every pod of the run's jobs) and the trial job's own label = trial
        # name.
        self.run_id = (manifest["metadata"].get("labels") or {}).get(RUN_ID_LABEL)
        self.kind = job_kind(manifest["spec"]["trialTemplate"]["trialSpec"]["kind"])
        self.logs = _TrialLogs(self.core, self.namespace, self.kind, self.retry_delay)
        self.ended: set = set()  # trials that have ended (their final/ deleted, their pods no longer checked)
        self.unschedulable_since: dict = {}
        self.podless_since: dict = {}  # running trial -> when it was first seen without any pod
        self.announce = True
        self.line: str | None = None  # the progress line last printed

    def list_trials(self) -> list[dict]:
        answer = call_api(
            self.custom.list_namespaced_custom_object,
            katib.GROUP,
            katib.VERSION,
            self.namespace,
            katib.TRIAL_PLURAL,
            label_selector=f"{katib.EXPERIMENT_LABEL}={self.name}",
            retry_delay=self.retry_delay,
        )
        return answer.get("items") or []

    def trial_pods(self, trial_names: set) -> list:
        if self.run_id is None or not trial_names:
            return []
        pods = call_api(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{RUN_ID_LABEL}={self.run_id}",
            retry_delay=self.retry_delay,
        ).items
        return [p for p in pods if (p.metadata.labels or {}).get(self.kind.pod_label) in trial_names]

    def never_got_a_pod(self, running: set, pods: list) -> str | None:
        """Why a running trial will never get a pod (its job could not create them), or None. The Trainer only
        records an event when JobSet refuses the TrainJob's JobSet; a job that Kueue holds (suspended) is queued."""
        kind, namespace = self.kind, self.namespace
        now = time.monotonic()
        with_pods = {(p.metadata.labels or {}).get(kind.pod_label) for p in pods}
        for t in sorted(running):
            if t in with_pods:
                self.podless_since.pop(t, None)
                continue
            waited = now - self.podless_since.setdefault(t, now)
            if waited < self.pending_timeout_seconds:
                continue
            try:
                job = call_api(
                    self.custom.get_namespaced_custom_object,
                    kind.group,
                    kind.version,
                    namespace,
                    kind.plural,
                    t,
                    retry_delay=self.retry_delay,
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                return (
                    f"trial {t} has had no job for {waited:.0f}s: Katib did not create it (kubectl -n "
                    f"{namespace} describe trial {t})"
                )
            if kind.suspended(job):
                continue
            hint = (
                ": the Trainer reports a JobSet it cannot create as a TrainJobResourcesCreationFailed event"
                if kind.kind == "TrainJob"
                else ", and its events"
            )
            return (
                f"trial {t} has had no pod for {waited:.0f}s: its {kind.kind} could not create them "
                f"(kubectl -n {namespace} describe {kind.kind.lower()} {t}{hint})"
            )
        return None

    def poll(self, experiment: dict) -> tuple[dict, list[dict]] | None:
        """One look at ``experiment`` and its trials: ``(experiment, trials)`` once it succeeded, None while it runs."""
        if self.announce and self.on_created is not None:
            self.on_created(experiment)
        self.announce = False
        trials = self.list_trials()
        progress = _progress(experiment, trials)
        if progress != self.line:
            self.line = progress
            print(f"{self.what}: {self.line}", flush=True)
        self._record_ended(trials)
        if true_condition(experiment, "Succeeded"):
            return experiment, trials
        if failed := true_condition(experiment, "Failed"):
            # Katib never stops the trials still running in a finished Experiment: they would keep their GPUs.
            self.runner.delete("it failed; its running trials would keep their GPUs")
            raise RuntimeError(_failure_report(self.what, failed, trials))
        self._check_running(trials)
        return None

    def _record_ended(self, trials: list[dict]) -> None:
        """The newly ended trials' exports deleted and the failed ones' logs read; each failed trial's tail attached."""
        done = {t["metadata"]["name"] for t in trials if any(true_condition(t, state) for state in _ENDED)}
        if self.trials_dir is not None:
            remove_exports(self.trials_dir, sorted(done - self.ended))
        for t in trials:
            if t["metadata"]["name"] in done - self.ended and any(true_condition(t, state) for state in _FAILED):
                self.logs.read(t, self.trial_pods({t["metadata"]["name"]}))
        self.ended |= done
        self.logs.attach(trials)

    def _check_running(self, trials: list[dict]) -> None:
        """A RuntimeError, once the Experiment is deleted, when a running trial cannot start or never got a pod, or
        no trial appeared, within ``pending_timeout_seconds``."""
        what, pending = self.what, self.pending_timeout_seconds
        running = {t["metadata"]["name"] for t in trials} - self.ended
        pods = self.trial_pods(running)
        if why := unstartable_pod_reason(pods, self.unschedulable_since, pending):
            self.runner.delete(f"a trial cannot start: {why}")
            raise RuntimeError(f"{what}: a trial cannot start: {why}")
        if self.run_id is not None and (why := self.never_got_a_pod(running, pods)):
            self.runner.delete(why)
            raise RuntimeError(f"{what}: {why}")
        if not trials and time.monotonic() - self.started > pending:
            self.runner.delete(f"no trial after {pending:.0f}s")
            raise RuntimeError(
                f"{what} created no trial in {pending:.0f}s: Katib's suggestion "
                f"service did not start or answer (kubectl -n {self.namespace} describe suggestion "
                f"{self.name}, and its pod)"
            )
