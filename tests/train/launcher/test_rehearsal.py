"""The rehearsal: the job the train step renders, run as the cluster runs it (tests/rehearsal/__init__.py).

    pytest -m slow tests/test_rehearsal.py     # as root, with util-linux unshare; 2 minutes idle, 5 loaded

The KFP train step's own function creates a 2-node PyTorchJob (or TrainJob) on a fake API server; a fake
Training Operator and kubelet run each pod's container exactly as rendered (argv, env, the operator's
injected rendezvous env) as local processes in their own mount namespaces (the claims at /mnt/data and
/mnt/models, the launcher's install hidden), from a "trainer image" virtualenv where the package is installed
from a wheel; the base model is named by Hub id and found in a pre-populated offline HF cache on the data
claim. 1 process per pod, gloo, DeepSpeed ZeRO-3 on CPU. Scenarios share one image and one uninterrupted run.

Skipped (with the reason) where it cannot run: not root, no ``unshare``, or namespaces refused. With
``CI=true`` those are failures instead: CI must run it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.paths import DATA_MOUNT, MODEL_MOUNT
from tests.rehearsal.cluster import orphan_guard

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
RUN_ID = "9c1f4e2a-5b7d-4c3e-8f1a-2d6b0e9a7c35"
MAX_STEPS, SAVE_STEPS = 10, 5  # the worker is evicted after checkpoint-5 and the re-run resumes there
# The re-run restores weights, optimizer, scheduler, RNG and data position from checkpoint-5: only float
# rounding could separate it from the uninterrupted run (measured here: identical to the last digit).
LOSS_RTOL = 1e-4
SCENARIO_TIMEOUT_SECONDS = 480  # inside the scenario; the subprocess gets a minute more
TAIL_LINES = 40


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the rehearsal needs root (mount namespaces and bind mounts at /mnt/data, /mnt/models, /etc/hosts)"
    if shutil.which("unshare") is None:
        return "the rehearsal needs util-linux `unshare`"
    probe = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--uts", "--propagation", "private", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"`unshare` cannot create mount/PID/UTS namespaces here: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def machine():
    why = _unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the rehearsal: {why}")
        pytest.skip(why)


@pytest.fixture(scope="session")
def trainer_image(machine, tmp_path_factory):
    from tests.rehearsal import image

    return image.build(ROOT, tmp_path_factory.mktemp("trainer-image"))


@pytest.fixture(scope="session")
def fixtures(machine, tmp_path_factory) -> Path:
    """The base model (becomes the Hub repo) and the prepared dataset (goes on the data claim)."""
    from tests.helpers.trainer import make_workdir

    return make_workdir(tmp_path_factory.mktemp("rehearsal-fixtures"))


def _read_raw(path: Path) -> str:
    """A log file as written: only "\\n" ends a line ("\\r" inside one, a redrawn progress bar, is kept)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        return f.read()


