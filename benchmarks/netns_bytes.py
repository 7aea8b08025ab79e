"""Bytes across the pod boundary per optimizer step, measured on CPU: two "pods" in their own network namespaces.

    python benchmarks/netns_bytes.py            # root and iproute2 needed; ~3 minutes on 2 cores; prints a table

Each pod is a network namespace (``ip netns add``) holding one end of a veth pair (10.77.0.1/24 and 10.77.0.2/24),
and runs ``torchrun --nnodes 2 --nproc_per_node 2 --node_rank R --master_addr 10.77.0.1`` of the trainer
(``-m components.train.trainer``, gloo on CPU, ``GLOO_SOCKET_IFNAME`` = the veth): 4 ranks, 2 per pod, so
everything that passes between the pods crosses the veth, and its byte counters count it (Ethernet frames: TCP/IP
headers and ACKs included). The model is a tiny Qwen3-MoE (2 layers, 4 experts, top-2), full fine-tuning, fp32,
micro-batch 1 x ``ACCUMULATION`` micro-steps, under ZeRO-3, under ZeRO++ hpZ with ``zero_hpz_partition_size`` 2
(= ranks per pod), and under transformers' FSDP2 layouts (``parallelism`` hsdp and hsdp_ep: sharded within a pod,
replicated across the pods, experts parallel within the pod; the trainer builds their DistributedConfig from
torchrun's environment, components/train/trainer/parallelism.py).

Per optimizer step, between step boundaries: a ``sitecustomize`` on the ranks' PYTHONPATH wraps transformers'
``CallbackHandler.on_step_end`` so that local rank 0 of each pod reads its veth's counters
(``/sys/class/net/<veth>/statistics/{tx,rx}_bytes``, the namespace's own) at the end of every optimizer step. The
figure is the difference between the end of step 1 and the end of the last step, over the steps between: start-up
(rendezvous, the model's broadcast and partitioning, step 1's first gathers), the evaluation and the final export
are left out. The whole run's counters are read as well, from outside, for comparison.

The prediction: ``components.estimate.network.collectives`` for the tiny model's config.json (``model_shape``)
with 2 nodes x 2 GPUs: each GPU's network share per step (``Collective.network_bytes_per_gpu`` x
``times_per_step``) x 2 GPUs per pod = what one pod sends to the other per step, in bf16 as the plan counts on
GPUs; each collective x 4 / its ``dtype_bytes`` for the fp32 parameters and gradients of this CPU run (every
collective of the plan that crosses nodes scales with the parameter bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ADDRESSES = ("10.77.0.1", "10.77.0.2")
RANKS_PER_POD = 2
PODS = 2
ACCUMULATION = 4
STEPS = 4
FP32_BYTES = 4
CONVERSATIONS = 384  # tests/helpers/trainer.make_workdir's rows: ~77 packed training rows, 19 per rank
# "shipped": the DeepSpeed files as shipped. DeepSpeed keeps a parameter gathered from its forward to its backward
# when it is reused within stage3_max_reuse_distance (1e9 parameters by default) of it: the tiny model's 126k
# parameters all are, so its backward gathers nothing. Qwen3-30B-A3B's layers are ~0.6B parameters each, so all but
# the last layer or two are gathered again for the backward, as the plan counts. "regather":
# stage3_max_reuse_distance 0, the large model's regime on the tiny one.
REGIMES = ("shipped", "regather")
# The FSDP2 layouts (``parallelism``), measured in the "regather" regime only: FSDP2 frees each block after its
# forward and gathers it again for the backward whatever the model's size (reshard_after_forward), so they are in
# the large model's regime already.
FSDP2_LAYOUTS = ("hsdp", "hsdp_ep")
LABELS = {
    "zero3": "ZeRO-3",
    "hpz": f"ZeRO++ hpZ, partition {RANKS_PER_POD}",
    "hsdp": "HSDP (FSDP2, parallelism hsdp)",
    "hsdp_ep": "HSDP + EP (parallelism hsdp_ep)",
}

# The tiny Qwen3-MoE (tests/train/trainer/test_trainer_moe.py's shape).
MOE_CONFIG: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
)

# Loaded by every Python process under the torchrun of a pod (sitecustomize on PYTHONPATH). In a worker with
# LOCAL_RANK 0 it records the pod's veth counters at the end of each optimizer step (the Trainer's on_step_end,
# after the optimizer step and global_step += 1) and writes them out when the process ends.
TRACER = """
import atexit, json, os

