"""results/x2/train_speed/summary.json and results/x2/layout/summary.json from the runs of
`PHASES="speed learn" bash results/run_x2.sh` (results/README.md): every number comes from a metrics file there.

    python3 results/tools/summarize_speed.py COMMIT   # from the repo root, after the runs are copied into results/x2
"""
import json
import os
import statistics
import sys

SPEED, LAYOUT = "results/x2/train_speed", "results/x2/layout"
PEAK = 989.4e12  # H200 SXM dense bf16 FLOP/s (NVIDIA's datasheet; no sparsity)
Q15_PARAMS = 1_543_714_304  # Qwen2.5-1.5B's shapes (results/tools/make_models.py --device meta)


def rows(path):
    return [r for r in map(json.loads, open(path)) if "reward_mean" in r] if os.path.exists(path) else []


def med(rs, key, first=4):
    xs = [r[key] for r in rs if r["step"] >= first and r.get(key) is not None]
    return round(statistics.median(xs), 4) if xs else None


def evals(path):
    return {r["step"]: r["eval_accuracy"] for r in map(json.loads, open(path)) if "eval_accuracy" in r}


def main(commit):
    run = lambda d, name: rows(os.path.join(d, name + ".metrics.jsonl"))
    out = {"commit": commit}
    for key, name in (("smol_train_s", "speed_smol_noasync"), ("smol_noasync_step_s", "speed_smol_noasync"),
                      ("smol_async_step_s", "speed_smol_async"), ("smol_coloc_step_s", "speed_coloc"),
                      ("q15_train_s", "speed_q15")):
        for v in ("before", "after"):
            out[f"{key}_{v}"] = med(run(SPEED, f"{name}_{v}"), "time_train" if "train" in key else "time_step")
    after = run(SPEED, "speed_q15_after")  # the same prompts and lengths in both runs (one data order, 1024 tokens)
    tokens = statistics.median(r["prompt_len_mean"] + r["completion_len_mean"] for r in after) * 24 * 8 if after else None
    for v in ("before", "after"):
        t = out[f"q15_train_s_{v}"]
        out[f"q15_mfu_{v}"] = round(6 * Q15_PARAMS * tokens / t / PEAK, 4) if t and tokens else None
        out[f"q15_peak_gb_{v}"] = max((r["peak_mem_gb"] for r in run(SPEED, f"speed_q15_{v}")), default=None)
    out["q7_train_s_before"] = out["q7_train_s_after"] = None  # not run: device time (the note says so)
    prof = os.path.join(SPEED, "profile", "summary.json")
    out["profile_after"] = json.load(open(prof)) if os.path.exists(prof) else None
    seeds = [s for s in (0, 1, 2) if run(LAYOUT, f"smol_async_seed{s}")]
    reward = {s: round(statistics.mean(r["reward_mean"] for r in run(LAYOUT, f"smol_async_seed{s}") if r["step"] > 80), 4)
              for s in seeds}
    out["check_mismatch_median_after"] = med(run(LAYOUT, "smol_async_seed0"), "check_mismatch_mean", 2)  # steps 2-100
    out["reward_81_100_after"] = reward
    out["notes"] = {"tokens_per_step_q15": tokens, "flop_count": "6 x parameters x (prompt + completion tokens) per "
                    "step, no extra for the recomputed LM head; peak 989.4 TFLOP/s", "medians": "steps 4 to the last"}
    if run(SPEED, "speed_smol_noasync_after"):  # (at aea69c7 these files were lost: train_speed/README.md)
        json.dump(out, open(os.path.join(SPEED, "summary.json"), "w"), indent=1)

    s0 = run(LAYOUT, "smol_async_seed0")
    bound = [max(r["time_rollout"], r["time_score"] + r["time_train"] + r["time_sync"]) for r in s0 if r["step"] >= 4]
    lines = open("grpo_sglang.py", encoding="utf-8").read().splitlines()
    lay = {"smol_async_step_s": med(s0, "time_step"), "smol_own_bound_s": round(statistics.median(bound), 4) if bound
           else None, "reward_81_100": reward, "eval_final": {s: evals(os.path.join(LAYOUT, f"smol_async_seed{s}.metrics.jsonl"))
                                                                 .get(100) for s in seeds},
           "seeds": seeds, "lines_total": len(lines), "fence_line": next(i + 1 for i, l in enumerate(lines)
                                                                      if l.startswith("# ---- Plumbing below")),
           "lines_over_120": sum(len(l) > 120 for l in lines), "commit": commit,
           "notes": {"bound": "max(rollout, score + train + sync), medians over steps 4-100 of seed 0's run",
                     "runs": "seed 0 alone on the GPUs against one server on GPU 1 (its step time is the guard's); "
                             "seeds 1 and 2 together, one more server each on GPU 1 (run_x2.sh's learn phase)",
                     "step_over_bound_per_seed": {s: round(med(run(LAYOUT, f"smol_async_seed{s}"), "time_step") / statistics.median(
                         max(r["time_rollout"], r["time_score"] + r["time_train"] + r["time_sync"]) for r in
                         run(LAYOUT, f"smol_async_seed{s}") if r["step"] >= 4), 3) for s in seeds}}}
    json.dump(lay, open(os.path.join(LAYOUT, "summary.json"), "w"), indent=1)
    print(json.dumps(out, indent=1), json.dumps(lay, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
