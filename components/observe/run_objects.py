"""Objects the train step creates for the length of a stage and deletes when it ends, recorded on the model claim so
that the run's exit handler (notify_run, components/observe/component.py) deletes them too when the step could not:
a step killed by KFP, by its node or by a timeout never reaches its ``finally``.

    record_objects(model_root, run_id, record, objects)   # before the first is created
    forget_objects(model_root, run_id, record)            # once the step has deleted them itself
    remove_recorded(model_root, run_id, record)           # the exit handler: delete what is still recorded

A record is ``runs/<run id>/<record>`` (the variants' ``runs/<run id>-<variant>/<record>`` too), a JSON list of
``{"kind", "namespace", "name"}``. Kinds: ConfigMap, Deployment, Service, NetworkPolicy. Today: the grpo stage's vLLM
generation server (components/train/launcher/generation_server.py, ``GRPO_SERVER_RECORD``) and each training job's
NetworkPolicy (components/train/launcher/job.py::trainer_network, ``TRAINER_POLICY_RECORD``).

A record says where to look, never what may be deleted: every trainer pod writes its run's folder on the model claim
and runs user code, so a file there can name any object (KFP's own API server). ``delete_run_object`` deletes an
object only when the live object carries this run's ``RUN_ID_LABEL`` (which the train step sets on everything it
creates), and only that object: the delete carries the uid it checked as its precondition, so a same-named object
made since is refused by the API server (409).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import RUN_ID_LABEL, call_api, load_api_client
from components.paths import run_dir

log = logging.getLogger("run_objects")

GRPO_SERVER_RECORD = "grpo-vllm-server.json"
TRAINER_POLICY_RECORD = "trainer-network-policy.json"  # the training job's NetworkPolicy (launcher/job.py)
RECORDS = (GRPO_SERVER_RECORD, TRAINER_POLICY_RECORD)  # what the exit handler looks for
KINDS = ("ConfigMap", "Deployment", "Service", "NetworkPolicy")  # what records may name (_APIS)


# Each kind's API class and the snake-case name its namespaced methods use (read_/delete_namespaced_<name>).
_APIS = {
    "ConfigMap": (k8s.CoreV1Api, "config_map"),
    "Deployment": (k8s.AppsV1Api, "deployment"),
    "Service": (k8s.CoreV1Api, "service"),
    "NetworkPolicy": (k8s.NetworkingV1Api, "network_policy"),
}


def _method(api_client, verb: str, kind: str):
    api, name = _APIS[kind]
    return getattr(api(api_client), f"{verb}_namespaced_{name}")


def delete_object(api_client, kind: str, namespace: str, name: str) -> bool:
    """Delete one object (background propagation: the Deployment's pods go with it); False when it was gone."""
    delete = _method(api_client, "delete", kind)
    try:
        call_api(delete, name, namespace, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


def _read(api_client, kind: str, namespace: str, name: str) -> dict | None:
    """The live object as a dict (its metadata), or None when it is gone."""
    read = _method(api_client, "read", kind)
    try:
        obj = call_api(read, name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None
    meta = obj.metadata
    return {"uid": meta.uid, "labels": meta.labels or {}}


def belongs_to_run(labels: dict, run_id: str) -> bool:
    """Whether an object's labels say the run ``run_id`` (or one of its variants, ``<run id>-<variant>``) made it."""
    owner = str(labels.get(RUN_ID_LABEL, ""))
    return bool(run_id) and (owner == run_id or owner.startswith(f"{run_id}-"))


def delete_run_object(api_client, kind: str, namespace: str, name: str, run_id: str) -> bool:
    """Delete ``kind namespace/name`` if the live object belongs to run ``run_id`` (``belongs_to_run``), with its
    uid as the delete's precondition; True when deleted. False when it is gone (or replaced since the check: the API
    server's 409). Raises PermissionError, naming the object and its run label, when it belongs to no such run: the
    caller's record was not authority to delete it."""
    found = _read(api_client, kind, namespace, name)
    if found is None:
        return False
    if not belongs_to_run(found["labels"], run_id):
        raise PermissionError(
            f"{kind} {namespace}/{name} is not this run's ({RUN_ID_LABEL}={found['labels'].get(RUN_ID_LABEL)!r}, "
            f"run {run_id}): a record on the model claim names it, and records are not authority to delete"
        )
    delete = _method(api_client, "delete", kind)
    options = k8s.V1DeleteOptions(propagation_policy="Background", preconditions=k8s.V1Preconditions(uid=found["uid"]))
    try:
        call_api(delete, name, namespace, body=options)
    except ApiException as exc:
        if exc.status in (404, 409):  # gone, or a new object of that name: not the one checked
            return False
        raise
    return True


def record_objects(model_root: str, run_id: str, record: str, objects: list[dict]) -> Path:
    """Write ``objects`` (manifests, or ``{"kind", "namespace", "name"}``) to the run's ``record``, atomically."""
    folder = Path(run_dir(model_root, run_id))
    folder.mkdir(parents=True, exist_ok=True)
    entries = [_entry(o) for o in objects]
    tmp = folder / f".{record}.tmp"
    tmp.write_text(json.dumps(entries))
    os.replace(tmp, folder / record)
    return folder / record


def forget_objects(model_root: str, run_id: str, record: str) -> None:
    (Path(run_dir(model_root, run_id)) / record).unlink(missing_ok=True)


def remove_recorded(model_root: str, run_id: str, record: str, api_client=None) -> list[str]:
    """The exit handler's part: delete the objects the run's steps (its variants' too) recorded under ``record`` and
    still hold; returns ``Kind namespace/name`` of each deleted. Never raises: what it could not delete is a warning
    with the ``kubectl delete`` command, and its record stays."""
    root = Path(run_dir(model_root, run_id))
    removed: list[str] = []
    for path in [root / record, *sorted(root.parent.glob(f"{run_id}-*/{record}"))]:
        if not path.is_file():
            continue
        try:
            entries = [e for e in json.loads(path.read_text()) if e["kind"] in KINDS]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot read %s (%s): what it names is left in place", path, exc)
            continue
        failed = False
        for e in entries:
            try:
                api_client = api_client or load_api_client()
                if delete_run_object(api_client, e["kind"], e["namespace"], e["name"], run_id):
                    removed.append(f"{e['kind']} {e['namespace']}/{e['name']}")
            except PermissionError as exc:
                log.warning("left in place: %s", exc)
            except Exception as exc:  # the exit handler must still post the run's outcome
                failed = True
                log.warning(
                    "could not delete %s %s/%s (%s): kubectl delete -n %s %s %s",
                    e["kind"],
                    e["namespace"],
                    e["name"],
                    f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException) else repr(exc),
                    e["namespace"],
                    e["kind"].lower(),
                    e["name"],
                )
        if not failed:
            path.unlink(missing_ok=True)
    for what in removed:
        log.info("deleted %s", what)
    return removed


def _entry(obj: dict) -> dict:
    meta = obj.get("metadata", obj)
    return {"kind": obj["kind"], "namespace": meta["namespace"], "name": meta["name"]}
