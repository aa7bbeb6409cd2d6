"""Derive the summary.json files (and the timeline figure) from the logs and metrics committed under
results/: every number in them comes from a file next to it.

    python3 results/tools/summarize.py        # from the repo root; rewrites the summaries
"""
import json
import os
import re
import statistics
import subprocess
import sys

# the commits results/run_x2.sh ran at (results/x2/pipeline_<PHASES>_at-<commit>.log; results/README.md)
COMMIT = "9c31301"  # 2026-11-29, phases A-D (PHASES unset)
COMMIT_NCCL = "91659bc"  # 2026-11-30, PHASES=nccl_big_models (and the GPU tests, run by hand right after it)
COMMIT_7B = "17e375e"  # 2026-11-30, PHASES=memory_steps_7b (fused AdamW)
COMMIT_TF32 = "c5458af"  # 2026-11-30, PHASES=tf32 and tf32_7b (the LM head on TF32)
COMMIT_CHECK = "7547a64"  # 2026-11-30, PHASES="check_async layout" (the exact async check, the student-first layout)
COMMIT_MULTI = "f939f2a"  # 2026-11-30, PHASES=multi (several servers), then the two-server GPU tests again by hand
COMMIT_MULTI2 = "9fe208f"  # 2026-11-30, PHASES="multi_tests layout multi_bench" (servers started one after another)


def steps_of(path):
    """Per-step rows of a run: its metrics.jsonl, or (when the run ended before the file was copied) the
    step lines of its log, which carry the timings."""
    if os.path.exists(path + ".metrics.jsonl"):
        return [r for r in map(json.loads, open(path + ".metrics.jsonl")) if "reward_mean" in r], "metrics.jsonl"
    pat = re.compile(r"^step +(\d+) \| reward ([\d.]+).*rollout ([\d.]+)s train ([\d.]+)s sync ([\d.]+)s step ([\d.]+)s"
                     r".*mismatch ([\d.]+)")
    rows = [dict(zip(("step", "reward_mean", "time_rollout", "time_train", "time_sync", "time_step", "mismatch_mean"),
                     map(float, m.groups()))) for m in map(pat.match, open(path + ".log")) if m]
    return rows, "log (step lines; no time_ref there)"


def evals_of(path):
    src = open(path + ".log").read()
    return {int(s): float(a) for s, a in re.findall(r"eval step (\d+): accuracy ([\d.]+)", src)}


def med(rows, key, skip=3):
    xs = [r[key] for r in rows[skip:] if key in r]
    return round(statistics.median(xs), 4) if xs else None


def caught_at(path):
    """The step at which a negative control stopped, from its error message."""
    log = open(path + ".log").read()
    m = re.search(r"must come from version '(\d+)'", log)
    if m:  # the rollout (or, async, the re-score) of step v+1 must come from the weights after step v
        return int(m.group(1)) + 1
    m = re.search(r"weight sync check failed at step (\d+)", log)
    return int(m.group(1)) if m else None


def check_v2():
    d = "results/h200/check_v2/"
    main, _ = steps_of(d + "check_v2_main")
    ev = evals_of(d + "check_v2_main")
    mm = [r["mismatch_mean"] for r in main]
    out = {"steps": len(main), "false_alarms": 0 if len(main) == 300 and "error:" not in open(d + "check_v2_main.log").read() else None,
           "skip_one_step": 6, "skip_one_caught_at": caught_at(d + "check_v2_skip_one"),
           "stop_syncing_after": 3, "stop_syncing_caught_at": caught_at(d + "check_v2_stop_syncing"),
           "weights_dropped_tag_kept_after": 3, "weights_dropped_tag_kept_caught_at": caught_at(d + "check_v2_dropped_tagged"),
           "batch_mismatch_mean_median": round(statistics.median(mm), 4), "batch_mismatch_mean_max": round(max(mm), 4),
           "batch_mismatch_max_median": round(statistics.median(r["mismatch_max"] for r in main), 3),
           "batch_mismatch_kl_median": round(statistics.median(r["mismatch_kl"] for r in main), 5),
           "mismatch_max_flag": 0.1, "every_rollout_from_its_version": all(r["sampled_from_version"] == r["step"] - 1 for r in main),
           "reward_first10": round(statistics.mean(r["reward_mean"] for r in main[:10]), 3),
           "reward_last10": round(statistics.mean(r["reward_mean"] for r in main[-10:]), 3),
           "eval_before": ev.get(0), "eval_after": ev.get(300), "eval_by_step": ev,
           "median_step_s": med(main, "time_step"), "wall_s_300_steps": main[-1]["span_sync"][1],
           "commit": COMMIT, "commands": "results/run_x2.sh, phase A"}
    json.dump(out, open(d + "summary.json", "w"), indent=1)
    return out


