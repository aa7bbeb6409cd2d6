"""Tests of the maintainers' tools in dev/. test_smoke.py tests the trainer and imports nothing from here: a copy
without dev/ passes it. This file borrows test_smoke's helpers (the tiny model, the stand-in server, run()) and covers
the tools that run the trainer (negative_control.py's faults, LoRA's too; profile_train.py; fit_bench.py and
train_phase_bench.py), the README's size claims and test_smoke.py's map of the story, and the GPU results
(summarize_gpu.py's summaries, the sync check's rule replayed on the runs).

    python -m pytest -q dev/test_dev.py                  # from the repo root
"""
import glob
import json
import os
import re
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from test_smoke import (LORA, g, held_differ, read_metrics, run, run_against, server, tiny_model,  # noqa: E402,F401
                        train_cmd)

DEV = os.path.join(ROOT, "dev")
sys.path.insert(0, DEV)


# ---------------------------------------------------------------------------------------------
# the tools that run the trainer

@pytest.mark.parametrize("flags, checker, says", [
    (("--skip", "2"), True, "sampled with weights of version '1', but this rollout must come from version '2'"),
    (("--skip", "2-6", "--tag_skipped"), True, "version 2 (the weights after step 2), the server at {url} holds other "
                                               "weights than the trainer pushed: 20 of 20 "),
    (("--half", "2"), True, "the trainer pushed: 10 of 20 tensors differ"),
    (("--skip", "2-6", "--tag_skipped"), False, "weight sync check failed at step 3: the server at {url} had the")])
def test_the_negative_controls_of_the_gpu_runs_stop_where_they_should(tiny_model, tmp_path, flags, checker, says):
    """The tool's faults stop the run at the next step; --half: the 10 of 20 tensors it left out (all moved)."""
    tool = os.path.join(DEV, "negative_control.py")
    code, out, _, s = run_against(tiny_model, tmp_path, {"checker": checker}, "--steps", "6", tool=(tool, *flags))
    assert code == 1 and says.format(url=s.url) in out and "negative control: the push of version 2" in out, out
    assert [r["step"] for r in read_metrics(tmp_path) if "reward_mean" in r] == [1, 2]
    assert held_differ(s, tmp_path)[0] == (10 if "--half" in flags else 20)  # the server's tensors, independently


@pytest.mark.parametrize("checker", [True, False])
def test_lora_a_server_sampling_from_the_base_model_is_caught(tiny_model, tmp_path, checker):
    """negative_control.py --base_only: from the push of version 2 on, the server gets the base model's weights (the
    adapters left out) under the right tag: the weight check stops the run at step 3, before it trains on that
    batch; without /weights_checker the log-prob check stops it too, once the adapters moved the policy."""
    code, out, _, s = run_against(tiny_model, tmp_path, {"checker": checker}, *LORA, "--steps", "12",
                                  tool=(os.path.join(DEV, "negative_control.py"), "--base_only", "2-12", "--"))
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert code == 1 and out.count("error: weight sync check failed") == 1 and "Traceback" not in out, out
    assert ("version 2 (the weights after step 2), the server at " in out and "holds other weights than the trainer "
            "pushed: 14 of 20 tensors differ" in out
            if checker else "had the right version tag" in out and "it does not generate with the weights" in out)
    assert len(m) == 2 if checker else 2 <= len(m) < 12


def test_the_profile_tool_profiles_the_steps_it_is_asked_for(tiny_model, server, tmp_path):
    cmd = train_cmd(tiny_model, server.url, tmp_path / "run", "--steps", "4", "--eval_every", "0")
    tool = os.path.join(DEV, "profile_train.py")
    code, out = run([cmd[0], tool, "--out", str(tmp_path / "prof"), "--profile_steps", "1-2", *cmd[2:]], timeout=180)
    summary = json.load(open(tmp_path / "prof" / "summary.json"))
    assert code == 0 and len(summary["train_wall_s_per_step"]) == 2 and summary["top_cpu_total_s_per_step"], out
    assert "Self CPU" in (tmp_path / "prof" / "ops_by_cpu.txt").read_text()
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "reward_mean" in r] == [1, 2, 3, 4]


