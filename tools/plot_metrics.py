"""Draw a run's learning curve from its metrics.jsonl: the training reward per step (and a 10-step mean), the held-out
accuracy at each evaluation, and the sync check's trainer/server gap per step (docs/metrics.md names each metric).

    python tools/plot_metrics.py runs/grpo/metrics.jsonl curve.png [--title "..."]     # needs matplotlib
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def moving_mean(xs, k):
    """xs -> the mean of each value and the k - 1 before it (fewer at the start); None values are left out."""
    out = []
    for i in range(len(xs)):
        window = [x for x in xs[max(0, i - k + 1): i + 1] if x is not None]
        out.append(sum(window) / len(window) if window else None)
    return out


def main(path, out, title=None):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps = [r for r in rows if "reward_mean" in r]  # one row per step, and one per evaluation
    evals = [r for r in rows if "eval_accuracy" in r]
    if not steps:
        raise SystemExit(f"{path} holds no step rows (no 'reward_mean'): is it a grpo_sglang metrics.jsonl?")
    x = [r["step"] for r in steps]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    reward = [r["reward_mean"] for r in steps]
    left.plot(x, reward, lw=1, alpha=0.4, color="C0", label="reward (training batch)")
    left.plot(x, moving_mean(reward, 10), lw=2, color="C0", label="reward, 10-step mean")
    left.plot([r["step"] for r in evals], [r["eval_accuracy"] for r in evals], "o-", color="C1",
              label="held-out accuracy (greedy)")
    left.set(xlabel="step", ylim=(0, 1.02), title=title or "learning curve")
    left.grid(alpha=0.3)
    left.legend(fontsize=8, loc="lower right")
    gap = [r.get("check_mismatch_mean") for r in steps]
    right.plot(x, gap, lw=1, color="C2", label="check_mismatch_mean")
    right.set(xlabel="step", ylabel="nats", title="sync check: trainer vs server", ylim=(0, None))
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("metrics")
    p.add_argument("out")
    p.add_argument("--title")
    a = p.parse_args()
    main(a.metrics, a.out, a.title)
