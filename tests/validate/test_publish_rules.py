"""validate_inputs' rules for the publish step: each bad setting is one line naming it, before any GPU."""

from components.settings import defaults
from components.validate.rules import check


def test_bad_publish_settings_are_one_line_each():
    errors = check(
        {
            **defaults(),
            "model_registry_url": "model-registry:8080",
            "hub_repo_id": "no-namespace",
            "hub_token_secret": "Bad_Name",
            "hub_endpoint": "hub.example.com",
        }
    )
    assert errors == [
        "model_registry_url='model-registry:8080' is not an http:// or https:// URL with a host; expected "
        "http(s)://host[:port], e.g. http://model-registry-service.kubeflow.svc.cluster.local:8080",
        "hub_repo_id='no-namespace' names no namespace: write <user or organization>/no-namespace, the account the "
        "model goes to",
        "hub_endpoint='hub.example.com' is not an http(s):// URL, e.g. https://hub.example.com",
        "hub_token_secret='Bad_Name' is not a valid Kubernetes Secret name (lowercase letters, digits, '-', at most "
        "253); e.g. 'bad-name'",
    ]


def test_the_defaults_publish_nowhere_and_pass():
    assert check(defaults()) == []
    values = {**defaults(), "model_registry_url": "http://model-registry-service.kubeflow:8080", "hub_repo_id": "org/m"}
    assert check(values) == []
