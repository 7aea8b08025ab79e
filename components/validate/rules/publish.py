"""The publish step's rules: the Model Registry's address, the Hub repository's id and its token's Secret."""

from __future__ import annotations

from urllib.parse import urlsplit

from components.names import DNS1123_SUBDOMAIN, name_error
from components.settings import Settings


def check_publish_settings(s: Settings) -> list[str | None]:
    """The problems with the publish settings (None where a check passed)."""
    from components.publish.hub_push import check_repo_id
    from components.publish.model_registry import parse_server_url

    p = s.publish
    errors: list[str | None] = []
    for check, value in ((parse_server_url, p.model_registry_url), (check_repo_id, p.hub_repo_id)):
        if value:
            try:
                check(value)
            except ValueError as e:
                errors.append(str(e))
    if p.hub_endpoint:
        parts = urlsplit(p.hub_endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            errors.append(f"hub_endpoint={p.hub_endpoint!r} is not an http(s):// URL, e.g. https://hub.example.com")
    if p.model_registry_url and not s.deploy.serving_name and not p.model_registry_model_name:
        errors.append("model_registry_url: name the registered model (model_registry_model_name) or serving_name")
    if p.hub_repo_id:
        if not p.hub_token_secret:
            errors.append(
                "hub_repo_id is set and hub_token_secret is empty: name the Secret whose key HF_TOKEN holds a Hub "
                "token that may write it"
            )
        else:
            errors.append(name_error("hub_token_secret", p.hub_token_secret, DNS1123_SUBDOMAIN, 253, "Secret name"))
    return errors
