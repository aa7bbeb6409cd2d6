"""results/x2/train_speed/at-COMMIT/summary.json (and, with --latest, results/x2/train_speed/summary.json) from the
runs of `PHASES=train_speed_final bash results/run_x2.sh` (or the earlier "nan speed learn variants coloc q15
profile") at COMMIT (results/README.md):
every number comes from a metrics file in results/x2/train_speed/at-COMMIT/. "before" is d7f3a11's script
(.gpukit/before/), "after" the commit's, one after the other on one machine and one server.

    python3 results/tools/summarize_train_speed.py COMMIT [--latest]   # from the repo root, the runs copied there
    python3 results/tools/summarize_train_speed.py COMMIT --h200 [--script C] [--before B]  # results/h200/...
    python3 results/tools/summarize_train_speed.py COMMIT --h200 --pair A B  # one script, two flag values (run_h200.sh
                                                                             # varlen: --attention sdpa / varlen)
"""
import glob
import json
import os
import statistics
import sys

from summarize_speed import PEAK, Q15_PARAMS, med  # the same peak, parameter count and medians as the earlier pairs

TOP = "results/x2/train_speed"


def rows(d, name):
    path = os.path.join(d, name + ".metrics.jsonl")
    return [r for r in map(json.loads, open(path)) if "reward_mean" in r] if os.path.exists(path) else []


def main(commit, latest):
    d = os.path.join(TOP, f"at-{commit}")
    out = {"commit": commit, "before_commit": "d7f3a11"}
    for key, name in (("smol_train_s", "speed_smol_noasync"), ("smol_noasync_step_s", "speed_smol_noasync"),
                      ("smol_async_train_s", "speed_smol_async"), ("smol_async_step_s", "speed_smol_async"),
                      ("smol_coloc_step_s", "speed_coloc"), ("q15_train_s", "speed_q15")):
        for v in ("before", "after"):
            out[f"{key}_{v}"] = med(rows(d, f"{name}_{v}"), "time_train" if "train" in key else "time_step")
    for name in ("speed_smol_noasync", "speed_smol_async", "speed_coloc"):
        for v in ("before", "after"):
            out[f"{name[6:]}_peak_gb_{v}"] = max((r["peak_mem_gb"] for r in rows(d, f"{name}_{v}")), default=None)
    after = rows(d, "speed_q15_after")  # the same prompts in both runs; ~1024 completion tokens each
    tokens = statistics.median(r["prompt_len_mean"] + r["completion_len_mean"] for r in after) * 24 * 8 if after else None
    for v in ("before", "after"):
        t = out[f"q15_train_s_{v}"]
        out[f"q15_mfu_{v}"] = round(6 * Q15_PARAMS * tokens / t / PEAK, 4) if t and tokens else None
        out[f"q15_peak_gb_{v}"] = max((r["peak_mem_gb"] for r in rows(d, f"speed_q15_{v}")), default=None)
    for v in ("before", "after"):  # 16 x 8, 128 new tokens, checkpointing (run_x2.sh train_speed_final; else null)
        out[f"q7_train_s_{v}"] = med(rows(d, f"speed_q7_{v}"), "time_train")
        out[f"q7_peak_gb_{v}"] = max((r["peak_mem_gb"] for r in rows(d, f"speed_q7_{v}")), default=None)
    seeds = [s for s in (0, 1, 2) if rows(d, f"smol_async_seed{s}")]
    out["check_mismatch_median_after"] = med(rows(d, "smol_async_seed0"), "check_mismatch_mean", 2)
    out["check_mismatch_median_after_by_seed"] = {s: med(rows(d, f"smol_async_seed{s}"), "check_mismatch_mean", 2)
                                                  for s in seeds}
    out["reward_81_100_after"] = {s: round(statistics.mean(r["reward_mean"] for r in rows(d, f"smol_async_seed{s}")
                                                           if r["step"] > 80), 4) for s in seeds}
    out["seeds_train_s_after"] = {s: med(rows(d, f"smol_async_seed{s}"), "time_train") for s in seeds}
    out["nonfinite_skips_seeds"] = sum(r.get("nonfinite_skips") or 0 for s in seeds for r in rows(d, f"smol_async_seed{s}"))
    noasync = rows(d, "speed_smol_noasync_after")
    out["smol_noasync_train_s_after_per_step"] = [round(r["time_train"], 3) for r in noasync]
    out["pack_fill_median_after"] = med(noasync, "pack_fill")
    nan = os.path.join(d, "sdpa_nan_check.jsonl")
    if os.path.exists(nan):
        cases = [r for r in map(json.loads, open(nan)) if "grad_q_nonfinite" in r]
        out["sdpa_nan_check"] = {f"{r['mask']}/{r['backend']}": sorted(c["L"] for c in cases if c["mask"] == r["mask"]
                                 and c["backend"] == r["backend"] and c["grad_q_nonfinite"]) for r in cases}
    out["notes"] = {"medians": "steps 4 to the last (check: steps 2-100 of seed 0)",
                    "flop_count": "6 x parameters x (prompt + completion tokens) per step; peak 989.4 TFLOP/s",
                    "tokens_per_step_q15": tokens,
                    "sdpa_nan_check": "key lengths at which cuDNN's / memory-efficient attention's backward gave a "
                                      "non-finite grad_q (results/tools/sdpa_nan_check.py)"}
    for path in (d, TOP) if latest else (d,):
        json.dump(out, open(os.path.join(path, "summary.json"), "w"), indent=1)
    print(json.dumps(out, indent=1))


