"""A record on the model claim is never authority to delete (issue 39 item 2): every trainer pod mounts the claim
read-write and runs user code (reward functions), so a file under ``runs/<id>/`` may name anything. The exit handler
deletes an object only when the live object carries this run's id label (``pipelines.kubeflow.org/run-id``, which the
train step sets on what it creates), and only that object (its uid as the delete's precondition). Driven through the
real kubernetes client against the fake API server, which checks ``preconditions.uid`` as the API server does."""

from __future__ import annotations

import json

import pytest

from components.kube import RUN_ID_LABEL
from components.observe import run_objects, tensorboard
from components.observe.run_objects import GRPO_SERVER_RECORD, remove_recorded
from tests.fakes.k8s_api import FakeKubeAPI

RUN_ID = "7d2e9a41-0c5b-4f8e-9a63-1b4c2d8e7f90"
OTHER_RUN = "0b6f1c7e-55aa-4a3e-8f0e-2c9d1e7a4b11"
NS = "team-llm"


def _deployment(namespace: str, name: str, labels: dict) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}}},
    }


def _plant(tmp_path, run_id: str, record: str, entries) -> None:
    folder = tmp_path / "runs" / run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / record).write_text(json.dumps(entries))


def test_a_record_naming_an_object_without_this_runs_label_deletes_nothing(tmp_path):
    with FakeKubeAPI() as api:
        api.put_object("apps", "v1", "deployments", _deployment("kubeflow", "ml-pipeline", {"app": "ml-pipeline"}))
        api.put_object("apps", "v1", "deployments", _deployment(NS, "their-server", {RUN_ID_LABEL: OTHER_RUN}))
        api.put_object("apps", "v1", "deployments", _deployment(NS, "our-server", {RUN_ID_LABEL: RUN_ID}))
        _plant(
            tmp_path,
            RUN_ID,
            GRPO_SERVER_RECORD,
            [
                {"kind": "Deployment", "namespace": "kubeflow", "name": "ml-pipeline"},  # KFP's own API server
                {"kind": "Deployment", "namespace": NS, "name": "their-server"},  # another run's
                {"kind": "Deployment", "namespace": NS, "name": "our-server"},
            ],
        )
        removed = remove_recorded(str(tmp_path), RUN_ID, GRPO_SERVER_RECORD, api_client=api.client)
        assert removed == [f"Deployment {NS}/our-server"]
        assert api.get_object("apps", "v1", "deployments", "kubeflow", "ml-pipeline") is not None
        assert api.get_object("apps", "v1", "deployments", NS, "their-server") is not None
        assert api.get_object("apps", "v1", "deployments", NS, "our-server") is None
        # Only the deletion of the labelled one was asked for, with its uid as the precondition.
        (delete,) = api.requests_for("DELETE")
        assert delete.path.endswith("/our-server") and delete.body["preconditions"]["uid"]


def test_a_variants_record_deletes_only_that_variants_objects(tmp_path):
    variant = f"{RUN_ID}-lr2"
    with FakeKubeAPI() as api:
        api.put_object("apps", "v1", "deployments", _deployment(NS, "v-server", {RUN_ID_LABEL: variant}))
        api.put_object("apps", "v1", "deployments", _deployment(NS, "base-server", {RUN_ID_LABEL: RUN_ID}))
        _plant(tmp_path, variant, GRPO_SERVER_RECORD, [{"kind": "Deployment", "namespace": NS, "name": "v-server"}])
        assert remove_recorded(str(tmp_path), RUN_ID, GRPO_SERVER_RECORD, api_client=api.client) == [
            f"Deployment {NS}/v-server"
        ]
        assert api.get_object("apps", "v1", "deployments", NS, "base-server") is not None


@pytest.mark.parametrize("labels", [{}, {RUN_ID_LABEL: OTHER_RUN}])
def test_a_tensorboard_record_naming_an_unlabelled_server_deletes_nothing(tmp_path, labels):
    with FakeKubeAPI() as api:
        api.put_object("apps", "v1", "deployments", _deployment(NS, "victim", labels))
        api.put_object(
            "",
            "v1",
            "services",
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "victim", "namespace": NS, "labels": labels}},
        )
        folder = tmp_path / "runs" / RUN_ID
        folder.mkdir(parents=True)
        (folder / tensorboard.RECORD).write_text(json.dumps({"namespace": NS, "name": "victim"}))
        assert tensorboard.remove_servers(str(tmp_path), RUN_ID, api_client=api.client) == []
        assert api.get_object("apps", "v1", "deployments", NS, "victim") is not None
        assert api.get_object("", "v1", "services", NS, "victim") is not None
        assert not api.requests_for("DELETE")


def test_an_object_replaced_after_the_check_is_not_deleted(tmp_path, monkeypatch):
    """Between the exit handler's read and its delete the name may be taken by a new object: the delete carries the
    uid it checked, and the API server refuses it (409) for any other."""
    with FakeKubeAPI() as api:
        api.put_object("apps", "v1", "deployments", _deployment(NS, "our-server", {RUN_ID_LABEL: RUN_ID}))
        real_read = run_objects._read

        def read_then_replace(api_client, kind, namespace, name):
            found = real_read(api_client, kind, namespace, name)
            api.put_object("apps", "v1", "deployments", _deployment(NS, "our-server", {"app": "someone-else"}))
            return found

        monkeypatch.setattr(run_objects, "_read", read_then_replace)
        _plant(tmp_path, RUN_ID, GRPO_SERVER_RECORD, [{"kind": "Deployment", "namespace": NS, "name": "our-server"}])
        assert remove_recorded(str(tmp_path), RUN_ID, GRPO_SERVER_RECORD, api_client=api.client) == []
        assert api.get_object("apps", "v1", "deployments", NS, "our-server")["metadata"]["labels"] == {
            "app": "someone-else"
        }
