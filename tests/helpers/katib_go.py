"""Katib's own Go code, ported, to check our Experiment against Katib offline.

Katib's Experiment CRD has no schema (x-kubernetes-preserve-unknown-fields): the API server keeps any field and
Katib's Go decoding silently drops one it does not know. So an Experiment is checked against

- the Go types it is decoded into (``tests/reference/katib/experiment_types.go``, ``common_types.go``): every
  key must be a json field of its struct, of the right kind (``experiment_type_errors``);
- the admission webhook's rules (``katib/validator.go``), ported function by function (``katib_webhook_errors``);

and ``katib_trial_job`` builds the job Katib creates for one trial (manifest/generator.go ``applyParameters``).
"""

from __future__ import annotations

import json
import re

from tests.helpers import repo

# -- Katib's Go types as a schema ---------------------------------------------------------------------------

_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.S | re.M)
_FIELD = re.compile(r"^\s+(?:(\w+)\s+)?([\w.*\[\]]+)\s+`json:\"([^\"]*)\"`", re.M)
_ALIAS = re.compile(r"^type (\w+) (string|int32|int)$", re.M)
_SCALARS = {"string": str, "int32": int, "int": int, "bool": bool, "float64": (int, float)}


def _go_types() -> tuple[dict, dict]:
    """``{struct: {json name: go type}}`` (inline structs flattened) and ``{alias: python type}``."""
    ref = repo.REFERENCE / "katib"
    text = (ref / "experiment_types.go").read_text() + (ref / "common_types.go").read_text()
    aliases = {name: _SCALARS[base] for name, base in _ALIAS.findall(text)}
    raw = {name: _FIELD.findall(body) for name, body in _STRUCT.findall(text)}

    def fields(struct: str) -> dict:
        out = {}
        for _, go_type, tag in raw[struct]:
            json_name = tag.split(",")[0]
            if ",inline" in tag and go_type in raw:
                out.update(fields(go_type))
            elif ",inline" in tag:  # metav1.TypeMeta
                out.update(apiVersion="string", kind="string")
            else:
                out[json_name] = go_type
        return out

    return {name: fields(name) for name in raw}, aliases


def go_type_errors(value, go_type: str, path: str, structs: dict, aliases: dict) -> list[str]:
    """How ``value`` does not decode into ``go_type``: unknown keys (Go drops them silently), wrong kinds."""
    go_type = go_type.lstrip("*")
    if go_type.startswith("[]"):
        if not isinstance(value, list):
            return [f"{path}: must be a list ({go_type})"]
        return [
            e
            for i, item in enumerate(value)
            for e in go_type_errors(item, go_type[2:], f"{path}[{i}]", structs, aliases)
        ]
    if go_type == "map[string]string":
        ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return [] if ok else [f"{path}: must map strings to strings"]
    name = go_type.rpartition(".")[2] if go_type.startswith("common.") else go_type
    if name in structs:
        if not isinstance(value, dict):
            return [f"{path}: must be an object ({name})"]
        errors = [
            f"{path}.{k}: not a field of {name} (Katib would drop it); fields: {sorted(structs[name])}"
            for k in value
            if k not in structs[name]
        ]
        return errors + [
            e
            for k, v in value.items()
            if k in structs[name]
            for e in go_type_errors(v, structs[name][k], f"{path}.{k}", structs, aliases)
        ]
    kind = aliases.get(name) or _SCALARS.get(name)
    if kind is None:
        return []  # a Kubernetes type (metav1, v1, unstructured): not Katib's to define
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        return [f"{path}: must be {name}, got {value!r}"]
    return []


def experiment_type_errors(exp: dict) -> list[str]:
    structs, aliases = _go_types()
    unknown = [
        f"{k}: not a field of Experiment" for k in exp if k not in ("apiVersion", "kind", "metadata", "spec", "status")
    ]
    return (
        unknown
        + go_type_errors(exp.get("spec", {}), "ExperimentSpec", "spec", structs, aliases)
        + (go_type_errors(exp["status"], "ExperimentStatus", "status", structs, aliases) if "status" in exp else [])
    )


# -- Katib's admission webhook (katib/validator.go), ported ---------------------------------------------------

# The suggestion algorithms in Katib's default katib-config (GetSuggestionConfigData fails for any other name).
KATIB_CONFIG_ALGORITHMS = {
    "random",
    "tpe",
    "grid",
    "hyperband",
    "bayesianoptimization",
    "cmaes",
    "sobol",
    "multivariate-tpe",
    "enas",
    "darts",
    "pbt",
}
PARAM_REPLACE = "${{trialParameters.{}}}"  # consts.TrialTemplateParamReplaceFormat
PARAM_REPLACE_REGEX = re.compile(r"\$\{trialParameters\..+?\}")  # consts.TrialTemplateParamReplaceFormatRegex
META_REPLACE_REGEX = re.compile(r"\$\{trialSpec\.(.+?)\}")  # consts.TrialTemplateMetaReplaceFormatRegex
META_PARSE_REGEX = re.compile(r"(.+)\[(.+)]")  # consts.TrialTemplateMetaParseFormatRegex
META_KEYS = ("Name", "Namespace", "Kind", "APIVersion", "Annotations", "Labels")  # consts.TrialTemplateMetaKeys


