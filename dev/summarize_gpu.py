"""The summaries of the GPU runs in results/: each results/**/summary.json is summarize() of its folder's raw files,
one function for any folder that dev/run_gpu.sh fills ($RES): each training run's NAME.log and NAME.metrics.jsonl,
the tools' json, pipeline.log and versions.txt (subfolders, such as one per call, likewise). Per run: its command and
exit (pipeline.log), its log's header, per-step medians and ranges, the means of the first and last steps, the
evaluations, the sync check's numbers over all steps, the samples and the error it stopped on; per folder: the
versions and machine (versions.txt), what pipeline.log says, each tool's json.

The raw files are not in the tree: each summary names the commit that holds them ("raw_files_at"; "raw_folders": the
folders under results/ it reads, where they are not its own), and this reads them there (git archive). A summary that
names no commit is computed from the files in its folder (a new run's, before they leave the tree).

    python dev/summarize_gpu.py --check [FOLDER ...]   # recompute each summary, compare with the tree's; write nothing
    python dev/summarize_gpu.py [FOLDER ...]           # rewrite them (default: every summary under results/)
    python dev/summarize_gpu.py --at SHA FOLDER ...    # read the raw files at commit SHA, and record it

FOLDER: a folder of results/ (results/h100/calls_1206c), or its summary.json. A new run: copy its $RES into
results/<folder>/, commit it, `git rm -r` the raw files, then `python dev/summarize_gpu.py --at HEAD results/<folder>`
(HEAD still holds them) and commit the summary. It needs git and a clone with history (a shallow one lacks the
commits: git fetch --unshallow).
"""
import argparse
import glob
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
RESULTS = os.path.join(ROOT, "results")
STEP_LINE = re.compile(r"^step +(\d+) \|(.*)$", re.M)
ALL_STEPS = ("check_mismatch_mean", "check_mismatch_max", "mismatch_mean", "mismatch_max", "staleness_mean", "is_ess",
             "improbable_identical_groups", "weights_checked", "sampled_from_version", "peak_mem_gb")  # the sync check
PROGRESS = ("reward_mean", "accuracy", "turns_mean")  # means of the first and last 10 and 20 steps


def sig(x):
    """A float to 5 significant digits (ints, strings and None as they are)."""
    return float(f"{x:.5g}") if isinstance(x, float) else x


def spread(xs):
    """-> [median, min, max], 5 significant digits."""
    return [sig(st.median(xs)), sig(min(xs)), sig(max(xs))]


def compact(v):
    """A tool's json, its numbers to 5 significant digits; a list of more than 10 numbers as its count, median and
    range; a list of more than 10 records as its count."""
    if isinstance(v, dict):
        return {k: compact(x) for k, x in v.items()}
    if isinstance(v, list) and len(v) > 10 and all(isinstance(x, (int, float)) for x in v):
        return {"n": len(v), "median_min_max": spread(v)}
    if isinstance(v, list) and len(v) > 10 and any(isinstance(x, (dict, list)) for x in v):
        return {"records": len(v)}
    return [compact(x) for x in v] if isinstance(v, list) else sig(v)