if os.environ.get("LOCAL_RANK") == "0" and "RANK" in os.environ and os.environ.get("NETNS_BYTES_VETH"):
    from transformers import trainer_callback

    import torch.distributed as dist

    _veth = os.environ["NETNS_BYTES_VETH"]
    _marks = []
    _ops = {}  # "op over n ranks" -> bytes this rank passed to or got from it

    def _count(name, fn, tensor_arg):
        def traced(*args, **kwargs):
            try:  # counting must never break the run
                t = kwargs[tensor_arg[0]] if tensor_arg[0] in kwargs else args[tensor_arg[1]]
                size = sum(x.numel() * x.element_size() for x in (t if isinstance(t, (list, tuple)) else [t]))
                key = f"{name} over {dist.get_world_size(kwargs.get('group'))}"
                _ops[key] = _ops.get(key, 0) + size
            except Exception as e:
                _ops[f"{name}: not counted ({type(e).__name__})"] = 0
            return fn(*args, **kwargs)
        return traced

    # The bytes of the output for gathers, of the input for reductions: the "size" S of the plan's Collective.
    for _name, _arg in (("all_gather_into_tensor", ("output_tensor", 0)), ("all_gather", ("tensor_list", 0)),
                        ("reduce_scatter_tensor", ("input", 1)), ("reduce_scatter", ("input_list", 1)),
                        ("all_reduce", ("tensor", 0)), ("broadcast", ("tensor", 0))):
        setattr(dist, _name, _count(_name, getattr(dist, _name), _arg))

    def _counter(name):
        with open(f"/sys/class/net/{_veth}/statistics/{name}") as f:
            return int(f.read())

    _on_step_end = trainer_callback.CallbackHandler.on_step_end
    _on_log = trainer_callback.CallbackHandler.on_log
    _losses = {}

    def _traced(self, args, state, control):
        _marks.append([state.global_step, _counter("tx_bytes"), _counter("rx_bytes"), dict(_ops)])
        return _on_step_end(self, args, state, control)

    def _logged(self, args, state, control, logs):
        if "loss" in logs:
            _losses[state.global_step] = logs["loss"]
        return _on_log(self, args, state, control, logs)

    trainer_callback.CallbackHandler.on_step_end = _traced
    trainer_callback.CallbackHandler.on_log = _logged

    @atexit.register
    def _write():
        path = os.path.join(os.environ["NETNS_BYTES_DIR"], f"rank{os.environ['RANK']}.json")
        with open(path, "w") as f:
            json.dump({"marks": _marks, "losses": _losses}, f)
"""


def unavailable() -> str | None:
    """Why the measurement cannot run here (not root, no ``ip``, namespaces refused), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    probe = f"nsbprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add refused: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