def test_the_play_tool_plays_the_first_held_out_rows_greedily_with_the_servers_weights(tiny_model, server, tmp_path):
    """dev/play.py's episodes (the README's episode before and after training) are the task's first held-out rows, in
    order, played greedily (the same twice), each marked right or wrong by the task's own check."""
    cfg = g.Config(model=tiny_model, dataset="builtin", task="python", max_new_tokens=64, max_reply_tokens=32)
    _, _, evals, tasks = g.load_data(cfg)
    got = []
    for k in range(2):
        code, out = run([sys.executable, os.path.join(DEV, "play.py"), "--model", tiny_model, "--url", server.url,
                         "--rows", "3", "--max_new_tokens", "64", "--max_reply_tokens", "32",
                         "--out", str(tmp_path / f"{k}.json")], timeout=180)
        assert code == 0 and "play: 0 of 3 right (server weights default)" in out, out
        got.append(json.load(open(tmp_path / f"{k}.json")))
    assert got[0] == got[1] and [e["answer"] for e in got[0]] == [r["answer"] for r in evals[:3]]
    assert all(r["question"] in e["messages"][0]["content"] for e, r in zip(got[0], evals))
    assert all(e["correct"] == tasks["python"].correct(e["messages"][-1]["content"], e["answer"]) for e in got[0])


def test_the_benchmark_tools_run_the_trainers_step_on_a_tiny_shape(tmp_path):
    """dev/fit_bench.py (what fits my GPU) and dev/train_phase_bench.py run the trainer's own step on made-up
    rollouts (through sequences(), as a real batch): on the CPU, a tiny Llama (2 layers, 64 wide, MLP 128, 4 heads of
    16, 2 KV heads), each variant its steps; LoRA 16 trains r x (in + out) per adapted Linear and nothing else.
    (fit_bench.py at train_phase_bench.py's tiny batch, 4 x 4 of 64 tokens, not the quick start's 16 x 8 of 128:
    its steps took 5 s of the test's 13-19 s.)"""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1"]
    small = ["--prompts_per_step", "4", "--group_size", "4", "--max_new_tokens", "64", "--micro_batch", "8"]
    code, out = run(torchrun + [os.path.join(DEV, "fit_bench.py"), "--shape", "tiny", "--models",
                                str(tmp_path), "--steps", "2", "--variants", "full,lora_ckpt", "--out",
                                str(tmp_path / "fit.json"), "--", *small], timeout=240)
    assert code == 0, out[-3000:]
    fit = json.load(open(tmp_path / "fit.json"))["variants"]
    linears = [(64, 64), (64, 32), (64, 32), (64, 64), (64, 128), (64, 128), (128, 64)]  # q k v o gate up down
    assert fit["lora_ckpt"]["trainable"] == 2 * sum(16 * (i + o) for i, o in linears)
    assert fit["full"]["trainable"] == fit["full"]["params"] == fit["lora_ckpt"]["params"] - fit["lora_ckpt"]["trainable"]
    assert all(len(v["steps"]) == 2 and v["seconds_median"] > 0 and v["flags"][-8:] == small for v in fit.values())
    code, out = run(torchrun + [os.path.join(DEV, "train_phase_bench.py"), "--shape", "tiny", "--models",
                                str(tmp_path), "--steps", "2", "--out", str(tmp_path / "phase.json")], timeout=240)
    assert code == 0, out[-3000:]
    phase = json.load(open(tmp_path / "phase.json"))
    assert len(phase["steps"]) == 2 and all(s["tokens"] > 0 and s["grad_norm"] > 0 for s in phase["steps"])


# ---------------------------------------------------------------------------------------------
# the GPU results: the summaries and the runs behind them

def summaries():
    """{folder of results/: its summary.json}, or a skip where this clone lacks the commits that hold the runs' raw
    files (a shallow clone; a copy without .git)."""
    import summarize_gpu as sg
    got = {folder: sg.in_tree(folder) for folder in sg.summaries()}
    lacking = sorted({s["raw_files_at"][:7] for s in got.values() if s.get("raw_files_at")
                      and sg.commit_of(s["raw_files_at"]) is None})
    if lacking:
        pytest.skip(f"the GPU runs' raw files are in git's history, at {', '.join(lacking)}, which this clone lacks "
                    f"(a shallow clone, or a copy without .git): git fetch --unshallow")
    return got