def seed_metrics(d, out):
    """The three SmolLM2 seeds of a results/h200 run (smol_async_seed{0,1,2}) into out."""
    seeds = [s for s in (0, 1, 2) if rows(d, f"smol_async_seed{s}")]
    out["check_mismatch_median_after"] = {s: med(rows(d, f"smol_async_seed{s}"), "check_mismatch_mean", 2) for s in seeds}
    out["reward_81_100_after"] = {s: round(statistics.mean(r["reward_mean"] for r in rows(d, f"smol_async_seed{s}")
                                                           if r["step"] > 80), 4) for s in seeds}
    out["eval_accuracy_100_after"] = {s: [r["eval_accuracy"] for r in map(json.loads, open(os.path.join(
        d, f"smol_async_seed{s}.metrics.jsonl"))) if r.get("step") == 100 and "eval_accuracy" in r][0] for s in seeds}
    out["nonfinite_skips_seeds"] = sum(r.get("nonfinite_skips") or 0 for s in seeds for r in rows(d, f"smol_async_seed{s}"))


def main_h200(commit, script, before=None):
    """results/h200/train_speed/at-COMMIT/summary.json: `bash results/run_h200.sh train_speed` on one H200 (server
    and trainer colocated; before = d7f3a11's script) and the train_bench runs of the same call (no server); every
    bench_*.json there. script: the commit of the grpo_sglang.py that ran (COMMIT's own unless given); before: the
    commit whose q15 bench is q15_*_before (else the first other bench_q15_at_* by name)."""
    d = os.path.join("results/h200/train_speed", f"at-{commit}")
    out = {"commit": commit, "script_commit": script, "before_commit": "d7f3a11",
           "layout": "one H200: SGLang (MEM_FRACTION 0.3) and the trainer on GPU 0 (--colocate)"}
    for mode in ("async", "noasync"):
        for key in ("time_train", "time_step", "time_rollout"):
            for v in ("before", "after"):
                out[f"smol_coloc_{mode}_{key[5:]}_s_{v}"] = med(rows(d, f"speed_coloc_{mode}_{v}"), key)
        for v in ("before", "after"):
            out[f"smol_coloc_{mode}_peak_gb_{v}"] = round(max(r["peak_mem_gb"] for r in rows(d, f"speed_coloc_{mode}_{v}")), 2)
    out["smol_coloc_step_s_before"], out["smol_coloc_step_s_after"] = (out["smol_coloc_async_step_s_before"],
                                                                       out["smol_coloc_async_step_s_after"])
    seed_metrics(d, out)
    for path in sorted(glob.glob(os.path.join(d, "bench_*.json"))):  # bench_q15_at_e21c2d4: that commit's script
        b, name = json.load(open(path)), os.path.basename(path)[:-5]
        out[name] = {"train_s": round(b["train_s_median"], 4), "mfu": round(b["mfu"], 4),
                     "peak_gb": round(max(s["peak_gb"] for s in b["steps"]), 1),
                     "first_step_s": round(b["steps"][0]["train_s"], 1), "profiled": "--profile" in b["flags"]}
    after = f"bench_q15_at_{script}" if f"bench_q15_at_{script}" in out else "bench_q15"  # unprofiled if there
    out["q15_train_s_after"], out["q15_mfu_after"] = out[after]["train_s"], out[after]["mfu"]
    out["q15_peak_gb_after"], out["q15_after_from"] = out[after]["peak_gb"], after
    before = f"bench_q15_at_{before}" if before else min((k for k in out if k.startswith("bench_q15_at_") and
                                                          k != after), default=None)  # an older script
    out["q15_before_from"] = before
    for k in ("train_s", "mfu", "peak_gb"):
        out[f"q15_{k}_before"] = out[before][k] if before else None
    for v in ("before", "after"):  # the names; one GPU: colocated, --no-async (the server idle meanwhile)
        out[f"smol_train_s_{v}"] = out[f"smol_coloc_noasync_train_s_{v}"]
        out[f"smol_noasync_step_s_{v}"] = out[f"smol_coloc_noasync_step_s_{v}"]
    out["q7_train_s_before"] = out["q7_train_s_after"] = None  # not run: its trainer needs a GPU of its own
    out["notes"] = {"medians": "steps 4 to the last (check: steps 2-100)", "bench": "results/tools/train_phase_bench.py"
                    ", random models of the shapes, no server; medians of steps 4 to the last, profiled steps left out",
                    "flop_count": "6 x parameters x (prompt + completion tokens) per step; peak 989.4 TFLOP/s",
                    "issue_names": "smol_train_s_*, smol_noasync_step_s_*: the colocated --no-async pair (no server "
                                   "GPU of its own on one H200); q15_*_before: q15_before_from (an older commit's "
                                   "script in the same run, not d7f3a11's); q7: not run",
                    "bench_names": "bench_SHAPE_at_C: commit C's grpo_sglang.py (a trailing b: a second run of it); "
                                   "bench_SHAPE: the repo's own at COMMIT; profiled: --profile on some steps, and "
                                   "SmolLM2's steps after a profile can run slower (b3dda67's, this run's)"}
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
    print(json.dumps(out, indent=1))


