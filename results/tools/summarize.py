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

COMMIT = "9c31301"  # the commit results/run_x2.sh ran (see results/x2/pipeline.log)


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
    if m:
        return int(m.group(1)) + 1  # the rollout of step v+1 must come from the weights after step v
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
                 "medians of steps 4-12; the async run finished but its metrics.jsonl was not copied before the device "
                 "time ran out, so its numbers come from its log"),
           {"model": "Qwen2.5-7B-shaped, random weights", "sync_step_s": None, "async_step_s": None, "rollout_s": None,
            "train_s": None, "sync_s": None, "sync_eval_final": None, "async_eval_final": None,
            "note": "not run: the session's 30 minutes of device time ran out before phase D reached it"},
           model("SmolLM2-135M-Instruct, ONE shared GPU (--colocate), 30 steps", "results/h200/check_v2/coloc_sync",
                 "results/h200/check_v2/coloc_async")]
    json.dump(out, open(d + "summary.json", "w"), indent=1)
    subprocess.run([sys.executable, "results/tools/plot_timeline.py", d + "timeline.png",
                    f"sync={d}x2_smol_sync.metrics.jsonl", f"async={d}x2_smol_async.metrics.jsonl", "--steps", "20:25"], check=True)
    return out


def sync():
    bench = json.load(open("results/x2/sync/bench_smol/summary.json"))
    out = [{k: b[k] for k in ("model", "bytes", "disk_s", "tensor_s", "nccl_s", "raw_copy_s")} for b in bench]
    out[0]["model"] = "SmolLM2-135M-Instruct (trainer GPU 0, server GPU 1)"
    for m in ("Qwen2.5-1.5B-shaped, random weights", "Qwen2.5-7B-shaped, random weights"):
        out.append({"model": m, "bytes": None, "disk_s": None, "tensor_s": None, "nccl_s": None, "raw_copy_s": None,
                    "note": "not run: the session's device time ran out before phase D's bench"})
    json.dump(out, open("results/x2/sync/summary.json", "w"), indent=1)
    return out


if __name__ == "__main__":
    for f in (check_v2, asynchronous, sync):
        print(f.__name__, json.dumps(f(), indent=1)[:2500])