@pytest.fixture(scope="module")
def raw_results(tmp_path_factory):
    """{folder: a results/ folder holding the raw files its summary reads, out of git at the commit it names}."""
    import summarize_gpu as sg
    return {f: sg.raw_files(s.get("raw_folders") or [f], s["raw_files_at"], str(tmp_path_factory.mktemp("raw")))
            for f, s in summaries().items()}


def test_the_gpu_summaries_are_computed_from_the_runs_files():
    """Every summary.json under results/ (where the GPU numbers of the README and docs come from) is what
    dev/summarize_gpu.py computes from its runs' raw files, read out of git at the commit the summary names
    (raw_files_at, a full hash; the raw files are not in the tree): a summary edited by hand, or left behind when its
    runs were replaced, fails here; so does one that names no commit."""
    import summarize_gpu as sg
    for folder, there in summaries().items():
        assert re.fullmatch(r"[0-9a-f]{40}", there.get("raw_files_at", "")), (
            f"results/{folder}/summary.json names no commit of its raw files (raw_files_at, a full hash): commit them, "
            f"git rm them, then python dev/summarize_gpu.py --at HEAD results/{folder} (dev/README.md)")
        tree, got = sg.recompute(folder)
        differ = sorted(k for k in set(got["calls"]) | set(tree["calls"]) if got["calls"].get(k) != tree["calls"].get(k))
        assert got == tree, f"results/{folder}/summary.json is not what its raw files give; these calls differ: {differ}"


def test_a_run_gpu_folder_is_summarized_from_its_files(tmp_path):
    """What dev/run_gpu.sh leaves in $RES (a run's log and metrics.jsonl, pipeline.log, versions.txt, a tool's json,
    nvidia-smi's samples), made here: the summary has the run's command and exit, medians and ranges of steps 4 on, the
    sync check over all steps, the means of its first and last steps, its evaluations (per task too), the error it
    stopped on; the tool's numbers; each value computed here by hand."""
    import summarize_gpu as sg
    rows = [{"step": 0, "eval_accuracy": 0.25}] + [
        {"step": k, "reward_mean": k / 20, "accuracy": k / 40, "time_step": [9.0, 1.0, 1.0, 0.5, 0.7, 0.6][k % 6],
         "check_mismatch_mean": 0.01 * k, "sampled_from_version": k - 1} for k in range(1, 21)]
    rows.append({"step": 20, "eval_accuracy": 0.75})
    (tmp_path / "calc.metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "calc.log").write_text("task: calculator\nstep    1 | reward 0.05\n  sample (reward 1): 'calc: 2 * 3'\n"
                                       "eval step 20 (--task calculator): accuracy 0.750\n"
                                       "  traceback : error: weight sync check failed at step 21: the server ...\n")
    (tmp_path / "pipeline.log").write_text("[10:00:00] calc: torchrun grpo_sglang.py --task calculator\n"
                                           "[10:01:00] calc: exit 1 after 60 s: step 20 | reward 1.0\n")
    (tmp_path / "versions.txt").write_text("python 3.12 | sglang 0.5.16\nNVIDIA H100, 580.159, 81559 MiB\n")
    (tmp_path / "turn_cost.json").write_text(json.dumps({"ratio": 2.123456, "times": list(range(12))}))
    (tmp_path / "gpu_mib.txt").write_text("100\n300\n200\n")
    call = sg.summarize(str(tmp_path))["calls"]["."]
    run = call["runs"]["calc"]
    assert call["versions"][1] == "NVIDIA H100, 580.159, 81559 MiB"
    assert run["command"] == "torchrun grpo_sglang.py --task calculator" and run["exit"] == "exit 1 after 60 s"
    later = [[9.0, 1.0, 1.0, 0.5, 0.7, 0.6][k % 6] for k in range(4, 21)]
    assert run["steps"] == 20 and run["steps_4_on"]["time_step"] == [sorted(later)[8], 0.5, 9.0]
    assert run["all_steps"]["check_mismatch_mean"] == [0.105, 0.01, 0.2]
    assert run["means"]["reward_mean"] == {"1-10": 0.275, "11-20": 0.775, "1-20": 0.525}
    assert run["totals"]["time_step"] == 40.4  # steps 1-18: 3 x (1 + 1 + 0.5 + 0.7 + 0.6 + 9); 19, 20: 1 + 1
    assert run["eval"]["accuracy"] == {0: 0.25, 20: 0.75} and run["eval_per_task"] == {"calculator": {20: 0.75}}
    assert run["stopped"].startswith("error: weight sync check failed at step 21")
    assert run["samples"] == {"step 1, reward 1": "'calc: 2 * 3'"} and run["header"] == ["task: calculator"]
    assert call["files"]["turn_cost.json"] == {"ratio": 2.1235, "times": {"n": 12, "median_min_max": [5.5, 0, 11]}}
    assert call["files"]["gpu_mib.txt"] == [100, 300, 200]


