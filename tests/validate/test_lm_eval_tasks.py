"""lm_eval_tasks checked before training: names lm-evaluation-harness's registry does not know are one error with the
closest names (where the harness is installed: the components image, a machine with the eval extra); a local run
without the harness is one error naming the install, since its evaluation would fail after training."""

import sys
import textwrap

import pytest

from components.validate.rules import check
from pipelines import params as P

# lm-eval 0.4.13's registry as validation reads it: TaskManager().all_tasks (tasks, groups and tags, sorted) and
# match_tasks, fnmatch over them (lm_eval/tasks/manager.py TaskManager.all_tasks / match_tasks, lm_eval/utils.py
# pattern_match). The dev extra leaves lm-eval out (it pulls in much), so the test installs this stand-in.
FAKE_TASKS = textwrap.dedent(
    """
    import fnmatch

    class TaskManager:
        def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None):
            self._all_tasks = sorted(["ai2_arc", "arc_challenge", "arc_easy", "hellaswag", "kmmlu", "mmlu"])

        @property
        def all_tasks(self):
            return self._all_tasks

        def match_tasks(self, task_list):
            return sorted({m for p in task_list for m in fnmatch.filter(self._all_tasks, p)})
    """
)


@pytest.fixture
def harness(tmp_path, monkeypatch):
    package = tmp_path / "site" / "lm_eval"
    (package / "tasks").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tasks" / "__init__.py").write_text(FAKE_TASKS)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield
    # what the test imported goes with it: a later test must not find the stand-in as the installed harness
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        del sys.modules[name]


def local(**over) -> dict:
    return {**P.resolve("local-tiny"), **over}


def cluster(**over) -> dict:
    return {**P.resolve("qwen3-30b-a3b-full"), **over}


def test_a_task_the_registry_does_not_know_is_one_error_with_the_closest_names(harness):
    (error,) = check(local(lm_eval_tasks=["arc_easy", "arc_eazy", "helaswag"]))
    assert error.startswith("lm_eval_tasks: ['arc_eazy', 'helaswag'] are not tasks, groups or tags")
    assert "'arc_eazy': arc_easy" in error and "'helaswag': hellaswag" in error


def test_tasks_groups_and_globs_the_registry_knows_pass(harness):
    assert check(local(lm_eval_tasks=["arc_easy", "mmlu", "arc_*"])) == []
    assert check(cluster(lm_eval_tasks=["kmmlu"], eval_gpus=8)) == []


def test_a_local_run_without_the_harness_is_one_error_naming_the_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "lm_eval" else object())
    (error,) = check(local(lm_eval_tasks=["arc_easy"]))
    assert "lm-evaluation-harness is not installed on this machine" in error and "pip install 'lm-eval==" in error
    # a cluster run is checked again by the validate pod, whose image has it (images/components/Dockerfile)
    assert check(cluster(lm_eval_tasks=["arc_easy"], eval_gpus=8)) == []