def asynchronous():
    def model(name, sync, asyn, note=""):
        s, src_s = steps_of(sync)
        a, src_a = steps_of(asyn)
        ev_s, ev_a = evals_of(sync), evals_of(asyn)
        last = max(ev_s) if ev_s else None
        trainer = lambda rows: (med(rows, "time_train") or 0) + (med(rows, "time_ref") or 0)
        row = {"model": name, "sync_step_s": med(s, "time_step"), "async_step_s": med(a, "time_step"),
               # the parts, from the sync run (nothing overlaps there); train = reference/old forward + training
               "rollout_s": med(s, "time_rollout"), "train_s": round(trainer(s), 4), "sync_s": med(s, "time_sync"),
               "sync_eval_final": ev_s.get(last) if len(ev_s) > 2 else None,
               "async_eval_final": ev_a.get(last) if len(ev_a) > 2 else None}
        row["async_over_sync"] = round(row["async_step_s"] / row["sync_step_s"], 3)
        row["overlap_bound_s"] = round(max(row["rollout_s"], row["train_s"] + row["sync_s"]), 4)
        row["async_over_bound"] = round(row["async_step_s"] / row["overlap_bound_s"], 3)
        # the same bound from the async run's own parts: how well it overlaps what it did (its training may
        # run slower or faster than the sync run's)
        own = max(med(a, "time_rollout"), trainer(a) + med(a, "time_sync"))
        row["async_over_own_bound"] = round(row["async_step_s"] / own, 3)
        if len(ev_s) > 2:
            row.update(sync_eval=ev_s, async_eval=ev_a,
                       sync_reward_last10=round(statistics.mean(r["reward_mean"] for r in s[-10:]), 3),
                       async_reward_last10=round(statistics.mean(r["reward_mean"] for r in a[-10:]), 3),
                       sync_wall_s=s[-1]["span_sync"][1], async_wall_s=a[-1]["span_sync"][1])
        row["sources"] = {"sync": src_s, "async": src_a}
        if note:
            row["note"] = note
        return row
    d = "results/x2/async/"
    out = [model("SmolLM2-135M-Instruct (trainer GPU 0, server GPU 1)", d + "x2_smol_sync", d + "x2_smol_async"),
           model("Qwen2.5-1.5B-shaped, random weights (trainer GPU 0, server GPU 1)", d + "x2_q15_sync", d + "x2_q15_async",
                 "medians of steps 4-12"),
           model("Qwen2.5-7B-shaped, random weights (trainer GPU 0, server GPU 1, --grad_checkpointing)",
                 d + "x2_q7_sync", d + "x2_q7_async", "medians of steps 4-6 (6 steps each: device time); both runs then "
                 "stopped writing the final checkpoint: the machine's disk was full (logs)"),
           model("SmolLM2-135M-Instruct, ONE shared GPU (--colocate), 30 steps", "results/h200/check_v2/coloc_sync",
                 "results/h200/check_v2/coloc_async")]
    for row, commit in zip(out, (COMMIT_TF32, COMMIT_TF32, COMMIT_TF32, COMMIT)):
        row["commit"] = commit
    json.dump(out, open(d + "summary.json", "w"), indent=1)
    subprocess.run([sys.executable, "results/tools/plot_timeline.py", d + "timeline.png",
                    f"sync={d}x2_smol_sync.metrics.jsonl", f"async={d}x2_smol_async.metrics.jsonl", "--steps", "20:25"], check=True)
    return out