def test_the_what_fits_table_is_computed_from_the_summaries():
    """The README's "what fits my GPU" table (README.md or docs/): each model's row is the smallest GPU that
    dev/fit_bench.py --table derives from results/h200/fit's and h200/lora's summaries."""
    import fit_bench
    read = lambda f: json.load(open(os.path.join(ROOT, "results", "h200", f, "summary.json")))
    fits = fit_bench.what_fits(read("fit"), read("lora"))
    docs = [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md"))
    text = "\n".join(open(p).read() for p in docs)
    for shape, name in (("q05", "0.5B"), ("q15", "1.5B"), ("q3", "3B")):
        row = re.search(rf"^\| Qwen2\.5-{re.escape(name)} \|(.*)\|$", text, re.M)
        assert row, f"no row of Qwen2.5-{name} in the README's or docs' table of what fits"
        said = [c.strip() for c in row.group(1).split("|")]
        want = [fits[shape][v]["smallest_gpu"].split()[0] for v in ("full", "full_ckpt", "lora", "lora_ckpt")]
        assert said == want, f"the table's row of Qwen2.5-{name} says {said}; the summaries give {want}"


def test_sync_check_replayed_on_the_recorded_gpu_runs(raw_results):
    """The stop rule (each rollout from exactly its version; trainer and server under the same weights within
    --mismatch_max: the batch mismatch where a run logged nothing else, the re-scored check where it did) replayed
    over every recorded GPU run: no correct push stops a run, and the negative controls stop exactly where they did
    on the GPU (the weight hashes' at the very next step). The async run at lr 5e-5 is one the rule before the
    re-scored check (the batch mismatch) stopped. The runs are read out of git at the commits their summaries name."""
    limit = g.Config.mismatch_max

    def replay(path, old_rule=False):
        """-> the first step that the rule stops, or None."""
        rows = [r for r in map(json.loads, open(path)) if "reward_mean" in r]
        saved = path.replace(".metrics.jsonl", ".config.json")  # the run's flags, where it kept them
        said = re.search(r"rollouts: (a?sync)", open(path.replace(".metrics.jsonl", ".log")).read())  # its log
        async_run = (json.load(open(saved))["async_"] if os.path.exists(saved) else said.group(1) == "async" if said
                     else "async" in os.path.basename(path) or "nccl_hidden" in path)
        for r in rows:
            want = max(r["step"] - 2, 0) if async_run else r["step"] - 1
            seen = r["mismatch_mean"] if old_rule else r.get("check_mismatch_mean", r["mismatch_mean"])
            if r["sampled_from_version"] != want or (seen is not None and seen > limit):
                return r["step"]
        log = open(path.replace(".metrics.jsonl", ".log")).read()  # the step that stopped, never logged as a row
        m = re.search(r"by ([\d.]+) nats on average", log)
        if m and float(m.group(1)) > limit:
            return rows[-1]["step"] + 1
        m = re.search(r"with weights of version '(\d+)', but this (?:rollout|check) must come from version '(\d+)'", log)
        if m:
            return int(m.group(2)) + 1
        m = re.search(r"holds other weights than the trainer sent in the push of version (\d+)", log)  # the hashes
        if m:  # (before 5377a06: after the push, so the next step stops)
            return int(m.group(1)) + 1
        m = re.search(r"after the rollout sampled from version (\d+)", log)  # (since: the step that trains on it)
        return int(m.group(1)) + (2 if async_run else 1) if m else None
    folder = lambda f: os.path.join(raw_results[f], f)  # a folder of runs, at its commit
    h200 = [f for f in raw_results if f.startswith("h200/")]
    runs = [r for f in h200 for r in glob.glob(os.path.join(folder(f), "*.metrics.jsonl"))] + glob.glob(
        os.path.join(raw_results["x2"], "x2", "check_async", "*.metrics.jsonl"))
    negative = ("check_v2_", "neg_", "dropped_", "base_only", "episodes_dropped_", "reload")  # the controls, below
    good = [p for p in runs if not os.path.basename(p).startswith(negative) or "check_v2_main" in p]
    assert len(good) >= 26, good  # 300 steps, lr 5e-5 async, the three seeds of the curve, lr 1e-5 and 1e-6, ...
    for path in good:
        assert replay(path) is None, path
    check = folder("h200/check_v2")
    assert replay(os.path.join(check, "check_v2_skip_one.metrics.jsonl")) == 7  # push after step 6 skipped
    assert replay(os.path.join(check, "check_v2_stop_syncing.metrics.jsonl")) == 5  # no push after step 4
    assert replay(os.path.join(check, "check_v2_dropped_tagged.metrics.jsonl")) == 18  # tag kept, weights dropped
    main = [r["mismatch_mean"] for r in map(json.loads, open(os.path.join(check, "check_v2_main.metrics.jsonl"))) if "mismatch_mean" in r]
    assert len(main) == 300 and max(main) < limit / 3  # the limit is over 3x the worst correct step of 300
    ca = os.path.join(raw_results["x2"], "x2", "check_async")  # async, lr 5e-5: the same controls, and the old rule's false alarm
    assert [replay(os.path.join(ca, f"neg_async_{n}.metrics.jsonl")) for n in ("skip_one", "stop_syncing", "dropped_tagged")] == [7, 5, 6]
    assert replay(os.path.join(ca, "async_lr5e-5.metrics.jsonl")) is None
    assert replay(os.path.join(ca, "async_lr5e-5.metrics.jsonl"), old_rule=True) == 4
    lora = folder("h200/lora")  # LoRA: the pushes from version 10 on the base's weights
    assert replay(os.path.join(lora, "base_only.metrics.jsonl")) == 11
    trust = folder("h200/trust")  # the weight hashes: the push after step 11 dropped
    assert [replay(os.path.join(trust, f"dropped_{n}.metrics.jsonl")) for n in ("tag_kept", "half")] == [12, 12]
    episodes = folder("h200/episodes")  # episodes: pushes dropped after version 6, tag kept
    assert replay(os.path.join(episodes, "episodes_dropped_tag_kept.metrics.jsonl")) == 7
    reload = folder("h200/rollout_check")  # another client reloads from disk after step 10
    assert replay(os.path.join(reload, "reload.metrics.jsonl")) == 12  # async: step 12 trains on version 10's rollout


# ---------------------------------------------------------------------------------------------
# the README's numbers and test_smoke.py's map of the story (a student's hack that adds lines or a function above the
# fence keeps test_smoke.py green; these are the maintainers' to keep true)

def test_the_readmes_size_claims_are_the_files():
    """The README's "the first ~N lines of grpo_sglang.py": N is where the fence is, within a few lines. It is the
    README's only count of lines: a count no test checks (the file's length was one, 2,870 against 2,896) drifts."""
    readme = " ".join(open(os.path.join(ROOT, "README.md")).read().split())
    claim = re.search(r"the first ~([\d,]+) lines of `grpo_sglang.py`", readme)
    assert claim, "README.md no longer says how long the story is: 'the first ~N lines of `grpo_sglang.py`'"
    lines = open(os.path.join(ROOT, "grpo_sglang.py")).read().splitlines()
    fence = next(i for i, line in enumerate(lines, 1) if line.startswith("# ---- Plumbing below"))
    assert abs(int(claim.group(1).replace(",", "")) - fence) <= 5, (
        f"README.md says the story is the first ~{claim.group(1)} lines of grpo_sglang.py, but its fence is at line "
        f"{fence}: update the README's number")
    counts = re.findall(r"[\d,]+ lines\b|\([\d,]+ in all\)", readme)
    assert counts == [f"{claim.group(1)} lines"], (f"README.md counts lines where no test checks them: {counts[1:]}: "
                                                   f"drop those counts, or check them here")


def test_the_test_index_maps_every_function_of_the_story():
    """test_smoke.py's docstring map (`  NAME -> -k words`) has a line for each function and class above
    grpo_sglang.py's fence, so a reader finds the tests of each piece of the story."""
    import ast
    import test_smoke
    mapped = {f for fs, _ in re.findall(r"^  ([\w, ]+) -> (.+)$", test_smoke.__doc__, re.M) for f in fs.split(", ")}
    src = open(os.path.join(ROOT, "grpo_sglang.py")).read()
    fence = next(i for i, line in enumerate(src.splitlines(), 1) if line.startswith("# ---- Plumbing below"))
    story = [n.name for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.lineno < fence]
    lacking = [f for f in story if f not in mapped]
    assert story and not lacking, (f"test_smoke.py's docstring map lacks these functions above grpo_sglang.py's fence: "
                                   f"{lacking}: add a line `  NAME -> WORDS` to it (WORDS: -k words of the tests that "
                                   f"check it, joined by ' or ')")


# ---------------------------------------------------------------------------------------------
# the mutation list and the paths the docs name

def test_every_mutation_breaks_a_line_its_file_holds_and_names_tests_that_exist(request):
    """dev/mutation_check.py breaks the first place its pattern is found in the file an entry names, and says "??
    pattern not found" only when someone runs it (30 minutes): an entry whose line was rewritten, or whose file moved,
    is a check that silently stopped. Every entry: its file exists and holds its pattern, the break changes it, its
    name is its own, and its -k expression selects tests of test_smoke.py or dev/test_dev.py (the tests this session
    collected, where they select some for every entry; else all of them, collected anew: ~10 s)."""
    import subprocess
    from _pytest.mark.expression import Expression
    import mutation_check
    text = lambda f: open(os.path.join(ROOT, f)).read() if os.path.isfile(os.path.join(ROOT, f)) else None
    stale = [f"{name} ({f})" for name, f, old, new, _ in mutation_check.M if old not in (text(f) or "")]
    assert not stale, (f"{len(stale)} entries of dev/mutation_check.py break a line their file no longer holds "
                       f"(rewrite the pattern, or the entry): {'; '.join(stale)}")
    names = [m[0] for m in mutation_check.M]
    assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})
    assert not [name for name, _, old, new, _ in mutation_check.M if old == new]

    def idle_of(tests):  # the entries whose -k expression selects none of `tests`
        compiled = [(f"{name} [-k {k}]", Expression.compile(k)) for name, _, _, _, k in mutation_check.M]
        return [n for n, e in compiled if not any(e.evaluate(lambda w, **_: w.lower() in t.lower()) for t in tests)]
    here = [i.nodeid.split("::", 1)[1] for i in request.session.items
            if i.nodeid.split("::")[0] in mutation_check.TESTS]  # (this session's; under .ci/run all of them)
    if len(here) <= 300 or idle_of(here):  # a session of some tests only (-k, --lf): all of them, collected anew
        listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                 *mutation_check.TESTS], cwd=ROOT, capture_output=True, text=True)
        tests = [line.split("::", 1)[1] for line in listed.stdout.splitlines() if "::" in line]
        assert len(tests) > 300, listed.stdout[-2000:] + listed.stderr[-2000:]
        idle = idle_of(tests)
        assert not idle, f"these entries' -k expressions select no test: {'; '.join(idle)}"


