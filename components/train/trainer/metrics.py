"""Live training metrics for Prometheus, served by each pod's local rank 0 while the trainer runs; the run's record
in Langfuse (settings, checkpoints, final metrics), kept by global rank 0 when Langfuse's keys are set.

    TRAINER_METRICS_PORT=9410 torchrun ... -m components.train.trainer --config FILE
    curl http://<pod>:9410/metrics     # llm_train_step{run_id=...,stage="sft",job_name=...,node_rank="0"} 12.0

What the pod's environment says (components/train/launcher/pods.py sets it from the settings; a local run from
the train step): ``TRAINER_METRICS_PORT`` (the ``metrics_port`` setting; unset or 0: no metrics),
``TRAINER_RUN_ID`` and ``TRAINER_JOB_NAME`` (the series' labels). The node rank is torchrun's ``GROUP_RANK``
(the operators' ``PET_NODE_RANK``), the stage the config's.

Every series carries the labels ``run_id``, ``stage``, ``job_name`` and ``node_rank``. The values are the ones the
progress line shows (callbacks.py): the loss is the mean over every rank, the same number on every pod, so any pod's
series tells the run's state; a pod that stops reporting is the one whose scrape fails. The alert rules and the
dashboard (manifests/monitoring/) read exactly ``METRIC_NAMES``.

The server starts before the model loads (``serve``, called by the entry point, __main__.py) so that a port another
process holds is an error in the first second, not after minutes of loading; the callback (``MetricsCallback``,
attached with the progress output) updates the values.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import time
import typing

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from transformers import TrainerCallback

from components.langfuse_trace import Trace, configured, start_trace

log = logging.getLogger("sft.metrics")

PORT_ENV, RUN_ID_ENV, JOB_NAME_ENV = "TRAINER_METRICS_PORT", "TRAINER_RUN_ID", "TRAINER_JOB_NAME"
# "1" (a local run's trainer: components/train/launcher/local_torchrun.py): a taken port is not an error, a free one is
# served.
ANY_PORT_ENV = "TRAINER_METRICS_ANY_PORT"
LABELS = ("run_id", "stage", "job_name", "node_rank")
PREFIX = "llm_train_"
# name (without PREFIX) -> help: every series the trainer exports (tests hold the dashboard and rules to these).
GAUGES = {
    "info": "1 while this trainer process runs: its labels join DCGM's per-pod GPU series to the run.",
    "step": "Optimizer steps done (global_step).",
    "max_steps": "Optimizer steps the run will take.",
    "loss": "Training loss of the last logging step (mean over every rank); NaN when it was NaN.",
    "loss_nan": "1 when the last logged training loss was NaN or infinite, else 0.",
    "learning_rate": "Learning rate at the last logging step.",
    "tokens_per_second_per_device": "Non-padding tokens per second per GPU over the last logging interval.",
    "mfu": "Model FLOPs utilisation over the last logging interval (0..1; absent without a known GPU peak).",
    "eta_seconds": "Seconds until max_steps at the rate since training began.",
    "last_step_timestamp_seconds": "Unix time of the last optimizer step (training start until the first).",
    "last_checkpoint_timestamp_seconds": "Unix time the last complete checkpoint was saved (0: none yet).",
    "start_timestamp_seconds": "Unix time this trainer process started training (a re-run starts a new one).",
}
# Computed when scraped: the age of the last complete checkpoint.
SINCE_CHECKPOINT = "seconds_since_checkpoint"
METRIC_NAMES = tuple(PREFIX + name for name in (*GAUGES, SINCE_CHECKPOINT))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def node_rank() -> str:
    """This pod's node rank: torchrun's GROUP_RANK, else the operators' PET_NODE_RANK, else 0."""
    return os.environ.get("GROUP_RANK") or os.environ.get("PET_NODE_RANK") or "0"


def metrics_port() -> int:
    """The port in ``TRAINER_METRICS_PORT`` (0: no metrics); ValueError naming the setting for a bad value."""
    raw = os.environ.get(PORT_ENV, "").strip() or "0"
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise ValueError(f"{PORT_ENV}={raw!r} (setting metrics_port) must be a port number 1-65535, or 0 for none")
    return int(raw)


