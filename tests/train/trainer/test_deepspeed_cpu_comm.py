"""On CPU the trainer wraps torch.distributed in deepspeed.comm without DeepSpeed's shared-memory allreduce op.

``deepspeed.init_distributed`` on the CPU accelerator JIT-builds and loads ``deepspeed_shm_comm``
(deepspeed/comm/torch.py: ``TorchBackend.__init__`` -> ``build_shm_op``), an op only DeepSpeed's inference
tensor-parallel layers call (``inference_all_reduce``); training's collectives are torch.distributed's. Every
process that loads it takes torch's ``FileBaton`` (torch/utils/file_baton.py: a ``lock`` file beside the build,
waited on with no timeout) for the build: tens of seconds the first time, a ninja check after. A rank killed while
it holds the baton (a cancelled local run, a lost pod, a test killing a run) leaves the file behind, and every later
trainer on the machine waited on it forever with no message. The trainer now never loads the op.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from components.models.server_process import free_port
from tests.helpers.repo import ROOT

pytestmark = pytest.mark.slow  # a fresh process importing DeepSpeed: ~8 s

PROGRAM = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from components.train.trainer.common import init_deepspeed_comm
    init_deepspeed_comm("gloo")
    x = torch.ones(2)
    dist.all_reduce(x)
    import deepspeed.comm
    print("world", deepspeed.comm.get_world_size(), x.tolist())
    """
)


def test_a_stale_extension_lock_left_by_a_killed_rank_does_not_stop_the_next_run(tmp_path):
    # What a rank SIGKILLed inside torch's build section leaves: the lock file, nothing else.
    extensions = tmp_path / "torch_extensions"
    stale = extensions / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / "deepspeed_shm_comm" / "lock"
    stale.parent.mkdir(parents=True)
    stale.touch()
    env = {
        **os.environ,
        "TORCH_EXTENSIONS_DIR": str(extensions),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    # Before the fix this waited on the lock forever; 120 s is many times what it takes on 2 busy cores (~5 s).
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "world 1 [1.0, 1.0]" in proc.stdout
    # Nothing was built or waited on: the extension folder holds only the stale lock.
    assert sorted(p.name for p in stale.parent.iterdir()) == ["lock"]