def _is_meta_key(reference: str) -> bool:  # isMetaKey
    match = META_REPLACE_REGEX.search(reference)
    if not match:
        return False
    sub = META_PARSE_REGEX.search(match.group(1))
    return match.group(1) in META_KEYS or bool(sub and sub.group(1) in META_KEYS)


def _trial_template_string(exp: dict) -> str:  # manifest.Generator.GetTrialTemplate: json.Marshal(trialSpec)
    return json.dumps(exp["spec"]["trialTemplate"]["trialSpec"], sort_keys=True, separators=(",", ":"))


def katib_webhook_errors(exp: dict) -> list[str]:
    """validator.go ``ValidateExperiment`` for a new Experiment (oldInst nil), after no defaulting."""
    errors = []
    spec, name = exp["spec"], exp["metadata"]["name"]
    # Go's MatchString finds the pattern anywhere: anchored only at the start, as in Katib.
    if not re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 40:
        errors.append("metadata.name: lower case alphanumeric or '-', at most 40 characters")
    max_trials, parallel, max_failed = (
        spec.get(k) for k in ("maxTrialCount", "parallelTrialCount", "maxFailedTrialCount")
    )
    if max_failed is not None and max_failed < 0:
        errors.append("spec.maxFailedTrialCount: should not be less than 0")
    if max_trials is not None and max_trials <= 0:
        errors.append("spec.maxTrialCount: must be greater than 0")
    if parallel is not None and parallel <= 0:
        errors.append("spec.parallelTrialCount: must be greater than 0")
    if max_failed is not None and max_trials is not None and max_failed > max_trials:
        errors.append("spec.maxFailedTrialCount: should be less than or equal to spec.maxTrialCount")
    if parallel is not None and max_trials is not None and parallel > max_trials:
        errors.append("spec.parallelTrialCount: should be less than or equal to spec.maxTrialCount")
    objective = spec.get("objective")  # validateObjective
    if objective is None:
        return errors + ["spec.objective: must be specified"]
    if objective.get("type") not in ("minimize", "maximize"):
        errors.append("spec.objective.type: must be minimize or maximize")
    if not objective.get("objectiveMetricName"):
        errors.append("spec.objective.objectiveMetricName: must be specified")
    if objective.get("objectiveMetricName") in (objective.get("additionalMetricNames") or []):
        errors.append("spec.objective.additionalMetricNames: should not contain the objective")
    algorithm = spec.get("algorithm")  # validateAlgorithm
    if algorithm is None:
        errors.append("spec.algorithm: must be specified")
    elif algorithm.get("algorithmName") not in KATIB_CONFIG_ALGORITHMS:
        errors.append(f"spec.algorithm.algorithmName: no Suggestion config for {algorithm.get('algorithmName')!r}")
    if "earlyStopping" in spec:
        errors.append("spec.earlyStopping: not expected here")  # validateEarlyStopping: none configured
    if spec.get("resumePolicy", "") not in ("", "Never", "LongRunning", "FromVolume"):  # validateResumePolicy
        errors.append("spec.resumePolicy: invalid ResumePolicyType")
    errors += _trial_template_errors(exp)
    parameters = spec.get("parameters") or []
    if not parameters and "nasConfig" not in spec:
        errors.append("spec: spec.parameters or spec.nasConfig must be specified")
    for i, p in enumerate(parameters):  # validateParameters
        where, space = f"spec.parameters[{i}]", p.get("feasibleSpace") or {}
        if p.get("parameterType") not in ("int", "double", "categorical", "discrete", "unknown"):
            errors.append(f"{where}.parameterType: not supported")
        if space.get("distribution", "") not in ("", "uniform", "logUniform", "normal", "logNormal", "unknown"):
            errors.append(f"{where}.feasibleSpace.distribution: not supported")
        if not space:
            errors.append(f"{where}.feasibleSpace: must be specified")
        elif p.get("parameterType") in ("double", "int"):
            if space.get("list"):
                errors.append(f"{where}.feasibleSpace.list: not supported for {p['parameterType']}")
            if not space.get("max") or not space.get("min"):
                errors.append(f"{where}.feasibleSpace.max: max and min must be specified")
        elif space.get("max") or space.get("min") or space.get("step"):
            errors.append(f"{where}.feasibleSpace: max, min and step are not supported for {p['parameterType']}")
    collector = spec.get("metricsCollectorSpec") or {}  # validateMetricsCollector
    if (collector.get("collector") or {}).get("kind") not in ("StdOut", "Push"):
        errors.append("spec.metricsCollectorSpec.collector.kind: expected StdOut here")
    for fmt in ((collector.get("source") or {}).get("filter") or {}).get("metricsFormat") or []:
        try:
            re.compile(fmt)
        except re.error as exc:
            errors.append(f"spec.metricsCollectorSpec.source.filter.metricsFormat: invalid filter: {exc}")
            continue
        if not re.match(r".*\(.*\).*\(.*\).*", fmt):
            errors.append("spec.metricsCollectorSpec.source.filter.metricsFormat: two top subexpressions are required")
    return errors