class Pods:
    """Two network namespaces joined by a veth pair; ``with Pods() as pods`` removes both (and so the veth) at exit.

    Names carry the process id, so concurrent runs do not collide; interface names stay within 15 characters."""

    def __init__(self) -> None:
        tag = os.getpid() % 100000
        self.namespaces = [f"nsb{tag}p{i}" for i in range(PODS)]
        self.veths = [f"nsb{tag}v{i}" for i in range(PODS)]

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def __enter__(self) -> Pods:
        try:
            for ns in self.namespaces:
                self._ip("netns", "add", ns)
                self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip(
                "link",
                "add",
                self.veths[0],
                "netns",
                self.namespaces[0],
                "type",
                "veth",
                "peer",
                "name",
                self.veths[1],
                "netns",
                self.namespaces[1],
            )
            for ns, veth, addr in zip(self.namespaces, self.veths, ADDRESSES, strict=True):
                self._ip("-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
                self._ip("-n", ns, "link", "set", veth, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for ns in self.namespaces:
            # Deleting a namespace deletes the veth end inside it, and with it the pair.
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)

    def counters(self, pod: int) -> tuple[int, int]:
        """(tx_bytes, rx_bytes) of pod ``pod``'s veth."""
        out = subprocess.run(
            ["ip", "-n", self.namespaces[pod], "-s", "-j", "link", "show", self.veths[pod]],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["tx"]["bytes"], stats["rx"]["bytes"]


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()


def run_pods(pods: Pods, program: list[str], trace: Path, port: int, timeout_s: float = 900) -> None:
    """``program`` (torchrun's arguments after its options) under one torchrun per pod, each inside its namespace;
    raise with the output's tail on failure.
    Every process started is ended before this returns (its own process group)."""
    (trace / "sitecustomize.py").write_text(TRACER)
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for rank, (ns, veth) in enumerate(zip(pods.namespaces, pods.veths, strict=True)):
            env = {
                **os.environ,
                "GLOO_SOCKET_IFNAME": veth,
                "NETNS_BYTES_VETH": veth,
                "NETNS_BYTES_DIR": str(trace),
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(trace), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
            }
            cmd = [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(PODS),
                "--nproc_per_node",
                str(RANKS_PER_POD),
                "--node_rank",
                str(rank),
                "--master_addr",
                ADDRESSES[0],
                "--master_port",
                str(port),
                *program,
            ]
            log = open(trace / f"pod{rank}.log", "w")
            logs.append(log)
            procs.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
            )
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(1)
        codes = [p.poll() for p in procs]
        if codes != [0] * PODS:
            tails = "\n".join(
                f"--- pod {i}:\n" + "\n".join((trace / f"pod{i}.log").read_text().splitlines()[-25:])
                for i in range(PODS)
            )
            raise RuntimeError(f"torchrun exit codes per pod {codes} (None: still running at the deadline)\n{tails}")
    finally:
        _kill(procs)
        for log in logs:
            log.close()


def make_moe(root: Path) -> Path:
    """The trainer fixtures (tests/helpers/trainer.py) with a tiny Qwen3-MoE base in ``root/moe``; enough rows that
    the measured steps fall within the first epoch (an epoch's last optimizer step takes fewer micro-steps)."""
    import datasets
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from tests.helpers.trainer import make_workdir

    make_workdir(root, rows=CONVERSATIONS)
    rows = len(datasets.load_from_disk(str(root / "data"))["train"])
    assert rows >= STEPS * ACCUMULATION * PODS * RANKS_PER_POD, f"{rows} training rows: raise CONVERSATIONS"
    tok = AutoTokenizer.from_pretrained(root / "base")
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        **MOE_CONFIG,
    )
    Qwen3MoeForCausalLM(config).save_pretrained(root / "moe")
    tok.save_pretrained(root / "moe")
    return root / "moe"


def deepspeed_configs(root: Path, regime: str) -> dict[str, str]:
    """ZeRO-3 and hpZ (zero3_hpz.json with partition size 2: one pod's ranks), as shipped (``regime="shipped"``) or
    with ``stage3_max_reuse_distance: 0`` (``"regather"``, see REGIMES)."""
    from components.train.config import deepspeed_config_path

    out = {}
    for name, shipped in (("zero3", "zero3"), ("hpz", "zero3_hpz")):
        shipped_path = deepspeed_config_path(shipped)
        assert shipped_path is not None  # a shipped name
        config = json.loads(Path(shipped_path).read_text())
        zero = config["zero_optimization"]
        if name == "hpz":
            zero["zero_hpz_partition_size"] = RANKS_PER_POD
        if regime == "regather":
            zero["stage3_max_reuse_distance"] = 0
            # Without prefetching: DeepSpeed 0.19.8 asserts "Cannot partition a param in flight" when a prefetched
            # parameter is released at reuse distance 0. Prefetching changes when bytes move, not how many.
            zero["stage3_prefetch_bucket_size"] = 0
        path = root / f"{name}-{regime}.json"
        path.write_text(json.dumps(config))
        out[name] = str(path)
    return out


def factor_key(c) -> str:
    """The calibration a collective's crossing takes: by kind, and apart for an all-reduce between one rank per pod
    (HSDP's across the replicas), which gloo runs over 2 ranks rather than the 4."""
    return f"{c.kind}, one rank per pod" if c.per_node == 1 and c.nodes > 1 else c.kind


def predicted(
    model_dir: Path,
    deepspeed_config: str | None,
    regime: str,
    factors: dict[str, float] | None = None,
    parallelism: str = "deepspeed",
) -> float:
    """Bytes one pod sends to the other per optimizer step, by the plan (module docstring), for fp32.

    ``factors``: what gloo sends across the boundary per collective (``factor_key``), in units of the plan's
    (``calibrate``); None for the plan as it is (NCCL's rings). In the ``shipped`` regime the tiny model's backward
    gathers nothing (REGIMES), so the plan's backward gather over all ranks is left out."""
    from components.estimate.network import INTER, collectives, zero_config
    from components.models.shape import model_shape

    shape = model_shape(json.loads((model_dir / "config.json").read_text()))
    zero = zero_config(deepspeed_config) if deepspeed_config else {}
    items = collectives(shape, "full", zero, PODS, RANKS_PER_POD, shape.total, parallelism)
    if regime == "shipped":
        items = [c for c in items if c.name != "parameters, backward"]
    per_gpu = sum(
        c.network_bytes_per_gpu
        * c.times_per_step(ACCUMULATION)
        * (factors or {}).get(factor_key(c), 1.0)
        * FP32_BYTES
        / c.dtype_bytes
        for c in items
        if c.link == INTER
    )
    return per_gpu * RANKS_PER_POD


