"""How soon the other ranks of a training job see the base model rank 0 records (resolve_model_for_run).

Every rank waits at the trainer's first collective for the slowest one, so a rank that sleeps past rank 0's record
holds the whole job: on the laptop run rank 1 asked a moment before rank 0 wrote it, then slept the 5 s poll.
"""

import threading
import time

from components.models import resolve


def test_a_waiting_rank_takes_rank_0s_record_within_a_fraction_of_a_second(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    folder = tmp_path / "cache" / "models" / "tiny"
    folder.mkdir(parents=True)
    record = tmp_path / "train" / resolve.BASE_MODEL_RECORD
    record.parent.mkdir()
    rank0 = threading.Timer(
        0.3,
        resolve._write_record,
        args=(str(record), {"model_name_or_path": "builtin:tiny-qwen3", "path": str(folder)}),
    )
    started = time.monotonic()
    rank0.start()
    try:
        assert resolve.resolve_model_for_run("builtin:tiny-qwen3", str(tmp_path / "cache"), str(record)) == str(folder)
    finally:
        rank0.join()
    assert time.monotonic() - started < 2.0  # the record landed at 0.3 s; POLL_S (5 s) is for long waits only


def test_a_long_wait_polls_every_poll_s(tmp_path, monkeypatch):
    # Rank 0 downloading 30 GB: after the first seconds the volume is read every POLL_S, not ten times a second.
    monkeypatch.setenv("RANK", "1")
    sleeps = []
    clock = iter(range(0, 10_000, 1))
    monkeypatch.setattr(resolve.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(resolve.time, "sleep", sleeps.append)
    ready = iter([None] * 100 + ["folder"])
    assert resolve._wait_for(lambda: next(ready), deadline=10_000.0, what="the record") == "folder"
    assert sleeps[0] < 1 and sleeps[-1] == resolve.POLL_S