class TrainerMetrics:
    """The trainer's series in their own registry, with this process's labels bound."""

    def __init__(self, stage: str, run_id: str = "", job_name: str = "", rank: str = "0"):
        self.registry = CollectorRegistry()
        self.labels = {"run_id": run_id, "stage": stage, "job_name": job_name, "node_rank": rank}
        self.gauges = {
            name: Gauge(PREFIX + name, text, LABELS, registry=self.registry).labels(**self.labels)
            for name, text in GAUGES.items()
        }
        since = Gauge(
            PREFIX + SINCE_CHECKPOINT,
            "Seconds since the last complete checkpoint was saved (since training began while there is none).",
            LABELS,
            registry=self.registry,
        ).labels(**self.labels)
        since.set_function(self._since_checkpoint)
        self.started = time.time()
        self.last_checkpoint = 0.0
        self.gauges["start_timestamp_seconds"].set(self.started)
        self.gauges["info"].set(1)
        self.server: typing.Any = None  # prometheus_client's WSGIServer once serving
        self.url = ""

    def _since_checkpoint(self) -> float:
        return time.time() - (self.last_checkpoint or self.started)

    def serve(self, port: int, addr: str = "0.0.0.0", any_port: bool = False) -> str:
        """Serve ``/metrics`` on ``port``; returns the URL. RuntimeError naming ``metrics_port`` if it is taken, unless
        ``any_port``: then on a free port, with a warning naming both."""
        try:
            self.server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            if not any_port:
                raise RuntimeError(
                    f"metrics_port {port}: cannot serve the trainer's metrics ({exc.strerror or exc}); another process "
                    f"on this {'pod' if os.environ.get('KUBERNETES_SERVICE_HOST') else 'machine'} holds the port. Set "
                    "metrics_port to a free port, or 0 to turn the trainer's metrics off"
                ) from None
            # Chosen by the process that binds it: a port found free earlier may be taken by now.
            self.server, _thread = start_http_server(0, addr=addr, registry=self.registry)
            log.warning(
                "metrics_port %d is taken on this machine (another local run?): this run's metrics are on port %d",
                port,
                self.server.server_port,
            )
        host = "localhost" if addr in ("0.0.0.0", "") else addr
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            host = socket.gethostname()  # the pod's name: what a reader finds it by
        self.url = f"http://{host}:{self.server.server_port}/metrics"
        return self.url

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


_current: TrainerMetrics | None = None


def serve(cfg) -> TrainerMetrics | None:
    """Start this process's metrics server when ``TRAINER_METRICS_PORT`` names a port and this is local rank 0
    (once per process); None otherwise. Logs the endpoint. RuntimeError (naming ``metrics_port``) if it is taken."""
    global _current
    if _current is not None:
        return _current
    port = metrics_port()
    if not port or local_rank() != 0:
        return None
    metrics = TrainerMetrics(
        getattr(cfg, "stage", "sft"), os.environ.get(RUN_ID_ENV, ""), os.environ.get(JOB_NAME_ENV, ""), node_rank()
    )
    url = metrics.serve(port, any_port=os.environ.get(ANY_PORT_ENV) == "1")
    log.info("metrics at %s (Prometheus text format; node rank %s)", url, metrics.labels["node_rank"])
    _current = metrics
    return metrics


def current() -> TrainerMetrics | None:
    """The metrics ``serve`` started in this process, if any."""
    return _current