# 4 ranks in the two pods: what each collective sends across the boundary, per call, in units of the ring's B.
CALIBRATION = """
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
n = dist.get_world_size()
tx = f"/sys/class/net/{os.environ['GLOO_SOCKET_IFNAME']}/statistics/tx_bytes"
count = lambda: int(open(tx).read())
S, calls, x = 4_000_000, 5, torch.ones(1_000_000)
out = {}
# One rank per pod: {0, 2} and {1, 3}, both at once, as HSDP's replicas all-reduce (every rank builds every group).
pairs = [dist.new_group([r, r + n // 2]) for r in range(n // 2)]
pair = pairs[dist.get_rank() % (n // 2)]
for kind, fn in (("all-gather", lambda: dist.all_gather_into_tensor(torch.empty(S // 4), x[: S // 4 // n])),
                 ("reduce-scatter", lambda: dist.reduce_scatter_tensor(torch.empty(S // 4 // n), x)),
                 ("all-reduce", lambda: dist.all_reduce(x)),
                 ("all-reduce, one rank per pod", lambda: dist.all_reduce(x, group=pair))):
    dist.barrier(); before = count(); dist.barrier()
    for _ in range(calls):
        fn()
    dist.barrier()
    if kind.endswith("one rank per pod"):
        # The plan: each of a pod's n / 2 ranks sends the ring's 2 S (2 - 1) / 2 = S.
        out[kind] = (count() - before) / calls / (S * n // 2)
    else:
        out[kind] = (count() - before) / calls / (S * (n - 1) / n) / (2 if kind == "all-reduce" else 1)
if os.environ["LOCAL_RANK"] == "0":
    open(sys.argv[1] + f"/pod{os.environ['GROUP_RANK']}.json", "w").write(json.dumps(out))
dist.destroy_process_group()
"""


def calibrate(pods: Pods, work: Path, port: int) -> dict[str, float]:
    """Bytes each pod sends per gloo collective of 4 MB over the 4 ranks, over the ring's B (the plan's model: 1;
    an all-reduce over its 2 B), the mean of both pods."""
    work.mkdir(parents=True, exist_ok=True)
    script = work / "calibrate.py"
    script.write_text(CALIBRATION)
    run_pods(pods, [str(script), str(work)], work, port)
    pods_out = [json.loads((work / f"pod{i}.json").read_text()) for i in range(PODS)]
    return {k: sum(o[k] for o in pods_out) / PODS for k in pods_out[0]}


