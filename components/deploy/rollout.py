"""The rollout of a KServe InferenceService (components/deploy/manifest.py builds it): create it, or move it to the new
spec once that spec passed its gates beside the live one (a candidate service, or a Knative revision at 0%); wait for
Ready for this spec, saying where a slow rollout is (the predictor pods' phase, the model server's last log lines);
smoke-test every model name it serves, check that it serves the evaluated model and, with gates, its latency; and
roll it back (the previous spec restored, or the new service deleted) on any failure or a cancelled run.
``deploy_inference_services`` rolls out several, all or none.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.deploy.manifest import (
    DEPLOYMENT_MODE_ANNOTATION,
    LEGACY_DEPLOYMENT_MODES,
    PLURAL,
    RUNTIMES,
    TAG_ROUTING_ANNOTATION,
    runtime_of,
    served_name,
    served_names,
)
from components.deploy.smoke import TooSlow, chat_completion, check_latency, describe_latency
from components.kube import CustomResourceRunner, call_api, unstartable_pod_reason
from components.models.logprobs import ServingMismatch, check_server

# KServe labels every pod of a service with its name.
POD_LABEL = "serving.kserve.io/inferenceservice"
# While the rollout waits for Ready (up to the startup probe's 30 minutes): a line this often with the time waited,
# the predictor pods' phase and the last lines of the model server's log (KServe names its container so).
PROGRESS_SECONDS = 60.0
PREDICTOR_CONTAINER = "kserve-container"
PROGRESS_LOG_LINES = 3
# Standard mode over a live service: the spec is tested on a candidate service of this name suffix first, labelled
# with the live service's name (candidate_manifest).
CANDIDATE_SUFFIX = "-candidate"
CANDIDATE_LABEL = "llm-post-training/candidate-for"


def merge_patch_to(current, desired):
    """The RFC 7386 merge patch that turns ``current`` into ``desired`` (keys ``desired`` lacks become null)."""
    if not isinstance(current, dict) or not isinstance(desired, dict):
        return desired
    patch = {key: None for key in current if key not in desired}
    for key, value in desired.items():
        if key not in current:
            patch[key] = value
        elif current[key] != value:
            patch[key] = merge_patch_to(current[key], value)
    return patch


def _progress(core, runner: CustomResourceRunner, pods: list, isvc: dict) -> str:
    """Where a rollout that is not Ready is: each predictor pod's phase and whether its model server is ready, the
    service's conditions that are not True, then the last ``PROGRESS_LOG_LINES`` lines of each pod's model server
    log (a model download or a weight load tells its progress there), indented, one a line."""
    states, logs = [], []
    for pod in pods:
        name = pod.metadata.name
        server = next((c for c in pod.status.container_statuses or [] if c.name == PREDICTOR_CONTAINER), None)
        waiting = server.state.waiting if server and server.state else None
        detail = (
            "not started"
            if server is None
            else f"{PREDICTOR_CONTAINER} waiting: {waiting.reason}"
            if waiting
            else f"{PREDICTOR_CONTAINER} {'ready' if server.ready else 'not ready'}, {server.restart_count} restarts"
        )
        states.append(f"pod {name} {pod.status.phase} ({detail})")
        if server is None or waiting:
            continue
        try:
            text = call_api(
                core.read_namespaced_pod_log,
                name,
                runner.namespace,
                container=PREDICTOR_CONTAINER,
                tail_lines=PROGRESS_LOG_LINES,
                _preload_content=False,  # raw text: the client would json-decode a log line that is valid JSON
                retry_delay=runner.retry_delay,
            ).data.decode("utf-8", errors="replace")
        except ApiException as exc:
            if exc.status not in (400, 404):  # not started yet, or gone: nothing to show this time
                raise
            continue
        logs += [f"  [{name}] {line}" for line in text.splitlines() if line.strip()]
    where = "; ".join(states) or "no predictor pod yet"
    return "\n".join([f"{where}; {_not_ready_reasons(isvc)}", *logs])


def _ready(isvc: dict, generation: int) -> bool:
    status = isvc.get("status") or {}
    # A Ready left over from the previous spec says nothing about ours.
    if status.get("observedGeneration", generation) < generation:
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _not_ready_reasons(isvc: dict) -> str:
    status = isvc.get("status") or {}
    reasons = [
        f"{c['type']}={c.get('status')} ({c.get('reason', '')}): {c.get('message', '')}".replace(" (): ", ": ")
        for c in status.get("conditions") or []
        if c.get("status") != "True"
    ]
    failure = (status.get("modelStatus") or {}).get("lastFailureInfo") or {}
    if failure:
        reasons.append(f"model: {failure.get('reason', '')}: {failure.get('message', '')}")
    return "; ".join(reasons) or "no status conditions yet"


def deploy_inference_service(
    manifest: dict,
    *,
    timeout_seconds: float = 1800.0,
    poll_seconds: float = 10.0,
    api_client=None,
    smoke_prompt: str = "Hello",
    pending_timeout_seconds: float = 900.0,
    serving_reference: dict | None = None,
    serving_references: dict[str, dict] | None = None,
    progress_seconds: float = PROGRESS_SECONDS,
    latency_gates: dict | None = None,
) -> dict:
    """Create, or patch in place when it exists; wait for Ready; smoke-test; prove it serves the evaluated model;
    roll back on any failure. Over an existing service no request reaches the new spec through its route before the
    gates passed: in Standard mode they run on a candidate service beside it (``candidate_manifest``: deleted after,
    the live service patched only once it passed), in Knative mode on the new revision at ``canaryTrafficPercent: 0``
    by its ``latest`` tag, which then gets the manifest's share.

    Waits until the service is Ready for this spec (``status.observedGeneration``), failing fast on pods
    that cannot start (bad image, crash loop, Unschedulable past ``pending_timeout_seconds``). The smoke
    test is one chat completion (``components.deploy.smoke.chat_completion``) on the runtime's OpenAI route for
    every model name the service serves (its served name and each LoRA module's, ``served_names``) under the
    in-cluster address (``status.address.url``, else ``status.url``). On failure the previous
    spec is restored (merge patch), or the new service is deleted, and the error says which. With
    ``serving_reference`` (the evaluate step's, components/models/logprobs.py) the same address must then
    reproduce the evaluated model's per-token log-probabilities on held-out rows and its greedy first tokens. With
    ``latency_gates``, last, its latency: a few concurrent streamed chat completions to the served name
    (``components.deploy.smoke.check_latency``: time to first token, output tokens/s), gated on the deploy settings
    ``max_ttft_seconds`` and ``min_output_tokens_per_second`` (0: measured, not gated); a service too slow is rolled
    back the same way.

    Args:
        manifest: from ``build_inference_service``.
        timeout_seconds: how long the rollout may take to become Ready (model download and load included).
        poll_seconds: interval between status polls.
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.
        smoke_prompt: the user message of the smoke test.
        pending_timeout_seconds: how long a predictor pod may stay Unschedulable.
        serving_reference: from ``components.models.logprobs.read_reference``; None skips that check.
        serving_references: more references by served name (a LoRA module's, checked under its name).
        progress_seconds: while not Ready, print this often how long it has waited, the predictor pods' phase and
            the last lines of the model server's log.
        latency_gates: ``{"max_ttft_seconds": ..., "min_output_tokens_per_second": ...}`` (0: no gate), the
            ``check_latency`` keyword arguments; None skips the latency probe.

    Returns:
        ``{"endpoint": <status.url + OpenAI route>, "served_model_name": ..., "smoke_reply": ...}``, with
        ``latency_gates`` ``"latency"`` (``check_latency``'s figures), and
        ``"serving_check"`` (check_server's summary) with a ``serving_reference``; a service with LoRA modules
        adds ``"replies"`` (served name -> smoke reply) and ``"serving_checks"`` (served name -> summary).

    With a canary (``canaryTrafficPercent``, Knative) on an existing service, the smoke test goes to the new
    revision's tagged URL. SIGTERM (the KFP run cancelled) rolls back the same way and exits with 143.

    Raises:
        ValueError: the existing service runs in another deployment mode (nothing is changed).
        RuntimeError: a pod cannot start, the smoke test failed, the server is not the evaluated model or is slower
            than the latency gates allow (after the rollback).
        TimeoutError: not Ready within ``timeout_seconds``, with the status conditions' reasons (after the rollback).
        SystemExit: 143 after SIGTERM, once rolled back.
    """
    result, _ = _roll_out(
        manifest,
        timeout_seconds=timeout_seconds,
        poll_seconds=poll_seconds,
        api_client=api_client,
        smoke_prompt=smoke_prompt,
        pending_timeout_seconds=pending_timeout_seconds,
        serving_reference=serving_reference,
        serving_references=serving_references,
        progress_seconds=progress_seconds,
        latency_gates=latency_gates,
    )
    return result


def deploy_inference_services(manifests: list[dict], **kwargs) -> list[dict]:
    """``deploy_inference_service`` for each of ``manifests`` in turn (keyword arguments as for it; the references
    by served name), all or none: when one fails (or the run is cancelled), every service this call changed
    before it is rolled back too (restored, or deleted when it was new), and the error says so.

    Returns:
        Each service's result, in order.
    """
    results: list[dict] = []
    undo: list[tuple[str, object]] = []
    try:
        for manifest in manifests:
            result, roll_back = _roll_out(manifest, **kwargs)
            results.append(result)
            undo.append(
                (f"{manifest['kind']} {manifest['metadata']['namespace']}/{manifest['metadata']['name']}", roll_back)
            )
    except BaseException as exc:
        undone = "; ".join(f"{what}: {roll_back()}" for what, roll_back in reversed(undo))  # type: ignore[operator]
        if not undone:
            raise
        if isinstance(exc, SystemExit):
            print(f"the run was cancelled (SIGTERM); also rolled back {undone}", flush=True)
            raise
        if isinstance(exc, (RuntimeError, TimeoutError, ValueError)):
            raise type(exc)(f"{exc}; the services deployed before it were rolled back too: {undone}") from exc
        raise
    return results


def _check_mode(runner: CustomResourceRunner, previous: dict | None, manifest: dict) -> None:
    """A ValueError when the existing service runs in another deployment mode than ``manifest`` asks for: KServe
    cannot switch it."""
    wanted_mode = manifest["metadata"].get("annotations", {}).get(DEPLOYMENT_MODE_ANNOTATION)
    if previous is not None and (running := _deployment_mode(previous)) and wanted_mode and running != wanted_mode:
        name, namespace = runner.name, runner.namespace
        raise ValueError(
            f"InferenceService {namespace}/{name} runs in deployment mode {running}, and KServe cannot "
            f"change an existing service's mode to {wanted_mode}: pass deployment_mode={running!r}, "
            f"or delete it first (kubectl delete inferenceservice -n {namespace} {name})"
        )


def _apply(runner: CustomResourceRunner, previous: dict | None, manifest: dict) -> dict:
    """Create the service, or patch the existing one (``previous``) to ``manifest``; the object the API returned."""
    # Create or update in place, never re-attach: a retried step must roll out this spec, whatever is there.
    if previous is None:
        applied = call_api(
            runner.custom.create_namespaced_custom_object, *runner.ref, manifest, retry_delay=runner.retry_delay
        )
        print(f"created {runner.what}", flush=True)
        return applied
    applied = runner.patch(
        {
            "metadata": {key: manifest["metadata"].get(key, {}) for key in ("labels", "annotations")},
            "spec": merge_patch_to(previous["spec"], manifest["spec"]),
        }
    )
    print(f"patched {runner.what} (generation {applied['metadata'].get('generation')})", flush=True)
    return applied


@dataclass(frozen=True)
class _Served:
    """A Ready service's checks, each of which rolls it back (``roll_back``) and raises a RuntimeError on failure:
    ``names`` (its served name ``served`` first, then each LoRA module's) on its OpenAI route ``base_url``."""

    what: str
    base_url: str
    names: list[str]
    served: str
    roll_back: Callable[[], str]

    def smoke_test(self, prompt: str) -> dict[str, str]:
        """One chat completion to each name; the replies by name."""
        replies: dict[str, str] = {}
        for name in self.names:  # every model the service answers to: the model itself, then each LoRA module
            try:
                replies[name] = chat_completion(self.base_url, name, prompt)
            except (RuntimeError, OSError) as exc:  # OSError: refused, reset, timed out
                label = "" if len(self.names) == 1 else f" for model {name!r}"
                raise RuntimeError(
                    f"{self.what} is Ready but failed the smoke test{label}: {exc}; {self.roll_back()}"
                ) from exc
        return replies

    def check_models(self, references: dict[str, dict]) -> dict[str, dict]:
        """``check_server`` for each name with a reference (the evaluated model's log-probabilities); the
        summaries by name."""
        checks: dict[str, dict] = {}
        for name in self.names:
            if name not in references:
                continue
            label = "" if name == self.served else f" as {name!r}"
            try:
                check = checks[name] = check_server(self.base_url, name, references[name])
            except (ServingMismatch, OSError) as exc:
                raise RuntimeError(
                    f"{self.what} is Ready but does not serve the evaluated model{label}: {exc}; {self.roll_back()}"
                ) from exc
            print(
                f"{self.what} serves the evaluated model{label}: mean "
                f"|log-probability difference| {check['mean_abs_logprob_diff']:.4f} nats over {check['tokens']} "
                f"held-out tokens (tolerance {check['logprob_tolerance']}), {check['greedy_tokens_compared']} "
                "greedy tokens equal",
                flush=True,
            )
        return checks

    def check_latency(self, gates: dict) -> dict:
        """``check_latency``'s figures for the served name, gated on ``gates``."""
        try:
            latency = check_latency(self.base_url, self.served, **gates)
        except TooSlow as exc:
            raise RuntimeError(f"{self.what} is Ready but too slow to serve: {exc}; {self.roll_back()}") from exc
        print(f"{self.what} latency: {describe_latency(latency)}", flush=True)
        return latency


def _roll_out(
    manifest: dict,
    *,
    timeout_seconds: float = 1800.0,
    poll_seconds: float = 10.0,
    api_client=None,
    smoke_prompt: str = "Hello",
    pending_timeout_seconds: float = 900.0,
    serving_reference: dict | None = None,
    serving_references: dict[str, dict] | None = None,
    progress_seconds: float = PROGRESS_SECONDS,
    latency_gates: dict | None = None,
):
    """deploy_inference_service's work: its result, and a function that rolls the service back (for a later
    service's failure)."""
    rt = runtime_of(manifest)
    if rt is None:
        runtime = manifest["spec"]["predictor"]["model"].get("runtime")
        raise ValueError(f"runtime {runtime!r} is not one of {[r.runtime for r in RUNTIMES.values()]}")
    # The runner's deadline bounds the rollout; on it the service is rolled back, not deleted (on_deadline below).
    runner = CustomResourceRunner(
        manifest,
        PLURAL,
        api_client=api_client,
        poll_seconds=poll_seconds,
        timeout_seconds=timeout_seconds,
        controller="KServe's controller",
    )
    core = k8s.CoreV1Api(runner.api_client)
    what = runner.what
    previous = runner.read()
    _check_mode(runner, previous, manifest)

    def roll_back() -> str:
        if previous is None:
            runner.delete("rolling back: it did not exist before this step")
            return "deleted the new InferenceService"
        runner.patch({"spec": merge_patch_to(runner.get()["spec"], previous["spec"])})
        return "restored the previous spec"

    cleanups: list = []  # a candidate service while it exists

    def cancelled() -> None:
        # KFP cancelled the run mid-rollout: leave the service as it was before this step, and no candidate.
        done = [cleanup() for cleanup in list(cleanups)]
        print(f"the run was cancelled (SIGTERM); {what}: {'; '.join([*done, roll_back()])}", flush=True)

    references = dict(serving_references or {})
    if serving_reference is not None:
        references[served_name(manifest, rt)] = serving_reference
    gates = _Gates(smoke_prompt, references, latency_gates, pending_timeout_seconds, progress_seconds)
    knative = _deployment_mode(manifest) == "Knative"
    with runner.cancel_on_sigterm(on_cancel=cancelled):
        if previous is None:  # a new service: nobody is served by it until it passed
            status, service, checked = _gated(runner, core, None, manifest, rt, gates, roll_back, canary=False)
        elif knative:  # the new revision at 0% of the traffic, tested by its tag, then given its share
            zero = _at_zero_percent(manifest)
            _, service, checked = _gated(runner, core, previous, zero, rt, gates, roll_back, canary=True)
            status = _promote(runner, core, runner.get(), manifest, gates, roll_back)
        else:  # Standard: a candidate service beside the live one, tested, then the live one moved to its spec
            checked = _gated_candidate(runner, core, manifest, rt, gates, cleanups)
            status = _promote(runner, core, previous, manifest, gates, roll_back)
            url = _smoke_url(status, False) + rt.openai_route
            service = _Served(what, url, checked.names, checked.served, roll_back)
            checked = checked._replace(replies={**checked.replies, **service.smoke_test(smoke_prompt)})
        canary = knative and previous is not None and "canaryTrafficPercent" in manifest["spec"]["predictor"]
        served, replies, checks, latency = service.served, checked.replies, checked.checks, checked.latency
    _report_ready(what, service.names, manifest if canary else None)
    result: dict = {
        "endpoint": status["url"].rstrip("/") + rt.openai_route,
        "served_model_name": served,
        "smoke_reply": replies[served],
    }
    if latency is not None:
        result["latency"] = latency
    if served in checks:
        result["serving_check"] = checks[served]
    if len(service.names) > 1:
        result["replies"], result["serving_checks"] = replies, checks
    return result, roll_back


class _Gates(NamedTuple):
    """What a service must pass before it gets traffic: the smoke test's prompt, the evaluated model's references
    by served name, the latency gates (None: not probed), and how long its pods may take."""

    prompt: str
    references: dict
    latency: dict | None
    pending_timeout_seconds: float
    progress_seconds: float


class _Checked(NamedTuple):
    """A service's gates, passed: its names, the served one, the replies and serving checks by name, its latency."""

    names: list[str]
    served: str
    replies: dict
    checks: dict
    latency: dict | None


def _gated(runner, core, previous, manifest, rt, gates: _Gates, roll_back, *, canary: bool):
    """Apply ``manifest`` (over ``previous``), wait for Ready, and run every gate on the revision it made; on a
    failure ``roll_back`` and raise. Returns the status, the service's checks object and what they found."""
    status = _promote(runner, core, previous, manifest, gates, roll_back)
    url = _smoke_url(status, canary)
    if canary and url == _smoke_url(status, False):
        # No tagged URL for the new revision: the shared address would test the live one instead.
        raise RuntimeError(
            f"{runner.what} is Ready but shows no URL for its new revision (traffic tag 'latest'); KServe's tag "
            f"routing ({TAG_ROUTING_ANNOTATION}) is needed to test it before it gets traffic; {roll_back()}"
        )
    service = _Served(runner.what, url + rt.openai_route, served_names(manifest), served_name(manifest, rt), roll_back)
    replies = service.smoke_test(gates.prompt)
    checks = service.check_models(gates.references)
    latency = None if gates.latency is None else service.check_latency(gates.latency)
    return status, service, _Checked(service.names, service.served, replies, checks, latency)


def _at_zero_percent(manifest: dict) -> dict:
    """``manifest`` as a Knative revision that gets none of the traffic (``canaryTrafficPercent: 0``), reachable by
    its tag: what the gates test before the revision is given its share."""
    zero = copy.deepcopy(manifest)
    zero["spec"]["predictor"]["canaryTrafficPercent"] = 0
    zero["metadata"].setdefault("annotations", {})[TAG_ROUTING_ANNOTATION] = "true"
    return zero


def candidate_manifest(manifest: dict) -> dict:
    """The candidate beside a live Standard service: ``manifest`` under the name ``<name>-candidate`` (shortened by a
    hash past 63 characters), one replica, labelled with the service it is a candidate for."""
    candidate = copy.deepcopy(manifest)
    name = manifest["metadata"]["name"]
    new = f"{name}{CANDIDATE_SUFFIX}"
    if len(new) > 63:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        new = f"{name[: 63 - len(CANDIDATE_SUFFIX) - 9].rstrip('-')}-{digest}{CANDIDATE_SUFFIX}"
    candidate["metadata"]["name"] = new
    candidate["metadata"].setdefault("labels", {})[CANDIDATE_LABEL] = name
    predictor = candidate["spec"]["predictor"]
    for key in ("scaleMetric", "scaleTarget"):
        predictor.pop(key, None)
    predictor["minReplicas"], predictor["maxReplicas"] = 1, 1
    return candidate


def _gated_candidate(runner, core, manifest: dict, rt, gates: _Gates, cleanups: list) -> _Checked:
    """Standard mode over a live service: the candidate (``candidate_manifest``) created beside it, every gate run on
    the candidate's own address, and the candidate deleted (passed or not: its GPUs go back before the live service
    rolls). The live service is not touched here; a failure raises, saying so."""
    candidate = candidate_manifest(manifest)
    left = None if runner.deadline is None else max(1.0, runner.deadline - time.monotonic())
    crunner = CustomResourceRunner(
        candidate,
        PLURAL,
        api_client=runner.api_client,
        poll_seconds=runner.poll_seconds,
        timeout_seconds=left,
        controller="KServe's controller",
    )

    def drop() -> str:
        crunner.delete("its gates ran: a candidate never serves the live service's traffic")
        cleanups.remove(drop)
        return f"deleted the candidate {crunner.what}; {runner.what} was not changed"

    cleanups.append(drop)
    _, _, checked = _gated(crunner, core, crunner.read(), candidate, rt, gates, drop, canary=False)
    print(f"the candidate {crunner.what} passed its gates; {runner.what} moves to its spec", flush=True)
    drop()
    return checked


def _promote(runner, core, current: dict, manifest: dict, gates: _Gates, roll_back) -> dict:
    """``runner``'s service moved to ``manifest`` (from ``current``; None: created); its status once Ready for it (a
    failure rolls back and raises). The live service once its spec passed its gates, or the spec under test."""
    applied = _apply(runner, current, manifest)
    try:
        isvc = _wait_ready(
            runner,
            core,
            generation=applied["metadata"].get("generation", 1),
            pending_timeout_seconds=gates.pending_timeout_seconds,
            progress_seconds=gates.progress_seconds,
        )
    except (RuntimeError, TimeoutError) as exc:
        raise type(exc)(f"{runner.what} {exc}; {roll_back()}") from exc
    return isvc["status"]


def _report_ready(what: str, names: list[str], canary: dict | None) -> None:
    """The line that says the service is Ready and answered, under each of ``names``, on the canary revision of the
    manifest ``canary`` where there is one."""
    print(
        f"{what} is Ready and answered the smoke test"
        + (f" as each of {names}" if len(names) > 1 else "")
        + (
            f" on its canary revision ({canary['spec']['predictor']['canaryTrafficPercent']}% of traffic)"
            if canary
            else ""
        ),
        flush=True,
    )


def _deployment_mode(isvc: dict) -> str | None:
    """The mode KServe runs ``isvc`` in (status first, as KServe decides), in current names; None if unknown."""
    mode = (isvc.get("status") or {}).get("deploymentMode") or (
        (isvc.get("metadata") or {}).get("annotations") or {}
    ).get(DEPLOYMENT_MODE_ANNOTATION)
    return LEGACY_DEPLOYMENT_MODES.get(mode, mode) if mode is not None else None


def _smoke_url(status: dict, canary: bool) -> str:
    """Where the smoke test goes: a canary's own revision (tag ``latest``, with tag routing), else the
    in-cluster address (this step runs in the cluster, where the external URL may not resolve)."""
    if canary:
        traffic = ((status.get("components") or {}).get("predictor") or {}).get("traffic") or []
        latest = next((t["url"] for t in traffic if t.get("tag") == "latest" and t.get("url")), None)
        if latest:
            return latest.rstrip("/")
    return ((status.get("address") or {}).get("url") or status["url"]).rstrip("/")


def _wait_ready(
    runner: CustomResourceRunner,
    core,
    *,
    generation: int,
    pending_timeout_seconds: float,
    progress_seconds: float = PROGRESS_SECONDS,
) -> dict:
    """The service once Ready for ``generation`` with a URL; RuntimeError for a pod that cannot start,
    TimeoutError past the runner's deadline (both without the service's name: the caller adds it and the rollback).
    Every ``progress_seconds`` of waiting it prints where the rollout is (``_progress``)."""
    unschedulable_since: dict = {}
    started = time.monotonic()
    reported = [started]

    def ready(isvc: dict) -> dict | None:
        if _ready(isvc, generation) and (isvc.get("status") or {}).get("url"):
            return isvc
        pods = call_api(
            core.list_namespaced_pod,
            runner.namespace,
            label_selector=f"{POD_LABEL}={runner.name}",
            retry_delay=runner.retry_delay,
        ).items
        if why := unstartable_pod_reason(pods, unschedulable_since, pending_timeout_seconds):
            raise RuntimeError(f"cannot start: {why}")
        now = time.monotonic()
        if now - reported[0] >= progress_seconds:
            reported[0] = now
            progress = _progress(core, runner, pods, isvc)
            print(f"{runner.what} is not Ready yet after {now - started:.0f}s: {progress}", flush=True)
        return None

    def not_ready(isvc: dict) -> None:
        raise TimeoutError(f"was not Ready after {runner.timeout_seconds:.0f}s: {_not_ready_reasons(isvc)}")

    return runner.follow(ready, on_deadline=not_ready)
