"""The one custom-resource runner (components.kube.CustomResourceRunner) against the fake API server, through the
real kubernetes client: create or re-attach, re-create what is being deleted or spent, follow, wait until gone,
delete on SIGTERM, also when the signal's exception was dropped inside a finalizer."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import pytest
from kubernetes import client as k8s

from components import kube
from components.kube import Cancelled, CustomResourceRunner
from tests.fakes.k8s_api import FakeKubeAPI

NS, NAME = "team-llm", "hpo-run-1"
GVP = ("kubeflow.org", "v1beta1", "experiments")
WHAT = f"Experiment {NS}/{NAME}"


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def manifest() -> dict:
    return {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Experiment",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"maxTrialCount": 3},
    }


def runner(api, **over) -> CustomResourceRunner:
    return CustomResourceRunner(
        manifest(),
        GVP[2],
        **{"api_client": api.client, "poll_seconds": 0.01, "controller": "Katib's controller", **over},
    )


def finished(state: str):
    """A controller step: the resource reaches ``state``."""
    return lambda obj: FakeKubeAPI.set_condition(obj, state)


def until_done(obj: dict) -> dict | None:
    return obj if kube.latest_state(obj) in ("Succeeded", "Failed") else None


# -- create or re-attach ---------------------------------------------------------------------------------------


def test_creates_once_and_follows_to_the_end(capsys):
    with FakeKubeAPI() as api:
        api.on_get("experiments", api.steps(finished("Running"), lambda obj: None, finished("Succeeded")))
        r = runner(api)
        created = r.create(manifest())
        done = r.follow(until_done)
        assert len(api.requests_for("POST", "/experiments")) == 1 and api.requests_for("DELETE") == []
    assert created["metadata"]["uid"] == done["metadata"]["uid"] and kube.latest_state(done) == "Succeeded"
    assert f"created {WHAT}" in capsys.readouterr().out


def test_an_existing_resource_is_re_attached_to(capsys):
    with FakeKubeAPI() as api:
        first = api.put_object(*GVP, manifest())  # what the first attempt of the step created
        api.on_get("experiments", finished("Succeeded"))
        r = runner(api)
        attached = r.create(manifest())
        r.follow(until_done)
        assert len(api.requests_for("POST")) == 1  # answered 409 AlreadyExists
        assert api.get_object(*GVP, NS, NAME)["metadata"]["uid"] == first["metadata"]["uid"]
    assert attached["metadata"]["uid"] == first["metadata"]["uid"]
    assert f"{WHAT} already exists: re-attaching to it" in capsys.readouterr().out


def test_a_resource_being_deleted_is_waited_out_and_created_again(capsys):
    with FakeKubeAPI() as api:
        api.deletion_gets = 4
        first = api.put_object(*GVP, manifest())
        # A previous attempt deleted it (foreground: it stays while its dependents go) and stopped there.
        k8s.CustomObjectsApi(api.client).delete_namespaced_custom_object(
            *GVP[:2], NS, GVP[2], NAME, body=k8s.V1DeleteOptions(propagation_policy="Foreground")
        )
        seen = []
        created = runner(api).create(lambda gone: seen.append(gone) or manifest())
        log = [r.method for r in api.requests if "/experiments" in r.path][1:]  # after the test's own DELETE
    assert created["metadata"]["uid"] != first["metadata"]["uid"]
    # 409; four GETs see it still there (the first tells it is being deleted), the fifth a 404; only then the create.
    assert log == ["POST"] + ["GET"] * 5 + ["POST"]
    assert seen[0] is None and seen[1]["metadata"]["uid"] == first["metadata"]["uid"]  # the body saw what went
    out = capsys.readouterr().out
    assert f"{WHAT} is being deleted: creating it again once it is gone" in out
    assert f"waiting for {WHAT} to be deleted" in out


def test_a_spent_resource_is_deleted_in_the_foreground_and_created_again(capsys):
    with FakeKubeAPI() as api:
        spent = manifest()
        FakeKubeAPI.set_condition(spent, "Failed", reason="ExperimentFailed")
        first = api.put_object(*GVP, spent)
        created = runner(api).create(
            manifest(), replace=lambda obj: "it failed" if kube.true_condition(obj, "Failed") else None
        )
        (delete,) = api.requests_for("DELETE", f"/experiments/{NAME}")
        stored = api.get_object(*GVP, NS, NAME)
    assert delete.body["propagationPolicy"] == "Foreground"
    assert created["metadata"]["uid"] == stored["metadata"]["uid"] != first["metadata"]["uid"]
    assert "status" not in stored
    assert f"deleting {WHAT}: it failed; creating it again once it is gone" in capsys.readouterr().out


# -- following --------------------------------------------------------------------------------------------------


def test_a_resource_deleted_while_it_is_followed_is_an_error():
    with FakeKubeAPI() as api:
        api.on_get(
            "experiments", api.steps(finished("Running"), lambda obj: api.objects.pop((*GVP[:2], GVP[2], NS, NAME)))
        )
        r = runner(api)
        r.create(manifest())
        with pytest.raises(RuntimeError, match=f"{WHAT} was deleted while it ran"):
            r.follow(until_done)


def test_past_the_deadline_the_resource_is_deleted():
    with FakeKubeAPI() as api:
        api.on_get("experiments", finished("Running"))
        r = runner(api, timeout_seconds=0.1)
        r.create(manifest())
        with pytest.raises(TimeoutError, match=rf"{WHAT} did not finish within 0s \(last state Running\)"):
            r.follow(until_done)
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
        assert api.get_object(*GVP, NS, NAME) is None


def test_on_deadline_replaces_the_deletion():
    def roll_back(obj):
        raise TimeoutError(f"rolled back from {kube.latest_state(obj)}")

    with FakeKubeAPI() as api:
        api.on_get("experiments", finished("Running"))
        r = runner(api, timeout_seconds=0.05)
        r.create(manifest())
        with pytest.raises(TimeoutError, match="rolled back from Running"):
            r.follow(until_done, on_deadline=roll_back)
        assert api.requests_for("DELETE") == []


def test_a_deletion_held_by_a_finalizer_names_it_and_the_controller():
    with FakeKubeAPI() as api:
        api.deletion_gets = 10**6  # a finalizer nobody removes
        api.put_object(*GVP, manifest())
        r = runner(api, deletion_timeout_seconds=0.1)
        r.delete("a test", foreground=True)
        with pytest.raises(
            RuntimeError,
            match=r"still being deleted after 0s \(finalizers: foregroundDeletion\): "
            "check that Katib's controller is running",
        ):
            r.wait_until_gone()


# -- SIGTERM ------------------------------------------------------------------------------------------------------


def test_sigterm_deletes_the_resource_and_exits_143():
    before = signal.getsignal(signal.SIGTERM)
    with FakeKubeAPI() as api:
        api.on_get("experiments", finished("Running"))
        r = runner(api)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            with pytest.raises(SystemExit) as exit_, r.cancel_on_sigterm():
                r.create(manifest())
                r.follow(until_done)
        finally:
            timer.cancel()
        assert exit_.value.code == 128 + signal.SIGTERM
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
        assert api.get_object(*GVP, NS, NAME) is None
    assert signal.getsignal(signal.SIGTERM) is before


class _SignalledWhileFinalized:
    """An object whose finalizer is running when SIGTERM arrives (a dropped connection's ``__del__``, say)."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # the Python handler runs at the next bytecode boundary: here, inside __del__
            pass


def test_a_sigterm_whose_exception_a_finalizer_dropped_still_deletes_the_resource(monkeypatch):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))
    polls = []

    def poll(obj):
        polls.append(kube.latest_state(obj))
        if len(polls) == 3:
            _SignalledWhileFinalized()  # dropped at once: its __del__ runs here
        return None

    with FakeKubeAPI() as api:
        api.on_get("experiments", finished("Running"))
        r = runner(api, timeout_seconds=5)
        with pytest.raises(SystemExit) as exit_, r.cancel_on_sigterm():
            r.create(manifest())
            r.follow(poll)
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
    # Python dropped the handler's exception inside the finalizer, and yet the step stopped at the next poll.
    assert dropped == [Cancelled] and len(polls) == 3
    assert exit_.value.code == 128 + signal.SIGTERM