def main_pair(commit, a, b):
    """results/h200/train_speed/at-COMMIT/summary.json for `run_h200.sh varlen`: COMMIT's script with flag value a
    (before) and b (after) side by side: the colocated async pair speed_coloc_async_{a,b}, three seeds (b, the
    default), and every bench_*.json (bench_SHAPE_a / bench_SHAPE_b, or bench_SHAPE for b)."""
    d = os.path.join("results/h200/train_speed", f"at-{commit}")
    out = {"commit": commit, "pair": [a, b], "layout": "one H200: SGLang (MEM_FRACTION 0.3) and the trainer on GPU 0"}
    for v in (a, b):
        r = rows(d, f"speed_coloc_async_{v}")
        for key in ("time_train", "time_step", "time_rollout", "pack_fill"):
            out[f"smol_coloc_async_{key.replace('time_', '')}_{v}"] = med(r, key)
        out[f"smol_coloc_async_peak_gb_{v}"] = round(max(x["peak_mem_gb"] for x in r), 2)
    seed_metrics(d, out)
    for path in sorted(glob.glob(os.path.join(d, "bench_*.json"))):
        x, name = json.load(open(path)), os.path.basename(path)[:-5]
        out[name] = {"attention": x.get("attention"), "train_s": round(x["train_s_median"], 4), "mfu": round(x["mfu"], 4),
                     "peak_gb": round(max(s["peak_gb"] for s in x["steps"]), 1),
                     "first_step_s": round(x["steps"][0]["train_s"], 1), "profiled": "--profile" in x["flags"],
                     "pack_fill": round(statistics.median(s["pack_fill"] for s in x["steps"]), 4)}
    for v, when in ((a, "before"), (b, "after")):  # the names: a is "before", b "after" (one script)
        out[f"smol_coloc_step_s_{when}"] = out[f"smol_coloc_async_step_{v}"]
        q15 = out.get(f"bench_q15_{v}", {})
        out[f"q15_train_s_{when}"], out[f"q15_mfu_{when}"] = q15.get("train_s"), q15.get("mfu")
        out[f"q15_peak_gb_{when}"] = q15.get("peak_gb")
        for k in ("smol_train_s", "smol_noasync_step_s", "q7_train_s"):
            out[f"{k}_{when}"] = None  # not run in this pipeline
    out["notes"] = {"medians": "steps 4 to the last (check: steps 2-100)", "bench": "results/tools/train_phase_bench.py"
                    ", random models of the shapes, no server; medians of steps 4 to the last, profiled steps left out",
                    "flop_count": "6 x parameters x (prompt + completion tokens) per step; peak 989.4 TFLOP/s",
                    "issue_names": f"*_before: {a}, *_after: {b} (one script, the flag side by side); smol_coloc_step_s: "
                                   "the colocated async pair; q15_*: bench_q15_{a,b} (full rows); smol_train_s, "
                                   "smol_noasync_step_s (--no-async pairs) and q7 (7B shape): not run"}
    json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    if "--pair" in sys.argv:
        i = sys.argv.index("--pair")
        main_pair(sys.argv[1], sys.argv[i + 1], sys.argv[i + 2])
    elif "--h200" in sys.argv:
        opt = lambda name, default: sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default
        main_h200(sys.argv[1], opt("--script", sys.argv[1]), opt("--before", None))
    else:
        main(sys.argv[1], "--latest" in sys.argv)
