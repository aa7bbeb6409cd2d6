"""What fits my GPU, the trainer's side: its peak memory and train-phase time on one GPU, no server, for a
random-weight model of a real shape, full fine-tune and `--lora_rank 16`, each without and with
`--grad_checkpointing`, at the quick start's batch. grpo_sglang.py's own functions (load_models, micro_batches,
old_and_ref_logprobs, advantages, weights, train) on made-up rollouts (train_phase_bench.py's batch and phase), one
variant after the other in one process (each loads the model afresh; the peak is reset in between).

    torchrun --nproc_per_node 1 dev/fit_bench.py --shape q05 --out FILE.json [--steps 3] [-- more flags]
    python dev/fit_bench.py --table     # the README's table, from results/h200/fit's and h200/lora's summaries

--shape: q05, q15, q3, q7 (Qwen2.5-0.5B, 1.5B, 3B, 7B's shapes), or tiny (a CPU check of the tool). The batch is the
README quick start's, 16 prompts x 8, 128 new tokens, beta 0.04, lr 1e-5 (LoRA: 1e-4), but `--micro_batch 32` (128
needs more memory than a 7B's step has room for), every completion 128 tokens long (a random model's are). The
reference (beta 0.04) is a frozen bf16 copy in a full fine-tune and the base itself under LoRA, as in a real run.
What it leaves out: the weight push (a bf16 bucket of the weights at a time) and the server. The JSON has, per
variant, each step's seconds and torch.cuda.max_memory_allocated (the trainer's tensors; the process's CUDA context,
~0.5 GB, comes on top), or "oom" with the message.
"""
import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_phase_bench as tpb  # noqa: E402  (build, made_up_batch, train_phase)
g = tpb.g

QUICK = ["--prompts_per_step", "16", "--group_size", "8", "--max_new_tokens", "128", "--micro_batch", "32",
         "--lr", "1e-5", "--beta", "0.04"]
VARIANTS = {"full": [], "full_ckpt": ["--grad_checkpointing"], "lora": ["--lora_rank", "16", "--lr", "1e-4"],
            "lora_ckpt": ["--lora_rank", "16", "--lr", "1e-4", "--grad_checkpointing"]}


