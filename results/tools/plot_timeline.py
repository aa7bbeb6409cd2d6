"""Per-step timeline of grpo_sglang runs: what the server GPU and the trainer GPU were doing, step by step.

    python results/tools/plot_timeline.py OUT.png RUN_NAME=metrics.jsonl [RUN_NAME=metrics.jsonl ...] [--steps 5:10]

    e.g. python results/tools/plot_timeline.py timeline.png sync=runs/sync/metrics.jsonl async=runs/async/metrics.jsonl --steps 5:10

One subplot per run, two lanes each: "server GPU" with the rollout (generation) of every step, "trainer GPU"
with its training (log-probs, loss, backward, optimizer) and its weight sync to the server. The spans are the
`span_rollout`, `span_train` and `span_sync` that grpo_sglang writes into every step's line of metrics.jsonl,
in seconds since the run's first step began; the plot starts each run's x axis at the first bar it shows.
--steps A:B keeps steps A..B (both included; A: or :B leave one end open; default: every step).

With --async, the rollout recorded at step s is the generation of step s's batch, which the server ran
during step s-1: so each rollout bar sits under the previous step's training bar. That overlap is what
async buys. (Colocated runs have one GPU for both lanes: then the two lanes share it.)
Needs matplotlib only.
"""
import argparse
import json
import statistics

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {"rollout": "tab:blue", "train": "tab:orange", "sync": "tab:green"}
LANES = {"rollout": 1, "train": 0, "sync": 0}  # y position: 1 = server GPU, 0 = trainer GPU


def load_steps(path, first, last):
    """metrics.jsonl -> {step: line} of the training steps in [first, last]. Evaluation lines have no spans;
    a step logged twice (a resumed run appends) keeps its last line."""
    steps = {}
    for line in open(path):
        if line.strip():
            m = json.loads(line)
            if "span_train" in m and first <= m["step"] <= last:
                steps[m["step"]] = m
    if not steps:
        raise SystemExit(f"{path}: no step in {first}..{last} with span_rollout/span_train/span_sync "
                         f"(metrics from an older grpo_sglang?)")
    return dict(sorted(steps.items()))


def median_step_time(steps):
    """Median wall time of a step: the logged time_step, else the distance between consecutive sync ends."""
    times = [m["time_step"] for m in steps.values() if "time_step" in m]
    if not times:
        ends = [m["span_sync"][1] for m in steps.values()]
        times = [b - a for a, b in zip(ends, ends[1:])] or [0.0]
    return statistics.median(times)


def draw(ax, name, steps, median):
    t0 = min(m[f"span_{kind}"][0] for m in steps.values() for kind in COLOURS)  # the first bar starts at 0
    for step, m in steps.items():
        for kind, colour in COLOURS.items():
            start, end = m[f"span_{kind}"]
            y = LANES[kind]
            # a sync bar can be a few ms wide: its own-colour edge keeps it visible
            ax.broken_barh([(start - t0, end - start)], (y - 0.35, 0.7), facecolor=colour,
                           edgecolor=colour if kind == "sync" else "white", linewidth=1.0)
            if kind != "sync" and len(steps) <= 30:  # the step number on its rollout and train bars (if they fit)
                ax.text((start + end) / 2 - t0, y, str(step), ha="center", va="center", fontsize=8, color="white")
    ax.set_yticks([0, 1], ["trainer GPU", "server GPU"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_title(f"{name}: median step {median:.2f} s", fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the PNG to write")
    p.add_argument("runs", nargs="+", metavar="RUN_NAME=metrics.jsonl")
    p.add_argument("--steps", default=":", help="A:B, both included (default: all steps)")
    args = p.parse_args()
    a, _, b = args.steps.partition(":")
    first, last = int(a) if a else 0, int(b) if b else float("inf")

    runs = []
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        if not sep:
            raise SystemExit(f"{spec!r}: expected RUN_NAME=path/to/metrics.jsonl")
        steps = load_steps(path, first, last)
        runs.append((name, steps, median_step_time(steps)))

    # one row per run, one shared x axis: a faster run is a shorter timeline
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 0.8 + 1.9 * len(runs)), sharex=True, squeeze=False)
    for ax, (name, steps, median) in zip(axes[:, 0], runs):
        draw(ax, name, steps, median)
    axes[-1, 0].set_xlabel("seconds since the first bar shown")
    shown = sorted({s for _, steps, _ in runs for s in steps})
    fig.suptitle(f"Per-step timeline, steps {shown[0]}-{shown[-1]}: "
                 + ", ".join(f"{name} {median:.2f} s/step" for name, _, median in runs) + " (median)")
    fig.legend(handles=[Patch(color=COLOURS["rollout"], label="rollout (generation)"),
                        Patch(color=COLOURS["train"], label="train (log-probs, loss, backward, optimizer)"),
                        Patch(color=COLOURS["sync"], label="weight sync to the server")],
               loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))  # leave room for the legend at the bottom
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