def tf32_head():
    """The LM head on TF32 (--tf32_head, default) against exact fp32 (--no-tf32_head), side by side in one pipeline:
    the 1.5B sync step, and the SmolLM2 async run's trainer/server mismatch (TF32 must not move it)."""
    d = "results/x2/async/"
    q_tf32, _ = steps_of(d + "x2_q15_sync")
    q_fp32, _ = steps_of(d + "x2_q15_sync_fp32_head")
    s_tf32, _ = steps_of(d + "x2_smol_async")
    s_fp32, _ = steps_of(d + "x2_smol_async_fp32_head")
    out = {"qwen2.5_1.5b_sync": {"train_s": {"tf32_head": med(q_tf32, "time_train"), "fp32_head": med(q_fp32, "time_train")},
                                 "step_s": {"tf32_head": med(q_tf32, "time_step"), "fp32_head": med(q_fp32, "time_step")},
                                 "note": "medians of steps 4-12"},
           "smollm2_async_100_steps": {
               k: {"tf32_head": med(s_tf32, k, 0), "fp32_head": med(s_fp32, k, 0)}
               for k in ("mismatch_mean", "mismatch_max", "mismatch_kl", "is_truncated_frac", "time_train")},
           "smollm2_async_eval": {"tf32_head": evals_of(d + "x2_smol_async"), "fp32_head": evals_of(d + "x2_smol_async_fp32_head")},
           "commit": COMMIT_TF32, "commands": "results/run_x2.sh, PHASES=tf32"}
    out["smollm2_async_100_steps"]["note"] = "medians over all 100 steps"
    json.dump(out, open(d + "tf32_head_summary.json", "w"), indent=1)
    return out


def sync():
    d = "results/x2/sync/"
    out = []
    for name, bench, commit in (("SmolLM2-135M-Instruct", "bench_smol", COMMIT),
                                ("Qwen2.5-1.5B-shaped, random weights", "bench_q15", COMMIT_NCCL),
                                ("Qwen2.5-7B-shaped, random weights", "bench_q7", COMMIT_NCCL)):
        b = json.load(open(d + bench + "/summary.json"))[0]
        row = {k: b[k] for k in ("bytes", "disk_s", "tensor_s", "nccl_s", "raw_copy_s")}
        row = {"model": name + " (trainer GPU 0, server GPU 1)", **row, "verified": b["verified"],
               "disk_over_tensor": round(b["disk_s"] / b["tensor_s"], 1), "disk_over_nccl": round(b["disk_s"] / b["nccl_s"], 1),
               "tensor_gb_s": round(b["bytes"] / b["tensor_s"] / 1e9, 1), "nccl_gb_s": round(b["bytes"] / b["nccl_s"] / 1e9, 1),
               "source": d + bench, "commit": commit}
        out.append(row)
    json.dump(out, open(d + "summary.json", "w"), indent=1)
    return out


def nccl_run():
    """The 50-step --sync nccl run with the server's GPU hidden from the trainer (as on another host)."""
    d = "results/x2/sync/"
    rows, _ = steps_of(d + "x2_nccl_hidden_gpu")
    log = open(d + "x2_nccl_hidden_gpu.log").read()
    out = {"steps": len(rows), "sync": re.search(r"weight sync: (\S+)", log).group(1),
           # async: the batch of step s comes from the weights after step s-2 (version s-2), one step stale
           "every_rollout_from_its_version": all(r["sampled_from_version"] == max(r["step"] - 2, 0) for r in rows),
           "mismatch_mean_max": round(max(r["mismatch_mean"] for r in rows), 4), "eval": evals_of(d + "x2_nccl_hidden_gpu"),
           "median_sync_s": med(rows, "time_sync"), "median_step_s": med(rows, "time_step"), "commit": COMMIT_NCCL}
    json.dump(out, open(d + "nccl_run_summary.json", "w"), indent=1)
    return out


def memory():
    """Peak memory of one 7B-shaped training step on one H200, without and with checkpointing (fused AdamW),
    and the same two with torch's default foreach AdamW (both OOM)."""
    d = "results/x2/memory/"
    out = []
    for sub, opt, commit in (("", "fused AdamW", COMMIT_7B), ("foreach_adam/", "foreach AdamW (torch default)", COMMIT_NCCL)):
        for ck in ("", "_ckpt"):
            m = json.load(open(d + sub + f"memory_7b{ck}.json"))
            out.append({"model": "Qwen2.5-7B-shaped", "optimizer": opt, "grad_checkpointing": bool(ck),
                        "micro_batch": m["args"]["micro_batch"], "tokens_per_sequence": m["args"]["prompt_len"] + m["args"]["completion_len"],
                        "oom": m["oom"], "peak_allocated_gb": round(m["max_allocated_gb"], 1),
                        "peak_allocated_gb_by_step": [round(x["max_allocated_gb"], 1) for x in m["steps"] if "max_allocated_gb" in x],
                        "step_s": [round(x["seconds"], 2) for x in m["steps"]], "source": d + sub + f"memory_7b{ck}.json",
                        "commit": commit})
    json.dump(out, open(d + "summary.json", "w"), indent=1)
    return out