def rows_of(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def rows_of_log(log):
    """A run without metrics.jsonl: its log's step lines as rows ('rollout 0.76s' -> time_rollout 0.76)."""
    rows = []
    for step, rest in STEP_LINE.findall(log):
        r = {"step": int(step)}
        for key, value, s in re.findall(r"\b([a-z]+) (-?[\d.]+)(s?)(?= |$)", rest):
            r["time_" + key if s else key] = float(value)
        rows.append(r)
    return rows


def run(rows, log, pipeline, name):
    """One training run (its metrics.jsonl's rows, its log, the pipeline.log of its call) -> its summary."""
    steps = [r for r in rows if "reward_mean" in r or "time_step" in r]
    skip = 3 if len(steps) > 4 else min(1, len(steps) - 1)  # warm-up steps left out of medians
    numbers = lambda rs, k: [r[k] for r in rs if isinstance(r.get(k), (int, float)) and not isinstance(r[k], bool)]
    keys = sorted({k for r in steps for k in r if k != "step" and numbers([r], k)})
    out = {"command": next(iter(re.findall(rf"^(?:\[[\d:]+\] )?{re.escape(name)}: ((?!exit ).*)$", pipeline, re.M)),
                           None),
           "exit": next(iter(re.findall(rf"^(?:\[[\d:]+\] )?{re.escape(name)}: (exit .*?)(?::|$)", pipeline, re.M)),
                        None),
           "header": [line[:240] for line in log.split("\n", 400)[:400] if re.match(r"[a-z][\w ]*: ", line)
                      and "it/s" not in line and not line.startswith("eval step")][:12],
           "steps": len(steps), "last_step": steps[-1]["step"] if steps else None,
           f"steps_{skip + 1}_on": {k: spread(numbers(steps[skip:], k)) for k in keys if numbers(steps[skip:], k)},
           "all_steps": {k: spread(numbers(steps, k)) for k in ALL_STEPS if numbers(steps, k)},
           "totals": {k: sig(float(sum(numbers(steps, k)))) for k in keys if k.startswith("time_")}}
    n = len(steps)
    out["means"] = {k: {f"{a + 1}-{b}": sig(float(st.mean(numbers(steps[a:b], k))))
                        for a, b in ((0, 10), (n - 10, n), (0, 20), (n - 20, n)) if a >= 0 and numbers(steps[a:b], k)}
                    for k in PROGRESS if numbers(steps, k) and n >= 10}
    evals = [r for r in rows if "eval_accuracy" in r]
    out["eval"] = ({k[5:]: {r["step"]: sig(r[k]) for r in evals if k in r} for k in evals[0] if k.startswith("eval_")}
                   if evals else {"accuracy": {int(s): float(a) for s, a in
                                               re.findall(r"^eval step (\d+): accuracy ([\d.]+)", log, re.M)}})
    per_task = {}
    for s, task, a in re.findall(r"^eval step (\d+) \(--task (\w+)\): accuracy ([\d.]+)", log, re.M):
        per_task.setdefault(task, {})[int(s)] = float(a)
    out["eval_per_task"] = per_task
    samples, step = {}, 0
    for line in log.splitlines():
        m = STEP_LINE.match(line) or re.match(r"  sample \(reward ([^)]*)\): (.*)", line)
        if m and m.re is STEP_LINE:
            step = int(m.group(1))
        elif m:
            samples[f"step {step}, reward {m.group(1)}"] = m.group(2)[:240]
    out["samples"] = samples
    out["stopped"] = next(iter(re.findall(r"^(?:\s*traceback : )?(error: .*)", log, re.M)[-1:]), "")[:400] or None
    return out


def summarize(folder):
    """A folder of raw files -> its summary: {"calls": {subfolder ('.' for the folder itself): its versions,
    pipeline.log, runs and files}}."""
    calls = {}
    for d, subs, files in sorted(os.walk(folder)):
        subs.sort()
        names = set(files) - ({"summary.json"} if d == folder else set())
        if not names:
            continue
        text = lambda f: open(os.path.join(d, f), errors="replace").read()
        pipeline = "".join(text(f) for f in sorted(names) if f.startswith("pipeline") and f.endswith(".log"))
        call = {"versions": text("versions.txt").strip().splitlines() if "versions.txt" in names else None,
                "pipeline": [re.sub(r"^\[[\d:]+\] ", "", line)[:400] for line in pipeline.splitlines()],
                "runs": {}, "files": {}}
        rows_file = re.compile(r"\.(metrics|steps)\.jsonl$")  # (steps: TRL's, dev/trl_grpo.py)
        jsonl = {rows_file.sub("", f): f for f in names if rows_file.search(f)}
        logs = {f[:-4]: text(f) for f in names if f.endswith(".log") and not f.startswith("pipeline")}
        for name in sorted(set(jsonl) | {n for n, log in logs.items() if STEP_LINE.search(log)}):
            log = logs.pop(name, "")
            rows = rows_of(os.path.join(d, jsonl[name])) if name in jsonl else rows_of_log(log)
            call["runs"][name] = run(rows, log, pipeline, name)
        for f in sorted(names - set(jsonl.values()) - {"versions.txt"}):
            if f.endswith(".json"):
                call["files"][f] = compact(json.load(open(os.path.join(d, f))))
            elif f[:-4] in logs:  # a tool's log: its last line
                call["files"][f] = (logs[f[:-4]].strip().splitlines() or [""])[-1][:400]
            elif f.endswith(".txt"):  # nvidia-smi's samples (MiB), or text
                words = text(f).split()
                call["files"][f] = (compact([int(w) for w in words]) if words and all(w.isdigit() for w in words)
                                    else text(f).strip().splitlines()[:20])
        calls[os.path.relpath(d, folder)] = call
    return {"calls": calls}


class Error(Exception):
    """A problem this tool explains in one line (the command line prints it, without a traceback)."""


def git(*args):
    try:
        p = subprocess.run(["git", "-C", ROOT, *args], capture_output=True)
    except FileNotFoundError:
        raise Error("git is not installed: the raw files of the GPU runs are read from git's history")
    if p.returncode:
        raise Error(f"git {' '.join(args)}: {p.stderr.decode().strip()}")
    return p.stdout


def commit_of(sha):
    """The full hash of commit `sha`, or None when this clone lacks it (or is no clone, or git is missing)."""
    try:
        p = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"],
                           capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def summaries():
    """The folders (under results/) that hold a summary.json."""
    return sorted(os.path.relpath(os.path.dirname(p), RESULTS)
                  for p in glob.glob(os.path.join(RESULTS, "**", "summary.json"), recursive=True))


def in_tree(folder):
    path = os.path.join(RESULTS, folder, "summary.json")
    return json.load(open(path)) if os.path.exists(path) else None


def raw_files(folders, sha, into):
    """Write `folders` (under results/) as commit `sha` holds them under `into`/results/ -> that results folder."""
    tar = git("archive", "--format=tar", sha, "--", *[f"results/{f}" for f in folders])
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return os.path.join(into, "results")


def summary_of(folder, res, raw_folders):
    """The summary of `folder`'s raw files under the results folder `res` (its raw_folders', where it names them)."""
    if not raw_folders:
        return summarize(os.path.join(res, folder))
    calls = {}
    for f in raw_folders:
        for sub, call in summarize(os.path.join(res, f))["calls"].items():
            calls[os.path.normpath(os.path.join(os.path.relpath(f, folder), sub))] = call
    return {"calls": calls}


def recompute(folder, at=None):
    """-> (the summary in the tree or None, the summary computed from the raw files at commit `at` (default: the
    commit the summary names; none named: the files in the tree), with its raw_files_at)."""
    there = in_tree(folder) or {}
    sha, raw_folders = at or there.get("raw_files_at"), there.get("raw_folders")
    head = {"raw_folders": raw_folders} if raw_folders else {}
    if not sha:
        if not os.path.isdir(os.path.join(RESULTS, folder)):
            raise Error(f"results/{folder} is no folder")
        return there or None, json.loads(json.dumps(summary_of(folder, RESULTS, raw_folders)))
    full = commit_of(sha)
    if full is None:
        raise Error(f"--at {at}: no such commit in this clone" if at else
                    f"results/{folder}/summary.json: its raw files are at commit {sha[:7]}, which is not here (a "
                    f"shallow clone: git fetch --unshallow; a copy without .git, or no git: clone the repository)")
    with tempfile.TemporaryDirectory(prefix="raw_files_") as tmp:
        res = raw_files(raw_folders or [folder], full, tmp)
        got = summary_of(folder, res, raw_folders)
    if not got["calls"]:
        raise Error(f"results/{folder}: commit {full[:7]} holds no raw files there")
    return there or None, json.loads(json.dumps({"raw_files_at": full, **head, **got}))  # (keys as a file holds them)


def dumps(summary):
    """JSON, one value a line, short lists on one line."""
    text = json.dumps(summary, indent=1, ensure_ascii=False)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",\n"))
                  + "]" if len(m.group(0)) < 200 else m.group(0), text) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="*", help="folders of results/ (default: every one with a summary.json)")
    ap.add_argument("--check", action="store_true", help="compare with the summaries in the tree; write nothing")
    ap.add_argument("--at", help="read the raw files at this commit, and record it in the summaries")
    a = ap.parse_args(argv)
    if a.at and not a.folders:
        ap.error("--at SHA: name the folders whose raw files that commit holds")
    folders = [os.path.relpath(os.path.abspath(f[:-len("summary.json")] if f.endswith("summary.json") else f), RESULTS)
               for f in a.folders] or summaries()
    outside = [f for f in a.folders if os.path.relpath(os.path.abspath(f), RESULTS).startswith("..")]
    if outside:
        ap.error(f"{', '.join(outside)}: not under results/ (a folder such as results/h100/calls_1206c)")
    differ = []
    try:
        for folder in folders:
            there, got = recompute(folder, a.at)
            if a.check:
                differ += [] if there == got else [folder]
                print(f"results/{folder}: {'the same' if there == got else 'DIFFERS from its summary.json'}")
                continue
            os.makedirs(os.path.join(RESULTS, folder), exist_ok=True)  # (git rm took the folder with its raw files)
            open(os.path.join(RESULTS, folder, "summary.json"), "w").write(dumps(got))
            print(f"results/{folder}: wrote summary.json")
    except Error as e:
        sys.exit(f"error: {e}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
