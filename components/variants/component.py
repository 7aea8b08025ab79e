"""The variants' KFP steps: the loop's items, each variant's result, and the one comparison after the loop."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def list_variants(settings: dict, run_id: str, tuned: dict) -> list:
    """The items the pipeline's variants loop runs: one per variant (``variants``), or the run itself when it has
    none.

    Args:
        settings: every setting, as validate_inputs resolved and checked them (each variant's too).
        run_id: the KFP run id; a variant's folders and jobs take ``<run id>-<variant name>``.
        tuned: what the hyper-parameter search chose for the sft stage ({} when none ran).

    Returns:
        ``[{"variant", "run_id", "settings", "overrides", "tuned", "stage_1", ...}, ...]``: what each iteration
        reads (components/variants/__init__.py).
    """
    from components.quick_exit import freeze_heap_at_exit
    from components.variants import expand

    freeze_heap_at_exit()
    return expand(settings, run_id, tuned)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def variant_stages(variant: dict) -> NamedTuple(
    "VariantStages", [("stage_1", str), ("stage_2", str), ("stage_3", str), ("stage_4", str), ("stage_5", str)]
):
    """The stage each of the pipeline's stage slots trains for this variant ("" for an unused slot): one output
    per slot, one slot per possible stage (a test holds the count to the settings model's stages).

    Its own step because kfp.local (2.17.0) decides an ``If`` on a loop item's field wrongly (``variant.stage_2 !=
    ""`` ran the slot for an empty stage); on a step's output it decides as KFP does.

    Args:
        variant: the loop's item (list_variants).

    Returns:
        stage_1 ... stage_5: the run's stages, in order, then "".
    """
    from collections import namedtuple

    from components.quick_exit import freeze_heap_at_exit

    freeze_heap_at_exit()
    slots = sorted((k for k in variant if k.startswith("stage_")), key=lambda k: int(k.split("_")[1]))
    return namedtuple("VariantStages", slots)(*(variant[k] for k in slots))


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def variant_result(variant: str, run_id: str, model_path: str, model_uri: str, settings: dict, overrides: dict) -> dict:
    """One variant's outcome for the comparison after the loop (KFP collects these into one list).

    Args:
        variant: the variant's name ("" for a run without variants).
        run_id: the run id its folders and jobs carry.
        model_path, model_uri: its last stage's final model (evaluate_model recorded its result beside it).
        settings: its settings.
        overrides: what it changes from the run's settings.

    Returns:
        The same, as one object.
    """
    from components.quick_exit import freeze_heap_at_exit

    freeze_heap_at_exit()
    return {
        "variant": variant,
        "run_id": run_id,
        "model_path": model_path,
        "model_uri": model_uri,
        "settings": settings,
        "overrides": overrides,
    }


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def compare_variants(
    results: list,
    metrics: Output[Metrics],
    report: Output[Markdown],
) -> NamedTuple(
    "CompareOutputs",
    [("passed", bool), ("reason", str), ("model_path", str), ("model_uri", str), ("settings", dict), ("serve", list)],
):
    """Compare the variants on the run's held-out tokens and pick the one to serve: the lowest held-out loss among
    those that passed their gate (components/variants/compare.py). A run without variants passes its evaluation on.

    Args:
        results: every variant's variant_result.

    Returns:
        metrics: each variant's evaluation metrics as ``<variant>_<metric>``, and the served one's under their own
            names.
        report: the decision, one table of every variant and its base, the training losses in one picture, the
            answers side by side.
        passed: whether a variant passed its gate.
        reason: why, in one line.
        model_path, model_uri, settings: the variant to serve (the first when none passed).
        serve: what the deploy step serves ([] when none passed): the best variant, or with
            ``deploy_variants=all`` each that passed, as ``{"variant", "model_path", "model_uri", "settings",
            "served_model_name", "adapter"}`` (components/variants/compare.py, ``serving_list``).
    """
    from collections import namedtuple

    from components.quick_exit import freeze_heap_at_exit
    from components.variants.compare import compare

    freeze_heap_at_exit()
    outcome = compare(results)
    for name, value in outcome["metrics"].items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(outcome["report"])
    chosen = outcome["chosen"]
    outputs = namedtuple("CompareOutputs", ["passed", "reason", "model_path", "model_uri", "settings", "serve"])
    return outputs(
        outcome["passed"],
        outcome["reason"],
        chosen["model_path"],
        chosen["model_uri"],
        chosen["settings"],
        outcome["serve"],
    )