def check_async():
    """The exact async check (results/x2/check_async/): SmolLM2 at lr 5e-5, negative controls, the 1.5B shape."""
    d = "results/x2/check_async/"
    main, _ = steps_of(d + "async_lr5e-5")
    stale = lambda rows: [r["check_mismatch_mean"] for r in rows if r.get("staleness_mean") is not None]
    q, q0 = (steps_of(d + f"x2_q15_async_check{c}")[0] for c in (32, 0))
    ev = {r["step"]: r["eval_accuracy"] for r in map(json.loads, open(d + "async_lr5e-5.metrics.jsonl")) if "eval_accuracy" in r}
    out = {"model": "SmolLM2-135M-Instruct (the GPU kit's), built-in task, 16 prompts x 8, 128 new tokens, beta 0.04",
           "lr": 5e-5, "steps": len(main),
           "false_alarms": 0 if len(main) == 120 and "error:" not in open(d + "async_lr5e-5.log").read() else None,
           "old_rule_stopped_at": next((r["step"] for r in main if r["mismatch_mean"] > 0.1), None),
           "skip_one_step": 6, "skip_one_caught_at": caught_at(d + "neg_async_skip_one"),
           "stop_syncing_after": 3, "stop_syncing_caught_at": caught_at(d + "neg_async_stop_syncing"),
           "dropped_tagged_after": 3, "dropped_tagged_caught_at": caught_at(d + "neg_async_dropped_tagged"),
           "rescored_mismatch_median": {"smollm2": round(statistics.median(stale(main)), 4),
                                        "qwen2.5_1.5b_shape": round(statistics.median(stale(q)), 4)},
           "rescored_mismatch_max": {"smollm2": round(max(stale(main)), 4), "qwen2.5_1.5b_shape": round(max(stale(q)), 4)},
           "step_s_with_rescore": med(q, "time_step"), "step_s_without_rescore": med(q0, "time_step"),
           "notes": {"old_rule": "the first step whose batch mismatch (server at θ_{s-1} vs trainer at θ_s) exceeds 0.1: "
                                 "the rule before this change would have stopped the run there",
                     "steps_over_old_limit": sum(r["mismatch_mean"] > 0.1 for r in main),
                     "batch_mismatch_median_max": [round(statistics.median(r["mismatch_mean"] for r in main), 4),
                                                   round(max(r["mismatch_mean"] for r in main), 4)],
                     "staleness_median_max": [round(statistics.median(r["staleness_mean"] for r in main if r["staleness_mean"]), 4),
                                              round(max(r["staleness_mean"] for r in main if r["staleness_mean"]), 4)],
                     "rescored_mismatch": "check_mismatch_mean of the steps whose batch was one step old (re-scored rows)",
                     "reward_first10_last10": [round(statistics.mean(r["reward_mean"] for r in main[:10]), 3),
                                               round(statistics.mean(r["reward_mean"] for r in main[-10:]), 3)],
                     "eval_by_step": ev,
                     "dropped_tagged": "the pushes after step 3 were skipped but tagged; the server held θ_3; steps 5 "
                                       "and 6 were the first whose check compared against a newer trainer",
                     "step_s": "medians of steps 4-12 (1.5B shape, 24 x 8, 128 tokens, async, x2 layout), the two runs "
                               "back to back on one server; --check_seqs 32 (default) vs 0"},
           "commit": COMMIT_CHECK, "commands": "results/run_x2.sh, PHASES=check_async (results/x2/pipeline_check_async_layout_at-7547a64.log)"}
    json.dump(out, open(d + "summary.json", "w"), indent=1)
    return out


