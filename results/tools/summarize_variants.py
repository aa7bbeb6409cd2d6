"""results/x2/variants/at-COMMIT/summary.json from the runs of `PHASES=variants bash results/run_x2.sh` at COMMIT
(results/README.md), copied to results/x2/variants/summary.json with --latest: every number comes from a run's
metrics file there, its flags from its config.json (those that differ from the baseline run,
results/x2/layout/at-925f66b/smol_async_seed0.config.json, seed aside).

    python3 results/tools/summarize_variants.py COMMIT [--latest]   # from the repo root, the runs copied there
"""
import json
import os
import statistics
import sys

TOP, BASE = "results/x2/variants", "results/x2/layout/at-925f66b/smol_async_seed0.config.json"
DIR = None  # results/x2/variants/at-COMMIT


def summary(name, base):
    rows = list(map(json.loads, open(os.path.join(DIR, name + ".metrics.jsonl"))))
    steps = [r for r in rows if "reward_mean" in r]
    cfg = json.load(open(os.path.join(DIR, name + ".config.json")))
    flags = {k: v for k, v in cfg.items() if v != base.get(k) and k not in ("out_dir", "server_url", "seed")}
    evals = [r for r in rows if "eval_accuracy" in r]
    mean = lambda rs: round(statistics.mean(r["reward_mean"] for r in rs), 4)
    finite = all(isinstance(r.get(k), (int, float)) and abs(r[k]) < float("inf") for r in steps
                 for k in ("loss", "grad_norm", "reward_mean"))
    checks = [r["check_mismatch_max"] for r in steps if r.get("check_mismatch_max") is not None]
    means = [r["check_mismatch_mean"] for r in steps if r.get("check_mismatch_mean") is not None]
    return {"flags": flags, "steps": len(steps), "reward_first20": mean(steps[:20]), "reward_last20": mean(steps[-20:]),
            "eval_first": evals[0]["eval_accuracy"] if evals else None,
            "eval_final": evals[-1]["eval_accuracy"] if evals else None,
            "check_mismatch_max": round(max(checks), 4) if checks else None, "checks": len(checks),
            "check_mismatch_mean_max": round(max(means), 4) if means else None,
            "step_s": round(statistics.median(r["time_step"] for r in steps[3:]), 4), "finite": finite,
            "nonfinite_skips": sum(r.get("nonfinite_skips", 0) for r in steps),
            "empty_batch_skips": sum(r.get("empty_batch_skips", 0) for r in steps)}


def main(commit, latest):
    base = json.load(open(BASE))
    names = sorted(f[: -len(".metrics.jsonl")] for f in os.listdir(DIR) if f.endswith(".metrics.jsonl"))
    out = {"commit": commit, "runs": {n: summary(n, base) for n in names}}
    out["rising"] = {n: r["reward_last20"] > r["reward_first20"] for n, r in out["runs"].items()}
    out["notes"] = ("SmolLM2-135M-Instruct, built-in task, async, the SMOL flags of run_x2.sh; variant_0..9 40 steps "
                    "each, three at a time (one server each on GPU 1, the trainers on GPU 0), variants_all 100 steps "
                    "beside variant_9: step_s is that of runs sharing both GPUs. reward_* is the training reward "
                    "(reward_mean: shaping and mixes included) over the first and last 20 steps; check_mismatch_max is "
                    "the largest per-token |trainer - server| on the re-scored sequences of any step (same weights), "
                    "check_mismatch_mean_max the largest per-step mean, which stops a run above --mismatch_max 0.1.")
    for d in (DIR, TOP) if latest else (DIR,):
        json.dump(out, open(os.path.join(d, "summary.json"), "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    DIR = os.path.join(TOP, f"at-{sys.argv[1]}")
    main(sys.argv[1], "--latest" in sys.argv)