@dataclass
class Rehearsal:
    """One scenario's result JSON, the launcher's output and where its files are."""

    name: str
    result: dict
    output: str
    workdir: Path

    @property
    def succeeded(self) -> bool:
        return self.result.get("outcome") == "succeeded"

    def pod_logs(self) -> list[tuple[dict, list[str]]]:
        """(pod, its log lines as the kubelet stored them: split on newlines only) in the order pods started."""
        logs = []
        pods = self.result.get("pods") or [  # no result (the scenario died): whatever pods left behind
            {
                "name": p.name.rsplit("-", 1)[0],
                "uid": p.name.rsplit("-", 1)[1],
                "role": "?",
                "exit_code": None,
                "evicted": False,
                "log": str(p / "log"),
            }
            for p in sorted((self.workdir / "pods").glob("*"))
        ]
        for pod in pods:
            path = Path(pod["log"])
            text = _read_raw(path) if path.exists() else ""
            logs.append((pod, text.split("\n")[:-1]))
        return logs

    def printed(self, pod_name: str) -> list[str]:
        """What the launcher printed as ``pod_name``'s log."""
        prefix = f"[{pod_name}] "
        return [line[len(prefix) :] for line in self.output.split("\n") if line.startswith(prefix)]

    def report(self) -> str:
        """The launcher's output and every pod's log, the ends that explain a failure."""
        parts = [
            f"--- rehearsal {self.name}: {self.result.get('outcome')} "
            f"({self.result.get('elapsed_seconds')}s), files in {self.workdir}"
        ]
        if self.result.get("error"):
            parts.append(f"error: {self.result['error']}")
        if self.result.get("cluster_error"):
            parts.append(f"fake cluster crashed:\n{self.result['cluster_error']}")
        parts.append("--- cluster events:\n" + "\n".join(self.result.get("cluster_events", [])))
        parts.append(f"--- launcher output (last {TAIL_LINES} lines):\n" + _tail(self.output.split("\n"), TAIL_LINES))
        for pod, lines in self.pod_logs():
            parts.append(
                f"--- pod {pod['name']} (uid {pod['uid'][:8]}, exit {pod['exit_code']}"
                f"{', evicted' if pod['evicted'] else ''}) log, last {TAIL_LINES} lines "
                "(dependency warnings left out):\n" + _tail(lines, TAIL_LINES)
            )
        return "\n".join(parts)


_DEPENDENCY_WARNING = re.compile(r"site-packages/\S+:\d+: \w*Warning: ")


def _tail(lines: list[str], n: int) -> str:
    """The last ``n`` lines, less the dependencies' warnings (repeated every step) and the source line each
    quotes; of a progress bar redrawn with carriage returns, its last frame."""
    kept, quoted = [], False
    for line in lines:
        if quoted and line.startswith("  "):
            quoted = False
            continue
        quoted = bool(_DEPENDENCY_WARNING.search(line))
        if not quoted:
            kept.append(line.rsplit("\r", 1)[-1])
    return "\n".join(kept[-n:])