def _trial_template_errors(exp: dict) -> list[str]:  # validateTrialTemplate
    template, errors = exp["spec"].get("trialTemplate"), []
    if template is None:
        return ["spec.trialTemplate: must be specified"]
    if not template.get("primaryContainerName"):
        errors.append("spec.trialTemplate.primaryContainerName: must be specified")
    if not template.get("successCondition") or not template.get("failureCondition"):
        errors.append("spec.trialTemplate: successCondition and failureCondition must be specified")
    if template.get("trialParameters") is None:
        return errors + ["spec.trialTemplate.trialParameters: must be specified"]
    if ("trialSpec" in template) == ("configMap" in template):
        return errors + ["spec.trialTemplate: exactly one of trialSpec and configMap"]
    text = _trial_template_string(exp)
    parameter_names = {p["name"] for p in exp["spec"].get("parameters") or []}
    names, refs = set(), set()
    for i, p in enumerate(template["trialParameters"]):
        where = f"spec.trialTemplate.trialParameters[{i}]"
        if not p.get("name") or not p.get("reference") or "{" in p["name"] or "}" in p["name"]:
            errors.append(f"{where}: name and reference must be specified, name without braces")
            continue
        if p["name"] in names or p["reference"] in refs:
            errors.append(f"{where}: duplicated name or reference")
            continue
        names.add(p["name"])
        refs.add(p["reference"])
        if parameter_names and not _is_meta_key(p["reference"]) and p["reference"] not in parameter_names:
            errors.append(f"{where}.reference: {p['reference']} does not exist in spec.parameters")
        placeholder = PARAM_REPLACE.format(p["name"])
        if placeholder not in text:
            return errors + [f"{where}.name: {p['name']} not found in spec.trialTemplate"]
        text = text.replace(placeholder, "test-value")
    if left := PARAM_REPLACE_REGEX.findall(text):
        errors.append(f"spec.trialTemplate: parameters {left} not found in spec.trialParameters")
    run_spec = json.loads(text)  # util.ConvertStringToUnstructured
    metadata = run_spec.get("metadata") or {}
    if metadata.get("name") or metadata.get("namespace"):
        errors.append("spec.trialTemplate: metadata.name and metadata.namespace must be omitted")
    if not run_spec.get("apiVersion") or not run_spec.get("kind"):
        errors.append("spec.trialTemplate: APIVersion and Kind must be specified")
    return errors  # validateTrialJob checks batch/v1 Jobs only


def katib_trial_job(exp: dict, trial_name: str, assignments: dict[str, str]) -> dict:
    """The job Katib creates for one trial: manifest/generator.go ``applyParameters`` on the template string,
    then the trial controller's name and namespace (the trial's)."""
    text = json.dumps(exp["spec"]["trialTemplate"]["trialSpec"])
    spec = exp["spec"]["trialTemplate"]["trialSpec"]
    values = {}
    for p in exp["spec"]["trialTemplate"]["trialParameters"]:
        meta = META_REPLACE_REGEX.search(p["reference"])
        if not meta:
            values[p["name"]] = assignments[p["reference"]]
        else:
            values[p["name"]] = {
                "Name": trial_name,
                "Namespace": exp["metadata"]["namespace"],
                "Kind": spec["kind"],
                "APIVersion": spec["apiVersion"],
            }[meta.group(1)]
    assert len(assignments) == len(exp["spec"]["parameters"])  # errParamNotFoundInTrialParameters
    for name, value in values.items():
        text = text.replace(PARAM_REPLACE.format(name), value)
    job = json.loads(text)
    job["metadata"] = {**job.get("metadata", {}), "name": trial_name, "namespace": exp["metadata"]["namespace"]}
    return job


def trial_name(exp: dict) -> str:
    return f"{exp['metadata']['name']}-x7k2p9qd"  # suggestionclient.go: <experiment>-<8 random characters>
