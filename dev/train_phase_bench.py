"""The train phase alone on one GPU, no server: grpo_sglang.py's own functions (micro_batches, old_and_ref_logprobs,
advantages, weights, train) on rollouts made up to look like the built-in task's, step after step, each step a new
batch of new lengths (so new packed shapes, as in a real run). A benchmark of the trainer's code, not of SGLang. Flags after `--` go to
grpo_sglang.py (e.g. `-- --attention sdpa`).

    torchrun --nproc_per_node 1 dev/train_phase_bench.py --shape smol --steps 30 --out FILE.json \
        [--cudnn] [--reshard] [--profile DIR] [-- <more grpo_sglang.py flags, e.g. --grad_checkpointing>]

--shape: a random-weight model built from a config in code (weights do not change the time): smol (SmolLM2-135M's
shapes: 16 prompts x 8, 128 new tokens, micro-batch 128, beta 0.04, as the SMOL runs of the x2 script, `git show
0e3eade:results/run_x2.sh`) or q15 (Qwen2.5-1.5B's: 24 x 8, 1024 new tokens, micro-batch 8, beta 0, every completion
1024 long as a random model's are) or q7 (Qwen2.5-7B's, untied head: 16 x 8, 128 new tokens, micro-batch 8,
checkpointing, as that script's 7B runs).
Prompts are 40-52 tokens (the built-in task's ~46); completions are log-normal around 30 tokens with --truncated of
them at the limit (SmolLM2's runs: mean 20-43, 2-12% truncated). --cudnn turns PyTorch's cuDNN attention back on
(setup() turns it off); --reshard makes shard() gather the weights again for backward whatever the model's size.
--profile DIR: torch.profiler over --profile_steps (the last three), tables in DIR. GRPO_SCRIPT=PATH (environment):
time that grpo_sglang.py (an older commit's) instead of the repo's. The JSON has each step's train phase (wall
seconds from the batch to the end of train(), GPU synchronised), its tokens, and the median of steps 4 to the last
(the profiled ones left out); the 6 x parameters x tokens FLOP count of summarize_speed.py over it as a fraction of
the peak.
"""
import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the repo root
if os.environ.get("GRPO_SCRIPT"):  # another grpo_sglang.py (an older commit's), timed side by side with this one
    import importlib.util
    spec = importlib.util.spec_from_file_location("grpo_sglang", os.environ["GRPO_SCRIPT"])
    sys.modules["grpo_sglang"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["grpo_sglang"])
import grpo_sglang as g  # noqa: E402

PEAK = 989.4e12  # as summarize_speed.py: H200 dense bf16
QWEN = {"q05": "qwen2.5-0.5b-random", "q15": "qwen2.5-1.5b-random", "q3": "qwen2.5-3b-random",
        "q7": "qwen2.5-7b-random"}  # Qwen2.5's shapes: make_models.py's configs
SHAPES = {
    "smol": dict(cls="LlamaConfig", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=1e5, rms_norm_eps=1e-5,
                 max_position_embeddings=8192),
    "tiny": dict(cls="LlamaConfig", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),  # a CPU check of the tool
}
FLAGS = {"smol": ["--prompts_per_step", "16", "--group_size", "8", "--max_new_tokens", "128", "--micro_batch", "128",
                  "--lr", "1e-5", "--beta", "0.04"],
         "tiny": ["--prompts_per_step", "4", "--group_size", "4", "--max_new_tokens", "64", "--micro_batch", "8",
                  "--beta", "0.04"],
         "q15": ["--prompts_per_step", "24", "--group_size", "8", "--max_new_tokens", "1024", "--micro_batch", "8",
                 "--lr", "1e-6"],
         "q7": ["--prompts_per_step", "16", "--group_size", "8", "--max_new_tokens", "128", "--micro_batch", "8",
                "--lr", "1e-6", "--grad_checkpointing"]}


def config(shape):
    """The transformers config of `shape` (one of QWEN or SHAPES)."""
    import transformers
    if shape in QWEN:
        import make_models
        return make_models.configs(vocab=512)[QWEN[shape]]  # (vocab: the tiny models' only)
    kw = dict(SHAPES[shape])
    return getattr(transformers, kw.pop("cls"))(**kw)


def build(shape, d):
    """A random-weight model of `shape` saved in bf16 at d (once)."""
    import transformers
    if not os.path.exists(os.path.join(d, "config.json")):
        cfg = config(shape)
        cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, 2
        torch.manual_seed(0)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(d)
    return d


