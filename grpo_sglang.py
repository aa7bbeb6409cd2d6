"""
GRPO in one file, with rollouts from an SGLang server.

    bash serve.sh && torchrun --nproc_per_node 3 grpo_sglang.py        # 4 GPUs: server on 3, training on 0-2
    GPU=0 bash serve.sh && torchrun --nproc_per_node 1 grpo_sglang.py --colocate   # 1 GPU, shared
    torchrun --nproc_per_node 4 grpo_sglang.py --server_url http://B:30000 --sync nccl  # server on host B (README)
    GPU=2,3 SERVERS=2 bash serve.sh && torchrun --nproc_per_node 2 grpo_sglang.py --server_url URL1,URL2 --server_gpu 2,3
    python grpo_sglang.py --help                                        # every flag

Each step: the training ranks send their prompts to the SGLang server (`/generate`, token ids in, token ids +
logprobs out), score the completions with a reward function, turn rewards into group-relative advantages,
take `mu` optimizer steps on the clipped GRPO loss, and push the new weights to the server. Read it top to
bottom: Config, the GRPO math, data, one training step, main() and its loop; the plumbing below the fence
you should not need to read to change GRPO (the README's "Hacking guide" says where to change what).

The GRPO choices this file makes (each a flag):
  advantages   (r - mean(group)) / std(group), or without the std (Dr. GRPO, --no-scale_rewards)
  loss         PPO-style clipped surrogate, separate low/high clip range (DAPO's "clip higher")
  ratio        per token (GRPO), or one per sequence, the geometric mean of its tokens' (GSPO, --ratio_level)
  aggregation  token mean over the batch (DAPO, default), per-sequence mean (original GRPO),
               or a constant divisor (Dr. GRPO)
  KL           k3 estimator to a frozen reference model, only when --beta > 0 (default 0:
               DAPO and Dr. GRPO drop it and it costs a second model)
  updates      mu optimizer steps per rollout batch (mu=1: the ratio is 1 and clipping is moot)
  TIS          truncated importance weight min(π_trainer / π_server, --tis_cap) on every token: it
               corrects for the server's kernels and, with --async, for the one step of staleness
               (decoupled PPO: the trust region is around the trainer's own policy)
  --async      (default; --no-async is on-policy) one step off-policy: the trainer trains step s on a batch
               sampled from θ_{s-1} while the server samples step s+1's from θ_s, never pushed mid-generation
Every push is tagged with a version and every rollout must come from that version, or we stop. Every step
also compares trainer and server logprobs on the same tokens under the same weights (with --async: a few
sequences that the server re-scores with the new weights), so a server that does not hold what it was sent
stops the run even if its tag is right. The loss value is not a progress signal in GRPO (it is ~0 by
construction when advantages are centred): watch the reward.
"""
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import random
import socket
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from urllib.parse import urlparse

import requests
import torch
import torch.distributed as dist

import reward_fns


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    # GRPO
    steps: int = arg(200, "optimizer updates of the outer loop (one rollout batch each)")
    prompts_per_step: int = arg(24, "prompts per step, over all ranks (must divide by world size)")
    group_size: int = arg(8, "completions per prompt (G in the paper)")
    max_new_tokens: int = arg(256, "completion length limit, always sent to the server")
    temperature: float = arg(1.0, "sampling temperature (logprobs are computed at the same temperature)")
    top_p: float = arg(1.0, "keep 1.0 so the server samples the distribution the trainer scores")
    top_k: int = arg(-1, "-1 = off, for the same reason")
    lr: float = arg(1e-6, "AdamW learning rate")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "clip the gradient's norm to this (0: no clipping)")
    beta: float = arg(0.0, "KL coefficient to the reference model (0: no reference model is loaded)")
    clip_low: float = arg(0.2, "ratio clip below 1 - clip_low")
    clip_high: float = arg(0.2, "ratio clip above 1 + clip_high (DAPO uses 0.28)")
    ratio_level: str = arg("token", "'token' (GRPO) or 'sequence' (GSPO: one ratio per completion; use tiny clips, ~3e-4)")
    loss_agg: str = arg("token", "'token' (DAPO), 'seq' (original GRPO) or 'constant' (Dr. GRPO)")
    scale_rewards: bool = arg(True, "divide advantages by the group's std (off: Dr. GRPO)")
    mu: int = arg(1, "optimizer steps per rollout batch")
    tis_cap: float = arg(2.0, "truncated importance sampling cap on π_trainer / π_server (0 = off)")
    async_: bool = arg(True, "one-step off-policy: sample step s+1 while training step s (--no-async: on-policy)")
    # model and data
    model: str = arg("Qwen/Qwen2.5-0.5B-Instruct", "HF model name or local path; the server must serve the same")
    dataset: str = arg("openai/gsm8k", "HF dataset name, a local folder or .json/.jsonl file, or 'builtin' (no download)")
    dataset_config: str = arg("main", "HF dataset config name ('' for none)")
    train_split: str = arg("train", "split to train on")
    eval_split: str = arg("test", "held-out split ('' = hold out rows of the train split)")
    prompt_field: str = arg("question", "column with the question")
    answer_field: str = arg("answer", "column with the reference answer")
    instruction: str = arg("auto", "text appended to each question ('auto': fits the task)")
    prompt_format: str = arg("auto", "'chat' (chat template), 'plain' (base models) or 'auto' (chat if there is a template)")
    reward: str = arg("auto", f"reward function in reward_fns.py: {sorted(reward_fns.REWARD_FNS)} or 'auto'")
    builtin_max_operand: int = arg(20, "built-in task: operands of 'a + b' are drawn from 0..this")
    max_prompt_tokens: int = arg(256, "longer prompts are skipped (and counted)")
    eval_size: int = arg(200, "held-out prompts per evaluation (without an eval split: at most 10% of the train rows)")
    # the trainer's compute
    micro_batch: int = arg(32, "sequences per forward/backward on one rank (larger is faster, if memory allows)")
    tf32_head: bool = arg(True, "the fp32 LM head on TF32 tensor cores (fp32 logits, ~8x faster); off: exact fp32")
    grad_checkpointing: bool = arg(False, "recompute activations in backward to save memory")
    max_nonfinite_steps: int = arg(3, "stop after this many steps in a row with a NaN/Inf gradient (each is skipped)")
    device: str = arg("auto", "'cuda', 'cpu' (tests) or 'auto'")
    seed: int = arg(0, "seed for data order and torch")
    # the server and weight sync
    server_url: str = arg("http://127.0.0.1:30000", "SGLang server(s) started by serve.sh, comma-separated")
    api_key: str = arg("", "server API key (default: $SGLANG_API_KEY), sent as a Bearer token")
    server_gpu: str = arg("3", "each server's GPU (serve.sh's GPU), comma-separated; '+' joins a TP server's: 2+3")
    colocate: bool = arg(False, "the server shares rank 0's GPU on purpose (one-GPU machines)")
    request_timeout: float = arg(300.0, "seconds before one request to the server (or one NCCL send) is given up")
    request_retries: int = arg(3, "retries (with backoff) for a failed request before stopping")
    sync: str = arg("auto", "'tensor' (CUDA IPC: rank 0 sees the server's GPU), 'nccl' (any host) or 'auto'")
    sync_bucket_mb: float = arg(1024.0, "size (MiB) of one flattened weight bucket sent to the server")
    nccl_master_addr: str = arg("", "--sync nccl: rank 0's address the server connects to (default: on its route)")
    nccl_port: int = arg(0, "--sync nccl: TCP port of that rendezvous on rank 0's host (0: a free one)")
    mismatch_max: float = arg(0.1, "stop when trainer and server, holding the same weights, differ by more than this (mean nats)")
    check_seqs: int = arg(32, "--async: sequences per step the server re-scores with the trainer's weights for it (0: no check)")
    debug_skip_sync: str = arg("", "weight pushes to skip, by step, e.g. '6' or '4-300' (negative control)")
    debug_tag_skipped: bool = arg(False, "with --debug_skip_sync: still tag skipped versions (a server dropping weights)")
    # eval, checkpoints, logging
    eval_every: int = arg(50, "evaluate (greedy, via the server) every N steps; 0 = only at start and end")
    save_every: int = arg(100, "checkpoint every N steps (0 = only at the end)")
    out_dir: str = arg("runs/grpo", "checkpoints, metrics.jsonl and config.json go here")
    resume: bool = arg(False, "continue from the last checkpoint in out_dir")
    sample_every: int = arg(10, "print one completion every N steps")
    wandb: bool = arg(False, "log to Weights & Biases")
    wandb_project: str = arg("grpo_sglang", "wandb project")


# ----------------------------------------------------------------------------------------
# GRPO math: small pure functions (tested in test_smoke.py). This is the part to edit.

def group_advantages(rewards, group_size, scale=True, eps=1e-4):
    """(N,) rewards, groups of consecutive G -> (N,) advantages. GRPO: A = (r - mean) / std."""
    r = rewards.view(-1, group_size)  # (N/G, G)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale:  # Dr. GRPO drops this: it up-weights groups that are nearly all right or all wrong
        adv = adv / (r.std(dim=1, keepdim=True) + eps)  # unbiased std, as TRL; all-equal group -> 0
    return adv.view(-1)


def token_logprobs(logits, targets, temperature=1.0):
    """(B, T, V) logits, (B, T) targets -> (B, T) log p(target), in fp32."""
    logits = logits.float() / temperature if temperature != 1 else logits.float()  # no logits-sized copy at 1
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


@torch.no_grad()
def token_entropy(logits, temperature=1.0, rows=4):
    """(B, T, V) logits -> (B, T) entropy of the distribution each token was sampled from, logsumexp(z) - Σ p·z.
    A metric (it falls when the policy collapses): no gradient, and a few sequences at a time, so that no second
    (B, T, V) temporary is made; the dot product of p and z over V is one batched GEMV, not a product tensor."""
    out = []
    for z in logits.split(rows):
        z = z.float() / temperature if temperature != 1 else z.float()
        out.append(torch.logsumexp(z, -1) - torch.einsum("btv,btv->bt", torch.softmax(z, -1), z))
    return torch.cat(out)