def run_scenario(
    name: str,
    backend: str,
    trainer_image,
    fixtures: Path,
    workdir: Path,
    *,
    evict: bool = False,
    graceful: bool = False,
) -> Rehearsal:
    """Run one scenario in a private mount namespace (tests/rehearsal/scenario.py) and read what it reports."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "name": name,
        "backend": backend,
        "run_id": RUN_ID,
        "workdir": str(workdir),
        "fixtures": str(fixtures),
        "repo": str(ROOT),
        "max_steps": MAX_STEPS,
        "save_steps": SAVE_STEPS,
        "timeout_seconds": SCENARIO_TIMEOUT_SECONDS,
        "evict_worker_after_first_checkpoint": evict,
        "graceful_eviction": graceful,
        "result": str(workdir / "result.json"),
        "image": {
            "venv": str(trainer_image.venv),
            "site_packages": str(trainer_image.site_packages),
            "wheel": str(trainer_image.wheel),
            "deps": list(trainer_image.deps),
        },
    }
    (workdir / "scenario.json").write_text(json.dumps(config, indent=2))
    cmd = [
        *orphan_guard(),
        "unshare",
        "--mount",
        "--propagation",
        "private",
        sys.executable,
        "-m",
        "tests.rehearsal.scenario",
        str(workdir / "scenario.json"),
    ]
    started = time.monotonic()
    with open(workdir / "launcher.log", "w") as out:
        try:
            code = subprocess.run(
                cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=SCENARIO_TIMEOUT_SECONDS + 60
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    output = _read_raw(workdir / "launcher.log")
    result_path = workdir / "result.json"
    result = (
        json.loads(result_path.read_text())
        if result_path.exists()
        else {"outcome": "harness", "error": f"the scenario process exited {code} without a result"}
    )
    print(f"rehearsal {name}: {result.get('outcome')} in {time.monotonic() - started:.0f}s (files in {workdir})")
    return Rehearsal(name, result, output, workdir)


@pytest.fixture(scope="session")
def uninterrupted(trainer_image, fixtures, tmp_path_factory) -> Rehearsal:
    """Scenario 1: the PyTorchJob (1 Master + 1 Worker) from start to export, nothing in the way."""
    return run_scenario(
        "pytorchjob", "pytorchjob", trainer_image, fixtures, tmp_path_factory.mktemp("rehearsal-pytorchjob")
    )


# -- what every successful run must show ----------------------------------------------------------------------


def config_paths_outside_the_volumes(config: dict) -> list[str]:
    """Settings whose value is a path the pods cannot have: not on the data or model volume."""
    bad = []

    def walk(key, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}.{k}" if key else k, v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(f"{key}[{i}]", v)
        elif (
            isinstance(value, str)
            and value.startswith("/")
            and not any(value == m or value.startswith(m + "/") for m in (DATA_MOUNT, MODEL_MOUNT))
        ):
            bad.append(f"{key}={value!r}")

    walk("", config)
    return bad


def trained_and_exported(r: Rehearsal, base: Path) -> list[str]:
    """Problems with a run that should have trained MAX_STEPS steps on 2 ranks and exported final/."""
    if not r.succeeded:
        return [f"the train step did not succeed: {r.result.get('error')}"]
    problems = []
    metrics = r.result.get("metrics") or {}
    if metrics.get("global_step") != MAX_STEPS or metrics.get("world_size") != 2:
        problems.append(
            f"metrics.json: global_step {metrics.get('global_step')} (want {MAX_STEPS}), "
            f"world_size {metrics.get('world_size')} (want 2)"
        )
    if r.result["outputs"]["model_uri"] != f"pvc://llm-models/runs/{RUN_ID}/train/final":
        problems.append(f"model_uri {r.result['outputs']['model_uri']!r}")
    missing = {"config.json", "model.safetensors", "tokenizer.json", "model.json"} - set(r.result["final_files"])
    if missing:
        problems.append(f"final/ lacks {sorted(missing)} (has {r.result['final_files']})")
        return problems
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(r.result["final_dir"])
    if final.num_parameters() != AutoModelForCausalLM.from_pretrained(str(base)).num_parameters():
        problems.append("final/ does not hold the whole model (ZeRO-3 shards not gathered?)")
    card = r.result.get("model_card") or {}
    if card.get("base_model") != "rehearsal-org/tiny-qwen3" or card.get("steps") != MAX_STEPS:
        problems.append(f"final/model.json: base_model {card.get('base_model')!r}, steps {card.get('steps')}")
    return problems


# -- the tests --------------------------------------------------------------------------------------------------


def test_trainer_image_is_a_regular_install_of_the_wheel(trainer_image):
    """The image's package is the wheel's, installed as pip installs it in the Dockerfile: no editable hooks."""
    site = trainer_image.site_packages
    assert (site / "components" / "train" / "trainer" / "__main__.py").exists()
    assert list(site.glob("kubeflow_llm_post_training-*.dist-info"))
    assert not list(site.glob("__editable__*")), "the image must not carry an editable install"
    # Package data the pods read at run time came with the wheel.
    assert (site / "components" / "train" / "deepspeed" / "zero3.json").exists()
    assert (site / "components" / "models" / "qwen3_chat_template.jinja").exists()
    assert (site / "components" / "models" / "architectures" / "qwen3-30b-a3b.json").exists()


def test_pods_import_the_image_and_see_only_the_volumes(uninterrupted, trainer_image):
    """What the launcher hands the pods must hold inside the trainer image (DESIGN.md, Principles)."""
    r = uninterrupted
    problems = []
    config = r.result.get("trainer_config")
    if config is None:
        problems.append("the train step wrote no trainer config")
    else:
        bad = config_paths_outside_the_volumes(config)
        if bad:
            problems.append(
                f"trainer config names paths the pods do not have (only {DATA_MOUNT}/..., "
                f"{MODEL_MOUNT}/... or setting names hold in the trainer image): {', '.join(bad)}"
            )
    probe = r.result.get("probe") or {}
    site = str(trainer_image.site_packages)
    if not str(probe.get("components") or "").startswith(site + "/"):
        problems.append(
            f"a pod imports components from {probe.get('components')!r} (error {probe.get('error')}), "
            f"not from the trainer image's {site}"
        )
    if probe.get("repo_visible") is not False:
        problems.append(f"the launcher's install ({ROOT}) is visible inside the pods")
    if sorted(probe.get("mnt") or []) != ["data", "models"]:
        problems.append(f"/mnt in a pod holds {probe.get('mnt')}, not the two claims")
    assert not problems, "\n".join(problems) + "\n\n" + r.report()


def test_pytorchjob_trains_and_exports_the_model(uninterrupted, fixtures):
    """Scenario 1: the launcher returns Succeeded, metrics.json has every step, final/ loads."""
    r = uninterrupted
    problems = trained_and_exported(r, fixtures / "base")
    if r.succeeded and r.result["creates"] != 1:
        problems.append(f"the job was created {r.result['creates']} times (want once)")
    assert not problems, "\n".join(problems) + "\n\n" + r.report()


def test_launcher_streams_every_pod_log_line_once(uninterrupted):
    """Every line a pod logged is printed once, in order, prefixed with the pod; rank 0's log completely."""
    r = uninterrupted
    problems = []
    for pod, lines in r.pod_logs():
        printed = r.printed(pod["name"])
        at = 0
        for n, line in enumerate(printed):  # printed must be an in-order subsequence of the log
            while at < len(lines) and lines[at] != line:
                at += 1
            if at == len(lines):
                problems.append(
                    f"{pod['name']}: printed line {n + 1} of {len(printed)} is not the pod's next log "
                    f"line (a duplicate or a fragment): {line[:200]!r}"
                )
                break
            at += 1
        if pod["role"] == "master" and r.succeeded and lines and printed[-len(lines) :] != lines:
            problems.append(
                f"{pod['name']}: {len(lines)} log lines, the launcher printed {len(printed)}; "
                "the end of rank 0's log is not printed as logged"
            )
    assert not problems, "\n".join(problems) + "\n\n" + r.report()


