"""results/x2/train_speed/at-925f66b/summary.json and results/x2/layout/summary.json from the runs of
`PHASES="learn variants speed profile coloc q15"` and `PHASES=final bash results/run_x2.sh` (results/README.md): every number comes from a metrics file there.

    python3 results/tools/summarize_speed.py FINAL RUNS   # from the repo root, after the runs are copied there
"""
import json
import os
import statistics
import subprocess
import sys

SPEED, LAYOUT = "results/x2/train_speed/at-925f66b", "results/x2/layout"  # the later runs: summarize_train_speed.py
PEAK = 989.4e12  # H200 SXM dense bf16 FLOP/s (NVIDIA's datasheet; no sparsity)
Q15_PARAMS = 1_543_714_304  # Qwen2.5-1.5B's shapes (results/tools/make_models.py --device meta)


def rows(path):
    return [r for r in map(json.loads, open(path)) if "reward_mean" in r] if os.path.exists(path) else []


def med(rs, key, first=4):
    xs = [r[key] for r in rs if r["step"] >= first and r.get(key) is not None]
    return round(statistics.median(xs), 4) if xs else None


def evals(path):
    return {r["step"]: r["eval_accuracy"] for r in map(json.loads, open(path)) if "eval_accuracy" in r}


def main(final, runs):
    """final: the commit of results/x2/layout/smol_async_final (the last code); runs: the commit of the other runs
    (results/x2/train_speed/at-925f66b/ against d7f3a11, results/x2/layout/at-RUNS/ the three seeds)."""
    run = lambda d, name: rows(os.path.join(d, name + ".metrics.jsonl"))
    seeds_dir = os.path.join(LAYOUT, f"at-{runs}")
    out = {"commit": runs, "final_commit": final}
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
    seeds = [s for s in (0, 1, 2) if run(seeds_dir, f"smol_async_seed{s}")]
    reward = lambda rs: round(statistics.mean(r["reward_mean"] for r in rs if r["step"] > 80), 4)
    fin = run(LAYOUT, "smol_async_final")
    out["check_mismatch_median_after"] = med(fin, "check_mismatch_mean", 2)  # steps 2-100 of the final commit's run
    out["reward_81_100_after"] = {f"0@{final}": reward(fin), **{f"{s}@{runs}": reward(run(seeds_dir, f"smol_async_seed{s}"))
                                                                for s in seeds}}
    prof = os.path.join(SPEED, "profile", "summary.json")
    if os.path.exists(prof):  # the CUDA total from the table's footer: at 925f66b the tool's own sum counted the
        p = json.load(open(prof))  # kernels twice (an op's row repeats its kernels' time; fixed in 29bd791)
        footer = [l for l in open(os.path.join(SPEED, "profile", "ops_by_cuda.txt")) if "Self CUDA time total" in l]
        p["cuda_kernels_s_per_step"] = round(float(footer[0].split()[-1].rstrip("ms")) / 1e3 / len(
            p["train_wall_s_per_step"]), 4) if footer else None
        out["profile_after"] = p
    out["notes"] = {"q15_after": f"at {runs} the LM head ran each chunk under activation checkpointing: 1.45x slower "
                    f"than before on this shape, so {final} went back to aea69c7's hand-written HeadLogprobs, whose own "
                    "pair measured 7.52 -> 7.16 s and 72.5 -> 57.6 GB (printed_at-aea69c7.txt); the 1.5B shape was "
                    f"not run at {final} (device time)",
                    "targets": "not met: SmolLM2 train <= 0.10 s, --no-async step <= 0.45 s, colocated step <= 0.38 s, "
                    "1.5B >= 45% of peak; the 7B shape not run",
                    "tokens_per_step_q15": tokens, "flop_count": "6 x parameters x (prompt + completion tokens) per "
                    "step, no extra for the recomputed LM head; peak 989.4 TFLOP/s", "medians": "steps 4 to the last"}
    json.dump(out, open(os.path.join(SPEED, "summary.json"), "w"), indent=1)

    bound = lambda rs: statistics.median(max(r["time_rollout"], r["time_score"] + r["time_train"] + r["time_sync"])
                                         for r in rs if r["step"] >= 4)
    evals_of = lambda d, n: evals(os.path.join(d, n + ".metrics.jsonl")).get(100)
    lines = subprocess.run(["git", "show", f"{final}:grpo_sglang.py"], capture_output=True, text=True,  # the file
                           check=True).stdout.splitlines()  # that ran, not the working tree's
    lay = {"smol_async_step_s": med(fin, "time_step"), "smol_own_bound_s": round(bound(fin), 4),
           "reward_81_100": {"0": reward(fin)}, "eval_final": {"0": evals_of(LAYOUT, "smol_async_final")}, "seeds": [0],
           "lines_total": len(lines), "fence_line": next(i + 1 for i, l in enumerate(lines)
                                                         if l.startswith("# ---- Plumbing below")),
           "lines_over_120": sum(len(l.encode()) > 120 for l in lines), "commit": final,
           f"at_{runs}": {"seeds": seeds, "reward_81_100": {s: reward(run(seeds_dir, f"smol_async_seed{s}")) for s in seeds},
                          "eval_final": {s: evals_of(seeds_dir, f"smol_async_seed{s}") for s in seeds},
                          "step_s": {s: med(run(seeds_dir, f"smol_async_seed{s}"), "time_step") for s in seeds},
                          "own_bound_s": {s: round(bound(run(seeds_dir, f"smol_async_seed{s}")), 4) for s in seeds}},
           "notes": {"bound": "max(rollout, score + train + sync), medians over steps 4-100",
                     "runs": f"{final}: seed 0 alone on a fresh machine against one server on GPU 1; {runs}: seed 0 "
                             "alone (its step time is a guard's), then seeds 1 and 2 together, one more server each "
                             f"on GPU 1 (run_x2.sh's learn phase). {runs} and {final} differ in the LM head's "
                             f"backward only ({runs}: chunks under activation checkpointing; {final}: the "
                             "hand-written HeadLogprobs of aea69c7, both exact against float64 autograd on the CPU)"}}
    json.dump(lay, open(os.path.join(LAYOUT, "summary.json"), "w"), indent=1)
    print(json.dumps(out, indent=1), json.dumps(lay, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
