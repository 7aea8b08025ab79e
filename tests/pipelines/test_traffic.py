"""``python -m pipelines.run promote|rollback RUN_ID``: the last step of a Knative canary, on the fake API server."""

from __future__ import annotations

import pytest

from pipelines.run import main
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.kserve import becomes_ready
from tests.helpers.inference_service import GVP, NAME, NS, isvc

RUN = "8b0e3f2a"  # the run id label isvc() carries


def _live(api, **overrides) -> dict:
    service = isvc(deployment_mode="Knative", **overrides)
    service["status"] = {
        "observedGeneration": 1,
        "url": "http://x",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return api.put_object(*GVP, service)


@pytest.mark.parametrize(("action", "share"), [("promote", None), ("rollback", 0)])
def test_promote_and_rollback_move_the_canarys_traffic(action, share, monkeypatch, capsys):
    with FakeKubeAPI() as api:
        _live(api, canary_traffic_percent=10)
        candidate = isvc(name=f"{NAME}-candidate", deployment_mode="Knative", canary_traffic_percent=10)
        candidate["metadata"]["labels"]["llm-post-training/candidate-for"] = NAME
        api.put_object(*GVP, candidate)  # a candidate left behind is never promoted
        api.on_get("inferenceservices", becomes_ready(api, "http://x", after=1))
        monkeypatch.setattr("components.kube.load_api_client", lambda: api.client)
        code = main([action, RUN, "--namespace", NS, "--timeout", "10"])
        after = api.get_object(*GVP, NS, NAME)
        patched = [r.path.rsplit("/", 1)[1] for r in api.requests_for("PATCH")]
    out = capsys.readouterr().out
    assert code == 0 and patched == [NAME]
    assert after["spec"]["predictor"].get("canaryTrafficPercent") == share
    assert f"InferenceService {NS}/{NAME}: all of the traffic" in out and "(was 10% on the latest revision)" in out


def test_a_service_without_a_canary_or_no_service_is_one_line(monkeypatch, capsys):
    with FakeKubeAPI() as api:
        monkeypatch.setattr("components.kube.load_api_client", lambda: api.client)
        assert main(["promote", RUN, "--namespace", NS]) == 2
        assert "no InferenceService of run 8b0e3f2a in namespace team-llm" in capsys.readouterr().err
        _live(api)
        assert main(["rollback", RUN, "--namespace", NS]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "has no canary to rollback" in err and "deploying the earlier model" in err
        assert api.requests_for("PATCH") == []