def test_the_paths_the_docs_name_are_in_the_tree_or_name_their_commit():
    """Every path under dev/, tools/, results/, docs/ or data/ that README.md, docs/*.md, results/README.md, the files
    of dev/ and test_smoke.py name, and every relative link of those Markdown files, is in the tree, or says which
    commit keeps it: `git show SHA:PATH`, or "last at SHA" / "as at SHA" within the next few lines. A tool that moved,
    a folder folded into another, a file that left the tree: none leaves a pointer to nothing."""
    mention = re.compile(r"(?<![\w/.$-])((?:dev|tools|results|docs|data)/[\w.*{},/-]*[\w*}/])")
    kept = re.compile(r"\b(?:last at|as at|git show)\s+`?[0-9a-f]{7,40}\b")
    link = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")

    def expand(p):  # a{b,c}d -> abd, acd
        m = re.search(r"\{([^{}]*)\}", p)
        return [q for alt in m.group(1).split(",") for q in expand(p[:m.start()] + alt + p[m.end():])] if m else [p]
    files = ["README.md", "results/README.md", "test_smoke.py", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(
        os.path.join(ROOT, "docs", "*.md")) + [p for p in glob.glob(os.path.join(ROOT, "dev", "*")) if os.path.isfile(p)])]
    dangling = []
    for f in files:
        text = open(os.path.join(ROOT, f)).read()
        for m in mention.finditer(text):
            p = m.group(1)
            if "{" in p and not re.search(r"\{[^{}]*,[^{}]*\}", p):  # an f-string's {name}, not a path
                continue
            if all(glob.glob(os.path.join(ROOT, q)) for q in expand(p)):
                continue
            if re.search(r"[0-9a-f]{7,40}:$", text[max(m.start() - 41, 0):m.start()]) or kept.search(text, m.end(),
                                                                                            m.end() + 300):
                continue
            dangling.append(f"{f}:{text.count(chr(10), 0, m.start()) + 1}: {p}")
        for m in link.finditer(text) if f.endswith(".md") else ():
            target = m.group(1)
            if not re.match(r"[a-z]+:", target) and not os.path.exists(os.path.join(ROOT, os.path.dirname(f), target)):
                dangling.append(f"{f}:{text.count(chr(10), 0, m.start()) + 1}: a link to {target}")
    assert not dangling, ("these paths are not in the tree and name no commit that keeps them (fix the path, or add "
                          "'last at `SHA`' / `git show SHA:PATH` after it):\n" + "\n".join(dangling))