def test_evicted_worker_reruns_the_job_which_resumes_to_the_same_result(
    trainer_image, fixtures, uninterrupted, tmp_path_factory
):
    """Scenario 2: the kubelet evicts the Worker right after checkpoint-5 is complete; the operator fails the
    job; the launcher deletes and re-creates it; the new pods resume from checkpoint-5 and end at the same
    step and loss as the uninterrupted run."""
    r = run_scenario(
        "pytorchjob-evicted",
        "pytorchjob",
        trainer_image,
        fixtures,
        tmp_path_factory.mktemp("rehearsal-evicted"),
        evict=True,
    )
    problems = []
    evictions = r.result.get("evictions") or []
    if not r.succeeded:
        problems.append(
            f"the train step did not succeed{' after the eviction' if evictions else ''}: {r.result.get('error')}"
        )
    if not evictions:
        problems.append("the Worker was never evicted: no checkpoint was completed while it ran (see the pods' logs)")
    elif evictions[0]["checkpoints"] != [f"checkpoint-{SAVE_STEPS}"]:
        problems.append(f"the eviction came late: checkpoints then were {evictions[0]['checkpoints']}")
    if r.succeeded:
        problems += trained_and_exported(r, fixtures / "base")
        if r.result["creates"] != 2:
            problems.append(f"the job was created {r.result['creates']} times (want 2: the run and one re-run)")
        resumed = re.search(rf"resuming from {MODEL_MOUNT}/runs/{RUN_ID}/train/checkpoint-(\d+)", r.output)
        if resumed is None:
            problems.append("no 'resuming from .../checkpoint-N' in the launcher's output: the re-run started over")
        elif int(resumed.group(1)) != SAVE_STEPS:
            problems.append(f"the re-run resumed from checkpoint-{resumed.group(1)}, not checkpoint-{SAVE_STEPS}")
        a, b = uninterrupted.result.get("metrics"), r.result.get("metrics") or {}
        if not a:
            problems.append(f"no uninterrupted run to compare with (scenario 1: {uninterrupted.result.get('error')})")
        else:
            for key in ("final_train_loss", "eval_loss"):
                if b.get(key) != pytest.approx(a[key], rel=LOSS_RTOL):
                    problems.append(
                        f"{key} {b.get(key)} after the resume, {a[key]} uninterrupted "
                        f"(tolerance {LOSS_RTOL:g} relative)"
                    )
    assert not problems, "\n".join(problems) + "\n\n" + r.report()


