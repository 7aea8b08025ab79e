"""Which tests share a pytest-xdist worker, and the order the workers are handed them (tests/conftest.py applies it).

With ``python -m pytest -n 2`` (``--dist loadgroup``, pyproject.toml) a group named by an ``xdist_group`` mark runs on
one worker, one test after another. This relies on xdist suffixing each grouped test's node id with ``@group`` on the
worker, which pytest 9.2 silently undoes (pytest-dev/pytest-xdist#1386: every test is then handed out one by one);
pyproject.toml pins pytest below it and tests/test_worker_groups.py fails where grouping stops working.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

# These modules hold the machine for themselves in ways a test beside them would disturb, so they share the
# "machine" group: they make and count network namespaces and veth pairs (`ip netns list` before and after), run the
# real vLLM engine in a pod's namespace, and measure the bytes crossing a link.
# Run in this order. CI's serving image (vLLM's CPU build) builds beside the first tests (.ci/run): the modules that
# need it come after those that do not, here and in WHOLE_RUNS, so that no worker starts by waiting for it.
ONE_AT_A_TIME = (
    "tests/train/launcher/test_rehearsal.py",
    "tests/train/trainer/test_cross_pod_bytes.py",
    "tests/deploy/test_serving_rehearsal.py",
    "tests/deploy/test_lora_serving_rehearsal.py",
)

# The whole local pipeline runs: the longest single tests (2-5 minutes each on 2 busy cores). The LoRA variants run
# serves on vLLM: last.
WHOLE_RUNS = ("tests/pipelines/test_local_", "tests/deploy/test_local_lora_variants_run.py")


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test reads a fixture built once per module (a trained model, a started server)."""
    fixtures = item._fixtureinfo.name2fixturedefs.values()  # type: ignore[attr-defined]
    return any(defs[-1].scope == "module" for defs in fixtures)


def group_and_order(
    items: list[pytest.Item], one_at_a_time: Iterable[str] = ONE_AT_A_TIME, whole_runs: tuple[str, ...] = WHOLE_RUNS
) -> None:
    """Mark ``one_at_a_time``'s modules with the "machine" group and any other module whose tests read a
    module-scoped fixture with a group of its own, so that one worker builds that fixture once (a plain load split
    hands a module's tests to both workers and each builds it: the GRPO engine server's module, 2 minutes of setup,
    twice). Then sort ``items`` longest first, so that the short tests fill the end of a run on both workers (xdist
    hands out work in this order): the "machine" group, the whole local runs, the rest of the slow tier, the fast
    tier; within the first two, in the order of ``one_at_a_time`` and ``whole_runs``. The sort is stable: each
    module's tests stay in their order."""
    one_at_a_time = tuple(one_at_a_time)

    def start_order(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::")[0]
        if module in one_at_a_time:
            return 0, one_at_a_time.index(module)
        if item.get_closest_marker("slow") is None:
            return 3, 0
        if module.startswith(whole_runs):
            return 1, next(i for i, prefix in enumerate(whole_runs) if module.startswith(prefix))
        return 2, 0

    for item in items:
        module = item.nodeid.split("::")[0]
        if module in one_at_a_time:
            item.add_marker(pytest.mark.xdist_group("machine"))
        elif _uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(module))
    items.sort(key=start_order)
