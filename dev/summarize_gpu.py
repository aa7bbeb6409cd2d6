"""results/h200/{quickstart,trl,trust,lora,episodes,dynamic_sampling,fit}/summary.json (and the curves) from the logs
and metrics there, so that every number the README quotes is computed from files in the repository.

    python dev/summarize_gpu.py [part ...]   # from the repo root (parts: the functions below; default all);
                                               # needs matplotlib for the curves
"""
import json
import os
import re
import statistics as st
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
R = os.path.join(HERE, "results", "h200")
sys.path[:0] = [os.path.join(HERE, "tools"), os.path.join(HERE, "dev")]  # plot_metrics; train_phase_bench


def rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def steps(path):
    return [r for r in rows(path) if "reward_mean" in r]


def evals(path):
    return {r["step"]: round(r["eval_accuracy"], 4) for r in rows(path) if "eval_accuracy" in r}


def med(xs):
    return round(st.median(xs), 4)


def stopped_at(log):
    """The step a negative control stopped at, and why (the trainer's error, from its log), or None."""
    text = open(log).read()
    last = max([int(m) for m in re.findall(r"^step +(\d+) ", text, re.M)] or [0])
    err = re.search(r"error: (weight sync check failed[^\n]*|the server at [^\n]* with weights of version[^\n]*)", text)
    return (last + 1, err.group(1)[:300]) if err else (None, None)


def quickstart():
    d = os.path.join(R, "quickstart")
    out = {"commit": "b862d68", "date": "2026-12-02", "runs": {}}
    for seed in (0, 1, 2):
        s = steps(os.path.join(d, f"seed{seed}.metrics.jsonl"))
        out["runs"][seed] = {"steps": len(s), "reward_1_10": round(st.mean(r["reward_mean"] for r in s[:10]), 3),
                             "reward_91_100": round(st.mean(r["reward_mean"] for r in s[-10:]), 3),
                             "eval": evals(os.path.join(d, f"seed{seed}.metrics.jsonl")),
                             "step_s_median": med([r["time_step"] for r in s[3:]]),
                             "steps_s_total": round(sum(r["time_step"] for r in s), 1),
                             "check_mismatch_median": med([r["check_mismatch_mean"] for r in s])}
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
    import plot_metrics
    plot_metrics.main(os.path.join(d, "seed0.metrics.jsonl"), os.path.join(d, "curve.png"),
                      "SmolLM2-135M-Instruct, a + b, one H200 (server and trainer colocated)")
    return out


def trust():
    d = os.path.join(R, "trust")
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
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
    return out


def trl():
    """TRL's GRPOTrainer and ours on the same work (16 x 8, 128 tokens, lr 1e-5, beta 0, micro-batches of 32), one
    machine: ours --async and --no-async (30 steps each), then TRL (25 steps); medians and ranges of steps 4 on."""
    d = os.path.join(R, "trl")
    t = json.load(open(os.path.join(d, "trl.summary.json")))
    runs = {"trl_grpotrainer": rows(os.path.join(d, "trl.steps.jsonl"))}
    for mode in ("async", "no-async"):
        runs[f"grpo_sglang_{mode}"] = steps(os.path.join(d, f"ours_{mode}.metrics.jsonl"))
    out = {"commit": "b862d68 (trainer); trl_grpo.py at 8a15aea", "date": "2026-12-02", "trl": t["trl"],
           "medians_of": "steps 4 to the last of each run", "runs": {}}
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
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
    return out


def lora():
    d = os.path.join(R, "lora")
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
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
    return out


def episodes():
    """The multi-turn quick start of each built-in task of episodes, its single-turn baseline (one reply, no
    environment, the same held-out rows), the negative control during episodes and what a turn costs."""
    d = os.path.join(R, "episodes")
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
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
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
    fig.savefig(os.path.join(d, "curve.png"), dpi=110)
    return out


def dynamic_sampling():
    """The quick start with --dynamic_sampling 3 (DAPO) and without it, 200 steps each, one call, one server: the
    groups with signal (rewards that differ) a step trains on, the prompts it drew, its time, held-out accuracy
    against steps and against the steps' summed time."""
    d, G = os.path.join(R, "dynamic_sampling"), 16  # (--prompts_per_step)
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
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
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
    fig.savefig(os.path.join(d, "curve.png"), dpi=110)
    return out


def fit():
    """What fits my GPU: the trainer's peak per shape and variant (dev/fit_bench.py, one H200, no server) and, derived
    from it, the GPU memory a colocated run needs: the trainer's peak + the server's bf16 weights and a KV cache for
    the batch + the overhead runs beside a real server showed, the largest of their kind (full or LoRA). A run's
    overhead: the GPU in use (nvidia-smi, its max) - the server's share (MEM_FRACTION 0.3 of the GPU) - the trainer's
    peak: CUDA contexts, SGLang's CUDA graphs, PyTorch's cache. Runs beside a server: the 7B LoRA run at 722847b and
    the 1.5B's four variants at b862d68 (fit_1.5b_*, --beta 0: no reference model)."""
    d, gb = os.path.join(R, "fit"), 2**20 / 1e9  # (MiB -> GB)
    total_mib = int(re.search(r"H200, (\d+) MiB", open(os.path.join(d, "versions.txt")).read()).group(1))
    share = 0.3 * total_mib * gb
    lora = json.load(open(os.path.join(R, "lora", "summary.json")))["q7_lora"]
    smi = max(int(x) for x in open(os.path.join(R, "lora", "q7_gpu_mem.txt")).read().split())
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
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
    return out


if __name__ == "__main__":
    parts = {f.__name__: f for f in (quickstart, trust, trl, lora, episodes, dynamic_sampling, fit)}
    for name in sys.argv[1:] or parts:
        print(name, json.dumps(parts[name]()))