def test_softly_evicted_worker_saves_on_sigterm_and_the_re_run_resumes_from_that_checkpoint(
    trainer_image, fixtures, uninterrupted, tmp_path_factory
):
    """Scenario 2b: a soft eviction right after checkpoint-5: SIGTERM to the Worker's torchrun, which forwards it
    to its rank; both ranks agree to save at the next step end and stop; the launcher sees an evicted pod and
    re-runs the job, which resumes from that SIGTERM checkpoint (after step 5) and ends as the uninterrupted run."""
    r = run_scenario(
        "pytorchjob-soft-evicted",
        "pytorchjob",
        trainer_image,
        fixtures,
        tmp_path_factory.mktemp("rehearsal-soft-evicted"),
        evict=True,
        graceful=True,
    )
    problems = []
    if not r.succeeded:
        problems.append(f"the train step did not succeed: {r.result.get('error')}")
    else:
        problems += trained_and_exported(r, fixtures / "base")
        if r.result["creates"] != 2:
            problems.append(f"the job was created {r.result['creates']} times (want 2: the run and one re-run)")
        # Why the launcher re-ran the job. Either pod may end first: the Worker, evicted (its status says so), or the
        # Master, whose rank stopped with the Worker's at the agreed step (exit 143 in torchrun's report). Rank 0's own
        # "stopped by SIGTERM at step" line is not asked for: the operator deletes the Master's pod when the Worker's
        # failure fails the job, sometimes before the launcher has read its last lines.
        rerun = re.search(r"re-running .*: (pod \S+ was (Evicted|stopped by SIGTERM)[^\n]*)", r.output)
        if rerun is None:
            problems.append("the launcher's re-run line does not name the eviction or the SIGTERM stop")
        resumed = re.search(rf"resuming from {MODEL_MOUNT}/runs/{RUN_ID}/train/checkpoint-(\d+)", r.output)
        if resumed is None or not SAVE_STEPS < int(resumed.group(1)) < MAX_STEPS:
            problems.append(
                f"the re-run did not resume from a SIGTERM checkpoint after step {SAVE_STEPS}: "
                f"{resumed.group(0) if resumed else 'no resuming line'}"
            )
        # eval_loss only: the last logged train loss averages the steps since the resume, not since step 5.
        a, b = uninterrupted.result.get("metrics") or {}, r.result.get("metrics") or {}
        if a and b.get("eval_loss") != pytest.approx(a["eval_loss"], rel=LOSS_RTOL):
            problems.append(
                f"eval_loss {b.get('eval_loss')} after the resume, {a['eval_loss']} uninterrupted "
                f"(tolerance {LOSS_RTOL:g} relative): the resumed job did not see the same rows"
            )
    assert not problems, "\n".join(problems) + "\n\n" + r.report()


def test_trainjob_trains_and_exports_the_model(trainer_image, fixtures, tmp_path_factory):
    """Scenario 3: the TrainJob (Trainer v2, torch-distributed runtime) the train step renders, run the same way."""
    r = run_scenario("trainjob", "trainjob", trainer_image, fixtures, tmp_path_factory.mktemp("rehearsal-trainjob"))
    problems = trained_and_exported(r, fixtures / "base")
    if r.succeeded and r.result["creates"] != 1:
        problems.append(f"the job was created {r.result['creates']} times (want once)")
    assert not problems, "\n".join(problems) + "\n\n" + r.report()