def made_up_batch(cfg, vocab, truncated, rng, device):
    """The trainer's table (grpo_sglang.sequences of a rollout batch of one-turn episodes) for made-up rollouts of the
    built-in task's lengths."""
    n = cfg.prompts_per_step * cfg.group_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(40, 52))] for _ in range(cfg.prompts_per_step)]
    lens = [cfg.max_new_tokens if rng.random() < truncated else
            min(cfg.max_new_tokens - 1, max(4, round(math.exp(rng.gauss(math.log(30), 0.5))))) for _ in range(n)]
    eps = [{"prompt": prompts[i // cfg.group_size], "completion": [rng.randrange(3, vocab) for _ in range(k)],
            "mask": [1] * k, "server_lp": [-abs(rng.gauss(0, 1)) for _ in range(k)], "answer": "1", "task": "t", "turns": 1,
            "finish": "length" if k == cfg.max_new_tokens else "stop",
            "messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": "1"}]}
           for i, k in enumerate(lens)]
    batch = {"episodes": eps, "srv": [0] * n, "sampling": {"temperature": cfg.temperature, "top_p": cfg.top_p,
                                                            "top_k": cfg.top_k, "max_new_tokens": cfg.max_new_tokens}}
    return g.sequences(batch, cfg.group_size, device)


def train_phase(cfg, model, ref, opt, seqs, m, **mb_kw):
    """What a step does from its table to the end of train(), rewards made up (torch.rand) -> its micro-batches."""
    mbs = g.micro_batches(seqs, cfg.micro_batch, 0, **mb_kw)
    g.old_and_ref_logprobs(cfg, model, ref, seqs, mbs)
    seqs["reward"] = torch.rand(len(seqs["length"]), device=seqs["mask"].device)
    seqs["adv"], seqs["weight"] = g.advantages(cfg, seqs["reward"]), g.weights(cfg, seqs)
    g.train(cfg, model, opt, seqs, mbs, 1, lambda s, m: None, m)
    return mbs