class _SignalledWhileLogging(logging.Handler):
    """A log handler that is running when SIGTERM arrives (CPython's logging holds a lock here)."""

    def __init__(self):
        super().__init__()
        self.emitted: list[str] = []

    def emit(self, record):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # the Python handler runs at the next bytecode boundary: here, inside logging
            pass
        self.emitted.append(record.getMessage())


def test_a_sigterm_inside_logging_is_not_raised_there_and_cancels_at_the_next_poll():
    """Raising inside the logging package can leave its module lock held for good (it takes the lock outside its
    ``try`` blocks: ``_acquireLock(); try:``); every other thread that logs then waits forever (a W&B client's event
    loop did, in a later test of the same pytest worker). The cancel waits for the runner's next poll."""
    log = logging.getLogger("test-kube-sigterm-in-logging")
    log.propagate = False
    handler = _SignalledWhileLogging()
    log.addHandler(handler)
    with FakeKubeAPI() as api:
        r = runner(api)
        with pytest.raises(SystemExit) as exit_, r.cancel_on_sigterm():
            r.create(manifest())
            log.warning("created")  # SIGTERM arrives inside the handler: the record is still emitted whole
            r.sleep()
        assert handler.emitted == ["created"]
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
    assert exit_.value.code == 128 + signal.SIGTERM
    assert not handler.lock._is_owned()  # type: ignore[union-attr]


def test_a_sigterm_deferred_past_the_last_poll_still_cancels_when_the_block_ends():
    """A SIGTERM whose exception was not raised (inside logging) or was dropped (in a finalizer) after the last poll:
    leaving the block cancels, rather than the step carrying on as though KFP had not stopped it."""
    log = logging.getLogger("test-kube-sigterm-at-the-end")
    log.propagate = False
    log.addHandler(_SignalledWhileLogging())
    with FakeKubeAPI() as api:
        r = runner(api)
        with pytest.raises(SystemExit) as exit_, r.cancel_on_sigterm():
            r.create(manifest())
            log.warning("done")
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
    assert exit_.value.code == 128 + signal.SIGTERM


def test_on_cancel_replaces_the_deletion(capsys):
    with FakeKubeAPI() as api:
        api.put_object(*GVP, manifest())
        r = runner(api)
        with pytest.raises(SystemExit), r.cancel_on_sigterm(on_cancel=lambda: print("rolled back")):
            os.kill(os.getpid(), signal.SIGTERM)
            r.sleep()
        assert api.requests_for("DELETE") == []
    assert "rolled back" in capsys.readouterr().out
