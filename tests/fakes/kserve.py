"""KServe's side of an InferenceService rollout, for the fake API server (tests/fakes/k8s_api.py)."""


def becomes_ready(api, url, address=None, after=1, events=None):
    """KServe's side: the status stays as it was (none, or the previous generation's) for ``after`` GETs of a
    new generation, then says Ready at ``url`` for it."""
    seen = {"polls": 0}

    def controller(obj):
        generation = obj["metadata"]["generation"]
        status = obj.setdefault("status", {})
        if status.get("observedGeneration") == generation:
            return
        seen["polls"] += 1
        if seen["polls"] <= after:
            return
        status.update(observedGeneration=generation, url=url)
        if address:
            status["address"] = {"url": address}
        api.set_condition(obj, "PredictorReady", "True")
        api.set_condition(obj, "Ready", "True")
        if events is not None:
            events.append("ready for the new spec")

    return controller