def write_peak(snapshot, base, path):
    """Replays the recorded allocations of one step (torch.cuda.memory._snapshot) to its peak, and writes what was
    live then, grouped by where it was allocated (the innermost frames in grpo_sglang.py, else in torch): the part of
    the peak above what was allocated before the step (weights, optimizer state) is what a change can move. Each
    group is named by the innermost torch frame and up to three of grpo_sglang.py's (or this tool's)."""
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    events = [e for e in trace if e["action"] in ("alloc", "free_completed")]
    cur, top, at = base, base, -1
    for i, e in enumerate(events):
        cur += e["size"] if e["action"] == "alloc" else -e["size"]
        if cur > top:
            top, at = cur, i
    live = {}
    for e in events[: at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        else:
            live.pop(e["addr"], None)

    def where(e):
        frames = e.get("frames", [])
        ours = [f for f in frames if f["filename"].endswith(("grpo_sglang.py", "train_phase_bench.py"))][:3]
        return " <- ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"
                           for f in [f for f in frames if "/torch/" in f["filename"]][:1] + ours)

    groups = {}
    for e in live.values():
        key = where(e)
        n, size = groups.get(key, (0, 0))
        groups[key] = (n + 1, size + e["size"])
    with open(path, "w") as f:
        f.write(f"before the step {base / 1e9:.3f} GB; peak {top / 1e9:.3f} GB at event {at} of {len(events)}; "
                f"{(top - base) / 1e9:.3f} GB allocated during the step and live at the peak:\n")
        for k, (n, size) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:40]:
            f.write(f"{size / 1e9:8.3f} GB {n:5d} x  {k}\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smol", choices=list(FLAGS))  # (q05 and q3: fit_bench.py's)
    p.add_argument("--models", default="/tmp/bench_models", help="where the random models are saved")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--truncated", type=float, default=None, help="fraction of completions at the limit")
    p.add_argument("--cudnn", action="store_true", help="PyTorch's cuDNN attention on (setup() turns it off)")
    p.add_argument("--reshard", action="store_true", help="FSDP2 gathers the weights again for backward at any size")
    p.add_argument("--profile", default="", help="folder for torch.profiler tables of --profile_steps")
    p.add_argument("--profile_steps", default="", help="'a-b': the steps profiled (left out of the median); default: "
                   "the last three, since SmolLM2's steps after a profile ran slower (results/h200/train_speed/, "
                   "last at 0e3eade)")
    p.add_argument("--memory", default="", help="file for what is allocated at the last step's peak (CUDA)")
    p.add_argument("--out", required=True)
    args, rest = p.parse_known_args()
    if args.memory and not torch.cuda.is_available():
        p.error("--memory reads CUDA's allocation history: it needs a GPU")
    path = build(args.shape, os.path.join(args.models, args.shape))
    cfg = g.parse_config(["--model", path, "--dataset", "builtin", "--out_dir", "/tmp/bench_out"] + FLAGS[args.shape]
                         + [a for a in rest if a != "--"])
    truncated = args.truncated if args.truncated is not None else (0.08 if args.shape == "smol" else 1.0)

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.enable_cudnn_sdp(args.cudnn)  # setup()'s choice, unless --cudnn
        gc.collect()  # the model build() made (15 GB at q7) is not part of the train phase's peak
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    dist.init_process_group("nccl" if cuda else "gloo")
    from torch.distributed.device_mesh import init_device_mesh
    rt = SimpleNamespace(rank=0, world=1, master=True, device=device, mesh=init_device_mesh(device.type, (1,)),
                         ckpt=None)
    if args.reshard:  # grpo_sglang.shard's behaviour for large models, at any size
        shard = g.shard
        g.shard = lambda *a, **k: shard(*a, **k, keep_params=0)
    model, ref, opt, _, _ = g.load_models(cfg, rt)
    n_params = sum(p.numel() for p in model.parameters())
    flat = {"flat": model.varlen} if hasattr(model, "varlen") else {}  # (older scripts: rows as long as the longest)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    lo, _, hi = (args.profile_steps or f"{max(0, args.steps - 3)}-{args.steps - 1}").partition("-")
    window = range(int(lo), int(hi or lo) + 1) if args.profile else range(0)
    rng, steps = random.Random(0), []
    torch.manual_seed(0)  # the rewards (torch.rand): the same in every variant
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if cuda else []), record_shapes=True) if args.profile else None
    for step in range(args.steps):
        seqs = made_up_batch(cfg, model.config.vocab_size, truncated, rng, device)
        m = g.Metrics()
        if prof and step == window[0]:
            prof.start()
        if args.memory and step == args.steps - 1:  # the last step's allocations, to find what makes its peak
            base = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
        sync()
        t0 = time.time()
        mbs = train_phase(cfg, model, ref, opt, seqs, m, **flat)
        sync()
        dt = time.time() - t0
        if prof and step == window[-1]:
            prof.stop()
        if args.memory and step == args.steps - 1:
            write_peak(torch.cuda.memory._snapshot(), base, args.memory)
            torch.cuda.memory._record_memory_history(enabled=None)
        tokens = sum(len(a) + len(b) for a, b in zip(seqs["prompt"], seqs["completion"]))
        r = m.reduce(device)
        steps.append({"step": step, "train_s": dt, "tokens": tokens, "pack_fill": r.get("pack_fill"),
                      "micro_batches": len(mbs), "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
                      "grad_norm": r.get("grad_norm")})
        print(json.dumps(steps[-1]), flush=True)
    recorded = {args.steps - 1} if args.memory else set()  # as profiled steps, a recorded one runs slower
    tail = [s for s in steps[4:] if s["step"] not in window and s["step"] not in recorded] or steps
    med = statistics.median(s["train_s"] for s in tail)
    tok = statistics.median(s["tokens"] for s in tail)
    res = {"shape": args.shape, "script": os.environ.get("GRPO_SCRIPT", "grpo_sglang.py"), "cudnn": args.cudnn,
           "reshard": args.reshard, "flags": sys.argv[1:], "torch": torch.__version__,
           "attention": model.config._attn_implementation,
           "params": n_params, "train_s_median": med, "tokens_median": tok,
           "mfu": 6 * n_params * tok / med / PEAK if cuda else None, "steps": steps}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    json.dump(res, open(args.out, "w"), indent=1)
    print(f"{args.out}: median train phase {med:.3f} s over {len(tail)} steps (4-{len(steps) - 1}, profiled or "
          f"recorded ones out), {tok:.0f} tokens, MFU {res['mfu'] or 0:.3f}")
    if prof:
        os.makedirs(args.profile, exist_ok=True)
        for key, name in (("self_cpu_time_total", "ops_by_cpu.txt"), ("self_device_time_total", "ops_by_cuda.txt")):
            open(os.path.join(args.profile, name), "w").write(
                prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=60))
        open(os.path.join(args.profile, "ops_by_cuda_and_shape.txt"), "w").write(  # the head's ops from the blocks'
            prof.key_averages(group_by_input_shape=True).table(sort_by="self_device_time_total", row_limit=60,
                                                               max_name_column_width=40, max_shapes_column_width=80))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