def kl_k3(logp, ref_logp):
    """(B, T) -> (B, T). Schulman's k3 estimator of KL(pi || ref): e^(ref-logp) - (ref-logp) - 1 >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def log_ratio(logp, old_logp, mask, level="token"):
    """(B, T) log-probs now and before this step's updates, (B, T) completion mask -> (B, T) log π/π_old.
    token: per token (PPO, GRPO). sequence: the mean over each completion's tokens, one ratio for all of them
    (GSPO, Zheng et al. 2025: the geometric mean of the token ratios; TRL's importance_sampling_level)."""
    d = logp - old_logp
    if level == "sequence":
        d = ((d * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)).expand_as(d)
    return d


def clipped_surrogate(ratio, adv, clip_low, clip_high):
    """(B, T) ratios π/π_old, (B,) advantages -> per-token loss (B, T) and where clipping was active (B, T).
    PPO: -min(ratio * A, clip(ratio, 1 - low, 1 + high) * A)."""
    a = adv.unsqueeze(1)  # (B, 1)
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * a
    return -torch.min(unclipped, clipped), (clipped < unclipped)


def tis_weights(old_logp, server_logp, cap):
    """(B, T) -> (B, T). Truncated importance weight min(pi_trainer / pi_server, cap) for the gap
    between the policy that sampled (the server's kernels; one step older with --async) and the
    trainer's policy before this step's updates (Yao et al. 2025, "TIS"; AReaL's decoupled PPO)."""
    return torch.clamp(torch.exp(old_logp - server_logp), max=cap)


def grpo_token_loss(logp, old_logp, adv, mask, clip_low, clip_high, level="token", tis=None, ref_logp=None, beta=0.0):
    """(B, T) log-probs now and before this step's updates, (B,) advantages, (B, T) completion mask -> per-token
    loss (B, T), where clipping was active (B, T), per-token KL to the reference (B, T) or None.
    loss = -min(ρA, clip(ρ)A) · w + β · k3(π, π_ref),  ρ = π / π_old (see log_ratio),  w = TIS weight (1 if None)."""
    loss, clipped = clipped_surrogate(torch.exp(log_ratio(logp, old_logp, mask, level)), adv, clip_low, clip_high)
    if tis is not None:
        loss = loss * tis
    kl = kl_k3(logp, ref_logp) if ref_logp is not None else None
    if kl is not None:
        loss = loss + beta * kl
    return loss, clipped, kl


def aggregate(x, mask, mode, n_seqs, n_tokens, max_new_tokens):
    """(B, T) per-token values -> scalar. n_seqs / n_tokens count the WHOLE batch (all micro-batches
    and ranks), so summing the results over micro-batches gives the batch loss.
      seq      mean over each sequence's tokens, then over sequences (original GRPO; long answers
               get less weight per token)
      token    sum over all tokens / all tokens (DAPO)
      constant sum over all tokens / (sequences * max_new_tokens) (Dr. GRPO: no length bias)"""
    if mode == "seq":
        return ((x * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / n_seqs
    if mode == "token":
        return (x * mask).sum() / n_tokens
    if mode == "constant":
        return (x * mask).sum() / (n_seqs * max_new_tokens)
    raise ValueError(f"unknown loss_agg {mode!r}")


def mismatch_stats(trainer_lp, server_lp, mask, cap):
    """(B, T) logprobs of the sampled tokens under the trainer and under the server that sampled them ->
    (sums, maxima) over the masked tokens: |Δ|, k3 estimate of KL(server || trainer), and the importance
    ratio π_trainer / π_server (how often TIS truncates it at `cap`). The numbers TRL, verl and slime log."""
    d = (trainer_lp - server_lp) * mask
    ratio = torch.exp(d) * mask
    sums = {"mismatch_abs": d.abs().sum(), "mismatch_kl": (kl_k3(server_lp, trainer_lp) * mask).sum(),
            "is_ratio": ratio.sum(), "is_truncated": ((ratio > cap) if cap > 0 else ratio < 0).sum(), "tokens": mask.sum()}
    return sums, {"mismatch_max": d.abs().max(), "is_ratio_max": ratio.max()}


# ----------------------------------------------------------------------------------------
# Data: a built-in task, a local JSON/JSONL file, or any HF dataset with question/answer columns.

def builtin_rows(max_operand, seed=1234):
    """'What is a + b?' for all a, b in 0..max_operand, shuffled. Small models get a fair share
    right (SmolLM2-135M: see README), so GRPO has signal from the first step."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(pairs)
    return [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in pairs]


INSTRUCTIONS = {
    "gsm8k": "Solve the problem step by step, then give the final answer on its own line as '#### <number>'.",
    "arithmetic": "Answer with the number only.",
}


def load_splits(cfg):
    """-> (train rows, eval rows, where the eval rows come from), rows as dicts (unvalidated)."""
    if cfg.dataset == "builtin":
        rows = builtin_rows(cfg.builtin_max_operand)
        n_eval = min(cfg.eval_size, len(rows) // 4)
        return rows[n_eval:], rows[:n_eval], "held out of the built-in task"  # disjoint: never trained on
    if cfg.dataset.endswith((".json", ".jsonl")) or os.path.isfile(cfg.dataset):
        train, eval_split = read_rows(cfg.dataset), None  # one file: no splits
    else:
        ds = load_hf_dataset(cfg)  # checks that the splits exist
        train, eval_split = [dict(r) for r in ds[cfg.train_split]], cfg.eval_split
        if eval_split:
            return train, [dict(r) for r in ds[eval_split]][: cfg.eval_size], f"its {eval_split!r} split"
    random.Random(cfg.seed).shuffle(train)  # no held-out split: hold out rows of the train split
    n_eval = min(cfg.eval_size, len(train) // 10)
    why = "the file has no splits" if eval_split is None else "--eval_split ''"
    return train[n_eval:], train[:n_eval], f"held out of the training rows ({why}; at most 10%)"


def tokenize_rows(rows, tok, cfg, instruction, fmt, skipped, max_len=None):
    """Format and tokenize each question once: `fmt` 'chat' uses the tokenizer's chat template, 'plain'
    is 'question\ninstruction\n' (base models). Unusable rows are counted in `skipped`, never fatal."""
    out = []
    for r in rows:
        q, a = r.get(cfg.prompt_field), r.get(cfg.answer_field)
        if not isinstance(q, str) or not q.strip():
            skipped[f"empty or missing prompt (--prompt_field {cfg.prompt_field!r})"] += 1
            continue
        if a is None or reward_fns.extract_number(str(a)) is None:
            skipped[f"answer without a number (--answer_field {cfg.answer_field!r})"] += 1
            continue
        text = f"{q.strip()}\n{instruction}".strip()
        if fmt == "chat":
            text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]  # the template has its special tokens
        else:
            ids = tok(text + "\n")["input_ids"]  # with BOS where the tokenizer adds one
        if len(ids) > (max_len or cfg.max_prompt_tokens):
            skipped[f"prompt longer than max_prompt_tokens={cfg.max_prompt_tokens}" if (max_len or cfg.max_prompt_tokens)
                    == cfg.max_prompt_tokens else f"prompt longer than {max_len} tokens (the server's context)"] += 1
            continue
        out.append({"ids": ids, "answer": str(a), "question": q})
    return out


def prompts_for_step(n_rows, step, per_step, seed):
    """Row indices used at `step`: a fresh shuffle every epoch, so the data position is just the
    step number and resuming at step s continues with exactly the prompts it would have seen."""
    idx = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(k, n_rows)
        perm = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed + epoch))
        idx.append(int(perm[i]))
    return idx


# ----------------------------------------------------------------------------------------
# One training step: score a rollout batch, then mu optimizer steps on it.

def score(batch, tok, reward_fn, correct_fn, group_size, scale):
    """A rollout batch -> (samples, named sums, reward warnings). Each sample carries its reward, whether the
    task's check calls it correct (what accuracy counts, whatever the reward), and its group-relative
    advantage: completion k belongs to prompt k // group_size, so groups never straddle ranks."""
    warn, samples = Counter(), []
    for k, (ids, lps, fin) in enumerate(batch["outs"]):
        row = batch["rows"][k // group_size]
        text = tok.decode(ids, skip_special_tokens=True)
        samples.append({"prompt": row["ids"], "completion": ids, "server_lp": lps, "finish": fin, "text": text,
                        "reward": reward_fns.safe_reward(reward_fn, text, row["answer"], warn),
                        "correct": reward_fns.safe_reward(correct_fn, text, row["answer"], warn) == 1})
    rewards = torch.tensor([s["reward"] for s in samples])
    for s, a in zip(samples, group_advantages(rewards, group_size, scale).tolist()):
        s["adv"] = a
    sums = {"reward": rewards.sum(), "correct": sum(s["correct"] for s in samples), "seqs": len(samples),
            "completion_tokens": sum(len(s["completion"]) for s in samples), "truncated": sum(s["finish"] == "length" for s in samples),
            "groups": len(samples) // group_size, "zero_std_groups": (rewards.view(-1, group_size).std(1) == 0).sum(),
            "reward_warnings": sum(warn.values())}
    return samples, sums, warn


def pad_batch(samples, pad_id, device):
    """Prompts left-padded, completions right-padded, so every completion starts at column P:
    the model then only needs logits for the last C+1 columns (logits_to_keep)."""
    P = max(len(s["prompt"]) for s in samples)
    C = max(len(s["completion"]) for s in samples)
    ids = torch.full((len(samples), P + C), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    cmask = torch.zeros(len(samples), C)
    for i, s in enumerate(samples):
        p, c = s["prompt"], s["completion"]
        ids[i, P - len(p): P + len(c)] = torch.tensor(p + c)
        attn[i, P - len(p): P + len(c)] = 1
        cmask[i, : len(c)] = 1
    return ids.to(device), attn.to(device), cmask.to(device), P


def micro_batches(samples, size, pad_id, device):
    """Samples -> padded micro-batches of `size` sequences, with their advantages (B,) and the server's
    logprobs of the sampled tokens (B, C)."""
    out = []
    for i in range(0, len(samples), size):
        part = samples[i: i + size]
        ids, attn, mask, P = pad_batch(part, pad_id, device)
        server = torch.zeros(mask.shape)  # filled on the CPU, then one copy
        for j, s in enumerate(part):
            server[j, : len(s["server_lp"])] = torch.tensor(s["server_lp"])
        out.append({"ids": ids, "attn": attn, "mask": mask, "P": P, "server": server.to(device),
                    "adv": torch.tensor([s["adv"] for s in part], device=device)})
    return out


def completion_logits(model, ids, attn, P):
    """(B, P+C) ids -> (B, C, V) the logits that predict the C completion tokens under `model`."""
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # positions ignore the left padding
    return model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=ids.shape[1] - P + 1).logits[:, :-1]


def completion_logprobs(model, ids, attn, P, temperature):
    """(B, P+C) -> (B, C) log-probs of the completion tokens under `model`."""
    return token_logprobs(completion_logits(model, ids, attn, P), ids[:, P:], temperature)


def policy_loss(cfg, b, logp, old):
    """The GRPO loss of micro-batch `b` per token, from the flags: where a new loss variant is wired in.
    (B, T) log-probs now and before this step's updates -> (loss, clipped, kl), each (B, T)."""
    tis = tis_weights(old, b["server"], cfg.tis_cap) if cfg.tis_cap > 0 else None
    return grpo_token_loss(logp, old, b["adv"], b["mask"], cfg.clip_low, cfg.clip_high, cfg.ratio_level, tis, b.get("ref"), cfg.beta)


def train_step(cfg, model, ref, opt, mbs, n_seqs, n_tokens, world, check):
    """cfg.mu optimizer steps on this rank's micro-batches of one batch -> named sums and maxima over its tokens.
    The first pass scores every sequence with the weights the server holds; check(mbs, sums, maxes) then says
    whether the server really holds them (it stops the run if not), before any weight moves."""
    T = cfg.temperature
    with torch.no_grad():  # before any update: the old policy of the ratio (mu > 1; else it is the one we train)
        for b in mbs:      # and the reference
            b["old"] = completion_logprobs(model, b["ids"], b["attn"], b["P"], T) if cfg.mu > 1 else None
            b["ref"] = completion_logprobs(ref, b["ids"], b["attn"], b["P"], T) if ref is not None else None
    zero = lambda: torch.zeros((), dtype=torch.float64, device=mbs[0]["ids"].device)
    sums, maxes = defaultdict(zero), defaultdict(zero)
    for update in range(cfg.mu):
        for k, b in enumerate(mbs):
            model.set_requires_gradient_sync(k == len(mbs) - 1)  # reduce gradients once per update
            logits = completion_logits(model, b["ids"], b["attn"], b["P"])  # (B, C, V)
            logp = token_logprobs(logits, b["ids"][:, b["P"]:], T)
            old = b["old"] if cfg.mu > 1 else logp.detach()
            if update == 0:  # the weights the server holds: keep their logprobs for the check, compare with the server's
                b["lp0"] = old
                merge(sums, maxes, {"entropy": (token_entropy(logits, T) * b["mask"]).sum()})
                merge(sums, maxes, *mismatch_stats(old, b["server"], b["mask"], cfg.tis_cap))
            loss, clipped, kl = policy_loss(cfg, b, logp, old)
            loss = aggregate(loss, b["mask"], cfg.loss_agg, n_seqs, n_tokens, cfg.max_new_tokens)
            del logits  # logits-sized: let the backward free it as soon as it can
            (loss * world).backward()  # FSDP averages gradients over ranks: * world gives the batch's gradient
            merge(sums, maxes, {"loss": loss.detach(), "clipped": (clipped * b["mask"]).sum(), "trained_tokens": b["mask"].sum(),
                                "kl": (kl.detach() * b["mask"]).sum() if kl is not None else 0})
        if update == 0:
            merge(sums, maxes, *check(mbs, sums, maxes))
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or float("inf"))  # 0: no clip
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        finite = bool(torch.isfinite(grad_norm))  # else the step is skipped: it would poison the weights and the server
        merge(sums, maxes, {"grad_norm": grad_norm / world, "nonfinite": (not finite) / world})  # / world: summed over ranks
        if finite:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return sums, maxes


# ----------------------------------------------------------------------------------------
# The loop.

def main(cfg):
    rt = setup(cfg)                 # flags, ranks, GPUs, process group: checked before anything heavy
    server = Server(cfg, rt)        # up? our model? how do weights get there? (rollouts, check, pushes)
    tok, train, evals, reward_fn, correct_fn = load_data(cfg, server.context)
    model, ref, opt, start = load_models(cfg, rt)
    log = MetricsLog(cfg, rt, start, len(train))
    n, pad = cfg.prompts_per_step // rt.world, tok.pad_token_id or 0
    my_prompts = lambda step: [train[i] for i in prompts_for_step(len(train), step, cfg.prompts_per_step, cfg.seed)
                               [rt.rank * n: (rt.rank + 1) * n]]  # this rank's share of the step's prompts

    t0 = time.time()
    nbytes = server.push(model, start)  # the server starts from our weights (also after a resume)
    print0(f"initial sync: {nbytes / 2**20:.0f} MiB in {time.time() - t0:.2f}s, tagged version {start}")
    log.write(evaluate(cfg, server, tok, evals, reward_fn, correct_fn, start))
    t_run, next_batch = time.time(), None
    for step in range(start, cfg.steps):
        clock = Clock()
        # 1. rollout. Sync: sample now from θ_step. Async: this batch was sampled from θ_{step-1} during the last
        #    step, and the server samples the next one from θ_step while we train on this one.
        batch = next_batch or on_all_ranks(server.rollout, my_prompts(step), step)
        pending = POOL.submit(server.rollout, my_prompts(step + 1), step) if cfg.async_ and step + 1 < cfg.steps else None
        check = server.check(batch, step, model, pad)  # async: the server re-scores some of it with θ_step, meanwhile
        clock.lap("rollout_wait")
        # 2. rewards, correctness, group-relative advantages; micro-batches
        samples, sums, warn = score(batch, tok, reward_fn, correct_fn, cfg.group_size, cfg.scale_rewards)
        totals = all_reduce_named({"seqs": sums["seqs"], "tokens": sums["completion_tokens"]}, dist.ReduceOp.SUM, rt.device)
        mbs = micro_batches(samples, cfg.micro_batch, pad, rt.device)
        clock.lap("score")
        # 3. mu optimizer steps on the GRPO loss; before the first, the check that the server holds our weights
        train_sums, maxes = train_step(cfg, model, ref, opt, mbs, totals["seqs"], totals["tokens"], rt.world, check)
        clock.lap("train")
        # 4. push θ_{step+1}. Async: first wait for the next batch: weights never change mid-generation
        next_batch = on_all_ranks(pending.result) if pending else None
        clock.lap("next_rollout_wait")
        nbytes = server.push(model, step + 1)
        clock.lap("sync")
        # 5. log (named sums over micro-batches and ranks), checkpoint, evaluate
        s = all_reduce_named({**sums, **train_sums}, dist.ReduceOp.SUM, rt.device)
        mx = all_reduce_named(maxes, dist.ReduceOp.MAX, rt.device)
        log.step(step_metrics(cfg, step + 1, batch, s, mx, clock, t_run, nbytes, rt), samples[0], warn)
        if (cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.steps:
            save_checkpoint(cfg, model, opt, tok, step + 1)
        if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step + 1 == cfg.steps:
            log.write(evaluate(cfg, server, tok, evals, reward_fn, correct_fn, step + 1))
    server.close()
    log.close()
    dist.destroy_process_group()


# ======================================================================================================
# ---- Plumbing below: the SGLang server, weight sync, FSDP, checkpoints, logging. You should not need
# ---- to read it to change GRPO. main() is called at the very bottom.
# ======================================================================================================

def evaluate(cfg, server, tok, evals, reward_fn, correct_fn, step):
    """Greedy accuracy (the task's check) and mean reward on the held-out prompts, through the server (rank 0)."""
    if int(os.environ.get("RANK", 0)) != 0:
        return None
    t0 = time.time()
    outs = server.rollout(evals, step, greedy=True)["outs"]
    warn, texts = Counter(), [tok.decode(o[0], skip_special_tokens=True) for o in outs]
    mean = lambda fn: sum(reward_fns.safe_reward(fn, t, e["answer"], warn) for t, e in zip(texts, evals)) / len(evals)
    acc, reward = mean(correct_fn), mean(reward_fn)
    print0(f"eval step {step}: accuracy {acc:.3f}, reward {reward:.3f} on {len(evals)} held-out prompts (greedy, "
           f"{time.time() - t0:.1f}s)")
    return {"step": step, "eval_accuracy": acc, "eval_reward": reward}


def step_metrics(cfg, step, batch, s, mx, clock, t_run, nbytes, rt):
    """The step's named metrics, from sums and maxima over all micro-batches and ranks."""
    rel = lambda span: [round(span[0] - t_run, 3), round(span[1] - t_run, 3)]
    sp, stale = clock.spans, "stale_abs" in s  # stale: an async batch, some of whose rows were re-scored
    rollout = batch["span"][1] - batch["span"][0]
    return {"step": step, "sampled_from_version": batch["version"], "reward_mean": s["reward"] / s["seqs"],
            "accuracy": s["correct"] / s["seqs"], "kl": s["kl"] / s["trained_tokens"], "clip_frac": s["clipped"] / s["trained_tokens"],
            "entropy": s["entropy"] / s["tokens"], "loss": s["loss"] / cfg.mu, "grad_norm": s["grad_norm"] / cfg.mu,
            "completion_len_mean": s["completion_tokens"] / s["seqs"], "truncated_frac": s["truncated"] / s["seqs"],
            "zero_std_groups_frac": s["zero_std_groups"] / s["groups"], "reward_warnings": int(s["reward_warnings"]),
            "nonfinite_skips": round(s["nonfinite"]),
            # the sync check: trainer vs server on the same tokens under the same weights
            "check_mismatch_mean": s["check_abs"] / s["check_tokens"] if s["check_tokens"] else None,
            "check_mismatch_max": mx.get("check_max"),
            "staleness_mean": s["stale_abs"] / s["check_tokens"] if stale else None, "staleness_max": mx["stale_max"] if stale else None,
            # trainer vs the server that sampled (async: one step of policy change too, which TIS corrects)
            "mismatch_mean": s["mismatch_abs"] / s["tokens"], "mismatch_max": mx["mismatch_max"],
            "mismatch_kl": s["mismatch_kl"] / s["tokens"], "is_ratio_mean": s["is_ratio"] / s["tokens"],
            "is_ratio_max": mx["is_ratio_max"], "is_truncated_frac": s["is_truncated"] / s["tokens"],
            "time_rollout": rollout, **{f"time_{k}": b - a for k, (a, b) in sp.items()}, "time_step": clock.t - clock.t0,
            "sync_bytes": nbytes, "sync_skipped": step in rt.skip, "rollout_tokens_per_s": s["completion_tokens"] / max(rollout, 1e-9),
            "span_step": rel((clock.t0, clock.t)), "span_rollout": rel(batch["span"]), "span_train": rel(sp["train"]),
            "span_sync": rel(sp["sync"]),
            "peak_mem_gb": torch.cuda.max_memory_allocated(rt.device) / 1e9 if rt.device.type == "cuda" else 0.0}


class Clock:
    """A step's phases: lap(name) ends the phase that began at the previous lap."""
    def __init__(self):
        self.t0 = self.t = time.time()
        self.spans = {}

    def lap(self, name):
        self.spans[name], self.t = (self.t, time.time()), time.time()


class MetricsLog:
    """metrics.jsonl (and wandb) on rank 0, the one log line per step, and the NaN/Inf stop rule."""
    def __init__(self, cfg, rt, start, n_train):
        self.cfg, self.master, self.nonfinite_run = cfg, rt.master, 0
        print0(f"batch: {cfg.prompts_per_step} prompts x {cfg.group_size} completions = {cfg.prompts_per_step * cfg.group_size} "
               f"sequences per step, {cfg.prompts_per_step // rt.world * cfg.group_size} per rank x {rt.world} ranks; micro-batch "
               f"{cfg.micro_batch}; {cfg.mu} optimizer step(s) per rollout; {cfg.steps} steps = "
               f"{cfg.steps * cfg.prompts_per_step / n_train:.2f} epochs")
        print0("rollouts: " + ("async, one step off-policy: step s trains on a batch sampled from θ_{s-1} while the server "
                               "samples step s+1's from θ_s" if cfg.async_ else "sync, on-policy"))
        if self.master:
            json.dump(saved_config(cfg), open(os.path.join(cfg.out_dir, "config.json"), "w"), indent=1)
            self.file = open_metrics(cfg, start)
            if cfg.wandb:
                try:
                    import wandb
                except ImportError:
                    raise UserError("--wandb needs the wandb package: pip install wandb") from None
                self.wandb = wandb
                wandb.init(project=cfg.wandb_project, config=saved_config(cfg))

    def write(self, m):
        if self.master and m:
            self.file.write(json.dumps(m) + "\n")
            self.file.flush()
            if self.cfg.wandb:
                self.wandb.log(m, step=m["step"])

    def step(self, m, sample, warn):
        if warn:  # rewards that raised or returned NaN/None count as 0; say which (rank 0's)
            print0(f"reward warnings at step {m['step']}: {dict(warn)}")
        print0(f"step {m['step']:4d} | reward {m['reward_mean']:.3f} acc {m['accuracy']:.3f} | kl {m['kl']:.4f} "
               f"clip {m['clip_frac']:.3f} ent {m['entropy']:.2f} | len {m['completion_len_mean']:.0f} | rollout "
               f"{m['time_rollout']:.2f}s train {m['time_train']:.2f}s sync {m['time_sync']:.2f}s step {m['time_step']:.2f}s | "
               f"{m['rollout_tokens_per_s']:.0f} tok/s | check {'-' if m['check_mismatch_mean'] is None else format(m['check_mismatch_mean'], '.4f')} mismatch {m['mismatch_mean']:.4f} "
               f"from v{m['sampled_from_version']}")
        if self.cfg.sample_every and m["step"] % self.cfg.sample_every == 0:
            print0(f"  sample (reward {sample['reward']}): {sample['text'][:300]!r}")
        self.write(m)
        self.nonfinite_run = self.nonfinite_run + 1 if m["nonfinite_skips"] else 0  # the same on all ranks
        if m["nonfinite_skips"]:
            print0(f"warning: NaN/Inf gradient at step {m['step']}: {m['nonfinite_skips']} of {self.cfg.mu} update(s) skipped")
        if self.nonfinite_run >= self.cfg.max_nonfinite_steps:
            raise UserError(f"NaN/Inf gradients in {self.nonfinite_run} steps in a row (--max_nonfinite_steps); the weights "
                            f"were left as they were. Lower --lr, check the rewards and --tis_cap, then --resume "
                            f"from the last checkpoint in {self.cfg.out_dir}.")

    def close(self):
        if self.master and self.cfg.wandb:
            self.wandb.finish()


def saved_config(cfg):
    return {**dataclasses.asdict(cfg), "api_key": ""}  # the flags, never the key


def print0(*a):
    if int(os.environ.get("RANK", 0)) == 0:
        print(*a, flush=True)


# ----------------------------------------------------------------------------------------
# Setup: flags, ranks, GPUs, data, models.

def parse_config(argv=None):
    """The command line -> Config, which remembers the flags given (`--resume` restores the others)."""
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)  # only the flags given come back
    for f in dataclasses.fields(Config):
        flag, h = "--" + f.name.rstrip("_"), f.metadata["help"]  # `async` is a Python keyword: field async_
        if type(f.default) is bool:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, help=h)
        else:
            p.add_argument(flag, dest=f.name, type=type(f.default), help=h)
    given = vars(p.parse_args(argv))
    cfg = Config(**given)
    cfg.given = set(given)
    return cfg


# Flags a resumed run may change: how and where it runs, not what it trains (README, "Resuming").
RESUMABLE = {"steps", "resume", "out_dir", "eval_every", "save_every", "sample_every", "wandb", "wandb_project", "device",
             "micro_batch", "tf32_head", "grad_checkpointing", "max_nonfinite_steps", "server_url", "api_key", "server_gpu",
             "colocate", "request_timeout", "request_retries", "sync", "sync_bucket_mb", "nccl_master_addr", "nccl_port",
             "mismatch_max", "check_seqs", "debug_skip_sync", "debug_tag_skipped"}


def restore_config(cfg):
    """--resume: the flags of the run in --out_dir (its config.json) for every flag not given again. A flag given
    again may differ only if it is in RESUMABLE; any other difference is one error that lists them all."""
    path = os.path.join(cfg.out_dir, "config.json")
    if not os.path.exists(path):
        return
    try:
        saved = json.load(open(path))
    except (OSError, ValueError) as e:
        raise UserError(f"--resume: {path} cannot be read ({e}); it holds the flags of the run to resume") from None
    fields = {f.name: f.default for f in dataclasses.fields(Config)}
    given = getattr(cfg, "given", None)
    given = {k for k in fields if getattr(cfg, k) != fields[k]} if given is None else given
    changed = [(k, saved[k], getattr(cfg, k)) for k in sorted(given) if k in saved and k not in RESUMABLE
               and saved[k] != getattr(cfg, k)]
    if changed:
        raise UserError(f"--resume: these flags differ from the run in {cfg.out_dir} (its config.json), and a resumed run "
                        f"must train what it trained: " + "; ".join(f"--{k.rstrip('_')} was {a!r}, now {b!r}" for k, a, b
                                                                     in changed) + ". Drop them to continue that run, or "
                        f"start a new run in another --out_dir. Flags a resume may change: " +
                        ", ".join(f"--{k.rstrip('_')}" for k in sorted(RESUMABLE)))
    for k, v in saved.items():
        if k in fields and k not in given and k != "api_key":
            setattr(cfg, k, v)


class UserError(Exception):
    """A problem the user can fix; printed once as one clear message, never a traceback."""


def step_set(spec):
    """'6' or '4-300' or '3,7-9' -> set of step numbers."""
    steps = set()
    for part in filter(None, spec.replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        if not (lo.isdigit() and (hi or lo).isdigit()) or int(lo) > int(hi or lo):
            raise UserError(f"--debug_skip_sync {spec!r} is not a list of steps or ranges like '6' or '4-300'")
        steps.update(range(int(lo), int(hi or lo) + 1))
    return steps


def check_config(cfg, world):
    """Every flag's range, before anything heavy: one message naming the flag, its value and what is allowed."""
    rules = [("temperature", cfg.temperature > 0, "> 0 (sampling needs it; evaluation is greedy already)"),
             ("top_p", 0 < cfg.top_p <= 1, "in (0, 1]"), ("top_k", cfg.top_k == -1 or cfg.top_k >= 1, "-1 (off) or >= 1"),
             ("lr", cfg.lr >= 0, ">= 0"), ("weight_decay", cfg.weight_decay >= 0, ">= 0"),
             ("max_grad_norm", cfg.max_grad_norm >= 0, ">= 0 (0: no clipping)"), ("beta", cfg.beta >= 0, ">= 0"),
             ("clip_low", 0 <= cfg.clip_low < 1, "in [0, 1)"), ("clip_high", cfg.clip_high >= 0, ">= 0"),
             ("tis_cap", cfg.tis_cap == 0 or cfg.tis_cap >= 1, "0 (off) or >= 1"),
             ("mismatch_max", cfg.mismatch_max > 0, "> 0"), ("sync_bucket_mb", cfg.sync_bucket_mb > 0, "> 0"),
             ("request_timeout", cfg.request_timeout > 0, "> 0"), ("request_retries", cfg.request_retries >= 0, ">= 0"),
             ("check_seqs", cfg.check_seqs >= 0, ">= 0"),
             ("group_size", cfg.group_size >= 2, ">= 2 (advantages compare completions of the same prompt)")]
    rules += [(f, getattr(cfg, f) >= 1, ">= 1") for f in ("steps", "prompts_per_step", "max_new_tokens", "mu", "micro_batch",
                                                          "max_nonfinite_steps", "eval_size", "max_prompt_tokens", "builtin_max_operand")]
    rules += [(f, getattr(cfg, f) >= 0, ">= 0") for f in ("eval_every", "save_every", "sample_every")]
    rules += [("nccl_port", 0 <= cfg.nccl_port < 65536, "a TCP port, 1..65535 (0: a free one)")]
    rules += [(f, getattr(cfg, f) in allowed, " or ".join(allowed)) for f, allowed in (
        ("loss_agg", ("token", "seq", "constant")), ("ratio_level", ("token", "sequence")), ("prompt_format", ("auto", "chat", "plain")),
        ("sync", ("auto", "tensor", "nccl")), ("device", ("auto", "cuda", "cpu")))]
    for flag, ok, allowed in rules:
        if not ok:
            raise UserError(f"--{flag} {getattr(cfg, flag)!r} is out of range: it must be {allowed}")
    if cfg.prompts_per_step % world:
        raise UserError(f"--prompts_per_step {cfg.prompts_per_step} must divide by the world size {world}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no GPU: use --device cpu (tests), or a torch build with CUDA")
    if cfg.colocate and cfg.sync == "nccl":
        raise UserError("--sync nccl needs the server on another GPU than rank 0 (NCCL allows one rank per GPU); "
                        "drop --colocate or use --sync tensor")
    servers = parse_servers(cfg)
    try:  # and written: a read-only folder would fail only after the model and optimizer were loaded
        os.makedirs(cfg.out_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=cfg.out_dir).close()
    except OSError as e:
        raise UserError(f"--out_dir {cfg.out_dir!r} cannot be created or written: {e.strerror}") from None
    if cfg.ratio_level == "sequence" and max(cfg.clip_low, cfg.clip_high) >= 0.01:
        print0(f"warning: GSPO (--ratio_level sequence) with --clip_low {cfg.clip_low} / --clip_high {cfg.clip_high}: a "
               f"sequence's ratio is the geometric mean of its tokens', so GRPO's clips almost never bite; GSPO uses ~3e-4")
    check_out_dir(cfg)
    return step_set(cfg.debug_skip_sync), servers


def parse_servers(cfg):
    """--server_url, --server_gpu -> [(url, [its GPUs])], one per server (one --server_gpu entry serves them all)."""
    urls, gpus = [u.strip() for u in cfg.server_url.split(",")], str(cfg.server_gpu).split(",")
    for u in urls:
        p = urlparse(u)
        if p.scheme not in ("http", "https") or not p.hostname or not port_ok(p):
            raise UserError(f"--server_url {u!r} is not a server address: it must look like http://127.0.0.1:30000")
    urls = [u.rstrip("/") for u in urls]
    twice = [u for u in urls if urls.count(u) > 1]
    if twice:
        raise UserError(f"--server_url lists {twice[0]} twice: name each server once")
    gpus = gpus * len(urls) if len(gpus) == 1 else gpus
    if len(gpus) != len(urls) or not all(x.strip().isdigit() for g in gpus for x in g.split("+")):
        raise UserError(f"--server_gpu {cfg.server_gpu!r} must name the GPU of each --server_url ({len(urls)}), as "
                        f"serve.sh's GPU: one entry per server (comma-separated; '+' joins a tensor-parallel server's GPUs, "
                        f"e.g. 2+3), or one entry for all")
    return [(u, [int(x) for x in g.split("+")]) for u, g in zip(urls, gpus)]


def port_ok(url):
    try:
        return url.port is None or 0 < url.port < 65536
    except ValueError:  # not a number, or out of range
        return False


def setup(cfg):
    """Ranks, flags, the GPU layout and the process group, all checked before anything heavy is loaded.
    -> rank, world, master, device, mesh, the servers and how weights reach them (sync, why, server_idx), ckpt, skip."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if cfg.resume:
        restore_config(cfg)
    cfg.api_key = cfg.api_key or os.environ.get("SGLANG_API_KEY", "")
    skip, servers = check_config(cfg, world)
    ckpt = checkpoint_to_resume(cfg.out_dir) if cfg.resume else None
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if use_cuda:
        dev_idx, server_idx = gpu_layout(servers, cfg.colocate, local_rank, local_world, visible, torch.cuda.device_count())
        device = torch.device("cuda", dev_idx)
        torch.cuda.set_device(device)
    else:
        device, server_idx = torch.device("cpu"), ["cpu"] * len(servers)
        torch.multiprocessing.set_sharing_strategy("file_system")  # CPU tensors by file name (tests)
    sync, why = pick_sync(cfg, servers, server_idx, visible)
    if sync == "nccl":  # SGLang's server runs NCCL with cuMem off unless told otherwise: both ends must agree
        os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
    if "RANK" not in os.environ:  # plain `python grpo_sglang.py`: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29511"), RANK="0", WORLD_SIZE="1")
    # No device_id: a default group bound to a device makes torch build every later NCCL group by splitting
    # it, and the weight-update group must instead meet the server (found on the GPU: the server waited).
    dist.init_process_group("nccl" if use_cuda else "gloo")
    from torch.distributed.device_mesh import init_device_mesh
    torch.manual_seed(cfg.seed + rank)
    if use_cuda:  # CUDA-IPC handles then name the GPU by UUID (see the weight sync); CUDA tensors only
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        monkey_patch_torch_reductions()
    return SimpleNamespace(rank=rank, world=world, master=rank == 0, device=device, mesh=init_device_mesh(device.type, (world,)),
                           sync=sync, why=why, servers=servers, server_idx=server_idx, ckpt=ckpt, skip=skip)


def load_data(cfg, context=None):
    """-> tokenizer, train and eval prompts (formatted and tokenized once), the reward function and the task's
    correctness check (what accuracy counts). `context`: the server's context length (prompt + completion)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(cfg.model)
    fmt = ("chat" if tok.chat_template else "plain") if cfg.prompt_format == "auto" else cfg.prompt_format
    if fmt == "chat" and not tok.chat_template:
        raise UserError(f"--prompt_format chat, but the tokenizer of {cfg.model} has no chat template (a base model?): "
                        f"use --prompt_format plain (or auto)")
    task = "arithmetic" if cfg.dataset == "builtin" else "gsm8k"
    try:
        reward_fn = reward_fns.get_reward_fn(task if cfg.reward == "auto" else cfg.reward)
    except ValueError as e:
        raise UserError(f"--reward: {e}") from None
    instruction = INSTRUCTIONS[task] if cfg.instruction == "auto" else cfg.instruction
    skipped, max_len = Counter(), cfg.max_prompt_tokens
    if context and context - cfg.max_new_tokens - 1 < max_len:  # SGLang refuses prompt + max_new_tokens >= context
        max_len = context - cfg.max_new_tokens - 1
        if max_len < 1:
            raise UserError(f"--max_new_tokens {cfg.max_new_tokens} leaves no room for a prompt: the server's context is "
                            f"{context} tokens, prompt and completion together. Lower --max_new_tokens.")
        print0(f"prompts longer than {max_len} tokens are skipped: the server's context ({context}) minus --max_new_tokens")
    raw_train, raw_eval, held_out = load_splits(cfg)
    train, evals = (tokenize_rows(rows, tok, cfg, instruction, fmt, skipped, max_len) for rows in (raw_train, raw_eval))
    print0(f"data: {len(train)} train / {len(evals)} eval prompts from {cfg.dataset} (eval: {held_out}); skipped "
           f"{sum(skipped.values())} rows" + (f" ({dict(skipped)})" if skipped else ""))
    print0(f"prompt format: {fmt} " + ("(the tokenizer's chat template)" if fmt == "chat" else "('question\\ninstruction\\n')"))
    if not train or not evals:
        fields = any("_field" in why for why in skipped) and raw_train
        raise UserError(f"no usable rows left for {'training' if not train else 'evaluation'} (skipped: {dict(skipped)})" +
                        (f"; the rows have the fields {sorted(raw_train[0])}: name the question's and the answer's with "
                         f"--prompt_field and --answer_field" if fields else "") +
                        ("; raise --max_prompt_tokens (or lower --max_new_tokens)" if any("longer" in w for w in skipped)
                         else ""))
    return tok, train, evals, reward_fn, reward_fns.CORRECT[task]


def load_hf_dataset(cfg):
    import datasets
    try:  # a local folder of data files has no config name (the default 'main' is GSM8K's)
        ds = datasets.load_dataset(cfg.dataset, None if os.path.isdir(cfg.dataset) else cfg.dataset_config or None)
    except Exception as e:
        if os.path.isdir(cfg.dataset):  # datasets' error names no file: find the broken one (JSON: its line)
            for f in sorted(os.listdir(cfg.dataset)):
                if f.endswith((".json", ".jsonl")):
                    read_rows(os.path.join(cfg.dataset, f))
        raise UserError(f"could not load dataset {cfg.dataset!r} ({type(e).__name__}: {str(e)[:300]}). --dataset takes "
                        f"a dataset on the HF hub, a local folder of data files, a .json/.jsonl file, or 'builtin'") from None
    for flag, split in (("train_split", cfg.train_split), ("eval_split", cfg.eval_split)):
        if split and split not in ds:
            raise UserError(f"--{flag}: dataset {cfg.dataset!r} has no split {split!r} (it has {list(ds)})" +
                            (" (--eval_split '' holds out rows of the train split)" if flag == "eval_split" else ""))
    return ds


def read_rows(path):
    """A .jsonl file (one JSON object per line) or a .json file (a list of objects) -> rows; errors name the line."""
    example = '{"question": "What is 2 + 3?", "answer": "5"}'
    if not path.endswith((".json", ".jsonl")) or not os.path.isfile(path):
        raise UserError(f"--dataset {path}: " + ("no such file" if not os.path.exists(path) else "a local file must be .jsonl (one "
                        f"JSON object per line, e.g. {example}) or .json (a list of such objects)"))
    try:
        text = open(path, encoding="utf-8").read()
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    if path.endswith(".json") and text.lstrip().startswith("["):
        try:
            items = list(enumerate(json.loads(text), 1))
        except json.JSONDecodeError as e:
            raise UserError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            try:
                items += [(n, json.loads(line))] if line.strip() else []
            except json.JSONDecodeError as e:
                raise UserError(f"{path} line {n} is not valid JSON ({e.msg}): {line[:80]!r}") from None
    bad = next((n for n, r in items if not isinstance(r, dict)), None)
    if bad or not items:
        raise UserError(f"{path}: " + (f"row {bad} is not a JSON object" if bad else "the file holds no rows") +
                        f"; each row must be an object like {example}")
    return [r for _, r in items]


def load_models(cfg, rt):
    """-> the policy (fp32 master weights, sharded with FSDP2), the reference (only when beta > 0), AdamW, and the
    step to start from (a checkpoint's, with --resume)."""
    from transformers import AutoModelForCausalLM
    if cfg.resume and not rt.ckpt:
        print0(f"--resume: no checkpoint in {cfg.out_dir} yet, starting from {cfg.model}")
    if rt.ckpt:
        check_architecture(rt.ckpt, cfg.model)
    model = shard(load_policy(rt.ckpt or cfg.model, rt.device, cfg.grad_checkpointing), rt.mesh, torch.bfloat16, cfg.tf32_head)
    ref = None
    if cfg.beta > 0:
        ref = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.bfloat16).to(rt.device).eval()
        ref = shard(ref, rt.mesh, torch.bfloat16, cfg.tf32_head).requires_grad_(False)
    # fused: one kernel and no temporaries; the default (foreach) Adam allocates a copy of a moment per step,
    # which for a 7B model on one H200 is the difference between fitting and an OOM at the first step
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=rt.device.type == "cuda")
    start = load_checkpoint(rt.ckpt, model, opt) if rt.ckpt else 0
    if rt.ckpt:
        print0(f"resumed from {rt.ckpt} at step {start}")
    if start >= cfg.steps:
        raise UserError(f"--resume: the checkpoint in {cfg.out_dir} is at step {start} and --steps is {cfg.steps}: nothing "
                        f"left to train (raise --steps)")
    return model, ref, opt, start


def check_architecture(ckpt, model):
    """--resume: the checkpoint's weights must be those of --model's architecture (the server serves --model)."""
    from transformers import AutoConfig
    a, b = (AutoConfig.from_pretrained(p).to_dict() for p in (ckpt, model))
    keys = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings")
    diff = [f"{k} {a.get(k)} there, {b.get(k)} in --model" for k in keys if a.get(k) != b.get(k)]
    if diff:
        raise UserError(f"--resume: the checkpoint {ckpt} is not a checkpoint of --model {model} ({'; '.join(diff)}). "
                        f"Resume with the model it was trained from, or start a new run in another --out_dir.")


# ----------------------------------------------------------------------------------------
# The SGLang server, through its public HTTP API only.

class Server:
    """The SGLang servers: rollouts, the sync check and weight pushes. Every wait on a server has a timeout
    (--request_timeout) that ends in one clear message that names it, never a hang."""

    def __init__(self, cfg, rt):
        self.cfg, self.rt, self.urls = cfg, rt, [u for u, _ in rt.servers]
        info = on_all_ranks(lambda: rt.master and [check_server(cfg, u) for u in self.urls])  # every rank stops on a bad one
        info = on_all_ranks(lambda: check_servers_once(cfg, rt, rank0(info)))
        self.context = min((s["context"] for s in info if s["context"]), default=None)  # tokens: prompt + completion
        self.link, servers = None, [{"url": u, **s, "device": torch.device("cuda", i) if rt.device.type == "cuda" and
                                     i is not None else rt.device}  # rank 0's way to each server's weights
                                    for u, s, i in zip(self.urls, info, rt.server_idx)]
        if rt.master and rt.sync == "tensor":
            self.link = {"kind": "tensor", "servers": servers, "device": servers[0]["device"]}
        self.link = on_all_ranks(lambda: connect_nccl(cfg, rt.device, servers) if rt.master and rt.sync == "nccl" else self.link)
        where = f", NCCL group at {self.link['where']}" if self.link and "where" in self.link else ""
        print0(f"layout: training on {rt.device} x {rt.world}{' (server colocated)' if cfg.colocate else ''}; server"
               f"{'s' if len(self.urls) > 1 else ''} at {', '.join(self.urls)}" + (f" (tensor parallel: {[s['tp'] for s in servers]})"
               if info and max(s["tp"] for s in servers) > 1 else "") + f"; weight sync: {rt.sync} ({rt.why}{where})")

    def rollout(self, rows, version, greedy=False):
        """group_size completions of each prompt row (one, greedy, to evaluate), which must come from θ_version.
        Prompt j of this rank's share goes to server (rank * len(rows) + j) % servers: a pure function of the step,
        and a group never straddles two servers. -> the batch: rows, outs = [(completion ids, the server's logprobs
        of them, finish reason)], srv (each completion's server), version, span."""
        cfg, t0, n = self.cfg, time.time(), 1 if greedy else self.cfg.group_size
        sp = {"max_new_tokens": cfg.max_new_tokens, "temperature": 0.0 if greedy else cfg.temperature, "top_p": cfg.top_p,
              "top_k": cfg.top_k}
        srv = [(self.rt.rank * len(rows) + j) % len(self.urls) for j in range(len(rows)) for _ in range(n)]
        asked = {k: POOL.submit(generate, cfg, url, [r["ids"] for j, r in enumerate(rows) for _ in range(n) if srv[j * n] == k],
                                str(version), "sampled", "this rollout", sampling_params=sp) for k, url in enumerate(self.urls) if k in srv}
        got, outs = {k: iter(f.result()) for k, f in asked.items()}, []  # each request has its own timeout
        for k in srv:
            o = next(got[k])
            lps = [lp for lp, *_ in o["meta_info"]["output_token_logprobs"]]  # SGLang keeps EOS (and its logprob) in
            if len(lps) != len(o["output_ids"]):                             # output_ids: the policy must learn to stop
                raise UserError(f"/generate returned {len(o['output_ids'])} tokens but {len(lps)} logprobs: unexpected server version?")
            outs.append((o["output_ids"], lps, (o["meta_info"].get("finish_reason") or {}).get("type", "?")))
        return {"rows": rows, "outs": outs, "srv": srv, "version": version, "span": (t0, time.time())}

    def check(self, batch, version, model, pad_id):
        """-> check(mbs, sums, maxes), which train_step calls before its first update: the sync check of training
        on `batch` with θ_version, for every server. It compares trainer and server logprobs on the same tokens under
        the same weights: the batch's own if it was sampled from θ_version; else (--async: the batch is one step
        older) those of a few of its sequences, which their server re-scores with θ_version now, while we train."""
        cfg, srv = self.cfg, batch["srv"]
        if batch["version"] == version:
            return lambda mbs, sums, maxes: self.verdict(version, [r for b in mbs for r in row_stats(b)], srv)
        if not cfg.check_seqs:  # --check_seqs 0: batches one step old go unchecked (the version check stays)
            return lambda mbs, sums, maxes: ({"check_tokens": 0}, {})
        rows = check_rows(srv, -(-cfg.check_seqs // self.rt.world))  # rounded up: never 0 rows on a rank
        seqs = [(batch["rows"][i // cfg.group_size]["ids"], batch["outs"][i][0]) for i in rows]
        asked = {k: POOL.submit(rescore, cfg, url, [q for q, i in zip(seqs, rows) if srv[i] == k], str(version))
                 for k, url in enumerate(self.urls) if k in {srv[i] for i in rows}}
        t1 = None
        if cfg.temperature != 1:  # SGLang re-scores at temperature 1, so must we. Now, before any backward: a no-grad
            ids, attn, _, P = pad_batch([{"prompt": p, "completion": c} for p, c in seqs], pad_id, self.rt.device)
            with torch.no_grad():  # forward after one leaves FSDP's root gathered, and the next step would use its
                t1 = list(completion_logprobs(model, ids, attn, P, 1.0))  # weights from before the update

        def check(mbs, sums, maxes):
            lps = t1 or [mbs[i // cfg.micro_batch]["lp0"][i % cfg.micro_batch] for i in rows]
            now = on_all_ranks(lambda: {k: iter(waited(f, cfg.request_timeout, "re-scoring a batch for the sync check"))
                                        for k, f in asked.items()})
            return self.verdict(version, [rescored_stats(t, next(now[srv[i]]), batch["outs"][i][1]) for t, i in zip(lps, rows)],
                                [srv[i] for i in rows])
        return check

    def verdict(self, version, stats, srv):
        """stats: per sequence (|Δ| sum, tokens, |Δ| max[, stale sum, stale max]) of trainer vs server `srv[i]` under
        θ_version. Stop (every rank) unless every server agrees with the trainer to within kernel noise.
        -> this rank's (named sums, maxima) for the metrics."""
        per = torch.zeros(len(self.urls), 2, dtype=torch.float64)
        for st, k in zip(stats, srv):
            per[k] += torch.tensor(st[:2], dtype=torch.float64)
        total = per.to(self.rt.device)
        dist.all_reduce(total)
        for k, (d, n) in enumerate(total.tolist()):
            if n and d / n > self.cfg.mismatch_max:
                raise UserError(f"weight sync check failed at step {version + 1}: the server at {self.urls[k]} had the right "
                                f"version tag (the weights after step {version}), but on {n:.0f} sampled tokens its logprobs differ "
                                f"from the trainer's, under those weights, by {d / n:.3f} nats on average (--mismatch_max "
                                f"{self.cfg.mismatch_max}; kernel noise is ~0.01-0.03): it does not generate with the weights "
                                f"it was sent.")
        col = lambda j, f: f(st[j] for st in stats) if stats else 0.0
        sums, maxes = {"check_abs": col(0, sum), "check_tokens": col(1, sum)}, {"check_max": col(2, max)}
        if stats and len(stats[0]) > 3:  # re-scored: the staleness on the same tokens too
            sums["stale_abs"], maxes["stale_max"] = col(3, sum), col(4, max)
        return sums, maxes

    def push(self, model, version):
        """θ_version (the weights after `version` steps) to every server, tagged `version`. -> bytes sent (rank 0)."""
        if version not in self.rt.skip:
            return on_all_ranks(push_weights, self.cfg, model, self.link, str(version))
        if self.cfg.debug_tag_skipped:  # negative control: servers that drop the weights but not the tag
            on_all_ranks(lambda: self.rt.master and [call(self.cfg, u, "/update_weight_version", {
                "new_version": str(version), "abort_all_requests": False}) for u in self.urls])
        return 0

    def close(self):
        for srv in self.link["servers"] if self.link and self.link["kind"] == "nccl" else []:
            call(self.cfg, srv["url"], "/destroy_weights_update_group", {"group_name": srv["group_name"]}, timeout=30, retries=0)


def row_stats(b):
    """A micro-batch -> per sequence (|Δ| sum, tokens, |Δ| max) of the trainer's first-pass logprobs against the
    server's that sampled it."""
    d = (b["lp0"] - b["server"]).abs() * b["mask"]
    return torch.stack([d.sum(1), b["mask"].sum(1), d.max(1).values], 1).tolist()


def rescored_stats(trainer, now, then):
    """One re-scored sequence: trainer (C,) vs the server now (same weights: kernel noise only, whatever the lr), and
    the server when it sampled, one step older, vs now (the pure staleness) -> (|Δ| sum, tokens, max, stale sum, max)."""
    now = trainer.new_tensor(now)
    d, stale = (trainer[: len(now)] - now).abs(), (trainer.new_tensor(then) - now).abs()
    return d.sum().item(), len(now), d.max().item(), stale.sum().item(), stale.max().item()


def call(cfg, url, path, payload=None, timeout=None, retries=None):
    """POST (or GET without payload) to the server at `url`, with timeout, retries and backoff. -> parsed JSON or text."""
    retries = cfg.request_retries if retries is None else retries
    for attempt in range(retries + 1):
        try:
            r = requests.request("GET" if payload is None else "POST", url + path, json=payload,
                                 headers=auth(cfg), timeout=timeout or cfg.request_timeout)
            if r.status_code in (401, 403):
                raise UserError(f"the server at {url} refused {path} (HTTP {r.status_code}): wrong or missing --api_key")
            if r.status_code >= 500 and attempt < retries:  # overloaded or restarting: try again
                raise requests.ConnectionError(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code >= 400:
                raise UserError(f"the server at {url} answered {path} with HTTP {r.status_code}: {r.text[:500]}")
            try:
                return r.json()
            except ValueError:
                return r.text  # /flush_cache answers plain text
        except (requests.ConnectionError, requests.Timeout) as e:
            if attempt == retries:
                raise UserError(f"no answer from the SGLang server at {url}{path} after "
                                f"{retries + 1} tries ({type(e).__name__}: {str(e)[:200]}).\n"
                                f"Is it running? Start it with: bash serve.sh   (see serve.log)") from None
            time.sleep(min(2 ** attempt, 30))


def auth(cfg):
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def check_server(cfg, url):
    """Before anything heavy: is the server up, and does it serve our model? -> whether it has /begin_weight_update,
    its tensor-parallel size, the port it reports listening on, and its context length (None if it does not say)."""
    call(cfg, url, "/health", timeout=10, retries=1)
    info = call(cfg, url, "/model_info", timeout=30)
    if not isinstance(info, dict):
        raise UserError(f"{url} does not answer like an SGLang server (/model_info: {str(info)[:100]!r})")
    served = str(info.get("model_path", ""))
    same = served == cfg.model or (os.path.exists(cfg.model) and os.path.realpath(served) == os.path.realpath(cfg.model))
    if not same:
        raise UserError(f"the server at {url} serves {served!r} but the trainer trains {cfg.model!r}.\n"
                        f"Restart it with the same model: bash serve.sh stop && MODEL={cfg.model} bash serve.sh")
    server_info = call(cfg, url, "/server_info", timeout=30)
    server_info = server_info if isinstance(server_info, dict) else {}
    try:  # the OpenAI-style model card says the server's real context length (its --context-length included)
        context = call(cfg, url, "/v1/models", timeout=30, retries=0)["data"][0].get("max_model_len")
    except (UserError, KeyError, IndexError, TypeError):
        context = None
    # SGLang >= 0.5.21 refuses weight updates outside a /begin_weight_update ... /end_weight_update
    # session; 0.5.16 has neither route. A GET on a POST-only route answers 405 where it exists.
    try:
        r = requests.get(url + "/begin_weight_update", headers=auth(cfg), timeout=cfg.request_timeout)
    except requests.RequestException as e:
        raise UserError(f"the SGLang server at {url} stopped answering ({e})") from None
    return {"begin_end": r.status_code == 405, "tp": int(server_info.get("tp_size") or 1), "context": context,
            "port": server_info.get("port")}


def check_servers_once(cfg, rt, info):
    """Each server counted once: two names of one server (127.0.0.1 and localhost, or this host's name) would get every
    push twice. The same server: the same address and port, or both on this host and listening on the same port (as
    each reports it). A tensor-parallel server on this host must have all its GPUs in --server_gpu. -> info."""
    where = [address(u) for u, _ in rt.servers]
    for j, ((host, port), s) in enumerate(zip(where, info)):
        for i in range(j):
            here = on_this_host(host) and on_this_host(where[i][0]) and s["port"] and s["port"] == info[i]["port"]
            if (host, port) == where[i] or here:
                raise UserError(f"--server_url names one server twice, as {rt.servers[i][0]} and {rt.servers[j][0]}: "
                                f"list each server once (else it gets every push twice)")
    for (url, gpus), s, (host, _) in zip(rt.servers, info, where):
        if on_this_host(host) and len(gpus) != s["tp"] and not (cfg.colocate and len(rt.servers) == 1):
            raise UserError(f"--server_gpu gives the server at {url} {len(gpus)} GPU(s) ({'+'.join(map(str, gpus))}), but it "
                            f"is tensor-parallel over {s['tp']}: name all its GPUs joined by '+' (e.g. 2+3), as serve.sh "
                            f"prints them, so that no training rank lands on one of them")
    return info


def address(url):
    """A server's URL -> (IP address, port), its hostname resolved."""
    u = urlparse(url)
    try:
        host = socket.gethostbyname(u.hostname)
    except OSError:
        host = u.hostname
    return host, u.port or (443 if u.scheme == "https" else 80)


def on_this_host(host):
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname()) or host == local_address(host)


def rank0(obj):
    """Rank 0's obj on every rank."""
    out = [obj]
    dist.broadcast_object_list(out, src=0)
    return out[0]


def generate(cfg, url, input_ids, version, did, what, **req):
    """One batched /generate (the server schedules all of it, and every rank's, together) -> its answers. Every
    answer must come from weights `version` (the tag of the last push), or we stop: a push was lost."""
    out = call(cfg, url, "/generate", {"input_ids": input_ids, "return_logprob": True, **req})
    if not isinstance(out, list) or len(out) != len(input_ids):
        raise UserError(f"/generate returned {type(out).__name__} of unexpected size (wanted {len(input_ids)} items)")
    for o in out:
        if str(o["meta_info"].get("weight_version")) != version:
            raise UserError(f"the server at {url} {did} with weights of version {o['meta_info'].get('weight_version')!r}, but {what} "
                            f"must come from version {version!r} (the trainer's weights after step {version}). A weight push "
                            f"was skipped, rejected or reordered, or another client changed the server's weights. Stopping "
                            f"rather than training on another policy's samples.")
    return out


def rescore(cfg, url, seqs, version):
    """[(prompt ids, completion ids)] -> the server's logprobs of each completion under its current weights,
    which must be `version`: a prefill only (max_new_tokens 0). SGLang's input logprobs are those of the
    raw logits (temperature 1) and start with None for the token at logprob_start_len: we start one early.
    Their token ids say that they line up with the tokens sent; SGLang reports ids >= vocab_size - 1 as 0
    (it clips image-token hashes so), and a random-weight model, sampling every id, does sample the last one."""
    out = generate(cfg, url, [p + c for p, c in seqs], version, "re-scored the batch", "this check", sampling_params={
        "max_new_tokens": 0}, logprob_start_len=[len(p) - 1 for p, _ in seqs])
    lps = [o["meta_info"]["input_token_logprobs"][-len(c):] for o, (_, c) in zip(out, seqs)]
    for got, (_, c) in zip(lps, seqs):
        off = [i for i, ((lp, t, *_), x) in enumerate(zip(got, c)) if lp is None or t not in (x, 0)]
        if off or len(got) != len(c):
            raise UserError(f"the server at {url} re-scored a sequence of the sync check (/generate, max_new_tokens 0, "
                            f"logprob_start_len) out of line with its {len(c)} completion tokens ({len(got)} logprobs, "
                            f"the first off at token {off[0] if off else '-'}): unexpected from this server version. "
                            f"--check_seqs 0 turns the re-scoring off; the version check of every rollout stays.")
    return [[lp for lp, *_ in got] for got in lps]


def check_rows(srv, k):
    """About k of a rank's rows (srv: each row's server) for the re-score check, evenly spaced over each server's rows,
    and at least one of each server's: a server that drops weights must be among the re-scored."""
    per, rows = -(-k // len(set(srv))), []
    for server in sorted(set(srv)):
        idx = [i for i, s in enumerate(srv) if s == server]
        rows += idx if per >= len(idx) else [idx[j * len(idx) // per] for j in range(per)]
    return sorted(rows)


POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64)  # requests (to every server), NCCL sends, rollouts


def waited(future, timeout, what):
    """future.result(), its error raised here, and a timeout that ends in a clear message, never a hang."""
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        raise UserError(f"{what} did not finish within {timeout:.0f}s (--request_timeout): is the server still alive? "
                        f"Its log (serve.log) says more.") from None


def on_all_ranks(fn, *args):
    """fn(*args) on this rank; a UserError on ANY rank is raised on every rank, so none of them is
    left waiting in a collective for a rank that stopped."""
    err = out = None
    try:
        out = fn(*args)
    except UserError as e:
        err = str(e)
    errs = [None] * dist.get_world_size()
    dist.all_gather_object(errs, err)
    errs = [e for e in errs if e]
    if errs:
        raise UserError(errs[0])
    return out


# ----------------------------------------------------------------------------------------
# Weight sync. Two ways to get rank 0's weights into the server after every optimizer step:
#   tensor  The server process sees only its own GPU, so a CUDA-IPC handle of a tensor on a training
#           GPU is useless to it. Rank 0 (which sees every GPU under torchrun) copies the weights into
#           flat buckets that live ON THE SERVER'S GPU and sends their IPC handles, serialized with
#           SGLang's own helpers (which name the device by UUID: the server's cuda:0 is our cuda:3).
#   nccl    Rank 0 and the server form a 2-rank process group; rank 0 broadcasts each bucket while
#           the server's /update_weights_from_distributed request receives it. Works across hosts.

def gpu_layout(servers, colocate, local_rank, local_world, visible, n_devices):
    """-> (this rank's CUDA index, for each server its first GPU as this process indexes it, or None if hidden).
    `visible` is CUDA_VISIBLE_DEVICES (None if unset). With --colocate one server shares rank 0's GPU (whatever
    --server_gpu says), several may share training GPUs. Raises UserError on impossible layouts."""
    if local_world > n_devices:
        raise UserError(f"{local_world} training ranks but only {n_devices} visible GPUs")
    if colocate and len(servers) == 1:
        return local_rank, [0]
    ids, firsts = [s.strip() for s in visible.split(",")] if visible is not None else [str(i) for i in range(n_devices)], []
    for url, gpus in servers:
        stages = [ids.index(str(g)) if str(g) in ids else None for g in gpus]
        for gpu, stage in zip(gpus, stages):
            if stage is not None and stage < local_world and not colocate:
                raise UserError(f"training rank {stage} would run on GPU {gpu}, which the SGLang server at {url} uses. Ranks "
                                f"take the visible GPUs 0..n-1 in order: use fewer ranks or list the server's GPU last in "
                                f"CUDA_VISIBLE_DEVICES, move the server (GPU=<id> bash serve.sh, --server_gpu <id>), or pass "
                                f"--colocate to share it on purpose.")
        firsts.append(stages[0])
    return local_rank, firsts


def pick_sync(cfg, servers, server_idx, visible):
    """-> ('tensor' or 'nccl', why). The tensor path needs rank 0 to see every server's GPU on this host."""
    hosts = [urlparse(u).hostname or "" for u, _ in servers]
    away = [h for h in hosts if not on_this_host(h)]
    if cfg.sync == "nccl":
        return "nccl", "--sync nccl"
    if not away and None not in server_idx:
        return "tensor", ("on the CPU: tensors shared through files" if server_idx[0] == "cpu" else "the server shares rank 0's "
                          "GPU" if cfg.colocate and len(servers) == 1 else f"rank 0 sees the servers' GPU {cfg.server_gpu}")
    hidden = [gpus[0] for (_, gpus), i in zip(servers, server_idx) if i is None]
    why = (f"the server's GPU {hidden[0]} (--server_gpu) is not visible to the trainer "
           f"({f'CUDA_VISIBLE_DEVICES={visible}' if visible is not None else 'no such GPU here'})"
           if not away else f"the server ({away[0]}) is on another host")
    if cfg.sync == "tensor":
        raise UserError(f"--sync tensor needs rank 0 to see the server's GPU on the same host, but {why}. Use "
                        f"--sync nccl (or auto), or fix the layout: --server_gpu <id>, or unset CUDA_VISIBLE_DEVICES.")
    return "nccl", why


def local_address(host):
    """This host's address on the route to `host` (what a server there connects back to)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))  # UDP: picks the route, sends nothing
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def weight_buckets(model, limit, keep):
    """All ranks: -> iterator of (bucket, last?); a bucket is [(name, full tensor)] of about `limit`
    bytes in bf16. Gathering a sharded parameter is a collective, so every rank walks all of them;
    only a rank with `keep` holds on to the full tensors."""
    from torch.distributed.tensor import DTensor
    params, one_rank = list(model.named_parameters()), dist.get_world_size() == 1
    bucket, size = [], 0
    for i, (name, p) in enumerate(params):
        full = p.data
        if isinstance(full, DTensor):
            full = full.to_local() if one_rank else full.full_tensor()
        size += full.numel() * 2
        bucket += [(name, full)] if keep else []
        last = i == len(params) - 1
        if last or size >= limit:
            yield bucket, last
            bucket, size = [], 0


def pack(named, device):
    """[(name, tensor)] -> (ONE flat uint8 buffer on `device` holding every tensor as bf16, back to
    back; SGLang's FlattenedTensorMetadata of each): the layout its FlattenedTensorBucket reads."""
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata
    flat = torch.empty(sum(t.numel() * 2 for _, t in named), dtype=torch.uint8, device=device)
    meta, off = [], 0
    for name, t in named:
        n = t.numel() * 2
        flat[off: off + n].view(torch.bfloat16).copy_(t.reshape(-1))  # cast (+ cross-GPU copy)
        meta.append(FlattenedTensorMetadata(name=name, shape=t.shape, dtype=torch.bfloat16,
                                            start_idx=off, end_idx=off + n, numel=n))
        off += n
    if flat.is_cuda:  # the gathers and copies are done (on our GPU and the buffer's) before anyone reads it
        torch.cuda.synchronize()
        torch.cuda.synchronize(device)
    return flat, meta


def send_bucket(cfg, link, flat, meta, last, version):
    """POST one bucket's update to every server; the last one flushes their prefix caches and sets the version tag.
    -> wait(). tensor: a copy of the bucket on each server's GPU (a server sees its own GPUs only), its CUDA-IPC
    handle (SGLang's serializer) for each TP rank; `flat` must stay alive until the servers have answered.
    nccl: every server posts its receive when the request reaches it, so all requests are in flight before our
    broadcasts (one per server's group) are waited on (a blocking request first would deadlock); the broadcasts run
    on a side thread and all are waited on with --request_timeout: a dead server is an error, never an NCCL hang."""
    req, flats = {"load_format": "flattened_bucket", "flush_cache": last, "weight_version": version if last else None}, {}
    if link["kind"] == "tensor":
        for d in {srv["device"] for srv in link["servers"]}:
            flats[d] = flat.to(d)  # the same tensor where it already is
            if flat.is_cuda:
                torch.cuda.synchronize(d)
        # one serialization for each receiving rank: each counts one reference to the shared memory, which that rank's
        # rebuild releases (one payload read by three ranks released it three times: seen with stand-ins under load)
        posts = [POOL.submit(call, cfg, s["url"], "/update_weights_from_tensor", {
            **req, "serialized_named_tensors": [serialize_bucket(flats[s["device"]], meta) for _ in range(s["tp"])]})
                 for s in link["servers"]]
        sent = None
    else:
        req.update(names=[m.name for m in meta], dtypes=["bfloat16"] * len(meta), shapes=[list(m.shape) for m in meta])
        posts = [POOL.submit(call, cfg, s["url"], "/update_weights_from_distributed", {**req, "group_name": s["group_name"]},
                             retries=0) for s in link["servers"]]  # a retry would expect a second send
        sent = POOL.submit(lambda: [broadcast(flat, s["group"]) for s in link["servers"]])

    def wait():
        for srv, answered in zip(link["servers"], posts):
            try:
                r = answered.result()  # raises if the server refused or did not answer in time: nothing waits on NCCL
            except UserError as e:
                raise UserError(f"{e}\nThe NCCL broadcast of a weight bucket did not complete. If the servers are alive, NCCL "
                                f"could not connect the ends: run both sides with NCCL_DEBUG=INFO (see the README).") if sent else e from None
            if not (isinstance(r, dict) and r.get("success")):
                raise UserError(f"the server at {srv['url']} rejected the weight update: {r}. Training on would sample from "
                                f"stale weights, so we stop.")
        if sent:
            waited(sent, cfg.request_timeout, "the NCCL send of a weight bucket")
        return flat.numel()
    return wait


def serialize_bucket(flat, meta):
    from sglang.srt.utils import MultiprocessingSerializer
    return MultiprocessingSerializer.serialize({"flattened_tensor": flat, "metadata": meta}, output_str=True)


def broadcast(flat, group):
    if flat.is_cuda:
        torch.cuda.set_device(flat.device)  # the current device is per thread
    dist.broadcast(flat, src=0, group=group)
    if flat.is_cuda:
        torch.cuda.synchronize(flat.device)


def connect_nccl(cfg, device, servers):
    """Rank 0: one group with each server (us rank 0, its TP ranks 1..tp), built with SGLang's own helper and the same
    group name on both sides. Not one group for all servers: NCCL refuses two ranks of a group on one GPU, and servers
    that share a GPU (or rank 0's) are a layout we use. Everyone blocks until all have joined, so the requests run on
    side threads. -> the link: its servers, each with its group."""
    from datetime import timedelta
    from sglang.srt.utils import init_custom_process_group
    addr = cfg.nccl_master_addr or local_address(urlparse(servers[0]["url"]).hostname or "127.0.0.1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"  # under torchrun, tcp:// rendezvous would only be a
    #                                                       client of torchrun's store; we must host this one
    joins = []
    for k, srv in enumerate(servers):
        port = cfg.nccl_port + k if cfg.nccl_port else free_port()
        srv.update(group_name=f"grpo_sglang_{socket.gethostname()}_{os.getpid()}_{k}", where=f"{addr}:{port}")
        joins.append((POOL.submit(call, cfg, srv["url"], "/init_weights_update_group", {
            "master_address": addr, "master_port": port, "rank_offset": 1, "world_size": 1 + srv["tp"],
            "group_name": srv["group_name"], "backend": backend}, retries=0), POOL.submit(
            init_custom_process_group, backend=backend, init_method=f"tcp://{addr}:{port}", world_size=1 + srv["tp"], rank=0,
            group_name=srv["group_name"], timeout=timedelta(seconds=cfg.request_timeout))))
    for srv, (joined, group) in zip(servers, joins):
        try:
            r = joined.result()
        except UserError as e:
            raise UserError(f"{e}\nThe server at {srv['url']} did not join the NCCL group at {srv['where']}: it must reach "
                            f"this address and port (--nccl_master_addr, --nccl_port, firewall; NCCL_SOCKET_IFNAME picks "
                            f"the interface).") from None
        if not (isinstance(r, dict) and r.get("success")):
            raise UserError(f"the server at {srv['url']} could not join the NCCL weight-update group: {r}")
        srv["group"] = waited(group, cfg.request_timeout, "joining the NCCL group")
    return {"kind": "nccl", "servers": servers, "device": device, "where": ", ".join(s["where"] for s in servers)}


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def push_weights(cfg, model, link, version):
    """All ranks gather each full parameter; rank 0 (the one with a `link`) packs them into flat bf16
    buckets and sends them, bucket k in flight while it gathers and packs bucket k+1. With NCCL and
    several ranks, each send completes before the next gather: interleaving FSDP's collectives with
    the sends deadlocked TRL. The last bucket flushes the server's prefix cache (cached prompts hold
    activations of the old weights) and tags the weights `version`. -> bytes sent (rank 0)."""
    serial = link and link["kind"] == "nccl" and dist.get_world_size() > 1
    for srv in link["servers"] if link else []:
        if srv["begin_end"]:
            call(cfg, srv["url"], "/begin_weight_update", {"selector": "all"})
    sent, in_flight = 0, None
    for bucket, last in weight_buckets(model, cfg.sync_bucket_mb * 2**20, keep=link is not None):
        if not link:
            continue
        flat, meta = pack(bucket, link["device"])
        sent += in_flight() if in_flight else 0  # one update at a time
        in_flight = send_bucket(cfg, link, flat, meta, last, version)
        if serial:
            sent, in_flight = sent + in_flight(), None
    sent += in_flight() if in_flight else 0
    for srv in link["servers"] if link else []:
        if srv["begin_end"]:
            call(cfg, srv["url"], "/end_weight_update", {})
    return sent


# ----------------------------------------------------------------------------------------
# The trainer's model: FSDP2, the TF32 head, checkpoints.

def load_policy(path, device, grad_checkpointing):
    """fp32 master weights in training mode, which transformers' gradient checkpointing needs. Every
    dropout is set to 0 in the config first: the server samples without dropout, and the trainer must
    score the same function (with dropout, ratio != 1 at mu = 1 and the mismatch check sees noise)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(path)
    for k, v in config.to_dict().items():
        if isinstance(v, float) and ("dropout" in k or "pdrop" in k):
            setattr(config, k, 0.0)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32).to(device).train()
    if grad_checkpointing:
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)(  # newer name first
            {"use_reentrant": False})
        model.config.use_cache = False
    return model


class TF32Matmul(torch.autograd.Function):
    """(..., H) @ (V, H)^T -> (..., V) in fp32, its forward and both backward GEMMs on TF32 tensor cores
    (inputs rounded to 10 mantissa bits, fp32 sums and output). Scoped to this matmul: the global switch
    would also round the fp32 RoPE angle matmul of transformers' models (transformers issue 48428)."""
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        with tf32_matmuls():
            return x @ w.T

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        with tf32_matmuls():
            dx = dy @ w if ctx.needs_input_grad[0] else None
            dw = dy.flatten(0, -2).T @ x.flatten(0, -2) if ctx.needs_input_grad[1] else None
        return dx, dw


@contextlib.contextmanager
def tf32_matmuls():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 (what SGLang's --enable-tf32-matmul sets)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def shard(model, mesh, param_dtype, tf32_head=False):
    """FSDP2: each transformer block its own unit computing in bf16; fp32 master weights and grads.
    The root unit (embeddings, final norm, LM head) computes in fp32: bf16 logits are rounded in
    steps of 0.125 at |logit| ~ 20, and our first H200 run showed trainer/server logprob gaps of exactly
    0.125 and 0.25 (serve.sh starts SGLang with --enable-fp32-lm-head to match; MiniMax-M1 did the same).
    Some final norms (Gemma's) return their input's dtype, bf16 from the last block, so the head casts
    its input to fp32 itself: one cast where it matters, rather than fp32 activations between blocks.
    `tf32_head`: the head's matmul on TF32, whose input rounding is finer than that of the bf16 weights the
    server's head reads; in exact fp32 it was the largest single cost of a 1.5B training step (FLOP count)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils._pytree import tree_map
    to_compute = lambda t: t.to(param_dtype) if torch.is_tensor(t) and t.is_floating_point() else t
    for m in model.modules():
        if type(m).__name__ in (model._no_split_modules or []):
            fully_shard(m, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32))
            # FSDP casts a block's inputs to bf16, but not when checkpointing re-runs the block in backward:
            # the root's fp32 rotary cos/sin then met bf16 values in attention (an H200 run, transformers 5.12)
            m.register_forward_pre_hook(lambda m, args, kwargs: tree_map(to_compute, (args, kwargs)), with_kwargs=True)
    head = model.get_output_embeddings()
    if tf32_head and type(head) is torch.nn.Linear:
        def head_forward(x):  # head.weight: by now FSDP has swapped the gathered weight in
            y = TF32Matmul.apply(x.float(), head.weight)
            return y if head.bias is None else y + head.bias
        head.forward = head_forward
    else:
        head.register_forward_pre_hook(lambda m, args: (args[0].float(), *args[1:]))
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32))
    return model


def save_checkpoint(cfg, model, opt, tok, step):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)
    rng = [None] * dist.get_world_size()
    dist.all_gather_object(rng, {"torch": torch.get_rng_state(), "python": random.getstate(),
                                 "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None})
    n_params = sum(t.numel() for t in msd.values())

    def write():  # rank 0
        # Write a new folder, then point 'latest' at it with one atomic rename, then drop the old
        # one: a crash (even kill -9) at any moment leaves the previous checkpoint usable.
        import shutil
        d = os.path.join(cfg.out_dir, f"step_{step}")
        shutil.rmtree(d, ignore_errors=True)
        try:
            model.save_pretrained(d, state_dict=msd)
            tok.save_pretrained(d)
            torch.save({"optimizer": osd, "step": step, "rng": rng, "config": saved_config(cfg)},
                       os.path.join(d, "trainer_state.pt"))
            old = latest_checkpoint(cfg.out_dir)
            with open(os.path.join(cfg.out_dir, "latest.tmp"), "w") as f:
                f.write(f"step_{step}")
            os.replace(os.path.join(cfg.out_dir, "latest.tmp"), os.path.join(cfg.out_dir, "latest"))
        except Exception as e:  # a full disk (seen with a 7B model), a quota, permissions: say so, clean up
            shutil.rmtree(d, ignore_errors=True)
            raise UserError(f"could not write the checkpoint {d} ({type(e).__name__}: {str(e)[:200]}). Is the disk full? "
                            f"A checkpoint holds fp32 weights and Adam's two moments, ~{12 * n_params / 1e9:.1f} GB: free "
                            f"space or use another --out_dir. The previous checkpoint there is intact (--resume).") from None
        if old and os.path.basename(old) != f"step_{step}":
            shutil.rmtree(old, ignore_errors=True)
    on_all_ranks(lambda: dist.get_rank() == 0 and write())  # every rank stops if the write failed


def load_checkpoint(ckpt_dir, model, opt):
    """Optimizer state and this rank's RNG states from save_checkpoint's folder (the weights were loaded
    with the model). -> the step to continue from."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    st = torch.load(os.path.join(ckpt_dir, "trainer_state.pt"), weights_only=True)
    set_optimizer_state_dict(model, opt, st["optimizer"], options=StateDictOptions(full_state_dict=True))
    rng = st["rng"][dist.get_rank()]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return st["step"]


def latest_checkpoint(out_dir):
    """-> path of the last complete checkpoint in out_dir, or None."""
    try:
        return os.path.join(out_dir, open(os.path.join(out_dir, "latest")).read().strip())
    except OSError:
        return None


def checkpoint_to_resume(out_dir):
    """--resume: the checkpoint that out_dir/latest names, or None if there is none yet. One that was deleted or
    half-copied is an error that names the complete ones still there."""
    d = latest_checkpoint(out_dir)
    complete = lambda c: all(os.path.exists(os.path.join(c, f)) for f in ("config.json", "trainer_state.pt"))
    if d is None or complete(d):
        return d
    others = sorted((c for c in os.listdir(out_dir) if c.startswith("step_") and complete(os.path.join(out_dir, c))),
                    key=lambda c: int(c[5:]) if c[5:].isdigit() else -1)
    raise UserError(f"--resume: {os.path.join(out_dir, 'latest')} names {os.path.basename(d)}, but "
                    f"{'that folder is gone' if not os.path.isdir(d) else 'it is incomplete (no config.json or trainer_state.pt)'}. "
                    + (f"Complete checkpoints here: {', '.join(others)}; to resume from the last one: echo {others[-1]} > "
                       f"{os.path.join(out_dir, 'latest')}" if others else "There is no other checkpoint here: start afresh in "
                       "another --out_dir."))


def open_metrics(cfg, start):
    """metrics.jsonl for appending. A fresh run never writes into another run's folder; a resumed one first drops
    the rows after its checkpoint (and the evaluation it repeats), so that the file holds each step once."""
    path = os.path.join(cfg.out_dir, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path) if line.strip()] if os.path.exists(path) else []
    keep = [r for r in rows if r["step"] < start or (r["step"] == start and "eval_accuracy" not in r)]
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in keep)
    os.replace(path + ".tmp", path)
    return open(path, "a")


def check_out_dir(cfg):
    """A fresh run into a folder that holds a run would overwrite its checkpoints and mix the two in metrics.jsonl."""
    there = [f for f in ("latest", "metrics.jsonl") if os.path.exists(os.path.join(cfg.out_dir, f))]
    if there and not cfg.resume:
        raise UserError(f"--out_dir {cfg.out_dir} already holds a run ({' and '.join(there)}): continue it with --resume, or "
                        f"start this one in another --out_dir (or delete that one)")


def all_reduce_named(values, op, device):
    """{name: number or 0-d tensor} -> {name: float} reduced over ranks (sorted names: one order everywhere)."""
    keys = sorted(values)
    t = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=device).reshape(()) for k in keys])
    dist.all_reduce(t, op=op)
    return dict(zip(keys, t.tolist()))


def merge(sums, maxes, more_sums, more_maxes=None):
    """Add named sums, keep named maxima (never in place: values may be shared)."""
    for k, v in more_sums.items():
        sums[k] = sums[k] + v
    for k, v in (more_maxes or {}).items():
        maxes[k] = torch.maximum(maxes[k], torch.as_tensor(v).to(maxes[k]))


def exit_now(code, message=None):
    """Exit with `code`, the message said once: under torchrun in each rank's error file, where torchrun shows
    the first rank to fail (rank 0: the others wait 3 s) as the root cause. os._exit: no destructor of a process
    group, or of a thread still waiting for a dead server, can hang or abort the exit."""
    rank, error_file = int(os.environ.get("RANK", 0)), os.environ.get("TORCHELASTIC_ERROR_FILE")
    if message and error_file:
        time.sleep(3 if rank else 0)  # a rank alone with its error still says it, after the wait
        with open(error_file, "w") as f:
            json.dump({"message": {"message": message, "extraInfo": {"py_callstack": message,
                                                                     "timestamp": str(int(time.time()))}}}, f)
    elif message and rank == 0:
        print(f"\n{message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        main(parse_config())
    except UserError as e:
        exit_now(1, f"error: {e}")
    except KeyboardInterrupt:
        exit_now(130, "interrupted: the last checkpoint in --out_dir is intact; continue with --resume")
    exit_now(0)