def layout():
    """The guard of the student-first layout (results/x2/layout/): SmolLM2 async, 100 steps, and the GPU tests; the
    size of grpo_sglang.py at its last commit, which changed after the run only in the re-score check (ef0c56d, 77e7fd5)."""
    d = "results/x2/layout/at-9fe208f/"  # results/x2/layout/ itself: summarize_speed.py (aea69c7, three seeds)
    rows, _ = steps_of(d + "x2_smol_async")
    ev = {r["step"]: r["eval_accuracy"] for r in map(json.loads, open(d + "x2_smol_async.metrics.jsonl")) if "eval_accuracy" in r}
    train = statistics.median([r["time_score"] + r["time_train"] for r in rows[3:]])
    bound = max(med(rows, "time_rollout"), train + med(rows, "time_sync"))
    per = [max(b["time_rollout"], a["time_score"] + a["time_train"] + a["time_sync"]) for a, b in zip(rows[3:], rows[4:])]
    lines = lambda commit: subprocess.run(["git", "show", f"{commit}:grpo_sglang.py"], capture_output=True, text=True).stdout.splitlines()
    head = subprocess.run(["git", "log", "-1", "--format=%h", "--", "grpo_sglang.py"], capture_output=True, text=True).stdout.strip()
    src = lines(head)  # the last commit that changed grpo_sglang.py
    reward = lambda p, a, b: round(statistics.mean(r["reward_mean"] for r in map(json.loads, open(p)) if "reward_mean" in r and a <= r["step"] <= b), 3)
    out = {"smol_async_step_s": med(rows, "time_step"), "smol_own_bound_s": round(bound, 4),
           "eval_final": round(ev[100], 4), "lines_total": len(src),
           "fence_line": next(i + 1 for i, l in enumerate(src) if l.startswith("# ---- Plumbing below")),
           "notes": {"bound": "max(rollout, score + train + sync) of this run, medians over steps 4-100; the step waits for the "
                              "slower of the next batch's rollout and its own training and push",
                     "step_over_bound": round(med(rows, "time_step") / bound, 3),
                     "step_over_median_per_step_bound": round(med(rows, "time_step") / statistics.median(per), 3),
                     "between_steps_s_median": round(statistics.median(b["span_step"][0] - a["span_step"][1]
                                                                       for a, b in zip(rows, rows[1:])), 4),
                     "eval_by_step": ev, "gpu_tests": open(d + "gpu_tests.log").read().strip().splitlines()[-1],
                     "guard": f"held-out accuracy within 3 points of the recorded run: NOT met by this run ({ev[100]:.1%} "
                              f"against 92.7%); the training reward over steps 81-100 is the same (reward_81_100); held-out "
                              f"accuracy on 110 prompts has a binomial std of ~3 points per run",
                     "reward_81_100": {"this run": reward(d + "x2_smol_async.metrics.jsonl", 81, 100),
                                       "recorded (c5458af)": reward("results/x2/async/x2_smol_async.metrics.jsonl", 81, 100),
                                       "7547a64": reward("results/x2/layout/at-7547a64/x2_smol_async.metrics.jsonl", 81, 100)},
                     "eval_final_other_runs": {"recorded (c5458af)": 0.9273, "7547a64": 0.9455,
                                               "c5458af, exact fp32 head": 0.9091, "c5458af, --no-async": 0.9455},
                     "lines": f"lines_total and fence_line: grpo_sglang.py at {head}; at the run's commit {COMMIT_MULTI2}: "
                              f"{len(lines(COMMIT_MULTI2))} lines"},
           "commit": COMMIT_MULTI2,
           "commands": f"results/run_x2.sh, PHASES=\"multi_tests layout multi_bench\" (results/x2/pipeline_multi_tests_layout_"
                       f"multi_bench_at-{COMMIT_MULTI2}.log); the run at 7547a64: at-7547a64/"}
    json.dump(out, open(d + "summary.json", "w"), indent=1)
    return out


