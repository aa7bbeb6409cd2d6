"""Peak GPU memory of one grpo_sglang training step on one GPU, with no server and no data: just the trainer's
own code (load_policy, shard, pack_batch, completion_logprobs, policy_loss, aggregate) on random tokens.

    python dev/memory_step.py --model DIR [--grad_checkpointing] [--micro_batch 4] [--prompt_len 64] \
        [--completion_len 128] [--sequences 32] [--steps 2] [--device cuda|cpu] --out FILE.json

What one step is here, as in grpo_sglang.main with mu = 1 and beta = 0 (no reference model):
fp32 master weights sharded by FSDP2 over a world of one (bf16 compute in the blocks, fp32 LM head),
`--sequences` sequences of prompt_len + completion_len random tokens in micro-batches of `--micro_batch`,
forward + the clipped GRPO loss (token-mean aggregation) + backward per micro-batch, then gradient
clipping, AdamW step, zero_grad. The first step also allocates AdamW's two fp32 moments (8 bytes per
parameter), so the second step is the steady state. Per step the JSON has the seconds and the peak of
torch.cuda.max_memory_allocated (tensors) and max_memory_reserved (what PyTorch's allocator holds:
what nvidia-smi sees, minus the CUDA context); at the end, torch.cuda.mem_get_info (free / total).
An out-of-memory error is recorded ("oom": true, "error": the message) instead of crashing, so a sweep
can go on. --device cpu (gloo, no memory numbers) only checks that the code path runs.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the repo root
import grpo_sglang as g  # noqa: E402

GB = 1e9


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_samples(n, prompt_len, completion_len, vocab, gen):
    """n samples shaped like the trainer's: {"prompt": [ids], "completion": [ids]}."""
    ids = torch.randint(0, vocab, (n, prompt_len + completion_len), generator=gen).tolist()
    return [{"prompt": x[:prompt_len], "completion": x[prompt_len:]} for x in ids]


def train_step(model, opt, samples, adv, args, device):
    """One optimizer step over `samples`, micro-batch by micro-batch, as grpo_sglang.main does it."""
    n_tokens = sum(len(s["completion"]) for s in samples)  # the normaliser: the whole batch
    loss_sum = 0.0
    for i in range(0, len(samples), args.micro_batch):
        part = samples[i: i + args.micro_batch]
        g.fsdp_sync_grads(model, last=i + args.micro_batch >= len(samples))  # reduce once, at the last one
        b = g.pack_batch(part, 0, device)
        logp = g.completion_logprobs(model, b, 1.0)[0]
        # mu = 1: the "old" log-probs are the current ones, detached (ratio 1, gradient -A * grad log p)
        per_tok, _, _ = g.policy_loss(g.Config(tis_cap=0), {"adv": adv[i: i + len(part)].to(device), "mask": b["mask"]},
                                      logp, logp.detach(), None)
        loss = g.aggregate(per_tok, b["mask"], torch.ones(len(part), device=device), "token", n_tokens)
        loss.backward()
        loss_sum += loss.detach()  # a tensor: .item() here would make the CPU wait for the GPU
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # a DTensor under FSDP
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss_sum), grad_norm.item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder (e.g. from make_models.py)")
    p.add_argument("--grad_checkpointing", action="store_true")
    p.add_argument("--micro_batch", type=int, default=4)
    p.add_argument("--prompt_len", type=int, default=64)
    p.add_argument("--completion_len", type=int, default=128)
    p.add_argument("--sequences", type=int, default=32, help="sequences per optimizer step")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps (AdamW's state appears at the first)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--out", required=True, help="where to write the JSON")
    args = p.parse_args()
    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    # a world of one, set up like torchrun would (FSDP2 needs a process group and a device mesh)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (1,))

    import transformers
    res = {"args": vars(args), "torch": torch.__version__, "transformers": transformers.__version__,
           "gpu": torch.cuda.get_device_name(device) if cuda else None,
           "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
           "oom": False, "error": None, "phase": "load", "steps": []}

    def mem():  # peaks since the last reset (none on CPU)
        if not cuda:
            return {}
        return {"max_allocated_gb": torch.cuda.max_memory_allocated(device) / GB,
                "max_reserved_gb": torch.cuda.max_memory_reserved(device) / GB}

    def sync():  # wait for the GPU before reading the clock
        if cuda:
            torch.cuda.synchronize(device)

    try:
        t0 = time.time()
        model = g.load_policy(args.model, device, args.grad_checkpointing)
        vocab = model.config.vocab_size
        model = g.shard(model, mesh, torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")  # as the trainer
        sync()
        res.update(load_s=time.time() - t0, params=sum(p.numel() for p in model.parameters()),
                   model_class=type(model).__name__, after_load=mem())
        if cuda:
            res["after_load"]["allocated_gb"] = torch.cuda.memory_allocated(device) / GB

        gen = torch.Generator().manual_seed(0)
        for step in range(1, args.steps + 1):
            res["phase"] = f"step {step}"
            samples = random_samples(args.sequences, args.prompt_len, args.completion_len, vocab, gen)
            adv = torch.randn(args.sequences, generator=gen)  # stand-in advantages
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)  # peaks of this step alone
            t0 = time.time()
            loss, grad_norm = train_step(model, opt, samples, adv, args, device)
            sync()
            res["steps"].append({"step": step, "seconds": time.time() - t0, "loss": loss, "grad_norm": grad_norm, **mem()})
            print(json.dumps(res["steps"][-1]), flush=True)
        res["phase"] = "done"
    except torch.OutOfMemoryError as e:
        res.update(oom=True, error=str(e))
        res["at_oom"] = mem()
        print(f"out of memory in phase {res['phase']!r}", flush=True)

    if cuda:  # peaks over the whole run (load and every step); the per-step ones are in "steps"
        peaks = [res.get("after_load", {})] + res["steps"] + [res.get("at_oom", {})]
        for k in ("max_allocated_gb", "max_reserved_gb"):
            res[k] = max((d[k] for d in peaks if k in d), default=None)
        free, total = torch.cuda.mem_get_info(device)
        res["mem_get_info_gb"] = {"free": free / GB, "total": total / GB}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.out}: oom={res['oom']}" + (f", peak allocated {res['max_allocated_gb']:.2f} GB, "
                                                    f"reserved {res['max_reserved_gb']:.2f} GB" if cuda else ""))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