class MetricsCallback(TrainerCallback):
    """Updates ``metrics``' series at each logging step and each saved checkpoint (attach after the progress
    callback, whose tokens/s and MFU it reads from the logs)."""

    def __init__(self, metrics: TrainerMetrics):
        self.metrics = metrics
        self._begin: tuple[float, int] | None = None

    def _set(self, name: str, value) -> None:
        self.metrics.gauges[name].set(float(value))

    def on_train_begin(self, args, state, control, **kwargs):
        self._begin = (time.time(), state.global_step)
        self._set("step", state.global_step)
        self._set("max_steps", state.max_steps)
        # The stall alert counts from here: a first step that never comes (a hung collective) is a stall too.
        self._set("last_step_timestamp_seconds", self._begin[0])

    def on_step_end(self, args, state, control, **kwargs):
        # Every step, not only logging steps: the stall alert must not wait logging_steps x the step time.
        self._set("step", state.global_step)
        self._set("last_step_timestamp_seconds", time.time())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        now = time.time()
        loss = float(logs["loss"])
        self._set("step", state.global_step)
        self._set("max_steps", state.max_steps)
        self._set("loss", loss)
        self._set("loss_nan", not math.isfinite(loss))
        for name in ("learning_rate", "tokens_per_second_per_device", "mfu"):
            if name in logs:
                self._set(name, logs[name])
        if self._begin is not None:
            began, step0 = self._begin
            rate = (state.global_step - step0) / max(now - began, 1e-9)
            if rate > 0:
                self._set("eta_seconds", max(state.max_steps - state.global_step, 0) / rate)

    def on_save(self, args, state, control, **kwargs):
        # Called after CompleteMarkerCallback (attached before this one) wrote the marker: the checkpoint is complete.
        self.metrics.last_checkpoint = time.time()
        self._set("last_checkpoint_timestamp_seconds", self.metrics.last_checkpoint)

    def on_train_end(self, args, state, control, **kwargs):
        self._set("step", state.global_step)
        self._set("eta_seconds", 0)


def _run_id(args) -> str:
    # The pods' TRAINER_RUN_ID; else the run's folder (<model root>/runs/<run id>/<stage folder>).
    return os.environ.get(RUN_ID_ENV) or os.path.basename(os.path.dirname(os.path.abspath(args.output_dir)))


def run_settings(args) -> dict:
    """The config's fields that differ from their defaults (what the user set, not TrainingArguments' 100+ keys)."""
    defaults = {f.name: f.default for f in dataclasses.fields(args) if f.default is not dataclasses.MISSING}
    return {k: v for k, v in args.to_dict().items() if k in defaults and defaults[k] != v}


class LangfuseRunCallback(TrainerCallback):
    """The training run as one Langfuse trace, on global rank 0: the settings as its input, a span per complete
    checkpoint, the final metrics as its output (``finish``, once the run's metrics are known)."""

    def __init__(self) -> None:
        self.trace: Trace | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or self.trace is not None:
            return
        run_id = _run_id(args)
        self.trace = start_trace(
            f"train {args.stage} {run_id}",
            run_id=run_id,
            tags=["train", args.stage],
            input=run_settings(args),
            metadata={
                "run_id": run_id,
                "stage": args.stage,
                "job_name": os.environ.get(JOB_NAME_ENV, ""),
                "model": args.model_name_or_path,
                "output_dir": args.output_dir,
                "world_size": args.world_size,
                "resumed_at_step": state.global_step,
            },
        )

    def on_save(self, args, state, control, **kwargs):
        if self.trace is not None:
            losses = [e["loss"] for e in state.log_history if "loss" in e]
            self.trace.span(
                f"checkpoint-{state.global_step}",
                output={
                    "path": os.path.join(args.output_dir, f"checkpoint-{state.global_step}"),
                    "step": state.global_step,
                    "max_steps": state.max_steps,
                    "loss": losses[-1] if losses else None,
                },
            )


_langfuse: LangfuseRunCallback | None = None


def attach(trainer) -> None:
    """Add the metrics callback to ``trainer`` when this process serves metrics (``serve``), and the Langfuse
    record when Langfuse's keys are set."""
    global _langfuse
    if _current is not None:
        trainer.add_callback(MetricsCallback(_current))
    if configured():
        _langfuse = LangfuseRunCallback()
        trainer.add_callback(_langfuse)


def finish(metrics: dict) -> None:
    """The run's final metrics: the Langfuse record's output (sent now)."""
    if _langfuse is not None and _langfuse.trace is not None:
        _langfuse.trace.end(output=metrics)
        _langfuse.trace = None
