"""Plot a grpo_sglang metrics.jsonl: reward, held-out accuracy, KL, probe gap and sync time per step.

    python results/plot_metrics.py runs/grpo/metrics.jsonl results/h200/curves.png   # needs matplotlib
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps = [r for r in rows if "reward_mean" in r]
    evals = [r for r in rows if "eval_accuracy" in r]
    x = [r["step"] for r in steps]
    fig, ax = plt.subplots(1, 4, figsize=(18, 3.8))
    ax[0].plot(x, [r["reward_mean"] for r in steps], lw=1, alpha=0.5, label="reward (train, sampled)")
    k = 10  # moving average
    ma = [sum(r["reward_mean"] for r in steps[max(0, i - k + 1): i + 1]) / len(steps[max(0, i - k + 1): i + 1])
          for i in range(len(steps))]
    ax[0].plot(x, ma, lw=2, label=f"reward, {k}-step mean")
    ax[0].plot([r["step"] for r in evals], [r["eval_accuracy"] for r in evals], "o-", label="held-out accuracy (greedy)")
    ax[0].set(title="reward", xlabel="step", ylim=(0, 1.02))
    ax[0].legend(fontsize=8)
    ax[1].plot(x, [r["kl"] for r in steps])
    ax[1].set(title="KL to reference (k3)", xlabel="step")
    ax[2].plot(x, [r["sync_logprob_diff_max"] for r in steps], label="max")
    ax[2].plot(x, [r["sync_logprob_diff_mean"] for r in steps], label="mean")
    ax[2].set(title="sync check: |server - trainer| probe logprob (nats)", xlabel="step")
    ax[2].legend(fontsize=8)
    ax[3].plot(x, [r["time_sync"] for r in steps], label="sync")
    ax[3].plot(x, [r["time_step"] for r in steps], label="whole step")
    ax[3].set(title="seconds", xlabel="step", yscale="log")
    ax[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