def measure(
    workdir: Path, regimes: tuple[str, ...] = REGIMES, port_base: int = 29611, fsdp2: tuple[str, ...] = FSDP2_LAYOUTS
) -> dict:
    """ZeRO-3 and hpZ in each regime, and the ``fsdp2`` layouts in the regather regime, measured and predicted:
    {"factors": calibrate's, (regime, name): {...}}."""
    from components.models.shape import model_shape
    from tests.helpers.trainer import trainer_config

    model = make_moe(workdir)
    results: dict = {}
    port = port_base
    with Pods() as pods:
        factors = results["factors"] = calibrate(pods, workdir / "calibration", port)
        for regime in regimes:
            layouts: list[tuple[str, str | None, str]] = [
                (name, ds, "deepspeed") for name, ds in deepspeed_configs(workdir, regime).items()
            ]
            if regime == "regather":
                layouts += [(name, None, name) for name in fsdp2]
            for name, ds, parallelism in layouts:
                port += 1
                run = f"{name}-{regime}"
                over = {"deepspeed": ds} if ds else {}
                cfg = trainer_config(
                    workdir,
                    run,
                    model_name_or_path=str(model),
                    max_steps=STEPS,
                    save_steps=STEPS,
                    logging_steps=1,
                    gradient_accumulation_steps=ACCUMULATION,
                    per_device_train_batch_size=1,
                    parallelism=parallelism,
                    **over,
                )
                trace = workdir / f"trace-{run}"
                trace.mkdir()
                before = [pods.counters(p) for p in range(PODS)]
                run_pods(pods, ["-m", "components.train.trainer", "--config", cfg], trace, port)
                after = [pods.counters(p) for p in range(PODS)]
                marks, ops, losses = {}, {}, {}
                for pod in range(PODS):
                    traced = json.loads((trace / f"rank{pod * RANKS_PER_POD}.json").read_text())
                    marks[pod] = {step: (tx, rx) for step, tx, rx, _ in traced["marks"]}
                    if pod == 0:
                        ops = {step: o for step, _, _, o in traced["marks"]}
                        losses = {int(step): loss for step, loss in traced["losses"].items()}
                first, last = 1, STEPS
                steps = last - first
                results[(regime, name)] = {
                    # Pod 0's veth: tx = pod 0 -> pod 1, rx = pod 1 -> pod 0.
                    "tx_per_step": (marks[0][last][0] - marks[0][first][0]) / steps,
                    "rx_per_step": (marks[0][last][1] - marks[0][first][1]) / steps,
                    "pod1_tx_per_step": (marks[1][last][0] - marks[1][first][0]) / steps,
                    "whole_run": sum(after[0]) - sum(before[0]),
                    "planned": predicted(model, ds, regime, parallelism=parallelism),
                    "planned_gloo": predicted(model, ds, regime, factors, parallelism),
                    "losses": losses,
                    "eval_loss": json.loads((workdir / run / "metrics.json").read_text())["eval_loss"],
                    "collectives_per_step": {
                        k: (ops[last].get(k, 0) - ops[first].get(k, 0)) / steps for k in sorted(ops[last])
                    },
                    "params": model_shape(json.loads((model / "config.json").read_text())).total,
                }
    return results


def table(results: dict) -> str:
    """The Markdown table of ``measure``'s results (MB = 1e6 bytes, per optimizer step)."""
    lines = [
        "| regime | layout | pod 0 -> 1 | pod 1 -> 0 | both directions | ZeRO-3 / this | plan (NCCL rings), "
        "per direction | measured / plan | plan with gloo's collectives | measured / that | whole run, both "
        "directions | losses (steps 1-4) | eval_loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for key, r in results.items():
        if key == "factors":
            continue
        regime, name = key
        z3 = results[(regime, "zero3")]
        both, z3_both = r["tx_per_step"] + r["rx_per_step"], z3["tx_per_step"] + z3["rx_per_step"]
        losses = ", ".join(f"{v:.6f}" for _, v in sorted(r["losses"].items()))
        label = LABELS[name]
        lines.append(
            f"| {regime} | {label} | {r['tx_per_step'] / 1e6:.3f} MB | {r['rx_per_step'] / 1e6:.3f} MB | "
            f"{both / 1e6:.3f} MB | {z3_both / both:.2f} | {r['planned'] / 1e6:.3f} MB | "
            f"{both / 2 / r['planned']:.3f} | {r['planned_gloo'] / 1e6:.3f} MB | "
            f"{both / 2 / r['planned_gloo']:.3f} | {r['whole_run'] / 1e6:.2f} MB | {losses} | "
            f"{r['eval_loss']:.6f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temporary folder, removed)")
    parser.add_argument("--regime", choices=REGIMES, nargs="+", default=list(REGIMES))
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"cannot measure here: {why}")
    if args.keep:
        work = Path(args.keep)
        work.mkdir(parents=True, exist_ok=True)
        results = measure(work, tuple(args.regime))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = measure(Path(tmp), tuple(args.regime))
    runs = {k: v for k, v in results.items() if k != "factors"}
    params = next(iter(runs.values()))["params"]
    print(
        f"tiny Qwen3-MoE ({params:,} parameters, fp32), {PODS} pods x {RANKS_PER_POD} ranks, gloo over a veth, "
        f"micro-batch 1 x {ACCUMULATION} micro-steps, per optimizer step between the ends of steps 1 and {STEPS}"
    )
    print(
        "gloo, bytes a pod sends per collective over the ring's B:",
        {k: round(v, 3) for k, v in results["factors"].items()},
    )
    print(table(results))
    for (regime, name), r in runs.items():
        print(
            f"{name}-{regime}: bytes per step rank 0 passed to each collective (gathers: output, reductions: input):",
            {k: round(v) for k, v in r["collectives_per_step"].items()},
        )


if __name__ == "__main__":
    main()