# ---------------------------------------------------------------------------------------------
# gguf_tokenizer.py: a GGUF's SentencePiece tokenizer rebuilt (the Gemma runs' tokenizer)

def test_a_ggufs_sentencepiece_tokenizer_is_rebuilt_merge_by_score(tmp_path):
    """A GGUF of 13 tokens written here: merges follow the scores ('▁ab' from '▁a' + 'b', as '▁a' outranks 'ab'), a
    character outside the vocabulary falls back to its bytes, user-defined tokens stay whole, BOS comes first, and
    the text decodes back as written."""
    gguf = pytest.importorskip("gguf")
    import gguf_tokenizer
    toks = ["<pad>", "<eos>", "<bos>", "<unk>", "<0x0A>", "\n\n", "a", "b", "▁", "▁a", "ab", "▁ab", "ba"]
    scores = [-1000.0] * 6 + [-10.0, -11.0, -12.0, -1.0, -3.0, -2.0, -4.0]  # higher: merged first
    types = [3, 3, 3, 2, 6, 4, 1, 1, 1, 1, 1, 1, 1]
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok, n = gguf_tokenizer.build(str(tmp_path / "t.gguf"))
    assert n == 5  # ▁a = ▁ + a, ab = a + b, ▁ab = ▁ + ab and ▁a + b, ba = b + a
    enc = tok.encode("ab ab\n\nba\nb")
    assert enc.tokens == ["<bos>", "ab", "▁ab", "\n\n", "ba", "<0x0A>", "b"]
    assert tok.decode(enc.ids, skip_special_tokens=True) == "ab ab\n\nba\nb"
    assert tok.encode("bab").tokens == ["<bos>", "b", "ab"]  # 'ab' (-3) outranks 'ba' (-4)
    assert tok.encode("aab").tokens == ["<bos>", "a", "ab"]  # 'aa' is no token
