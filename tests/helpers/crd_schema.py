"""Check a manifest against the real CRD's OpenAPI v3 schema, offline, with jsonschema.

The CRDs are the upstream copies in ``tests/reference/crds`` (see tests/reference/README.md; ``REFERENCE_DIR``
names another folder of the same layout).

The API server prunes fields a structural schema does not declare instead of rejecting them, so a typo
in a manifest would vanish silently on a cluster. Here undeclared fields are errors: every object schema
with ``properties`` gets ``additionalProperties: false`` unless it says
``x-kubernetes-preserve-unknown-fields``. ``x-kubernetes-int-or-string`` becomes "integer or string".
CEL rules (``x-kubernetes-validations``) are not evaluated.
"""

from __future__ import annotations

import functools

import jsonschema
import yaml

from tests.helpers import repo

CRDS = repo.REFERENCE / "crds"


def _strict(schema: dict) -> dict:
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if "properties" in schema:
        out["properties"] = {name: _strict(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _strict(schema["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_strict(sub) for sub in schema[key]]
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in schema:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in schema:
        out["type"] = [schema["type"], "null"]
    return out


@functools.cache
def _crd(filename: str) -> dict:
    # libyaml: the InferenceService CRD is 2 MB, seconds to parse in pure Python.
    return yaml.load((CRDS / filename).read_text(), Loader=yaml.CSafeLoader)


@functools.cache
def _validator(filename: str, version: str) -> jsonschema.Draft7Validator:
    crd = _crd(filename)
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    if version not in served:
        raise AssertionError(f"{filename} does not serve version {version}; it serves {sorted(served)}")
    return jsonschema.Draft7Validator(_strict(served[version]["schema"]["openAPIV3Schema"]))


def crd_errors(manifest: dict, filename: str) -> list[str]:
    """Every way ``manifest`` breaks the CRD in ``filename`` (group, kind, served version, schema), as
    ``path: message`` lines; empty when it conforms."""
    crd = _crd(filename)
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    api_group, _, version = manifest.get("apiVersion", "").rpartition("/")
    errors = []
    if api_group != group:
        errors.append(f"apiVersion: {manifest.get('apiVersion')!r} is not in group {group}")
    if manifest.get("kind") != kind:
        errors.append(f"kind: {manifest.get('kind')!r} is not {kind}")
    if errors:
        return errors
    validator = _validator(filename, version)
    for err in sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path))):
        errors.append(f"{'.'.join(map(str, err.absolute_path)) or '<root>'}: {err.message}")
    return errors
