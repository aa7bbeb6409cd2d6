"""How many operations one train step issues, by phase: the cost of a CPU-bound train phase (SmolLM2's on an H200,
~0.2 s a step for a few ms of arithmetic) is per operation, so fewer operations is what would make it faster.
On the CPU, with SmolLM2's 30 blocks at width 64 and a dozen tokens per sequence (the arithmetic ~0, the operations
as many as at full size); every aten operation the step dispatches is counted (torch's dispatch mode, which on the
CPU sees the backward too), views and allocations left out (they launch no kernel on a GPU). The counts are not the
GPU's: there FSDP gathers and AdamW steps with fused kernels, and the attention is one kernel.

    torchrun --nproc_per_node 1 results/tools/count_ops.py [--out FILE] [-- <more grpo_sglang.py flags>]
"""
import argparse
import collections
import os
import random
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_phase_bench as tb  # noqa: E402  (it imports the repo's grpo_sglang)

g = tb.g
SHAPE = dict(tb.SHAPES["smol"], hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=512)  # SmolLM2's 30 blocks, narrow
FLAGS = ["--prompts_per_step", "2", "--group_size", "8", "--max_new_tokens", "8", "--micro_batch", "128",
         "--beta", "0.04"]  # SmolLM2's runs' flags, fewer and shorter sequences
NO_KERNEL = {"view", "_unsafe_view", "transpose", "t", "unsqueeze", "squeeze", "expand", "as_strided", "slice",
             "select", "reshape", "permute", "alias", "detach", "split", "split_with_sizes", "unbind", "chunk",
             "narrow", "_reshape_alias", "view_as", "lift_fresh", "empty", "empty_strided", "empty_like", "new_empty",
             "new_empty_strided", "is_same_size", "_record_function_enter_new", "_record_function_exit"}


class Count(TorchDispatchMode):
    """Counts (phase, op) for every dispatched op that would launch work."""
    def __init__(self):
        super().__init__()
        self.ops, self.phase = collections.Counter(), "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in NO_KERNEL:
            self.ops[(self.phase, name)] += 1
        return func(*args, **(kwargs or {}))


def in_phase(count, name, fn):
    def wrapped(*a, **k):
        before, count.phase = count.phase, name(*a) if callable(name) else name
        try:
            return fn(*a, **k)
        finally:
            count.phase = before
    return wrapped


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="/tmp/bench_models")
    p.add_argument("--out", default="")
    args, rest = p.parse_known_args()
    tb.SHAPES["narrow"] = SHAPE
    path = tb.build("narrow", os.path.join(args.models, "narrow"))
    cfg = g.parse_config(["--model", path, "--dataset", "builtin", "--out_dir", "/tmp/bench_out", "--device", "cpu"]
                         + FLAGS + [a for a in rest if a != "--"])
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh
    dev = torch.device("cpu")
    rt = SimpleNamespace(rank=0, world=1, master=True, device=dev, mesh=init_device_mesh("cpu", (1,)), ckpt=None)
    model, ref, opt, _ = g.load_models(cfg, rt)
    count = Count()
    fwd = lambda net, b, t: "reference forward" if net is ref else "policy forward" + ("" if torch.is_grad_enabled()
                                                                                      else " (no grad)")
    g.completion_logprobs = in_phase(count, fwd, g.completion_logprobs)
    g.clip_grads = in_phase(count, "clip_grads", g.clip_grads)
    opt.step = in_phase(count, "optimizer step", opt.step)
    torch.Tensor.backward = in_phase(count, "backward", torch.Tensor.backward)
    rng = random.Random(0)
    for step in range(4):  # the last one counted: the first steps allocate optimizer state, caches
        seqs = tb.made_up_batch(cfg, model.config.vocab_size, 0.08, rng, dev)
        seqs["prompt"] = [q[:4] for q in seqs["prompt"]]
        if step == 3:
            count.__enter__()
        mbs = g.micro_batches(seqs, cfg.micro_batch, 0, flat=model.varlen)
        g.old_and_ref_logprobs(cfg, model, ref, seqs, mbs)
        seqs["reward"] = torch.rand(len(seqs["length"]))
        seqs["adv"], seqs["weight"] = g.advantages(cfg, seqs["reward"]), g.weights(cfg, seqs)
        g.train(cfg, model, opt, seqs, mbs, 1, lambda s, m: None, g.Metrics())
    count.__exit__(None, None, None)
    phases = collections.Counter()
    for (phase, _), n in count.ops.items():
        phases[phase] += n
    lines = [f"operations in one train step (SmolLM2's 30 blocks, narrow, on the CPU; views and allocations not "
             f"counted): {sum(phases.values())}; blocks {model.config.num_hidden_layers}"]
    for phase, n in phases.most_common():
        top = sorted(((k, op) for (ph, op), k in count.ops.items() if ph == phase), reverse=True)[:12]
        lines.append(f"{phase:32s} {n:6d}   " + ", ".join(f"{op} {k}" for k, op in top))
    print("\n".join(lines))
    if args.out:
        open(args.out, "w").write("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
