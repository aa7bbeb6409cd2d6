"""Where the train phase's time goes: grpo_sglang.py as it is, with torch.profiler around its train() calls of a few
steps (CPU and CUDA activity), printed as tables and written to --out.

    torchrun --nproc_per_node 1 dev/profile_train.py --out DIR --profile_steps 8-10 -- <grpo_sglang.py flags>

--profile_steps 'a-b': the train() calls of steps a..b (counted from 0, as the loop does; rank 0 writes). DIR gets
ops_by_cpu.txt, ops_by_cuda.txt (torch's key_averages tables, top 40) and summary.json: per profiled step the wall
time of train(), the CUDA kernels' total time, and the CPU time of the top-level ops by name.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402
import torch  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the tables and summary.json")
    p.add_argument("--profile_steps", default="8-10", help="train() calls to profile: 'a-b'")
    args, rest = p.parse_known_args()
    lo, _, hi = args.profile_steps.partition("-")
    steps, train, calls, walls = range(int(lo), int(hi or lo) + 1), g.train, [0], []
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available()
                                                    else [])
    prof = torch.profiler.profile(activities=acts)

    def profiled_train(*a, **k):
        step, calls[0] = calls[0], calls[0] + 1
        if step not in steps:
            return train(*a, **k)
        if step == steps[0]:
            prof.start()
        t0 = time.time()
        out = train(*a, **k)
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        walls.append(time.time() - t0)
        if step == steps[-1]:
            prof.stop()
            if int(os.environ.get("RANK", 0)) == 0:
                write(prof, walls, args.out)
        return out
    g.train = profiled_train
    try:
        g.main(g.parse_config([a for a in rest if a != "--"]))
    except g.UserError as e:
        g.exit_now(1, f"error: {e}")
    g.exit_now(0)


def write(prof, walls, out):
    os.makedirs(out, exist_ok=True)
    avg = prof.key_averages()
    for key, name in (("self_cpu_time_total", "ops_by_cpu.txt"), ("self_device_time_total", "ops_by_cuda.txt")):
        table = avg.table(sort_by=key, row_limit=40, max_name_column_width=60)
        open(os.path.join(out, name), "w").write(table)
        print(table[:6000], flush=True)
    # the kernels themselves (the ops' rows repeat their kernels' time: summing every row counted it twice)
    kernels = sum(e.self_device_time_total for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6 / len(walls)  # seconds per step
    cpu = sorted(((e.key, e.cpu_time_total / 1e6 / len(walls)) for e in avg), key=lambda x: -x[1])[:25]
    summary = {"train_wall_s_per_step": [round(w, 4) for w in walls], "cuda_kernels_s_per_step": round(kernels, 4),
               "top_cpu_total_s_per_step": {k: round(v, 4) for k, v in cpu}}
    json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()