def multi():
    """Several servers (results/x2/multi/): the GPU tests, the bench (one server against two, --no-async and --async)
    and rollouts alone (rollout_split.json)."""
    d = "results/x2/multi/"
    bench = {n: json.load(open(d + f"bench_{n}/bench.json"))["step"] for n in
             ("one_server_sync", "two_servers_sync", "one_server_async", "two_servers_async")}
    old = {n: json.load(open(d + f"at-{COMMIT_MULTI}/bench_{n}/bench.json"))["step"] for n in ("one_server", "two_servers")}
    m = {n: b["medians"] for n, b in bench.items()}
    tests = open(d + "gpu_tests_multi.log").read()
    failed = re.findall(r"^FAILED \S+\[(\w+)\]", tests, re.M)
    ran = "3 passed" in tests.strip().splitlines()[-1] or failed
    ok = lambda layout: bool(ran) and layout not in failed
    split = json.load(open(d + "rollout_split.json"))["batches"]
    r = lambda x, n=3: round(x, n)
    out = {"tp2_exact": ok("tp2_colocated"), "two_servers_exact_tensor": ok("two_servers_tensor"),
           "two_servers_exact_nccl": ok("two_servers_nccl"),
           "rollout_one_server_s": r(m["one_server_sync"]["time_rollout"]), "rollout_two_servers_s": r(m["two_servers_sync"]["time_rollout"]),
           "push_one_server_s": r(m["one_server_sync"]["time_sync"], 4), "push_two_servers_s": r(m["two_servers_sync"]["time_sync"], 4),
           "async_step_one_server_s": r(old["one_server"]["medians"]["time_step"]),
           "async_step_two_servers_s": r(old["two_servers"]["medians"]["time_step"]),
           "notes": {
               "tests": "after 3 steps every rank of every server holds the trainer's weights: /weights_checker checksums equal "
                        "those after SGLang loads the trainer's checkpoint itself, and differ from the starting model's. A TP-2 "
                        "server over GPUs 0-1 with the trainer colocated on GPU 0 (tensor path); two servers on GPU 1 with the "
                        "trainer on GPU 0 (tensor path; NCCL with GPU 1 hidden from the trainer). A random Qwen3-shaped tiny model",
               "bench": "Qwen2.5-1.5B-shaped random model, 24 x 8 prompts, 1024 new tokens, micro-batch 8, medians of steps 3-6 "
                        "of 6; one server on GPU 1 against two (one on GPU 0 with the trainer, one on GPU 1). rollout_* and "
                        "push_*: --no-async (generation with nothing else on the GPUs), side by side at " + COMMIT_MULTI2,
               "rollout_ratio": r(m["two_servers_sync"]["time_rollout"] / m["one_server_sync"]["time_rollout"]),
               "push_ratio": r(m["two_servers_sync"]["time_sync"] / m["one_server_sync"]["time_sync"]),
               "sync_step_s": {"one_server": r(m["one_server_sync"]["time_step"]), "two_servers": r(m["two_servers_sync"]["time_step"])},
               "sync_train_s": {"one_server": r(m["one_server_sync"]["time_train"]), "two_servers": r(m["two_servers_sync"]["time_train"])},
               "rollout_alone": {n: {"one_server_s": r(statistics.median(v["one_server_s"])), "two_servers_s": r(statistics.median(
                   v["two_servers_s"])), "ratio": r(v["ratio"]), "one_server_tok_s": round(v["one_server_tok_s"])} for n, v in split.items()},
               "rollout_alone_how": "results/tools/rollout_split.py: N sequences of 1024 tokens (ignore_eos) from one server, "
                                    "then N/2 from each of two at once, nothing else on the GPUs; medians of 2. The servers "
                                    "capture decode CUDA graphs up to 192 sequences (--cuda-graph-max-bs-decode 192): at 768 "
                                    "they decode without graphs, slower per token than at 192",
               "async_step": f"async_step_*: the pair measured side by side at {COMMIT_MULTI} (4 steps each). At {COMMIT_MULTI2}: "
                             f"one server {r(m['one_server_async']['time_step'])} s; two servers "
                             f"{r(m['two_servers_async']['time_step'])} s in the one step after the warm-up before it stopped",
               "async_rollout_s": {"one_server": r(old["one_server"]["medians"]["time_rollout"]),
                                   "two_servers": r(old["two_servers"]["medians"]["time_rollout"])},
               "async_train_s": {"one_server": r(old["one_server"]["medians"]["time_train"]),
                                 "two_servers": r(old["two_servers"]["medians"]["time_train"])},
               "two_servers_async_stopped": "at step 4 of 6: " + re.findall(r"traceback : (error: .*)", open(
                   d + "bench_two_servers_async/step_train.log").read())[-1] + " (the likely cause, read in SGLang's source; the "
                   "run kept no tokens to confirm it: it "
                   "reports input token ids >= vocab_size - 1 as 0, and the random model samples its last id; the check "
                   "allows it since 77e7fd5)",
               "why_async_slower": "with --async the server on GPU 0 generates while the trainer trains on GPU 0: each slows "
                                   "the other (train 12.8 s against 6.7 s), so two servers were slower than one in this layout"},
           "commit": COMMIT_MULTI2,
           "commands": f"results/run_x2.sh, PHASES=\"multi_tests layout multi_bench\" (results/x2/pipeline_multi_tests_layout_"
                       f"multi_bench_at-{COMMIT_MULTI2}.log); async_step_*: PHASES=multi at {COMMIT_MULTI} (at-{COMMIT_MULTI}/, "
                       f"results/x2/pipeline_multi_at-{COMMIT_MULTI}.log)"}
    json.dump(out, open(d + "summary.json", "w"), indent=1)
    return out


if __name__ == "__main__":
    for f in (check_v2, asynchronous, tf32_head, sync, nccl_run, memory, check_async, layout, multi):
        print(f.__name__, json.dumps(f(), indent=1)[:2500])