def measure(path, flags, steps, rt):
    """Load the variant, run `steps` train phases -> {"steps": [{seconds, peak_gb}], "params", "trainable"}."""
    cuda = rt.device.type == "cuda"
    cfg = g.parse_config(["--model", path, "--dataset", "builtin", "--out_dir", "/tmp/fit_out"] + flags)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model, ref, opt, _, _ = g.load_models(cfg, rt)
    res = {"params": sum(p.numel() for p in model.parameters()),
           "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad), "steps": []}
    if cuda:
        res["after_load_gb"] = torch.cuda.memory_allocated() / 1e9
    rng = random.Random(0)
    torch.manual_seed(0)
    for step in range(steps):
        seqs = tpb.made_up_batch(cfg, model.config.vocab_size, 1.0, rng, rt.device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.time()
        tpb.train_phase(cfg, model, ref, opt, seqs, g.Metrics())
        if cuda:
            torch.cuda.synchronize()
        res["steps"].append({"step": step, "seconds": time.time() - t0,
                             "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None})
        print(json.dumps(res["steps"][-1]), flush=True)
    del model, ref, opt
    return res


def what_fits(fit, lora):
    """The summaries of results/h200/fit and h200/lora -> {shape: {variant: the GPU memory a colocated run needs and
    the smallest common GPU that holds it}}: the trainer's peak (this tool's, no server) + the server's bf16 weights
    and a KV cache for the batch + the overhead runs beside a real server showed, the largest of their kind (full or
    LoRA): the GPU in use (nvidia-smi's max) - the server's share (MEM_FRACTION 0.3) - the trainer's peak (CUDA
    contexts, SGLang's CUDA graphs, PyTorch's cache). Runs beside a server: lora's q7_lora, fit's fit_1.5b_*."""
    import transformers
    fit, lora, gb = fit["calls"]["."], lora["calls"]["."], 2**20 / 1e9  # (MiB -> GB)
    total_mib = int(fit["versions"][1].split(", ")[1].split()[0])
    most = lambda mib: mib["median_min_max"][2] if isinstance(mib, dict) else max(mib)  # (nvidia-smi's samples)
    beside = [("lora", lora["runs"]["q7_lora"]["all_steps"]["peak_mem_gb"][2], most(lora["files"]["q7_gpu_mem.txt"]))]
    for v in ("full_ck0", "full_ck1", "lora_ck0", "lora_ck1"):
        beside.append((v.split("_")[0], fit["runs"][f"fit_1.5b_{v}"]["all_steps"]["peak_mem_gb"][2],
                       most(fit["files"][f"fit_1.5b_{v}_gpu_mib.txt"])))
    over = lambda kind: max(round(round(mib * gb, 1) - 0.3 * total_mib * gb - round(peak, 1), 1)
                            for k, peak, mib in beside if k == kind)
    cards = [(24, "24 GB"), (40, "40 GB"), (48, "48 GB"), (80, "80 GB"), (total_mib / 1024, "141 GB (H200)")]  # GiB
    tokens = 16 * 8 * (46 + 128)  # the batch: 128 sequences, prompts ~46 tokens, 128 new tokens
    out = {}
    for shape in ("q05", "q15", "q3", "q7"):
        c = tpb.config(shape)
        with torch.device("meta"):
            params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(c).parameters())
        kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.hidden_size // c.num_attention_heads * 2  # K, V bf16
        server = round((2 * params + tokens * kv) / 1e9, 1)
        out[shape] = {}
        for v in VARIANTS:
            peak = fit["files"][f"{shape}.json"]["variants"].get(v, {}).get("peak_gb")
            if v == "lora_ckpt" and shape == "q7":  # the real colocated run
                peak = lora["runs"]["q7_lora"]["all_steps"]["peak_mem_gb"][2]
            need = round(round(peak, 1) + server + over(v.split("_")[0]), 1) if peak else None
            out[shape][v] = {"need_gb": need, "smallest_gpu": next((label for cap, label in cards
                                                                    if need and cap * 2**30 / 1e9 >= need), "none")}
    return out


def main():
    if sys.argv[1:] == ["--table"]:
        results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results", "h200")
        read = lambda f: json.load(open(os.path.join(results, f, "summary.json")))
        return print(json.dumps(what_fits(read("fit"), read("lora")), indent=1))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", required=True, choices=["q05", "q15", "q3", "q7", "tiny"])
    p.add_argument("--models", default="/tmp/bench_models", help="where the random models are saved")
    p.add_argument("--steps", type=int, default=3, help="train phases per variant (AdamW's state appears at the first)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    p.add_argument("--out", required=True)
    args, rest = p.parse_known_args()
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: {', '.join(map(repr, unknown))} unknown; choose from {', '.join(VARIANTS)}")
    path = tpb.build(args.shape, os.path.join(args.models, args.shape))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        gc.collect()  # (the model build() made is not the trainer's)
        torch.cuda.empty_cache()
    dist.init_process_group("nccl" if cuda else "gloo")
    from torch.distributed.device_mesh import init_device_mesh
    rt = SimpleNamespace(rank=0, world=1, master=True, device=device, mesh=init_device_mesh(device.type, (1,)),
                         ckpt=None)
    out = {"shape": args.shape, "batch": QUICK, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(device) if cuda else None, "variants": {}}
    for name in args.variants.split(","):
        flags = QUICK + VARIANTS[name] + [a for a in rest if a != "--"]
        try:
            r = measure(path, flags, args.steps, rt)
            r.update(peak_gb=max((s["peak_gb"] or 0) for s in r["steps"]) if cuda else None,
                     seconds_median=statistics.median(s["seconds"] for s in r["steps"][1:] or r["steps"]))
        except torch.OutOfMemoryError as e:
            r = {"oom": True, "error": str(e)[:300]}
        r["flags"] = flags
        out["variants"][name] = r
        print(name, json.dumps({k: v for k, v in r.items() if k != "steps"}), flush=True)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        json.dump(out, open(args.out, "w"), indent=1)  # after each variant: a run cut short keeps what it measured
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
