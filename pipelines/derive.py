"""What ``python -m pipelines.compile`` derives from the settings model (components/settings/), besides the
compiled YAML: the source of the ``validate_inputs`` component and the settings table in docs/settings.md.

A lightweight KFP component is its function's source text, so the component that receives the pipeline's
parameters one by one must spell them out: it is written here from the model, never by hand.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALIDATE_COMPONENT = ROOT / "components" / "validate" / "component.py"
SETTINGS_DOC = ROOT / "docs" / "settings.md"
TABLE_BEGIN = "<!-- settings table: written by python -m pipelines.compile from components/settings/ -->"
TABLE_END = "<!-- end of settings table -->"

_HEADER = '''\
"""validate_inputs: the pipeline's first task. Fails the run with one clear message before any GPU is requested.

Written by ``python -m pipelines.compile`` from the settings model (components/settings/): edit the model, not
this file. Its inputs are the pipeline's parameters (the plain settings and ``advanced_settings``); its output is
every setting, resolved and checked: the ``settings`` input of every later step.
"""

from typing import NamedTuple

from kfp import dsl

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def validate_inputs(
'''

_BODY = '''
    Returns:
        settings: every setting by name, resolved (defaults filled in, advanced_settings merged) and checked.
    """
    arguments = dict(locals())  # every argument, taken before anything else binds a local name
    from components.validate.checks import validate

    return validate(arguments)
'''

_DOC = '''    """Check the run's settings and the cluster, and fail with every problem listed, each naming the fix.

    The checks also run in ``python -m pipelines.run`` before a run is submitted; this task repeats them because
    runs started from the KFP UI or a schedule never pass through the CLI. On a cluster (``train_backend`` other
    than ``local``) it then runs the preflight: the job and InferenceService APIs are installed, both claims
    exist, are Bound and ReadWriteMany, the token Secret has its key, the runner's service account may do what
    the steps do, and enough GPU nodes match the node selector. All of it before any GPU is requested.

    Args:
'''


def pipeline_parameters() -> list[tuple[str, type, object, str]]:
    """``(name, type, default, help)`` of every pipeline parameter: the plain settings, then advanced_settings."""
    from components.settings import ADVANCED, specs

    plain = [(s.name, s.type, s.default, s.help) for s in specs().values() if s.plain]
    advanced = ", ".join(s.name for s in specs().values() if not s.plain)
    return plain + [
        (
            ADVANCED,
            dict,
            {},
            'Any other setting by name, as a JSON object, e.g. {"lora_r": 32}: '
            f"{advanced}. python -m pipelines.run --help describes each.",
        )
    ]


def _wrap(name: str, text: str, indent: int) -> str:
    pad = " " * indent
    return textwrap.fill(f"{name}: {text}", width=116, initial_indent=pad, subsequent_indent=pad + "    ") + "\n"


def pipeline_docstring(description: str) -> str:
    """The pipeline function's docstring: KFP shows each Args entry beside its parameter in the UI."""
    return description + "\n\nArgs:\n" + "".join(_wrap(n, h, 4) for n, _, _, h in pipeline_parameters())


def validate_component_source() -> str:
    """The source of components/validate/component.py: one parameter per pipeline parameter, one output."""
    params = pipeline_parameters()
    signature = "".join(f"    {name}: {kind.__name__},\n" for name, kind, _, _ in params)
    args = "".join(_wrap(name, text, 8) for name, _, _, text in params)
    return _HEADER + signature + ') -> NamedTuple("ValidateOutputs", [("settings", dict)]):\n' + _DOC + args + _BODY


def settings_table() -> str:
    """docs/settings.md's table of every setting: name, step, default, whether it is a parameter of its own, help."""
    from components.settings import ADVANCED, specs

    rows = ["| setting | step | default | help |", "|---|---|---|---|"]
    for s in specs().values():
        default = json.dumps(s.default) if isinstance(s.default, (dict, list, str)) else str(s.default)
        where = s.group if s.plain else f"{s.group} (in `{ADVANCED}`)"
        rows.append(f"| `{s.name}` | {where} | `{default}` | {s.help.replace('|', '/')} |")
    return "\n".join([TABLE_BEGIN, *rows, TABLE_END])


def with_settings_table(page: str) -> str:
    """``page`` (docs/settings.md's text) with its settings table replaced by the current one."""
    head, sep, rest = page.partition(TABLE_BEGIN)
    if not sep:
        raise ValueError(f"docs/settings.md lacks the line {TABLE_BEGIN!r} where the settings table goes")
    _, sep, tail = rest.partition(TABLE_END)
    if not sep:
        raise ValueError(f"docs/settings.md lacks the line {TABLE_END!r} after the settings table")
    return head + settings_table() + tail


def derived_files() -> dict[Path, str]:
    """Every file derived from the settings model, with the text it must have."""
    return {
        VALIDATE_COMPONENT: validate_component_source(),
        SETTINGS_DOC: with_settings_table(SETTINGS_DOC.read_text()),
    }
