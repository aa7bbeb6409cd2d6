"""Can the trainer's rank 0 and a server process that sees only its own GPU (CUDA_VISIBLE_DEVICES=1, as
serve.sh starts it) form an NCCL group with SGLang's helper and broadcast? Both sides run with
NCCL_CUMEM_ENABLE=0 unless set, as SGLang's server and grpo_sglang.py --sync nccl do. Prints one line
per size (seconds, GB/s) or the error.

    python3 results/tools/nccl_check.py 0          # the trainer sees only GPU 0 (as if the server were on another host)
    python3 results/tools/nccl_check.py 0,1        # the trainer sees both (torchrun's default layout)
    NCCL_P2P_DISABLE=1 python3 results/tools/nccl_check.py 0
"""
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
if len(sys.argv) == 2:  # parent: start the receiver (GPU 1) and the sender (GPU 0, seeing sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, str(rank), str(port)],
                              env=dict(os.environ, CUDA_VISIBLE_DEVICES="1" if rank else sys.argv[1])) for rank in (1, 0)]
    try:
        codes = [p.wait(timeout=180) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        codes = ["timeout"]
    print(f"nccl_check (trainer sees {sys.argv[1]}):", "ok" if codes == [0, 0] else f"FAILED {codes}", flush=True)
    sys.exit(0 if codes == [0, 0] else 1)

from datetime import timedelta

import torch
import torch.distributed as dist
from sglang.srt.utils import init_custom_process_group

rank, port = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.set_device(0)
pg = init_custom_process_group(backend="nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank,
                               group_name="nccl_check", timeout=timedelta(seconds=120))
for gib in (0.25, 1.0, 4.0):
    buf = torch.full((int(gib * 2**30),), 7 if rank == 0 else 0, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.time()
        dist.broadcast(buf, src=0, group=pg)
        torch.cuda.synchronize()
        times.append(time.time() - t0)
    ok = bool((buf == 7).all())
    if rank == 1:
        t = sorted(times)[1]
        print(f"nccl_check {gib:5.2f} GiB: {t * 1e3:7.1f} ms  {gib * 2**30 / t / 1e9:6.1f} GB/s  received intact: {ok}", flush=True)
    assert ok
