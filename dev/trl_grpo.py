"""TRL's GRPOTrainer on the work of the README's one-GPU quick start, for a side-by-side on the same GPU: the same
model, the built-in task's training rows (grpo_sglang.load_splits, so the held-out rows stay out), its instruction in
the chat template and its reward (reward_fns.arithmetic_reward; --task and --dataset: another single-turn task's, on
the rows grpo_sglang would train on with the same flags), 16 prompts x 8 completions of up to 128 new tokens
(--max_new_tokens), AdamW at a constant lr 1e-5, no KL (beta 0), token-mean loss ("dapo", TRL's default, as
grpo_sglang's --loss_agg token), clip 0.2, fp32 master weights computing in bf16, one optimizer step per batch in 4
micro-batches of 32.
TRL samples with transformers' generate on the training GPU (its vLLM path needs vllm, which this machine lacks).

    pip install trl   # 1.16.0 measured
    python dev/trl_grpo.py --model HuggingFaceTB/SmolLM2-135M-Instruct --steps 40 --out runs/trl

Writes OUT/steps.jsonl (one row per step: reward, the step's wall time, TRL's own metrics) and OUT/summary.json.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402
import reward_fns  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", default="runs/trl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_new_tokens", type=int, default=128, help="TRL's max_completion_length")
    p.add_argument("--task", default="arithmetic", choices=sorted(reward_fns.TASKS),
                   help="a single-turn task of reward_fns.TASKS (instruction, reward)")
    p.add_argument("--dataset", default="builtin", help="as grpo_sglang's --dataset (a .jsonl file: 10%% held out)")
    a = p.parse_args()
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    task = reward_fns.TASKS[a.task]
    if task.max_turns != 1:
        sys.exit(f"--task {a.task} takes {task.max_turns} turns: TRL's GRPOTrainer here runs single-turn tasks only")
    train, _, _ = g.load_splits(g.Config(dataset=a.dataset, seed=a.seed), task)  # the rows ours trains on
    reward_fn = reward_fns.REWARD_FNS[task.reward]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{r['question']}\n{task.instruction}"}],
                               "answer": r["answer"]} for r in train])

    def reward(completions, answer, **_):  # conversational completions: a list of messages each
        return [reward_fn(c[0]["content"], x) for c, x in zip(completions, answer)]

    os.makedirs(a.out, exist_ok=True)
    rows, t = [], [time.time()]

    class Log(TrainerCallback):  # one log per optimizer step (logging_steps=1): the wall time between two is a step
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                now = time.time()
                rows.append({"step": state.global_step, "reward_mean": logs["reward"], "time_step": now - t[-1],
                             **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})
                t.append(now)
                print(json.dumps(rows[-1]), flush=True)

    cfg = GRPOConfig(output_dir=os.path.join(a.out, "trainer"), max_steps=a.steps, learning_rate=1e-5,
                     lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                     per_device_train_batch_size=32, gradient_accumulation_steps=4, num_generations=8,
                     max_completion_length=a.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, beta=0.0, epsilon=0.2,
                     loss_type="dapo", scale_rewards="group", bf16=torch.cuda.is_available(), logging_steps=1,
                     save_strategy="no", report_to="none", seed=a.seed, model_init_kwargs={"dtype": torch.float32},
                     use_cpu=not torch.cuda.is_available())  # (the CPU: only to try this script)
    trainer = GRPOTrainer(model=a.model, reward_funcs=reward, args=cfg, train_dataset=data, callbacks=[Log()])
    t[0] = time.time()
    trainer.train()
    with open(os.path.join(a.out, "steps.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    steady = [r["time_step"] for r in rows[3:]] or [r["time_step"] for r in rows]  # steps 4 on: past warm-up
    summary = {"trl": trl.__version__, "torch": torch.__version__, "model": a.model, "task": a.task,
               "dataset": a.dataset, "steps": len(rows),
               "step_s_median": statistics.median(steady), "wall_s": t[-1] - t[0],
               "reward_first10": statistics.mean(r["reward_mean"] for r in rows[:10]),
               "reward_last10": statistics.mean(r["reward_mean"] for r in rows[-10:]),
               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0}
    json.dump(summary, open(os.path.join(a.out, "summary.json"), "w"), indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
