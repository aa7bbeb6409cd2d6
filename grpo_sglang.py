"""
GRPO in one file, with rollouts from an SGLang server.

GRPO, Group Relative Policy Optimization (Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300), is
PPO without a value network. For each prompt the policy samples a group of G completions, and a
reward function scores each one. A completion's advantage is its reward minus the mean reward of
its group, divided by the group's standard deviation. The group is the baseline that a value
network would otherwise learn. The loss is PPO's clipped objective, plus an optional KL penalty
that keeps the policy near a frozen reference model.

As in PPO, π_old in the ratio π/π_old is the policy before this batch's updates, so its log-probs
are the trainer's own at the start of the step. With one update per batch (--mu 1, the default) the
ratio is exactly 1, and the loss is the plain policy gradient. The clip acts from the second update
on. The server that sampled the batch is not π_old. Its kernels round differently, and with --async
(the default) it sampled the batch during the last step, from the weights before that step's update.
Truncated importance sampling (TIS, Yao et al. 2025) weighs each token by min(π_old / π_server, 2)
to correct for both.

Two more defaults follow later work. The loss is a mean over every sampled token of the batch
(DAPO), not a mean of each sequence's mean (GRPO). There is no KL penalty unless --beta > 0 (as in
DAPO and Dr. GRPO).

A rollout is an episode of one reply, or of several turns in which the task's environment (a game,
a tool) answers each reply. After every optimizer step the trainer pushes its weights to the
server, and every step checks that the server holds exactly those weights (README, "The sync
check"). The loss value is not a progress signal in GRPO. Watch the reward.

    bash serve.sh && torchrun --nproc_per_node 3 grpo_sglang.py    # 4 GPUs: the server on GPU 3
    GPU=0 MEM_FRACTION=0.3 bash serve.sh && \
        torchrun --nproc_per_node 1 grpo_sglang.py --colocate        # 1 GPU, shared with the server
    python grpo_sglang.py --help                                    # every flag (docs/reference.md)

Read it top to bottom, the config to the loop. The plumbing (HTTP, weight sync, FSDP) sits below
a fence. Where the story calls it, a comment says what comes back.
"""
import concurrent.futures, contextlib, dataclasses, functools, hashlib, json, math, os, random, re
import socket, sys, tempfile, time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from urllib.parse import urlparse

import requests
import torch
import torch.distributed as dist

import reward_fns


def arg(default, help, ok=None):
    """A flag: its default, its help, and a tuple of choices or a rule on v ("v > 0")."""
    return field(default=default, metadata={"help": help, "ok": ok})


# ---- The knobs of GRPO. Config, below the fence, adds the plumbing's flags.

@dataclass
class GRPOConfig:
    # the batch
    steps: int = arg(200, "optimizer updates of the outer loop, one rollout batch each", "v >= 1")
    prompts_per_step: int = arg(24, "prompts a step, over all ranks (a multiple of them)", "v >= 1")
    group_size: int = arg(8, "completions per prompt (G in the paper)", "v >= 2")
    max_new_tokens: int = arg(256, "an episode's tokens after the prompt at most", "v >= 1")
    temperature: float = arg(1.0, "sampling temperature (the trainer scores at it too)", "v > 0")
    seed: int = arg(0, "seed for the data order and torch")
    # the optimizer
    lr: float = arg(1e-6, "AdamW learning rate", "v >= 0")
    weight_decay: float = arg(0.0, "AdamW weight decay", "v >= 0")
    max_grad_norm: float = arg(1.0, "clip the gradient's norm to this (0: no clipping)", "v >= 0")
    mu: int = arg(1, "optimizer steps per rollout batch", "v >= 1")
    async_: bool = arg(True, "sample step s+1 while training step s (--no-async: on-policy)")
    # the loss
    clip_low: float = arg(0.2, "ratio clip below 1 - clip_low", "0 <= v < 1")
    clip_high: float = arg(0.2, "ratio clip above 1 + clip_high (DAPO uses 0.28)", "v >= 0")
    beta: float = arg(0.0, "KL coefficient to the reference model (0: none is loaded)", "v >= 0")
    tis_cap: float = arg(2.0, "TIS: the cap on π_old / π_server (0: off)", "v == 0 or v >= 1")
    loss_agg: str = arg("token", "'token' (DAPO), 'seq' (GRPO) or 'constant' (Dr. GRPO)",
                        ("token", "seq", "constant"))
    # the variants
    ratio_level: str = arg("token", "'token' (GRPO) or 'sequence' (GSPO; set the clips to ~3e-4)",
                           ("token", "sequence"))
    loss_type: str = arg("grpo", "'grpo': the clipped surrogate; 'cispo': a clipped, stopped IS "
                                 "weight on log π", ("grpo", "cispo"))
    tis_mode: str = arg("token_truncate", "TIS per token or sequence, truncated or masked",
                        ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"))
    entropy_coef: float = arg(0.0, "entropy bonus: the loss minus this x the entropy", "v >= 0")
    adv_estimator: str = arg("grpo", "baseline: the group's mean, or the others' ('rloo')",
                             ("grpo", "rloo"))
    scale_rewards: str = arg("group", "advantages / the std of the group, of the batch or 'none' "
                                      "(Dr. GRPO)", ("group", "batch", "none"))
    mask_truncated: bool = arg(False, "completions cut by max_new_tokens weigh 0: out of the loss")
    overlong_buffer: int = arg(0, "DAPO's overlong penalty over the last N tokens before the limit "
                               "(0 = off)", "0 <= v <= max_new_tokens")
    overlong_penalty: float = arg(1.0, "the penalty at max_new_tokens (from 0, linearly)", "v >= 0")
    filter_flat_groups: bool = arg(False, "groups of equal rewards weigh 0 (DAPO, no resampling)")
    dynamic_sampling: int = arg(0, "DAPO's dynamic sampling: up to N more rounds of new prompts a "
                                   "step while groups are flat (0: off)", "v >= 0")
    # the task, with its prompts (reward_fns.py)
    task: str = arg("auto", "a task of reward_fns.TASKS ('auto': by the answers), or "
                    "several, weighted: 'arithmetic:2,calculator:1'")
    reward: str = arg("auto", "'auto' (the task's), a reward of reward_fns.REWARD_FNS or a mix "
                              "('gsm8k:1,format:0.1')")
    max_turns: int = arg(0, "the model's replies per episode at most (0: the task's)", "v >= 0")
    max_reply_tokens: int = arg(0, "tokens of one reply at most (0: what max_new_tokens leaves)",
                                "v >= 0")
    # model and data
    model: str = arg("Qwen/Qwen2.5-0.5B-Instruct", "HF model name or local path (the server's)")
    dataset: str = arg("openai/gsm8k", "HF dataset name, a local folder or .json/.jsonl file, or "
                                       "'builtin' (the task's own rows, offline)")


# ---- The loss. policy_loss is PPO's, per token; the variants are named branches of it.
# GSPO (--ratio_level sequence, Zheng et al. 2025) uses one ratio per sequence, the geometric mean
# of its tokens' ratios. CISPO (--loss_type cispo, MiniMax-M1) clips the ratio as a weight and
# stops its gradient, so a clipped token still learns, -sg(min(ρ, 1 + clip_high)) A log π.

def policy_loss(cfg, x, logp, old, ent):
    """Micro-batch x's loss per token. logp is log π with its gradient, old is log π_old, ent the
    entropy, each (B, C). x holds adv, mask, server_lp and, with --beta > 0, ref_lp.
    -> the loss, clipped (where the clip acted, for clip_frac) and the KL (or None), each (B, C)."""
    adv = per_token(x["adv"], logp)  # (B, 1), or (B, C) with one advantage per token
    ratio = torch.exp(log_ratio(logp, old, x["mask"], cfg.ratio_level))  # π / π_old
    clipped_ratio = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    loss = -torch.min(ratio * adv, clipped_ratio * adv)  # PPO's clipped surrogate
    clipped = clipped_ratio * adv < ratio * adv  # min took the clipped term (no gradient)
    if cfg.loss_type == "cispo":
        clipped = ratio > 1 + cfg.clip_high
        loss = -torch.clamp(ratio, max=1 + cfg.clip_high).detach() * adv * logp
    if cfg.tis_cap > 0:  # the sampler is not π_old, so weigh each token by π_old / π_server
        loss = loss * tis_weights(old, x["server_lp"], cfg.tis_cap, x["mask"], cfg.tis_mode)
    kl = kl_k3(logp, x["ref_lp"]) if "ref_lp" in x else None
    if kl is not None:
        loss = loss + cfg.beta * kl
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * ent
    return loss, clipped, kl


def log_ratio(logp, old_logp, mask, level="token"):
    """(B, T) -> (B, T) log π/π_old, per token, or each sequence's mean over its tokens (GSPO)."""
    d = logp - old_logp
    if level == "sequence":
        d = ((d * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)).expand_as(d)
    return d


def kl_k3(logp, ref_logp):
    """(B, T) -> (B, T) Schulman's k3 estimator of KL(π || π_ref), e^d - d - 1, d = ref - logp.
    It is >= 0 and unbiased for samples of π, with less variance than log π - log π_ref."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def tis_weights(old_logp, server_logp, cap, mask=None, mode="token_truncate"):
    """(B, T) -> (B, T) weights π_old / π_server, truncated at `cap` or masked to 0 above it, per
    token or per sequence (the product over its tokens)."""
    d = old_logp - server_logp if mask is None else (old_logp - server_logp) * mask
    d = d.sum(1, keepdim=True) if mode.startswith("sequence") else d  # the log ratio
    w = torch.exp(d.clamp(max=math.log(cap)))  # in log space, as a sum of 400 x 0.25 nats overflows
    return (w if mode.endswith("truncate") else w * (d <= math.log(cap))).expand_as(old_logp)


def aggregate(x, mask, weight, mode, norm):
    """(B, T) values, (B,) weights -> this micro-batch's weighted sum over `norm`, the whole batch's
    count (loss_norm), so the micro-batches' terms add up to the batch's mean. 'token' (DAPO) is the
    mean over tokens. 'seq' (GRPO) is the mean of each sequence's mean, so a long answer's tokens
    weigh less. 'constant' (Dr. GRPO) divides by the sequences x max_new_tokens."""
    if mode == "seq":
        return (weight * (x * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / norm
    return (weight.unsqueeze(1) * x * mask).sum() / norm


def loss_norm(mode, seqs, tokens, max_new_tokens):
    """aggregate's `norm`, from the whole batch's weighted sequences and tokens."""
    return {"seq": seqs, "token": tokens, "constant": seqs * max_new_tokens}[mode]


# ---- Advantages. A group turns its rewards into a training signal.

def group_advantages(rewards, group_size, scale=True, eps=1e-4, rloo=False, std=None):
    """(N,) rewards, in groups of G in a row -> (N,) advantages. GRPO takes r minus the group's
    mean, over the group's std (or over `std`, the batch's). RLOO (Ahmadian et al. 2024) takes r
    minus the mean of the others, (r - mean) G / (G - 1). A group of equal rewards gets exactly 0
    (a float std of eight 0.1s is 8e-9, not 0)."""
    r = rewards.view(-1, group_size)  # (N/G, G)
    adv = (r - r.mean(dim=1, keepdim=True)) * (group_size / (group_size - 1) if rloo else 1)
    if scale:  # Dr. GRPO drops this, as it favours groups nearly all right or all wrong
        adv = adv / ((r.std(dim=1, keepdim=True) if std is None else std) + eps)  # unbiased, as TRL
    return torch.where(flat_groups(rewards, group_size).unsqueeze(1), 0.0, adv).view(-1)


def flat_groups(rewards, group_size):
    """(N,) rewards -> (N/G,) True where every reward of the group is the same."""
    r = rewards.view(-1, group_size)
    return (r == r[:, :1]).all(dim=1)


def advantages(cfg, rewards):
    """(N,) rewards -> (N,) advantages, with the baseline of --adv_estimator and the scale of
    --scale_rewards. A new estimator is a new choice of --adv_estimator with its branch here."""
    std = batch_std(rewards) if cfg.scale_rewards == "batch" else None  # all ranks' rewards
    return group_advantages(rewards, cfg.group_size, cfg.scale_rewards != "none",
                            rloo=cfg.adv_estimator == "rloo", std=std)


def shape_rewards(cfg, seqs, metrics):
    """The flags' reward terms, added to seqs["reward"] and logged as parts. Add yours here."""
    if cfg.overlong_buffer:
        penalty = cfg.overlong_penalty * overlong_penalty(seqs["length"], cfg.max_new_tokens,
                                                          cfg.overlong_buffer)
        seqs["reward"] = seqs["reward"] + penalty
        metrics.mean("reward_overlong", penalty.sum(), len(penalty))


def overlong_penalty(lengths, max_len, buffer):
    """(N,) lengths -> (N,) DAPO's soft overlong penalty (Yu et al. 2025, eq. 13). It is 0 up to
    max_len - buffer tokens, then falls linearly to -1 at max_len."""
    return ((max_len - buffer - lengths) / buffer).clamp(-1.0, 0.0)


def weights(cfg, seqs):
    """(N,) a weight per sequence in the loss and its divisors. 0 filters a sequence out."""
    w = torch.ones_like(seqs["reward"])
    if cfg.mask_truncated:  # a cut answer's end says nothing (TRL's mask_truncated_completions)
        w = w * (seqs["truncated"] == 0)
    if cfg.filter_flat_groups or cfg.dynamic_sampling:  # DAPO drops groups of equal rewards
        w = w * ~flat_groups(seqs["reward"], cfg.group_size).repeat_interleave(cfg.group_size)
    return w


# ---- The rollout, an episode per sequence. Each turn, the server samples the model's reply to
# the episode so far (token ids in, ids and log-probs out), and the task's environment answers
# with the next user message or ends the episode. The message's tokens extend the episode with
# mask 0, so they are never trained on. A single-turn task is an episode of one turn.

def rollout(cfg, server, tasks, rows, version, greedy=False):
    """group_size episodes per prompt row (one if greedy), sampled from θ_version -> the batch, a
    dict of rows, version, sampling (settings), srv (each episode's server: all its turns go there,
    so its prefix stays cached), warnings and env_s (the environments'), span and episodes.
    An episode is a dict of prompt and completion (token ids), mask (1 where the model sampled
    the token), server_lp (the sampler's log-probs, 0 where mask is 0), messages, answer, task,
    turns and finish ('stop', 'length' if out of tokens, 'turns' if out of replies)."""
    n, t0 = 1 if greedy else cfg.group_size, time.time()
    sampling = {"temperature": 0.0 if greedy else cfg.temperature, "top_p": cfg.top_p,
                "top_k": cfg.top_k, "max_new_tokens": cfg.max_new_tokens,
                "max_reply_tokens": cfg.max_reply_tokens or cfg.max_new_tokens}
    eps = [{"prompt": r["ids"], "completion": [], "mask": [], "server_lp": [], "turns": 0,
            "task": r["task"], "answer": r["answer"], "finish": None, "out_of_room": False,
            "messages": [{"role": "user", "content": r["text"]}]} for r in rows for _ in range(n)]
    srv, warn, env_s = server.place(len(rows), n), Counter(), 0.0  # each episode's server

    def append(e, ids, lps, mask):  # tokens at the episode's end, their log-probs and mask
        e["completion"] += ids
        e["server_lp"] += lps
        e["mask"] += [mask] * len(ids)
    for turn in range(max(tasks[r["task"]].max_turns for r in rows)):
        live = [i for i, e in enumerate(eps) if e["finish"] is None]
        if not live:
            break
        left = [min(cfg.max_new_tokens - len(eps[i]["completion"]), sampling["max_reply_tokens"])
                for i in live]
        # one batched /generate per server -> per episode (reply ids, their log-probs, finish)
        replies = server.sample([eps[i]["prompt"] + eps[i]["completion"] for i in live], left,
                                [tasks[eps[i]["task"]].stop for i in live], sampling, version,
                                [srv[i] for i in live])
        for e, (ids, lps, finish) in zip([eps[i] for i in live], replies):
            append(e, ids, lps, 1)
            e["turns"] += 1
            e["messages"].append({"role": "assistant", "content": tasks[e["task"]].decode(ids)})
        # every environment answers at once (a tool may run code) -> a message each, or None: done
        answers, seconds = env_answers(tasks, [eps[i] for i in live], warn)
        env_s += seconds
        for i, (ids, lps, finish), said in zip(live, replies, answers):
            e, task = eps[i], tasks[eps[i]["task"]]
            if said is None:  # done, with the server's finish ('stop' or 'length')
                e["finish"] = finish
                continue
            # what closes a reply (a chat's end of turn, or a newline) unless its last token did
            # (one cut short did not), the message as the user's turn, and what opens the next reply
            said_ids = task.env_ids(said, ids[-1] if ids else None)
            last = turn + 1 == task.max_turns
            if last or len(said_ids) >= cfg.max_new_tokens - len(e["completion"]):
                # no reply left, or no room for the message. A reply cut short makes it 'length'.
                e["finish"] = "turns" if last and finish != "length" else "length"
                e["out_of_room"] = not last
                continue
            append(e, said_ids, [0.0] * len(said_ids), 0)
            e["messages"].append({"role": "user", "content": said})
    return {"rows": rows, "version": version, "sampling": sampling, "srv": srv, "episodes": eps,
            "warnings": warn, "env_s": env_s, "span": (t0, time.time())}


# ---- One step, in the order the math reads: the table, the no-grad forwards, rewards and
# advantages, then mu optimizer steps on the loss.

def sequences(batch, group_size, device):
    """A rollout batch -> `seqs`, the step's table, one row per sequence (an episode). Every
    per-sequence quantity lives here. Rows are never reordered or dropped. To filter one out, set
    its weight to 0. Its columns are
      lists (N)  prompt, completion (token ids), text (the last reply, which rewards and
                 checks read), messages, answer, task, finish, server (its index)
      (N,)       group, length (every token after the prompt, the environment's too),
                 sampled_tokens (the model's own), turns, truncated (1 if finish is 'length');
                 the step adds reward, correct, adv (or (N, C), one per token) and weight
      (N, C)     the episodes' mask and server_lp, right-padded; the forwards add old_lp, ref_lp
                 and lp0 (log π_old, under θ_step, the weights the server holds now)
      sampling   the batch's sampling settings (temperature, ...)"""
    eps = batch["episodes"]
    C = max(len(e["completion"]) for e in eps)
    padded = lambda k: torch.tensor([e[k] + [0] * (C - len(e[k])) for e in eps], device=device,
                                    dtype=torch.float)
    mask = padded("mask")
    return {"prompt": [e["prompt"] for e in eps], "completion": [e["completion"] for e in eps],
            "text": [e["messages"][-1]["content"] for e in eps],
            "messages": [e["messages"] for e in eps], "answer": [e["answer"] for e in eps],
            "task": [e["task"] for e in eps], "finish": [e["finish"] for e in eps],
            "server": batch["srv"],
            "group": torch.arange(len(eps), device=device) // group_size,
            "length": torch.tensor([len(e["completion"]) for e in eps], device=device),
            "sampled_tokens": mask.sum(1).long(),
            "turns": torch.tensor([e["turns"] for e in eps], device=device),
            "truncated": torch.tensor([e["finish"] == "length" for e in eps], device=device,
                                      dtype=torch.float),
            "mask": mask, "server_lp": padded("server_lp"), "sampling": batch["sampling"]}


def completion_logprobs(model, b, temperature):
    """Micro-batch b -> (B, C) log π(token | what precedes it) of its completion tokens, and (B, C)
    the entropy of each token's distribution, both at `temperature`. b packs its sequences end to
    end in rows (ids, pos). Each attends only to itself, as its positions restart at 0, from which
    transformers builds a causal mask per sequence. src is where each completion token's logits
    sit, tgt its id and dst its place in the (B, C) table. model.token_logprobs never forms the
    (B, C, V) logits, too big for a 150k vocabulary."""
    lp, ent = model.token_logprobs(b["ids"], b["pos"], b["src"], b["tgt"], temperature)  # (n,)
    table = lambda x: torch.zeros(b["mask"].shape, device=x.device).index_put(tuple(b["dst"]), x)
    return table(lp), table(ent)  # (B, C), each completion's tokens from its row's start


@torch.no_grad()
def old_and_ref_logprobs(cfg, model, ref, seqs, mbs):
    """The no-grad forwards into the table. old_lp is log π_old, needed only for mu > 1 (at mu = 1
    the first training forward gives it). ref_lp is the reference's, for beta > 0 (with LoRA, the
    policy with its adapters off)."""
    for name, net in (("old_lp", model if cfg.mu > 1 else None), ("ref_lp", ref)):
        if net is not None:
            seqs[name] = torch.zeros_like(seqs["mask"])
            with adapters_off(net, name == "ref_lp"):
                for b in mbs:
                    seqs[name][b["rows"], : b["C"]] = completion_logprobs(
                        net, b, seqs["sampling"]["temperature"])[0]


def score(seqs, tasks, group_size, metrics):
    """Each sequence's reward (its task's reward_fn gives its total and named parts, each logged),
    and whether its task's check calls its last reply right (what accuracy counts) -> seqs["reward"]
    and seqs["correct"], (N,). Returns the warnings. A reward that raised or gave no number is 0."""
    warn = Counter()
    got = [tasks[row["task"]].reward_fn(row, warn) for row in samples(seqs)]  # as dicts
    dev = seqs["mask"].device
    seqs["reward"] = torch.tensor([r for r, _ in got], device=dev)
    right = [reward_fns.safe_reward(tasks[k].correct, t, a, warn) == 1 for t, a, k in
             zip(seqs["text"], seqs["answer"], seqs["task"])]
    seqs["correct"] = torch.tensor(right, device=dev, dtype=torch.float)
    for part in {p for _, parts in got for p in parts}:  # its mean over the rows that have it
        have = [parts[part] for _, parts in got if part in parts]
        metrics.mean(f"reward_{part}", sum(have), len(have))
    score_metrics(seqs, tasks, group_size, warn, metrics)  # accuracy, lengths, turns, flat groups
    return warn


def train(cfg, model, opt, seqs, mbs, world, check, metrics):
    """cfg.mu optimizer steps on this rank's micro-batches (mbs). Before the first, check(seqs,
    metrics) compares the trainer's log-probs under θ_step (lp0) with the server's on the same
    tokens (with --async, on rows it scores again), and stops the run if they differ."""
    metrics.mean("reward_mean", seqs["reward"].sum(), len(seqs["reward"]))  # shaping included
    n_seqs, n_tokens = batch_counts(seqs, mbs)  # the whole batch's, weighted, over all ranks
    norm = max(loss_norm(cfg.loss_agg, n_seqs, n_tokens, cfg.max_new_tokens), 1e-9)
    seqs["lp0"], skipped = torch.zeros_like(seqs["mask"]), 0
    per_token(seqs["adv"], seqs["mask"])  # (N,) or (N, C), else one clear error before any forward
    for update in range(cfg.mu):
        for k, b in enumerate(mbs):
            fsdp_sync_grads(model, last=k == len(mbs) - 1)  # FSDP reduces once an update
            x = rows_of(seqs, b)  # the table's (B,) and (B, C) slices for micro-batch b
            logp, ent = completion_logprobs(model, b, seqs["sampling"]["temperature"])
            old = x["old_lp"] if cfg.mu > 1 else logp.detach()  # π_old, before this step's updates
            if update == 0:  # θ_step, the server's weights, for the check and the metrics
                seqs["lp0"][b["rows"], : b["C"]] = old
                train_metrics(cfg, b, x, old, ent, metrics)
            loss, clipped, kl = policy_loss(cfg, x, logp, old, ent)  # (B, C) each
            loss = aggregate(loss, x["mask"], x["weight"], cfg.loss_agg, norm)
            (loss * world).backward()  # FSDP averages the ranks' gradients, x world sums them
            w = x["mask"] * x["weight"].unsqueeze(1)  # the tokens that count, and their weight
            metrics.sum("loss", loss.detach() / cfg.mu)
            metrics.mean("clip_frac", (clipped * w).sum(), w.sum())
            metrics.mean("kl", (kl.detach() * w).sum() if kl is not None else 0.0, w.sum())
        if update == 0:
            check(seqs, metrics)
        grad_norm = clip_grads(model.parameters(), cfg.max_grad_norm or float("inf"))  # all ranks
        finite = bool(torch.isfinite(grad_norm))  # else skipped, as it would poison the weights
        metrics.mean("grad_norm", grad_norm, 1)
        skipped += not finite
        if finite and n_seqs > 0:  # skipped if no sequence has weight (logged)
            opt.step()
        opt.zero_grad(set_to_none=True)
    metrics.max("nonfinite_skips", skipped)
    metrics.max("empty_batch_skips", cfg.mu if n_seqs == 0 else 0)


# ---- The loop.

def main(cfg):
    rt = setup(cfg)  # flags, ranks, GPUs and process group, checked first
    server = Server(cfg, rt)  # up? our model? how do weights get there?
    # tasks[row["task"]], a row's task, has
    #   reward_fn(row, warnings) -> (reward, {part: value}); correct(text, answer) -> 1 if right
    #   env(messages, answer) -> the next user message, or None to end the episode
    #   env_ids(message, the reply's last token) -> token ids; max_turns; stop; decode(ids) -> text
    tok, train_rows, evals, tasks = load_data(cfg, server.context)  # (tokens: prompt + completion)
    model, ref, opt, start, state = load_models(cfg, rt)  # state is what steps keep (checkpointed)
    log = MetricsLog(cfg, rt, start, len(train_rows))
    pad = tok.pad_token_id or 0
    # this rank's prompt rows of `step`, in rounds (more with DAPO's dynamic sampling)
    my_prompts = lambda step: [[train_rows[i] for i in r] for r in rank_rounds(
        len(train_rows), step, cfg.prompts_per_step, cfg.seed, rt.rank, rt.world,
        1 + cfg.dynamic_sampling)]
    # their rollout from θ_version. sample_groups calls rollout() on round 0, and on later rounds
    # only while groups are flat. Then each server used hashes the weights it holds, for the check.
    rollout_of = lambda rounds, version: server.weights_after(
        sample_groups(cfg, server, tasks, rounds, version))

    t0 = time.time()
    nbytes = server.push(model, start)  # the server starts from our weights (also after a resume)
    print0(f"initial sync: {nbytes / 2**20:.0f} MiB in {time.time() - t0:.2f}s, version {start}")
    log.write(evaluate(cfg, server, tasks, evals, start))
    t_run, next_batch = time.time(), None
    for step in range(start, cfg.steps):
        clock, metrics = Clock(), Metrics()  # the step's named sums, means and maxima
        # 1. The rollout. --no-async samples it now, from θ_step. --async sampled it from
        #    θ_{step-1} while the last step trained (the first step, now) and starts the next now,
        #    in a thread, from θ_step, its prompts drawn here. fail_together stops all ranks on an
        #    error.
        batch = next_batch or fail_together(rollout_of, my_prompts(step), step)
        pending = cfg.async_ and step + 1 < cfg.steps and POOL.submit(
            rollout_of, my_prompts(step + 1), step)
        check = server.check(batch, step, model, pad)  # the sync check that train() calls
        seqs = sequences(batch, cfg.group_size, rt.device)  # the step's table, a row per sequence
        mbs = micro_batches(seqs, cfg.micro_batch, pad)  # row indices, packed into fewer forwards
        clock.lap("rollout_wait")
        # 2. The no-grad forwards of the old policy (mu > 1) and the reference (beta > 0).
        old_and_ref_logprobs(cfg, model, ref, seqs, mbs)
        clock.lap("train")
        # 3. Rewards, then group-relative advantages and a weight per sequence.
        warn = score(seqs, tasks, cfg.group_size, metrics)
        rollout_metrics(batch, metrics)  # the environments' warnings, dynamic sampling's draws
        shape_rewards(cfg, seqs, metrics)  # the flags' reward terms (DAPO's overlong penalty)
        seqs["adv"] = advantages(cfg, seqs["reward"])  # (N,)
        seqs["weight"] = weights(cfg, seqs)  # (N,) 1, or 0 where the flags filter one out
        lr = cfg.lr * lr_factor(step, cfg.steps, cfg.lr_warmup_steps, cfg.lr_schedule,
                                cfg.min_lr_ratio)  # --lr, after the warmup and the schedule
        set_lr(opt, lr, metrics)
        clock.lap("score")
        # 4. mu optimizer steps on the loss, and before the first, the sync check.
        train(cfg, model, opt, seqs, mbs, rt.world, check, metrics)
        clock.lap("train")
        # 5. Push θ_{step+1}. With --async, first wait for the next batch (no push mid-rollout).
        next_batch = fail_together(pending.result) if pending else None
        clock.lap("next_rollout_wait")
        nbytes = server.push(model, step + 1)
        clock.lap("sync")
        # 6. Log the metrics (over micro-batches and ranks), checkpoint, evaluate.
        row = step_metrics(cfg, step + 1, batch, metrics.reduce(rt.device), clock, t_run, nbytes,
                           rt)
        log.step(row, seqs, warn + batch["warnings"])
        if (cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.steps:
            save_checkpoint(cfg, model, opt, tok, step + 1, state)
        if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step + 1 == cfg.steps:
            log.write(evaluate(cfg, server, tasks, evals, step + 1))
    server.close()
    log.close()
    dist.destroy_process_group()


# ==================================================================================================
# ---- Plumbing below (server, weight sync, FSDP, checkpoints, logs), not needed to change GRPO; the end calls main().
# ==================================================================================================

@dataclass
class Config(GRPOConfig):
    """Every flag: the story's GRPO knobs (GRPOConfig, at the top) and these, how and where it runs."""
    # sampling: keep top_p 1.0 and top_k -1, so that the server samples what the trainer scores
    top_p: float = arg(1.0, "nucleus sampling (keep 1.0: the server samples what the trainer scores)", "0 < v <= 1")
    top_k: int = arg(-1, "top-k sampling (-1 = off, for the same reason)", "v == -1 or v >= 1")
    stop: str = arg("auto", "strings that end a reply, comma-separated, escapes read ('\\n'), or 'none'; 'auto': "
                            "plain prompts end at a newline (episodes) or a blank line, chat ones at the template's "
                            "end of turn")
    # the learning-rate schedule
    lr_schedule: str = arg("constant", "after the warmup: constant, or a linear or cosine decay to min_lr_ratio",
                           ("constant", "linear", "cosine"))
    lr_warmup_steps: int = arg(0, "linear warmup of the lr over this many steps", "0 <= v < steps")
    min_lr_ratio: float = arg(0.0, "the decay's end, as a fraction of --lr", "0 <= v <= 1")
    # LoRA: the base frozen in bf16, only the adapters train; the server gets W + (alpha / rank) B A
    lora_rank: int = arg(0, "LoRA adapters of this rank (0: a full fine-tune)", "v >= 0")
    lora_alpha: float = arg(32.0, "LoRA's alpha: an adapter adds (alpha / rank) B A", "v > 0")
    lora_targets: str = arg("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                            "the Linears that get adapters, by name")
    # data files, splits and prompts
    dataset_config: str = arg("main", "HF dataset config name ('' for none)")
    train_split: str = arg("train", "split to train on")
    eval_split: str = arg("test", "held-out split ('' = hold out rows of the train split)")
    prompt_field: str = arg("question", "column with the question")
    answer_field: str = arg("answer", "column with the reference answer")
    instruction: str = arg("auto", "text appended to each question ('auto': fits the task)")
    prompt_format: str = arg("auto", "'chat' (chat template), 'plain' (base models) or 'auto' (chat if it has one)",
                             ("auto", "chat", "plain"))
    example: str = arg("auto", "the task's worked example (an episode, Task.example) before each question: 'auto': in "
                               "plain prompts, 'on': in chat ones too (as earlier turns), 'off'", ("auto", "on", "off"))
    builtin_max_operand: int = arg(20, "--task arithmetic, built in: operands of 'a + b' from 0..this", "v >= 1")
    max_prompt_tokens: int = arg(256, "longer prompts are skipped (and counted)", "v >= 1")
    eval_size: int = arg(200, "held-out prompts per eval, of each task (no eval split: at most 10% of the train rows)",
                         "v >= 1")
    # the trainer's compute
    micro_batch: int = arg(32, "sequences per forward/backward on one rank at the step's longest length (shorter "
                               "ones share: as many tokens); larger is faster if it fits", "v >= 1")
    head_matmul: str = arg("bf16", "the LM head's logits, always fp32: 'bf16' (bf16 inputs, fp32 sums: the products "
                                   "the server's fp32 head forms from its bf16 weights) or 'fp32' (exact, slower; the "
                                   "gradient's matmuls in fp32 too)", ("bf16", "fp32"))
    grad_checkpointing: bool = arg(False, "recompute activations in backward to save memory")
    max_nonfinite_steps: int = arg(3, "stop after this many steps in a row with a NaN/Inf gradient", "v >= 1")
    device: str = arg("auto", "'cuda', 'cpu' (tests) or 'auto'", ("auto", "cuda", "cpu"))
    # the server and weight sync
    server_url: str = arg("http://127.0.0.1:30000", "SGLang server(s) started by serve.sh, comma-separated")
    api_key: str = arg("", "server API key (default: $SGLANG_API_KEY), sent as a Bearer token")
    server_gpu: str = arg("3", "each server's GPU (serve.sh's GPU), comma-separated; '+' joins a TP server's: 2+3")
    colocate: bool = arg(False, "the server shares rank 0's GPU on purpose (one-GPU machines)")
    request_timeout: float = arg(300.0, "seconds before a request to the server (or an NCCL send) fails", "v > 0")
    request_retries: int = arg(3, "retries (with backoff) for a failed request before stopping", "v >= 0")
    collective_timeout: float = arg(600.0, "seconds a rank waits in a collective for the others, then the run stops "
                                           "(a hack that calls one a different number of times on each rank); raise "
                                           "it if a rank's rollout can take this much longer than another's", "v > 0")
    sync: str = arg("auto", "'tensor' (CUDA IPC: rank 0 sees the server's GPU), 'nccl' (any host) or 'auto'",
                    ("auto", "tensor", "nccl"))
    sync_bucket_mb: float = arg(1024.0, "size (MiB) of one flattened weight bucket sent to the server", "v > 0")
    nccl_master_addr: str = arg("", "--sync nccl: rank 0's address the server connects to (default: on its route)")
    nccl_port: int = arg(0, "--sync nccl: TCP port of that rendezvous on rank 0's host (0: a free one)",
                         "0 <= v <= 65535")
    mismatch_max: float = arg(0.1, "stop if trainer and server, same weights, differ by more (mean nats)", "v > 0")
    check_seqs: int = arg(32, "--async: sequences a step the server re-scores with its weights (0: none)", "v >= 0")
    # eval, checkpoints, logging
    eval_every: int = arg(50, "evaluate (greedy, via the server) every N steps; 0 = only at start and end", "v >= 0")
    save_every: int = arg(100, "checkpoint every N steps (0 = only at the end)", "v >= 0")
    keep_checkpoints: int = arg(3, "keep the run's newest N checkpoints, delete its older ones (0 = all)", "v >= 0")
    out_dir: str = arg("runs/grpo", "checkpoints, metrics.jsonl and config.json go here")
    resume: bool = arg(False, "continue the run in out_dir from its last checkpoint, with its flags (docs)")
    sample_every: int = arg(10, "print one completion every N steps", "v >= 0")
    wandb: bool = arg(False, "log to Weights & Biases")
    wandb_project: str = arg("grpo_sglang", "wandb project")


# ---- What the story's step calls: the prompts of each rank, dynamic sampling, the table's rows as a reward sees
# them, micro-batches, the finer metrics, and what the step needs because it runs on several ranks (FSDP: every rank
# must run as many micro-batches and updates, or the collectives inside them would wait forever).

def per_token(adv, like):
    """(B,) or (B, T) advantages -> broadcastable to `like` (B, T); any other shape: one error."""
    if adv.shape not in (like.shape[:1], like.shape):
        raise UserError(f"advantages of shape {tuple(adv.shape)} for {like.shape[0]} sequences of "
                        f"{like.shape[1]} tokens: they must be ({like.shape[0]},), one per "
                        f"sequence, or {tuple(like.shape)}, per token")
    return adv.unsqueeze(1) if adv.dim() == 1 else adv



def batch_std(x):
    """All ranks: (N,) -> the whole batch's unbiased std, in float64 about its mean (float32 loses
    the digits of 1000 + {0, 1})."""
    n_sum = torch.stack([torch.tensor(float(len(x)), device=x.device), x.double().sum()])
    dist.all_reduce(n_sum)
    ss = (x.double() - n_sum[1] / n_sum[0]).square().sum()  # the squares of the deviations from it
    dist.all_reduce(ss)
    return (ss / (n_sum[0] - 1).clamp(min=1)).sqrt().to(x.dtype)



def lr_factor(step, steps, warmup, schedule, min_ratio):
    """The learning rate of `step` over --lr: a linear warmup over `warmup` steps, then constant, or
    a linear or cosine decay to min_ratio at the last step (TRL's lr_scheduler_type, verl's
    min_lr_ratio)."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(steps - 1 - warmup, 1)  # 0 -> 1 over the steps after the warmup
    decay = {"constant": 1.0, "linear": 1 - t, "cosine": 0.5 * (1 + math.cos(math.pi * t))}
    decay = decay[schedule]
    return min_ratio + (1 - min_ratio) * decay if schedule != "constant" else 1.0



def set_lr(opt, lr, metrics):
    for group in opt.param_groups:
        group["lr"] = lr
    metrics.max("lr", lr)



def prompts_for_step(n_rows, step, per_step, seed):
    """Row indices of `step`: a new shuffle each epoch, so a resumed run sees what it would have."""
    idx = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(k, n_rows)
        perm = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed + epoch))
        idx.append(int(perm[i]))
    return idx



def rank_rounds(n_rows, step, per_step, seed, rank, world, rounds=1):
    """This rank's row indices of `step`, in `rounds` rounds of per_step / world. The step takes
    per_step x rounds rows of the shuffled stream, each rank a slice; round 0 is what a step
    trains on without --dynamic_sampling, and rows a step does not need are skipped, not reused."""
    n = per_step // world
    idx = prompts_for_step(n_rows, step, per_step * rounds, seed)[rank * n * rounds:
                                                                  (rank + 1) * n * rounds]
    return [idx[r * n: (r + 1) * n] for r in range(rounds)]



def sample_groups(cfg, server, tasks, rounds, version):
    """The step's rollout of this rank's groups: round 0's prompts and, with --dynamic_sampling
    (DAPO, Yu et al. 2025, 3.2), round after round of new ones while fewer than len(rounds[0])
    groups have rewards that differ. -> a batch of len(rounds[0]) groups: the first with rewards
    that differ, in the order drawn, then flat ones if the rounds ran out (they weigh 0), and how
    many groups were drawn and kept, in how many rounds."""
    batch = rollout(cfg, server, tasks, rounds[0], version)
    if len(rounds) == 1:
        return batch
    G, n, drawn, warn, env_s = cfg.group_size, len(rounds[0]), [], Counter(), 0.0  # drawn: (differ?, b, group)
    for k, rows in enumerate(rounds):
        b = batch if k == 0 else rollout(cfg, server, tasks, rows, version)
        warn, env_s = warn + b["warnings"], env_s + b["env_s"]
        rewards = [tasks[row["task"]].reward_fn(row, Counter())[0]
                   for row in samples(sequences(b, G, "cpu"))]
        drawn += [(len(set(rewards[g * G: (g + 1) * G])) > 1, b, g) for g in range(len(rows))]
        if sum(d for d, _, _ in drawn) >= n:
            break
    kept = ([x for x in drawn if x[0]] + [x for x in drawn if not x[0]])[:n]
    return {**batch, "rows": [b["rows"][g] for _, b, g in kept],
            "span": (batch["span"][0], time.time()),
            "episodes": [e for _, b, g in kept for e in b["episodes"][g * G: (g + 1) * G]],
            "srv": [s for _, b, g in kept for s in b["srv"][g * G: (g + 1) * G]],
            "groups": {"drawn": len(drawn), "kept": sum(d for d, _, _ in kept), "rounds": k + 1},
            "warnings": warn, "env_s": env_s}



def samples(seqs):
    """The table's rows as dicts, what a reward function sees: per-token values cut to length.
    (A value for all rows, as sampling, comes with each row.)"""
    N = len(seqs["completion"])
    cols = {k: v.tolist() if torch.is_tensor(v) and v.dim() == 1 else v for k, v in seqs.items()}
    cut = lambda v, i: v[i, : len(seqs["completion"][i])] if torch.is_tensor(v) else v[i]
    return [{k: v if isinstance(v, dict) else cut(v, i) for k, v in cols.items()} for i in range(N)]



def micro_batches(seqs, size, pad_id):
    """The rows, sorted by length, in micro-batches of at most `size` x the longest sequence's
    tokens (memory goes with tokens), as many on every rank, each packed: sequences end to end in
    rows (pack_batch). -> [{rows (B,), ids, pos (R, L), ..., C}]"""
    n = [len(p) + len(c) for p, c in zip(seqs["prompt"], seqs["completion"])]
    order = sorted(range(len(n)), key=lambda i: n[i])
    out = []
    for part in split_by_tokens([n[i] for i in order], size * max(n), seqs["mask"].device):
        rows = [order[j] for j in part]
        b = pack_batch([{"prompt": seqs["prompt"][i], "completion": seqs["completion"][i]}
                        for i in rows], pad_id, seqs["mask"].device)
        out.append({**b, "rows": torch.tensor(rows, device=b["ids"].device)})
    return out



def rows_of(seqs, b):
    """Micro-batch b's slice of every tensor of the table: (B,) per sequence, (B, C) per token."""
    return {k: v[b["rows"], : b["C"]] if v.dim() == 2 else v[b["rows"]] for k, v in seqs.items()
            if torch.is_tensor(v)}



def score_metrics(seqs, tasks, group_size, warn, m):
    """score()'s metrics of the scored table (docs/metrics.md): accuracy, lengths, turns, warnings, flat and identical
    groups; with several tasks, each one's reward, accuracy and turns (a task this rank did not draw: no count)."""
    N = len(seqs["completion"])
    for name in tasks if len(tasks) > 1 else ():
        mine = torch.tensor([k == name for k in seqs["task"]], device=seqs["reward"].device)
        for metric, col in (("reward", "reward"), ("accuracy", "correct"), ("turns", "turns")):
            m.mean(f"{metric}_{name}", (seqs[col] * mine).sum(), mine.sum())
    m.mean("accuracy", seqs["correct"].sum(), N)
    m.mean("completion_len_mean", seqs["mask"].sum(), N)
    m.mean("prompt_len_mean", sum(map(len, seqs["prompt"])), N)
    m.mean("turns_mean", seqs["turns"].sum(), N)
    m.sum("reward_warnings", sum(warn.values()))
    m.mean("truncated_frac", seqs["truncated"].sum(), N)
    m.mean("zero_std_groups_frac", flat_groups(seqs["reward"], group_size).sum(), N // group_size)
    same, improbable = identical_groups(seqs, group_size)
    m.mean("identical_groups_frac", same.sum(), N // group_size)
    m.sum("improbable_identical_groups", improbable.sum())


def rollout_metrics(batch, m):
    """A rollout batch's metrics: its environments' warnings, the episodes that ran out of room for the environment's
    message, and with --dynamic_sampling what the step drew to fill its batch."""
    m.sum("env_warnings", sum(batch["warnings"].values()))
    m.mean("time_env", batch["env_s"], 1)  # seconds the environments took, each turn's answers together
    m.mean("out_of_room_frac", sum(e["out_of_room"] for e in batch["episodes"]), len(batch["episodes"]))
    if "groups" in batch:
        m.sum("groups_drawn", batch["groups"]["drawn"])
        m.sum("groups_kept", batch["groups"]["kept"])
        m.mean("sampling_rounds", batch["groups"]["rounds"], 1)


def train_metrics(cfg, b, x, old, ent, m):
    """train()'s metrics of micro-batch b under the weights the server has (its first update): the entropy, how full
    its packed rows are, and how far the trainer's log-probs `old` are from the sampler's."""
    m.mean("entropy", (ent.detach() * x["mask"]).sum(), x["mask"].sum())
    m.mean("pack_fill", b["tokens"], b["ids"].numel())  # real tokens / positions
    mismatch_stats(old, x["server_lp"], x["mask"], cfg.tis_cap, m, cfg.tis_mode)


def identical_groups(seqs, group_size):
    """-> (groups,) True where the group's completions are the same tokens, and (groups,) where the
    sampler's own log-probs make that all but impossible: p^(G-1) < 1e-3, p the sequence's
    probability (a sharp policy repeats itself; a server that does not sample each copy of a
    prompt on its own repeats anything)."""
    c, G = seqs["completion"], group_size
    same = torch.tensor([all(c[i] == c[g] for i in range(g, g + G)) for g in range(0, len(c), G)],
                        dtype=torch.bool)
    log_p = (seqs["server_lp"] * seqs["mask"]).sum(1)[::G].cpu()  # (groups,) each group's first
    sampled = seqs["sampling"]["temperature"] > 0
    return same, same & ((G - 1) * log_p < math.log(1e-3)) & sampled



def split_by_tokens(lengths, budget, device):
    """Sorted lengths -> index ranges of <= `budget` tokens, as many on every rank."""
    cuts, total = [0], 0
    for i, n in enumerate(lengths):
        if total + n > budget and i > cuts[-1]:
            cuts, total = cuts + [i], 0
        total += n
    parts = [range(a, b) for a, b in zip(cuts, cuts[1:] + [len(lengths)])]
    want = len(parts)
    if dist.is_initialized() and dist.get_world_size() > 1:
        want = int(all_reduce_named({"parts": want}, dist.ReduceOp.MAX, device)["parts"])
    while len(parts) < want and any(len(p) > 1 for p in parts):  # (too few rows: batch_counts says)
        k = max((k for k, p in enumerate(parts) if len(p) > 1),
                key=lambda k: sum(lengths[i] for i in parts[k]))
        p, half = parts[k], sum(lengths[i] for i in parts[k]) / 2
        m = next(i for i in range(p.start + 1, p.stop)
                 if sum(lengths[p.start: i]) >= half or i == p.stop - 1)
        parts[k: k + 1] = [range(p.start, m), range(m, p.stop)]
    return parts



def batch_counts(seqs, mbs):
    """All ranks: -> the batch's weighted sequence and token counts; ranks out of step: an error."""
    got = [None] * dist.get_world_size()
    w = seqs["weight"]
    dist.all_gather_object(got, (len(mbs), float(w.sum()), float((w * seqs["mask"].sum(1)).sum())))
    if len({n for n, _, _ in got}) > 1:
        raise UserError(f"the ranks would run different numbers of micro-batches "
                        f"({[n for n, _, _ in got]}), and FSDP would hang: every rank must keep "
                        f"all its rows. To drop a sequence from the loss, set its seqs['weight'] "
                        f"to 0 (docs/hacking.md)")
    return sum(s for _, s, _ in got), sum(t for _, _, t in got)



def clip_grads(params, max_norm):
    """All ranks: torch's clip_grad_norm_ on FSDP's shards, without DTensor's per-tensor dispatch
    (~20 ms a SmolLM2 step)."""
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params
             if p.grad is not None]
    total = torch.stack(torch._foreach_norm(grads)).double().square().sum()
    dist.all_reduce(total)
    total = total.sqrt().float()
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0).to(grads[0].device))
    return total



def fsdp_sync_grads(model, last):
    """FSDP reduces the gradients, and gives back weights it kept gathered (shard), only after an
    update's last micro-batch."""
    model.set_requires_gradient_sync(last)
    if model.keeps_gathered:
        model.set_reshard_after_backward(last)



def pack_batch(samples, pad_id, device):
    """[{prompt, completion}] -> the sequences end to end (first fit, longest first) in rows as long as the longest,
    position_ids restarting at 0 for each (transformers keeps attention within each), shorter rows padded to it.
    src[j] of the flat rows predicts tgt[j], its log-prob at dst[:, j] of the (B, C) result.
    -> {ids, pos (R, L), src, tgt (n,), dst (2, n), mask (B, C), C, tokens}"""
    lens = [len(s["prompt"]) + len(s["completion"]) for s in samples]
    L, C = max(lens), max(len(s["completion"]) for s in samples)
    ids, pos, src, tgt, dst = [], [], [], [], []
    for i in sorted(range(len(samples)), key=lambda i: -lens[i]):
        r = next((r for r, row in enumerate(ids) if len(row) + lens[i] <= L), None)  # the first row with room
        if r is None:
            r, ids, pos = len(ids), ids + [[]], pos + [[]]
        p, c = samples[i]["prompt"], samples[i]["completion"]
        at = len(ids[r]) + len(p)  # where the completion starts in row r: the position before predicts its first token
        src += [(r, k) for k in range(at - 1, at - 1 + len(c))]
        tgt += c
        dst += [(i, k) for k in range(len(c))]
        ids[r], pos[r] = ids[r] + p + c, pos[r] + list(range(lens[i]))
    ids, pos = [row + [pad_id] * (L - len(row)) for row in ids], [row + [0] * (L - len(row)) for row in pos]
    n = torch.tensor([len(s["completion"]) for s in samples])
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)
    return {"ids": t(ids), "pos": t(pos), "src": t([r * L + k for r, k in src]), "tgt": t(tgt),
            "dst": t(dst).reshape(-1, 2).T, "mask": (torch.arange(C) < n.unsqueeze(1)).float().to(device), "C": C,
            "tokens": sum(lens)}


def evaluate(cfg, server, tasks, evals, step):
    """Greedy accuracy (each row's task's check) and mean reward on the held-out prompts, through the server (rank 0);
    with several tasks, each task's too."""
    if int(os.environ.get("RANK", 0)) != 0:
        return None
    t0 = time.time()
    batch = rollout(cfg, server, tasks, evals, step, greedy=True)
    seqs = sequences(batch, 1, "cpu")  # the table, as in training
    warn = score(seqs, tasks, 1, Metrics()) + batch["warnings"]
    if warn:  # as in training: rewards that raised or gave no number counted 0, environments that failed
        print0(f"warnings at eval step {step}: {dict(warn)}")
    out, episodes = {"step": step}, any(t.max_turns > 1 for t in tasks.values())
    for name in ["", *tasks] if len(tasks) > 1 else [""]:  # "": all rows
        mine = torch.tensor([not name or k == name for k in seqs["task"]])
        acc, reward, turns = (seqs[k][mine].float().mean().item() for k in ("correct", "reward", "turns"))
        print0(f"eval step {step}{f' (--task {name})' if name else ''}: accuracy {acc:.3f}, reward {reward:.3f} on "
               f"{int(mine.sum())} held-out prompts (greedy, " + (f"{turns:.2f} turns, " if episodes else "")
               + f"{time.time() - t0:.1f}s)")
        at = f"_{name}" if name else ""
        out.update({f"eval_accuracy{at}": acc, f"eval_reward{at}": reward,
                    f"eval_turns_{name}" if name else "eval_turns_mean": turns})
    return out


class Metrics:
    """Step metrics (m.sum(k, x), m.mean(k, total, count), m.max(k, x)) over batches and ranks, synced by reduce()."""
    def __init__(self):
        self.sums, self.maxes = defaultdict(float), {}

    def sum(self, name, x):
        self.sums[name] = self.sums[name] + x

    def mean(self, name, total, count):
        self.sum(name, total)
        self.sum(name + "#n", count)

    def ess(self, name, w):
        """w: importance weights (0 where no token) -> their effective sample size over their count, (Σw)² /
        (n Σw²)."""
        self.sum(name + "#w", w.sum()), self.sum(name + "#w2", w.square().sum()), self.sum(name + "#c", (w > 0).sum())

    def max(self, name, x):
        self.maxes[name] = x if name not in self.maxes else torch.maximum(torch.as_tensor(self.maxes[name]),
                                                                           torch.as_tensor(x).to(self.maxes[name]))

    def reduce(self, device):
        """All ranks -> {name: value} (a mean over nothing: None); names agreed first, so none can hang."""
        names = [None] * dist.get_world_size()
        dist.all_gather_object(names, (sorted(self.sums), sorted(self.maxes)))
        sums, maxes = (sorted(set().union(*(n[j] for n in names))) for j in (0, 1))
        s = all_reduce_named({k: self.sums.get(k, 0.0) for k in sums}, dist.ReduceOp.SUM, device)
        mx = all_reduce_named({k: self.maxes.get(k, -float("inf")) for k in maxes}, dist.ReduceOp.MAX, device)
        out = {k: (s[k] / s[k + "#n"] if s[k + "#n"] else None) if k + "#n" in s else s[k] for k in s if "#" not in k}
        ess = {k[:-3]: s[k[:-3] + "#w"] ** 2 / (s[k[:-3] + "#c"] * s[k]) if s[k] else None for k in s
               if k.endswith("#w2")}
        return {**out, **ess, **mx}


def mismatch_stats(trainer_lp, server_lp, mask, cap, m, mode="token_truncate"):
    """(B, T) trainer and sampler logprobs of the sampled tokens -> m: |Δ|, k3 KL, IS ratio, share over the TIS cap."""
    d, n = (trainer_lp - server_lp) * mask, mask.sum()
    ratio = torch.exp(d) * mask
    m.mean("mismatch_mean", d.abs().sum(), n), m.mean("is_ratio_mean", ratio.sum(), n), m.ess("is_ess", ratio)
    m.mean("mismatch_kl", (kl_k3(server_lp, trainer_lp) * mask).sum(), n)
    over = (d.sum(1, keepdim=True) if mode.startswith("sequence") else d) > (math.log(cap) if cap > 0 else math.inf)
    m.mean("is_truncated_frac", (over * mask).sum(), n)
    if d.numel():  # a micro-batch of empty completions has no maximum (and its means count 0 tokens: null)
        m.max("mismatch_max", d.abs().max()), m.max("is_ratio_max", ratio.max())


def step_metrics(cfg, step, batch, m, clock, t_run, nbytes, rt):
    """The step's metrics (m: Metrics.reduce) and its timings, versions and spans."""
    rel = lambda span: [round(span[0] - t_run, 3), round(span[1] - t_run, 3)]
    rollout = batch["span"][1] - batch["span"][0]
    return {"step": step, "sampled_from_version": batch["version"], **m, "time_rollout": rollout,
            "stale_token_frac": float(batch["version"] < step - 1),  # every token of a batch: from one version
            **{f"time_{k}": v for k, v in clock.time.items()}, "time_step": clock.t - clock.t0, "sync_bytes": nbytes,
            "rollout_tokens_per_s": m["completion_len_mean"] * cfg.group_size * cfg.prompts_per_step /
            max(rollout, 1e-9), "span_step": rel((clock.t0, clock.t)), "span_rollout": rel(batch["span"]),
            "span_train": rel(clock.spans["train"]), "span_sync": rel(clock.spans["sync"]),
            "peak_mem_gb": torch.cuda.max_memory_allocated(rt.device) / 1e9 if rt.device.type == "cuda" else 0.0}


class Clock:
    """lap(name) ends the phase begun at the last lap; a name that comes back adds up, its span first to last."""
    def __init__(self):
        self.t0 = self.t = time.time()
        self.spans, self.time = {}, defaultdict(float)

    def lap(self, name):
        now = time.time()
        self.time[name] += now - self.t
        self.spans[name], self.t = (self.spans.get(name, (self.t,))[0], now), now


class MetricsLog:
    """metrics.jsonl (and wandb) on rank 0, the one log line per step, and the NaN/Inf stop rule."""
    def __init__(self, cfg, rt, start, n_train):
        self.cfg, self.master, self.nonfinite_run, self.said_identical, self.said_room = cfg, rt.master, 0, False, False
        n = cfg.prompts_per_step * cfg.group_size
        print0(f"batch: {cfg.prompts_per_step} prompts x {cfg.group_size} completions = {n} sequences per step, "
               f"{n // rt.world} per rank x {rt.world} ranks; micro-batch {cfg.micro_batch}; {cfg.mu} optimizer "
               f"step(s) per rollout; {cfg.steps} steps = {cfg.steps * cfg.prompts_per_step / n_train:.2f} epochs")
        print0("rollouts: " + ("async, one step off-policy: step s trains on a batch sampled from θ_{s-1} while the "
                               "server samples step s+1's from θ_s" if cfg.async_ else "sync, on-policy"))
        keep = cfg.keep_checkpoints
        print0(f"checkpoints: {os.path.join(cfg.out_dir, 'step_N')} " + (f"every {cfg.save_every} steps and " if
               cfg.save_every else "") + "at the last step; " + (f"the newest {keep} kept, this run's older ones "
               f"deleted (--keep_checkpoints)" if keep else "all kept (--keep_checkpoints 0)"))
        if self.master:
            # a resumed run drops the rows after its checkpoint, the eval it repeats and a row cut short (a kill)
            self.path = path = os.path.join(cfg.out_dir, "metrics.jsonl")
            rows = [json.loads(s) for s in open(path) if s.strip() and s[-1] == "\n"] if os.path.exists(path) else []
            keep = [r for r in rows if r["step"] < start or (r["step"] == start and "eval_accuracy" not in r)]
            try:
                write_whole(os.path.join(cfg.out_dir, "config.json"), json.dumps(saved_config(cfg), indent=1))
                write_whole(path, "".join(json.dumps(r) + "\n" for r in keep))
                self.file = open(path, "a")
            except OSError as e:
                raise self.unwritten("config.json and metrics.jsonl", e) from None
            if cfg.wandb:
                try:
                    import wandb
                except ImportError:
                    raise UserError("--wandb needs the wandb package: pip install wandb") from None
                self.wandb, _ = wandb, wandb.init(project=cfg.wandb_project, config=saved_config(cfg))

    def write(self, m):
        if self.master and m:
            try:
                self.file.write(json.dumps(m) + "\n")
                self.file.flush()
            except OSError as e:
                raise self.unwritten(f"step {m['step']}'s row of {self.path}", e) from None
            if self.cfg.wandb:
                self.wandb.log(m, step=m["step"])

    def step(self, m, seqs, warn):
        if warn:  # rewards that raised or returned no number count 0, environments end the episode (rank 0's)
            print0(f"warnings at step {m['step']}: {dict(warn)}")
        f = lambda k, spec: "-" if m.get(k) is None else format(m[k], spec)
        print0(f"step {m['step']:4d} | reward {f('reward_mean', '.3f')} acc {f('accuracy', '.3f')} | "
               f"kl {f('kl', '.4f')} clip {f('clip_frac', '.3f')} ent {f('entropy', '.2f')} | "
               f"len {f('completion_len_mean', '.0f')} | rollout {m['time_rollout']:.2f}s train {m['time_train']:.2f}s "
               f"sync {m['time_sync']:.2f}s step {m['time_step']:.2f}s | {m['rollout_tokens_per_s']:.0f} tok/s | "
               f"check {f('check_mismatch_mean', '.4f')} mismatch {f('mismatch_mean', '.4f')} "
               f"from v{m['sampled_from_version']}")
        if self.cfg.sample_every and m["step"] % self.cfg.sample_every == 0:
            said = " | ".join(m["content"] for m in seqs["messages"][0][1:])  # the episode after its prompt
            print0(f"  sample (reward {float(seqs['reward'][0]):g}): {said[:300]!r}")
        if m.get("out_of_room_frac") and not self.said_room:
            self.said_room = True  # (once a run: out_of_room_frac has every step's share)
            print0(f"warning: at step {m['step']}, {m['out_of_room_frac']:.0%} of the episodes ended because the "
                   f"environment's next message and another reply did not fit in --max_new_tokens "
                   f"{self.cfg.max_new_tokens} (their replies and messages together): raise --max_new_tokens, or "
                   f"lower --max_reply_tokens")
        if m.get("improbable_identical_groups") and not self.said_identical:
            self.said_identical = True  # (once a run: the metric has every step's count)
            print0(f"warning: at step {m['step']}, {m['improbable_identical_groups']:.0f} group(s) of "
                   f"{self.cfg.group_size} completions are the same tokens, which the server's own log-probs say it "
                   f"would draw less than once in 1,000 tries: it does not sample each copy of a prompt on its own "
                   f"(SGLang's --enable-deterministic-inference does this). Their advantages are 0: they teach "
                   f"nothing. Restart the server without it (bash serve.sh restart; look at EXTRA_ARGS)")
        if m.get("empty_batch_skips"):
            print0(f"warning: every sequence of step {m['step']} had weight 0: its update was skipped")
        self.write(m)
        self.nonfinite_run = self.nonfinite_run + 1 if m["nonfinite_skips"] else 0  # the same on all ranks
        if m["nonfinite_skips"]:
            print0(f"warning: NaN/Inf gradient at step {m['step']}: {m['nonfinite_skips']} of {self.cfg.mu} "
                   f"update(s) skipped")
        if self.nonfinite_run >= self.cfg.max_nonfinite_steps:
            raise UserError(f"NaN/Inf gradients in {self.nonfinite_run} steps in a row (--max_nonfinite_steps); the "
                            f"weights were left as they were. Lower --lr, check the rewards and --tis_cap, then "
                            f"--resume from the last checkpoint in {self.cfg.out_dir}.")

    def unwritten(self, what, e):  # a full disk, a quota (as a checkpoint's write says)
        return UserError(f"could not write {what} ({e.strerror or e}): is the disk of {self.cfg.out_dir} full? Free "
                         f"space, then --resume from the last checkpoint there")

    def close(self):
        if self.master and self.cfg.wandb:
            self.wandb.finish()


def write_whole(path, text):
    """path.tmp, then one atomic rename over path: a crash or a full disk leaves the old file whole."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def saved_config(cfg):
    return {**dataclasses.asdict(cfg), "api_key": ""}  # the flags, never the key


def print0(*a):
    if int(os.environ.get("RANK", 0)) == 0:
        print(*a, flush=True)


# ---- Setup: flags, ranks, GPUs, data, models. ----------------------------------------------------

def parse_config(argv=None):
    """The command line -> Config, which remembers the flags given (`--resume` restores the others)."""
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)  # only the flags given come back
    for f in dataclasses.fields(Config):  # `async` is a Python keyword: field async_
        flag, h = "--" + f.name.rstrip("_"), f"{f.metadata['help']} (default: {f.default})".replace("%", "%%")
        if type(f.default) is bool:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, help=h)
        else:
            ok = f.metadata["ok"]
            p.add_argument(flag, dest=f.name, type=type(f.default), help=h,
                           metavar="{" + ",".join(ok) + "}" if isinstance(ok, tuple) else None)
    given = vars(p.parse_args(argv))
    cfg = Config(**given)
    cfg.given = set(given)
    return cfg


# Flags a resumed run may change: how and where it runs, not what it trains (docs/reference.md, "Resume").
RESUMABLE = {"steps", "resume", "out_dir", "eval_every", "save_every", "sample_every", "wandb", "wandb_project",
             "device", "micro_batch", "head_matmul", "grad_checkpointing", "max_nonfinite_steps",
             "server_url", "api_key", "server_gpu", "colocate", "request_timeout", "request_retries", "sync",
             "sync_bucket_mb", "nccl_master_addr", "nccl_port", "mismatch_max", "check_seqs", "keep_checkpoints",
             "collective_timeout"}


# Flags newer than runs that may be resumed, whose default would change what such a run trains: the value it trained
# with. (--example auto puts a worked example before plain prompts; a run begun before it had none.)
BEFORE_THE_FLAG = {"example": "off"}


def restore_config(cfg):
    """--resume: config.json's flags for those not given; a given one may differ only if RESUMABLE (else one error).
    A flag config.json lacks (the run began before it) takes BEFORE_THE_FLAG's value, where it has one, and says so."""
    path = os.path.join(cfg.out_dir, "config.json")
    if not os.path.exists(path):  # gone: the last checkpoint keeps the flags too (its trainer_state.pt)
        ckpt = latest_checkpoint(cfg.out_dir)
        try:
            saved = torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=True, mmap=True)["config"]
        except Exception:  # no checkpoint (a run that never saved starts again), or one checkpoint_to_resume names
            return
        print0(f"--resume: {path} is gone; the run's flags come from its checkpoint {ckpt}")
    else:
        try:
            saved = json.load(open(path))
        except (OSError, ValueError) as e:
            raise UserError(f"--resume: {path} cannot be read ({e}); it holds the flags of the run to resume") from None
    fields = {f.name: f.default for f in dataclasses.fields(Config)}
    bad = [f"{k!r}: {v!r} (--{k.rstrip('_')} takes a {type(fields[k]).__name__})" for k, v in saved.items()
           if k in fields and type(v) is not type(fields[k]) and (type(v), type(fields[k])) != (int, float)]
    if bad:
        raise UserError(f"--resume: {path} holds values of the wrong type: {'; '.join(bad)}. Fix them there (numbers "
                        f"unquoted, true/false for a switch)")
    given = getattr(cfg, "given", None)  # None: a Config built in code, whose given flags are those not at default
    given = {k for k in fields if getattr(cfg, k) != fields[k]} if given is None else given
    changed = [(k, saved[k], getattr(cfg, k)) for k in sorted(given) if k in saved and k not in RESUMABLE
               and saved[k] != getattr(cfg, k)]
    if changed:
        was = "; ".join(f"--{k.rstrip('_')} was {a!r}, now {b!r}" for k, a, b in changed)
        raise UserError(f"--resume: these flags differ from the run in {cfg.out_dir} (its config.json), and a resumed "
                        f"run must train what it trained: {was}. Drop them to continue that run, or start a new run "
                        f"in another --out_dir. Flags a resume may change: "
                        + ", ".join(f"--{k.rstrip('_')}" for k in sorted(RESUMABLE)))
    for k, v in saved.items():
        if k in fields and k not in given and k != "api_key":
            setattr(cfg, k, v)
    for k, v in BEFORE_THE_FLAG.items():
        if k not in saved and k not in given:
            setattr(cfg, k, v)
            print0(f"--resume: the run in {cfg.out_dir} began before --{k} existed: --{k} {v}, as it trained")


class UserError(Exception):
    """A problem the user can fix; printed once as one clear message, never a traceback."""


def check_config(cfg, world):
    """Each flag's `ok` (an error: the flag, its value, what is allowed), then rules between flags -> the servers."""
    for f in dataclasses.fields(cfg):
        ok, v = f.metadata.get("ok"), getattr(cfg, f.name)
        if ok is not None and not (v in ok if isinstance(ok, tuple) else obeys(v, ok, cfg)):
            words = [] if isinstance(ok, tuple) else ok.split()  # a rule may name other flags: say their values
            raise UserError(f"--{f.name.rstrip('_')} {v!r} is out of range: it must be " + (
                " or ".join(ok) if isinstance(ok, tuple) else " ".join(f.name if x == "v" else x for x in words))
                + "".join(f" (--{x} is {getattr(cfg, x)})" for x in words if hasattr(cfg, x)))
    task_weights(cfg.task)  # (here, not in the flag: a task may be added after the import)
    if "auto" in reward_fns.TASKS or "auto" in reward_fns.REWARD_FNS:  # the keyword wins: it would never run
        raise UserError(f"reward_fns.{'TASKS' if 'auto' in reward_fns.TASKS else 'REWARD_FNS'} has an entry named "
                        f"'auto', the keyword of --task and --reward (the dataset's pick): give it another name")
    if cfg.min_lr_ratio and cfg.lr_schedule == "constant":
        raise UserError(f"--min_lr_ratio {cfg.min_lr_ratio} is the end of a decay, and --lr_schedule is constant: add "
                        f"--lr_schedule linear (or cosine), or drop --min_lr_ratio")
    data, out = (os.path.realpath(p) for p in (cfg.dataset, cfg.out_dir))
    if os.path.isdir(cfg.dataset) and (out + os.sep).startswith(data + os.sep):  # its files would be read as data
        raise UserError(f"--out_dir {cfg.out_dir} is inside --dataset {cfg.dataset}: the run's files would be read as "
                        f"rows of the dataset. Use an --out_dir outside it")
    if cfg.prompts_per_step % world:
        raise UserError(f"--prompts_per_step {cfg.prompts_per_step} must divide by the world size {world}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no GPU: use --device cpu (tests), or a torch build with CUDA")
    if (cfg.head_matmul == "bf16" and cfg.device != "cpu" and torch.cuda.is_available()
            and tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 8)):  # mm's bf16 in, fp32 out: 2.8
        raise UserError(f"--head_matmul bf16 needs torch >= 2.8 on a GPU (torch.mm with out_dtype), this is torch "
                        f"{torch.__version__}: pip install -U torch (sglang 0.5.16 pins 2.11), or --head_matmul fp32")
    if cfg.colocate and cfg.sync == "nccl":
        raise UserError("--sync nccl needs the server on another GPU than rank 0 (NCCL allows one rank per GPU); "
                        "drop --colocate or use --sync tensor")
    names = [t.strip() for t in cfg.lora_targets.split(",")]  # "q_proj, v_proj": as meant
    if not all(names):
        raise UserError(f"--lora_targets {cfg.lora_targets!r} has an empty entry: name the Linears that get adapters, "
                        f"separated by commas (e.g. q_proj,v_proj)")
    cfg.lora_targets = ",".join(names)  # (also as config.json and adapter_config.json save them)
    servers = parse_servers(cfg)
    if cfg.out_dir != cfg.out_dir.strip() or not cfg.out_dir:  # a folder named by blanks, hard to see or delete
        raise UserError(f"--out_dir {cfg.out_dir!r} is blank or starts or ends with a blank: name the run's folder "
                        f"without them (e.g. runs/grpo)")
    try:  # and written: a read-only folder would fail only after the model and optimizer were loaded
        os.makedirs(cfg.out_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=cfg.out_dir).close()
    except OSError as e:
        raise UserError(f"--out_dir {cfg.out_dir!r} cannot be created or written: {e.strerror}") from None
    if cfg.ratio_level == "sequence" and max(cfg.clip_low, cfg.clip_high) >= 0.01:
        print0(f"warning: GSPO (--ratio_level sequence) with --clip_low {cfg.clip_low} / --clip_high "
               f"{cfg.clip_high}: a sequence's ratio is the geometric mean of its tokens', so GRPO's clips almost "
               f"never bite; GSPO uses ~3e-4")
    return servers


def obeys(v, rule, cfg=None):
    """A Config rule: v compared with numbers or flags, chained ('0 < v <= 1', 'v < steps'), alternatives by ' or '."""
    import operator
    ops = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}
    for alt in rule.split(" or "):
        t = alt.split()
        x = [v if s == "v" else float(getattr(cfg, s, s)) for s in t[::2]]
        if all(ops[op](a, b) for a, op, b in zip(x, t[1::2], x[1:])):
            return True
    return False


def parse_servers(cfg):
    """--server_url, --server_gpu -> [(url, [its GPUs])], one per server (one --server_gpu entry serves them all)."""
    urls, gpus = [u.strip() for u in cfg.server_url.split(",")], str(cfg.server_gpu).split(",")
    for u in urls:
        try:  # .port raises on a port that is not a number, or out of range
            p = urlparse(u)
            ok = p.scheme in ("http", "https") and p.hostname and p.port != 0
        except ValueError:
            ok = False
        if not ok:
            raise UserError(f"--server_url {u!r} is not a server address: it must look like http://127.0.0.1:30000")
        if p.path.strip("/") or p.params or p.query or p.fragment:  # an endpoint pasted with it: the trainer adds those
            raise UserError(f"--server_url {u!r} has a path ({u[len(p.scheme) + 3 + len(p.netloc):]}): give only the "
                            f"server's address, scheme://host:port ({p.scheme}://{p.netloc})")
    urls = [u.rstrip("/") for u in urls]
    twice = [u for u in urls if urls.count(u) > 1]
    if twice:
        raise UserError(f"--server_url lists {twice[0]} twice: name each server once")
    gpus = gpus * len(urls) if len(gpus) == 1 else gpus
    if len(gpus) != len(urls) or not all(x.strip().isdigit() for g in gpus for x in g.split("+")):
        raise UserError(f"--server_gpu {cfg.server_gpu!r} must name the GPU of each --server_url ({len(urls)}), as "
                        f"serve.sh's GPU: one entry per server (comma-separated; '+' joins a tensor-parallel server's "
                        f"GPUs, e.g. 2+3), or one entry for all")
    return [(u, [int(x) for x in g.split("+")]) for u, g in zip(urls, gpus)]


def expand_paths(cfg):
    """--model, --dataset and --out_dir as a shell reads a path: '~/x' and '$HOME/x' reach the trainer as written when
    quoted or after '=' (--out_dir=~/x), and were taken literally (a folder named '~' here). Expanded, and said; a
    variable that is not set, or a user that does not exist (~nobody/x), is one error."""
    for k in ("model", "dataset", "out_dir"):
        v = getattr(cfg, k)
        if not (v.startswith("~") or "$" in v):
            continue
        got = os.path.expandvars(os.path.expanduser(v))
        unset = re.findall(r"\$\{?\w+\}?", got) or (got[:1] == "~" and [got.split("/")[0]])
        if unset:
            raise UserError(f"--{k} {v!r}: " + (
                f"{unset[0]} is no user here (a shell reads ~name as that user's home): give the path in full"
                if unset[0][0] == "~" else
                f"{unset[0]} is not set (a shell reads it as a variable): set it, or give the path in full"))
        print0(f"--{k} {v!r} is read as {got}, as a shell reads a path (it reached the trainer quoted, or after '=')")
        setattr(cfg, k, got)


def check_not_a_checkpoint(cfg):
    """--out_dir is a run's folder: one that is a checkpoint of a run (runs/grpo/step_100) is one error that names the
    run's folder, with or without --resume (which continues the run from the checkpoint its `latest` names)."""
    d = os.path.normpath(cfg.out_dir)
    run, step = os.path.dirname(d) or ".", os.path.basename(d)
    if not (os.path.exists(os.path.join(d, "trainer_state.pt")) and run_files(run)):
        return
    latest = (latest_checkpoint(run) or "").rstrip("/")
    pick = "" if os.path.basename(latest) == step else f" (from this checkpoint: first echo {step} > {run}/latest)"
    raise UserError(f"--out_dir {cfg.out_dir} is a checkpoint of the run in {run}, not a run's folder: " + (
        f"--resume continues a run from its folder, at the checkpoint its latest names: --out_dir {run} --resume{pick}"
        if cfg.resume else f"to train on from these weights in a new run, --model {cfg.out_dir} --out_dir "
                           f"<another folder>; to continue that run, --out_dir {run} --resume{pick}"))


def setup(cfg):
    """Flags, ranks, GPU layout and process group, all checked before anything heavy. -> rt (SimpleNamespace)."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    expand_paths(cfg)
    check_not_a_checkpoint(cfg)
    model = os.path.realpath(cfg.out_dir) == os.path.realpath(cfg.model)
    if model or run_files(cfg.out_dir) == ["config.json"]:  # a run never overwrites files it did not write
        raise UserError(f"--out_dir {cfg.out_dir} " + ("is --model's folder" if model else "holds a config.json that "
                        "no run of this trainer wrote (a model's folder?)") + ": the run would write over its "
                        "config.json. Use another --out_dir")
    if cfg.resume:
        restore_config(cfg)
    cfg.api_key = cfg.api_key or os.environ.get("SGLANG_API_KEY", "")
    servers = check_config(cfg, world)
    lock = lock_out_dir(cfg.out_dir) if rank == 0 else None  # held until the process ends
    ckpt = checkpoint_to_resume(cfg.out_dir, world, cfg.resume)
    ckpt and check_lora_resume(cfg, ckpt)
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if use_cuda:
        dev_idx, server_idx = gpu_layout(servers, cfg.colocate, local_rank, local_world, visible,
                                         torch.cuda.device_count())
        device = torch.device("cuda", dev_idx)
        torch.cuda.set_device(device)
        # cuDNN attention: a plan per shape (new ones every step, packed); backward NaN at 64 mod 128 (pytorch#196678)
        torch.backends.cuda.enable_cudnn_sdp(False)
    else:
        device, server_idx = torch.device("cpu"), ["cpu"] * len(servers)
        torch.multiprocessing.set_sharing_strategy("file_system")  # CPU tensors by file name (tests)
    sync, why = pick_sync(cfg, servers, server_idx, visible)
    if sync == "nccl":  # SGLang's server runs NCCL with cuMem off unless told otherwise: both ends must agree
        os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
    from datetime import timedelta
    from torch.distributed.device_mesh import init_device_mesh
    # `python grpo_sglang.py`: a portless store; no device_id, else later NCCL groups split off it and miss the server
    alone = {} if "RANK" in os.environ else {"store": dist.HashStore(), "rank": 0, "world_size": 1}
    # a collective waits at most --collective_timeout for the other ranks (gloo raises, NCCL's watchdog ends the run)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=cfg.collective_timeout),
                            **alone)
    torch.manual_seed(cfg.seed + rank)
    random.seed(cfg.seed + rank)  # a hack's draws with Python's random (the checkpoint keeps its state): per rank
    if use_cuda:  # CUDA-IPC handles then name the GPU by UUID (see the weight sync); CUDA tensors only
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        monkey_patch_torch_reductions()
    return SimpleNamespace(rank=rank, world=world, master=rank == 0, device=device,
                           mesh=init_device_mesh(device.type, (world,)), sync=sync, why=why, servers=servers,
                           server_idx=server_idx, ckpt=ckpt, lock=lock)


def load_splits(cfg, task=None, names=()):
    """-> (train rows, eval rows, where the eval rows come from), rows as dicts (unvalidated); built in: the task's.
    Several tasks of one dataset (`names`): {name: those of its rows}, each task's held out by itself (hold_out)."""
    one_file = cfg.dataset.endswith((".json", ".jsonl")) or os.path.isfile(cfg.dataset)
    what = ("the task's own rows" if cfg.dataset == "builtin" else "one file, with no splits" if one_file else
            "a local folder, with no config" if os.path.isdir(cfg.dataset) else None)
    ignored = [f for f in ("dataset_config", "train_split", "eval_split") if f in getattr(cfg, "given", ()) and what
               and (f == "dataset_config" or not what.startswith("a local folder"))]
    if ignored:  # (a folder's splits are its files: train.jsonl, test.jsonl)
        raise UserError(f"--{ignored[0]} names a part of a dataset on the HF hub, and --dataset {cfg.dataset} is "
                        f"{what}: drop --{ignored[0]}")
    if cfg.dataset == "builtin":
        arithmetic = task.rows is reward_fns.arithmetic_rows  # (--builtin_max_operand sizes them)
        rows = task.rows(cfg.builtin_max_operand) if arithmetic else task.rows()
        n_eval = min(cfg.eval_size, len(rows) // 4)
        return rows[n_eval:], rows[:n_eval], "held out of the built-in task"  # disjoint rows: never trained on
    if one_file:
        train, eval_split, evals = read_rows(cfg.dataset), None, None  # one file: no splits
    else:
        ds = load_hf_dataset(cfg)  # checks that the splits exist
        train, eval_split = [dict(r) for r in ds[cfg.train_split]], cfg.eval_split
        evals = [dict(r) for r in ds[eval_split]] if eval_split else None
    if len(names) > 1:  # --eval_size of each task: a split's first rows may all be one task's
        return {n: hold_out(cfg, t, e, eval_split, n) for n, (t, e) in rows_by_task(cfg, train, evals, names).items()}
    return hold_out(cfg, train, evals, eval_split)


def hold_out(cfg, train, evals, eval_split, name=None):
    """-> (train rows, eval rows, where they come from): the eval split's first --eval_size rows, or where there is
    none, 10% of the train rows (at most --eval_size), shuffled by --seed. name: the task these rows are (several)."""
    of = f" of --task {name}" if name else ""
    if evals is not None:
        if not evals:  # (a split of no rows at all is refused where it is loaded)
            raise UserError(f"--dataset {cfg.dataset}: its {eval_split!r} split holds no row{of}, so it could not be "
                            f"evaluated: add rows{of} to that split (each naming its task), or --eval_split '' to hold "
                            f"out 10% of its training rows")
        return train, evals[: cfg.eval_size], f"its {eval_split!r} split"
    random.Random(cfg.seed).shuffle(train)  # no held-out split: hold out rows of the train split
    n_eval = min(cfg.eval_size, len(train) // 10)
    why = "the file has no splits" if eval_split is None else "--eval_split ''"
    if not n_eval and cfg.eval_size:
        raise UserError(f"--dataset {cfg.dataset} has {len(train)} row(s){of}: too few to hold any out for evaluation "
                        f"({why}; 10% are held out, so it needs at least 10). Add rows, or give it an eval split: "
                        + ("a folder of train.jsonl and test.jsonl" if eval_split is None else "--eval_split NAME"))
    return train[n_eval:], train[:n_eval], f"held out of the training rows ({why}; at most 10%)"


def tokenize_rows(rows, tok, cfg, instruction, fmt, skipped, task, max_len=None, held=(), name=None):
    """Rows -> [{ids, answer, question, text (the user's message), task (`name`)}] by `fmt`, tokenized; unusable or
    `held` rows are counted in `skipped`, by why: among them, answers no completion can match
    (reward_fns.answer_problem). The task's worked example, where --example shows it (shown_example), comes first: in
    plain prompts as the rollout writes an episode (the question, then each reply and message on a line of its own)
    and a blank line, in chat ones as turns."""
    out, limit, shown = [], max_len or cfg.max_prompt_tokens, shown_example(cfg, fmt, task, instruction) or []
    before = "".join(m["content"] + "\n" for m in shown) + "\n" if shown else ""  # plain
    for r in rows:
        q, a = r.get(cfg.prompt_field), r.get(cfg.answer_field)
        if not isinstance(q, str) or not q.strip():
            skipped[f"empty or missing prompt (--prompt_field {cfg.prompt_field!r})"] += 1
            continue
        if q.strip() in held:
            skipped["question also held out for evaluation (a duplicate)"] += 1
            continue
        answer = None if a is None else json.dumps(a) if isinstance(a, list) else str(a)  # a list: aliases
        why = "no answer" if a is None else reward_fns.answer_problem(task, answer)
        if why:
            skipped[f"{why} (--answer_field {cfg.answer_field!r})"] += 1
            continue
        text = f"{q.strip()}\n{instruction}".strip()
        if fmt == "chat":
            chat = tok.apply_chat_template(shown + [{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
            ids = tok(chat, add_special_tokens=False)["input_ids"]  # the template has its special tokens
        else:
            ids = tok(before + text + "\n")["input_ids"]  # with BOS where the tokenizer adds one
        if len(ids) > limit:
            skipped[f"prompt longer than max_prompt_tokens={limit}" if limit == cfg.max_prompt_tokens
                    else f"prompt longer than {limit} tokens (the server's context)"] += 1
            continue
        out.append({"ids": ids, "answer": answer, "question": q.strip(), "text": text, "task": name})
    return out


def shown_example(cfg, fmt, task, instruction):
    """--example -> the messages of the task's worked example (reward_fns.Task.example) to put before each question,
    its question with the instruction as any question's; or None: 'auto' shows it in plain prompts only."""
    if cfg.example == "off" or cfg.example == "auto" and fmt != "plain" or not task.example:
        return None
    q = task.example[0]["content"]
    return [{"role": "user", "content": f"{q.strip()}\n{instruction}".strip()}] + [dict(m) for m in task.example[1:]]


def check_shown_example(cfg, name, shown, max_turns, stop):
    """The worked example put before each question (`shown`) must be an episode this run's limits allow: at most
    max_turns replies, none holding a string that ends a reply (plain prompts of episodes end one at a newline). Else
    the model learns from replies it could never write: one error with the fix."""
    replies = [m["content"] for m in shown or [] if m["role"] == "assistant"]
    if len(replies) > max_turns:
        raise UserError(f"--max_turns {max_turns}: the worked example of --task {name}, before each question "
                        f"(--example {cfg.example}), takes {len(replies)} replies, and this run's episodes at most "
                        f"{max_turns}: raise --max_turns to {len(replies)} or more, or --example off")
    cut = next(((r, s) for r in replies for s in stop if s in r), None)
    if cut:
        auto = cfg.stop == "auto"
        raise UserError(f"--task {name}'s worked example, before each question (--example {cfg.example}), has the "
                        f"reply {reward_fns.shorten(repr(cut[0]))}, which holds {cut[1]!r}, where a reply ends (--stop "
                        + ("auto: plain prompts of episodes end a reply at a newline" if auto else cfg.stop) + "): the "
                        "model would learn from replies it cannot write. " + (
                            "Write each reply of its Task.example on one line (reward_fns.py)" if auto else
                            f"Drop {cut[1]!r} from --stop, write the example's replies without it (reward_fns.py)")
                        + ", or --example off")


def load_data(cfg, context=None):
    """-> tokenizer, train and eval prompts (tokenized, each with its task's name in "task"), and the tasks {name:
    task} (reward_fns.TASKS', --task): reward_fn(sample, warnings), correct(text, answer), stop (the strings that end a
    reply) and for episodes env, env_ids (its messages' tokens), max_turns; context: the server's. Several tasks: each
    task's rows as one task's, then mixed by --task's weights (reward_fns.mix_rows)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(cfg.model)
    fmt = ("chat" if tok.chat_template else "plain") if cfg.prompt_format == "auto" else cfg.prompt_format
    if fmt == "chat" and not tok.chat_template:
        raise UserError(f"--prompt_format chat, but the tokenizer of {cfg.model} has no chat template (a base "
                        f"model?): use --prompt_format plain (or auto)")
    builtin, weights = cfg.dataset == "builtin", task_weights(cfg.task)
    names = [n if n != "auto" else "arithmetic" if builtin else None for n in weights]  # a dataset's: by its answers
    taken = TAKEN_PARTS + tuple(names if len(names) > 1 else ())  # several: the trainer logs reward_<task>
    for name in names:
        check_task(name)
        try:  # a typo in --reward is said before any data loads
            reward_fns.combine(cfg.reward, name or "gsm8k", taken)
        except ValueError as e:
            raise UserError(f"--reward: {e}") from None
        if builtin and not reward_fns.TASKS[name].rows:
            raise UserError(f"--dataset builtin: --task {name} has no built-in rows: give it a --dataset")
    if cfg.example == "on" and len(names) > 1 and not any(reward_fns.TASKS[n].example for n in names):
        raise UserError(f"--example on: none of --task {cfg.task} has a worked example to show: give a Task one "
                        f"(example=, reward_fns.py), or drop --example")
    max_len = cfg.max_prompt_tokens
    if context and context - cfg.max_new_tokens - 1 < max_len:  # SGLang refuses prompt + max_new_tokens >= context
        max_len = context - cfg.max_new_tokens - 1
        if max_len < 1:
            raise UserError(f"--max_new_tokens {cfg.max_new_tokens} leaves no room for a prompt: the server's context "
                            f"is {context} tokens, prompt and completion together. Lower --max_new_tokens.")
        print0(f"prompts longer than {max_len} tokens are skipped: the server's context ({context}) minus "
               f"--max_new_tokens")
    if builtin:
        splits = {name: load_splits(cfg, reward_fns.TASKS[name]) for name in names}
    else:
        splits = load_splits(cfg, names=names) if len(names) > 1 else {names[0]: load_splits(cfg)}
    if "builtin_max_operand" in getattr(cfg, "given", ()) and not (builtin and any(
            reward_fns.TASKS[n].rows is reward_fns.arithmetic_rows for n in names)):
        raise UserError(f"--builtin_max_operand sizes the built-in rows of --task arithmetic only (here --task "
                        f"{cfg.task}, --dataset {cfg.dataset}): drop it")
    tasks, train, evals = {}, {}, []
    for name, (raw_train, raw_eval, held_out) in splits.items():
        why = ""
        if name is None:
            name, why = pick_task(cfg, raw_train + raw_eval)
            check_task(name)
        tasks[name], train[name], e = load_task(cfg, tok, fmt, name, raw_train, raw_eval, held_out, max_len, why,
                                                taken, len(splits) > 1)
        evals += e
    if len(tasks) == 1:
        return tok, train[name], evals, tasks
    mixed = reward_fns.mix_rows(train, dict(zip(tasks, weights.values())), cfg.seed)
    print0(mix_line(mixed, train, dict(zip(tasks, weights.values())), cfg.task))
    return tok, mixed, evals, tasks


def mix_line(mixed, train, weights, spec):
    """A mixed run's start line: each task's share of the prompts, never '0%' or '100%' for a share that is neither,
    and a task whose weight asks for less than one prompt said to get one (reward_fns.mix_rows)."""
    share, top = Counter(r["task"] for r in mixed), max(weights.values())
    asked = {n: sum(map(len, train.values())) * (w / top) / sum(v / top for v in weights.values())
             for n, w in weights.items()}  # the prompts its weight asks for (/ top: no overflow)
    return "tasks: " + ", ".join(
        f"{n} {percent(share[n], len(mixed))} of the prompts ({len(train[n])} rows" + (
            f"; its weight asks for {asked[n]:.2g} of the {len(mixed)} prompts: it gets 1, the fewest a task gets)"
            if asked[n] < 0.5 else ")") for n in weights) + f", by --task {spec!r}; each group one task"


def percent(part, whole):
    """part / whole as a percentage with as many decimals as it takes to read neither 0% nor 100% when it is neither:
    1 of 20,132 is '0.005%', not '0%'."""
    for d in range(12):
        said = f"{part / whole:.{d}%}"
        if part in (0, whole) or said not in (f"{0:.{d}%}", f"{1:.{d}%}"):
            return said
    return said


def rows_by_task(cfg, raw_train, raw_eval, names):
    """Several tasks from one dataset: {name: (its train rows, its eval rows)} by each row's "task" field, which must
    name one of them. raw_eval None (no eval split): None each."""
    for r in raw_train + (raw_eval or []):
        if str(r.get("task")) not in names:
            raise UserError(f"--dataset {cfg.dataset}: a row " + (f"names the task {r['task']!r}, which is not one of "
                            if "task" in r else "has no 'task' field, and each row must name its task, one of ")
                            + f"--task {cfg.task} ({reward_fns.shorten(json.dumps(r, default=str), 100)}): give "
                            f"each row its task, or add that task to --task")
    pick = lambda rows, n: None if rows is None else [r for r in rows if str(r["task"]) == n]
    return {n: (pick(raw_train, n), pick(raw_eval, n)) for n in names}


def load_task(cfg, tok, fmt, name, raw_train, raw_eval, held_out, max_len, why, taken, several):
    """One task of the run -> (the task, its train rows, its eval rows), tokenized; its start lines said."""
    t = reward_fns.TASKS[name]
    reward_fn = reward_fns.combine(cfg.reward, name, taken)  # (sample, warnings) -> (reward, parts)
    max_turns = (cfg.max_turns if t.env or not several else 0) or t.max_turns  # several: for those with episodes
    if max_turns > 1 and not t.env:
        raise UserError(f"--max_turns {max_turns}: --task {name} has no environment to answer a reply, so its episodes "
                        f"are one turn: drop --max_turns, or give the task an env (reward_fns.py, Task)")
    if max_turns == 1 and cfg.max_reply_tokens > cfg.max_new_tokens:
        raise UserError(f"--max_reply_tokens {cfg.max_reply_tokens} is more than --max_new_tokens "
                        f"{cfg.max_new_tokens}, which caps --task {name}'s one reply: drop --max_reply_tokens, or "
                        f"raise --max_new_tokens")
    if max_turns > 1 and cfg.max_reply_tokens >= cfg.max_new_tokens:
        raise UserError(f"--max_reply_tokens {cfg.max_reply_tokens} leaves no room in --max_new_tokens "
                        f"{cfg.max_new_tokens} (an episode's replies and messages together) for a second reply of "
                        f"--task {name}'s episodes of up to {max_turns}: lower --max_reply_tokens, or raise "
                        f"--max_new_tokens")
    task = SimpleNamespace(name=name, reward_fn=reward_fn, correct=t.correct, env=t.env, max_turns=max_turns,
                           env_ids=t.env and remembered(env_ids(tok, fmt, name)),
                           stop=stop_strings(cfg.stop, fmt, max_turns),
                           decode=lambda ids: tok.decode(ids, skip_special_tokens=True))
    instruction = t.instruction if cfg.instruction == "auto" else cfg.instruction
    if cfg.example == "on" and not t.example and not several:
        raise UserError(f"--example on: --task {name} has no worked example to show: give its Task one (example=, "
                        f"reward_fns.py), or drop --example")
    check_shown_example(cfg, name, shown_example(cfg, fmt, t, instruction), max_turns, task.stop)
    skipped = Counter()
    evals = tokenize_rows(raw_eval, tok, cfg, instruction, fmt, skipped, t, max_len, (), name)
    answers = defaultdict(set)  # a question asked with several answers hides its answer (a game's secret): no leak
    for r in raw_train + raw_eval:
        answers[str(r.get(cfg.prompt_field)).strip()].add(str(r.get(cfg.answer_field)))
    held = {r["question"] for r in evals if len(answers[r["question"]]) == 1}
    train = tokenize_rows(raw_train, tok, cfg, instruction, fmt, skipped, t, max_len, held, name)
    at = f" (--task {name})" if several else ""
    print0(f"data{at}: {len(train)} train / {len(evals)} eval prompts from {cfg.dataset} (eval: {held_out}); skipped "
           f"{sum(skipped.values())} rows" + (f" ({dict(skipped)})" if skipped else ""))
    print0(f"prompt format{at}: {fmt} " + ("(the tokenizer's chat template)" if fmt == "chat"
                                          else "('question\\ninstruction\\n')") + (
        ", each question after a worked episode of the task (--example)" if shown_example(cfg, fmt, t, "") else "") + (
        f"; a reply ends at {', '.join(map(repr, task.stop))} (--stop)" if task.stop else ""))
    if not train or not evals:
        missing = raw_train and all(r.get(cfg.prompt_field) is None or r.get(cfg.answer_field) is None
                                    for r in raw_train + raw_eval)
        hint = (f"; the rows have the fields {sorted(raw_train[0])}: name the question's and the answer's with "
                f"--prompt_field and --answer_field" if missing else "")
        if not missing and any("without a number" in w for w in skipped):
            hint += f"; --task {name} needs answers that hold a number: --task exact or choice (or auto) takes others"
        elif not missing and any("answer" in w and "(--answer_field" in w for w in skipped):
            hint += f"; no completion could match those answers under --task {name}'s check: fix the answers, or " \
                    f"pick the task that fits them (--task)"
        hint += "; raise --max_prompt_tokens (or lower --max_new_tokens)" + (
            ", or drop the worked example before each question: --example off" if shown_example(cfg, fmt, t, "") else ""
        ) if any("longer" in w for w in skipped) else ""
        raise UserError(f"no usable rows left for {'training' if not train else 'evaluation'}{at} (skipped: "
                        f"{dict(skipped)}){hint}")
    check_rows_task(cfg, raw_train + raw_eval, name, task.stop, t.numeric, several)
    print0(f"task: {name}" + (f", episodes of up to {max_turns} replies (its environment: {t.env.__name__})"
                              if max_turns > 1 else "") + why)
    return task, train, evals


TAKEN_PARTS = ("mean", "warnings", "overlong")  # reward_<these> are the trainer's own metrics, not a reward's part


def check_rows_task(cfg, rows, name, stop, numeric, several=False):
    """One task's rows: their `task` field, when this run trains one task, naming another task is one error, naming
    no task is said (several tasks: rows_by_task routed them); a --stop string in the answers (a numeric task's: their
    number) would cut them: said."""
    named = Counter(str(r["task"]) for r in rows if "task" in r and "task" not in (cfg.prompt_field, cfg.answer_field))
    other = [t for t in named if t != name and t in reward_fns.TASKS and not several]
    if other:
        raise UserError(f"--dataset {cfg.dataset}: {named[other[0]]} rows name the task {other[0]!r} in their 'task' "
                        f"field, and this run trains --task {name} alone. Pass --task {name},{other[0]} to train both "
                        f"(each row by its task), --task {other[0]}, or drop those rows")
    if set(named) - {name} and not several:
        print0(f"note: the rows' 'task' field ({', '.join(sorted(named)[:3])}) names no task of reward_fns.py, and is "
               f"not read: --task {name} scores them")
    answers = [str(a) for a in (r.get(cfg.answer_field) for r in rows) if a is not None]
    cut = [s for s in stop if cfg.stop != "auto" and any(s in ((reward_fns.extract_number(a) or a) if numeric else a)
                                                         for a in answers)]
    if cut:
        print0(f"warning: --stop {cfg.stop!r}: the answers hold {', '.join(map(repr, cut))}, where a reply would stop "
               f"before it writes the answer: drop it from --stop")


def task_weights(spec):
    """--task -> {name: weight}: 'auto' alone, or tasks of reward_fns.TASKS, each with its share of the prompts (one
    task: no weight); else one clear error."""
    try:
        weights = reward_fns.task_weights(spec)
    except ValueError as e:
        raise UserError(f"--task {e}") from None
    unknown = [n for n in weights if n not in ("auto", *reward_fns.TASKS)]
    if unknown:
        raise UserError(f"--task {unknown[0]!r} is not a task of reward_fns.py" + (
            f" (in --task {spec!r})" if len(weights) > 1 else "") + f": it must be auto or one of "
            f"{', '.join(sorted(reward_fns.TASKS))}")
    if "auto" in weights and len(weights) > 1:
        raise UserError(f"--task {spec!r}: auto picks one task by the dataset's answers: name each task of the run")
    if len(weights) == 1 and ":" in spec:
        raise UserError(f"--task {spec!r}: a weight is a task's share of the prompts among several tasks: with one "
                        f"task, drop ':{spec.partition(':')[2].strip()}'")
    taken = [n for n in weights if n in TAKEN_PARTS and len(weights) > 1]
    if taken:
        raise UserError(f"--task {spec!r}: the task {taken[0]!r} would be logged as reward_{taken[0]}, one of the "
                        f"trainer's own metrics: register it under another name")
    return weights


def check_task(name):
    """The run's task held to reward_fns' contract (its reward, check, environment, turns): one error naming it."""
    try:
        name and reward_fns.check_task(name, reward_fns.TASKS[name])
    except ValueError as e:
        raise UserError(str(e)) from None


def stop_strings(flag, fmt, max_turns):
    """--stop -> the strings that end a reply (SGLang's `stop`). 'auto': none where the chat template ends a turn; for
    plain prompts (a base model has no end of turn) a newline in episodes, a blank line in single-turn tasks."""
    if flag == "auto":
        return [] if fmt == "chat" else ["\n"] if max_turns > 1 else ["\n\n"]
    if flag == "none":
        return []
    if flag.strip().lower() in ("auto", "none"):  # a typo of a keyword, not a stop string
        raise UserError(f"--stop {flag!r}: write 'auto' or 'none' exactly (or the strings that end a reply)")
    import codecs
    try:
        got = [codecs.decode(s.encode("latin-1", "backslashreplace"), "unicode_escape") for s in flag.split(",")]
    except UnicodeDecodeError as e:
        raise UserError(f"--stop {flag!r}: {e.reason} in an escape: write a newline as \\n") from None
    if "" in got:
        raise UserError(f"--stop {flag!r} has an empty string: strings separated by commas, 'none' or 'auto'")
    task = lambda s: ":" in s and s.partition(":")[0].strip() in reward_fns.TASKS  # 'calculator:\n'
    if any(map(task, got)):  # a task's own stop string, as the user meant it, would stop only at that text
        named = next(filter(task, got))
        alone = ",".join(s.partition(":")[2].lstrip(" ") if task(s) else s for s in flag.split(","))
        raise UserError(f"--stop '{flag}': {named!r} reads as a stop string of --task {named.partition(':')[0].strip()}"
                        f", but --stop is one list for every task, and would end a reply at the text {named!r}: give "
                        f"the strings alone, for all tasks (--stop '{alone}'), or --stop auto: each task's own")
    return got


def env_ids(tok, fmt, task):
    """-> ids(text, last): the tokens that end the model's reply (whose last token is `last`), add the environment's
    message `text` as the next user turn and open the model's next reply. With a chat template: its rendering of the
    message after a fixed conversation minus the conversation's own, checked to extend it (TRL's and SkyRL's way; the
    episode itself is never re-tokenized: its text could split into other tokens than the model sampled). Plain
    prompts: the text on a line of its own."""
    if fmt == "plain":
        lead = lambda last: "" if last is not None and tok.decode([last]).endswith("\n") else "\n"  # (--stop)
        return lambda text, last: tok(lead(last) + text + "\n", add_special_tokens=False)["input_ids"]
    render = lambda msgs, gen: list(tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen,
                                                            return_dict=False))
    talk = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    opened, whole = render(talk[:1], True), render(talk, False)
    hello = tok("Hello", add_special_tokens=False)["input_ids"]
    close = whole[len(opened) + len(hello):]  # what ends a reply: ChatML's <|im_end|> and a newline

    def ids(text, last):
        more = render(talk + [{"role": "user", "content": text}], True)
        if whole[: len(opened) + len(hello)] != opened + hello or more[: len(whole)] != whole:
            raise UserError(f"--task {task}: the chat template of this tokenizer does not render a conversation as its "
                            f"earlier turns followed by the new one (it rewrites earlier turns, or a reply's tokens), "
                            f"so the environment's messages cannot be appended as token ids. Use --prompt_format "
                            f"plain, or a model whose template only appends turns")
        return (close[1:] if close[:1] == [last] else close) + more[len(whole):]  # a reply cut short: closed here
    ids("Hi", None)  # the template checked before anything heavy
    return ids


def remembered(ids):
    """ids(text, last), remembered: an environment says few distinct things (the guess game's "higher than 8"), and
    the chat template costs ~0.15 ms a message, ~15% of what a turn of 128 episodes adds (docs/design.md)."""
    seen = functools.lru_cache(maxsize=2**16)(lambda text, last: tuple(ids(text, last)))
    return lambda text, last: list(seen(text, last))


def pick_task(cfg, rows):
    """--task auto for a dataset, by its answers: gsm8k (the last number) if every answer holds a number, choice if
    every one is a letter A-J, else exact (normalised exact match). -> (name, the start line's reason)"""
    answers = [(json.dumps(a) if isinstance(a, list) else str(a)).strip()
               for a in (r.get(cfg.answer_field) for r in rows) if a is not None]
    if all(reward_fns.extract_number(a) is not None for a in answers):
        return "gsm8k", ""
    letters = all(re.fullmatch(r"\(?[A-Ja-j]\)?\.?", a) for a in answers)
    words = sum(reward_fns.extract_number(a) is None for a in answers)
    return ("choice" if letters else "exact"), (f" (--task auto: {words} of {len(answers)} answers are no number"
                                                + (", each a letter" if letters else "") + "; --task gsm8k, exact, "
                                                "choice or yours chooses)")


def load_hf_dataset(cfg):
    import datasets
    try:  # a local folder of data files has no config name (the default 'main' is GSM8K's)
        ds = datasets.load_dataset(cfg.dataset, None if os.path.isdir(cfg.dataset) else cfg.dataset_config or None)
    except Exception as e:
        if os.path.isdir(cfg.dataset):  # datasets' error names no file: find the broken one (JSON: its line)
            for f in sorted(os.listdir(cfg.dataset)):
                if f.endswith((".json", ".jsonl")):
                    read_rows(os.path.join(cfg.dataset, f))
        raise UserError(f"could not load dataset {cfg.dataset!r} ({type(e).__name__}: {str(e)[:300]}). --dataset "
                        f"takes a dataset on the HF hub, a local folder of data files, a .json/.jsonl file, or "
                        f"'builtin'") from None
    for flag, split in (("train_split", cfg.train_split), ("eval_split", cfg.eval_split)):
        if split and split not in ds:
            raise UserError(f"--{flag}: dataset {cfg.dataset!r} has no split {split!r} (it has {list(ds)})" +
                            (" (--eval_split '' holds out rows of the train split)" if flag == "eval_split" else ""))
    return ds


def read_rows(path):
    """A .jsonl file (one JSON object per line) or a .json file (a list of objects) -> rows; errors name the line. Also
    one JSON document spanning lines in either: a list of objects, or an object whose one list of objects is the rows
    ({"data": [...]}); what was read is said."""
    example = '{"question": "What is 2 + 3?", "answer": "5"}'
    if not os.path.exists(path):
        raise UserError(f"--dataset {path}: no such file")
    if not path.endswith((".json", ".jsonl")) or not os.path.isfile(path):
        raise UserError(f"--dataset {path}: a local file must be .jsonl (one JSON object per line, e.g. {example}) "
                        f"or .json (a list of such objects)")
    try:
        text = open(path, encoding="utf-8").read()
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    items = json_document(path, text)
    if items is None and path.endswith(".json") and text.lstrip().startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
    elif items is None:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            try:
                items += [(n, json.loads(line))] if line.strip() else []
            except json.JSONDecodeError as e:
                doc = "" if n > 1 or line.strip() not in ("[", "{") else document_error(text)  # (a pretty-printed one)
                raise UserError(f"{path} line {n} is not valid JSON ({e.msg}): {line[:80]!r}{doc}") from None
    bad = next((n for n, r in items if not isinstance(r, dict)), None)
    if bad or not items:
        raise UserError(f"{path}: " + (f"row {bad} is not a JSON object" if bad else "the file holds no rows") +
                        f"; each row must be an object like {example}")
    return [r for _, r in items]


def json_document(path, text):
    """The rows of a data file that is one JSON document, [(n, row)], saying what was read where it is not the file
    type's own shape; None if the text is not one JSON document (JSON Lines, or broken)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    rows = lambda v: isinstance(v, list) and v and all(isinstance(r, dict) for r in v)
    keys = [k for k, v in doc.items() if rows(v)] if isinstance(doc, dict) else []
    if len(keys) > 1:
        raise UserError(f"{path} is one JSON object with several lists of rows ({', '.join(map(repr, keys))}): keep "
                        f"the one to train on (or give a folder of train.jsonl and test.jsonl)")
    if keys or (isinstance(doc, list) and path.endswith(".jsonl")):
        how = f"the list under its key {keys[0]!r}" if keys else "one JSON list"
        items = doc[keys[0]] if keys else doc
        print0(f"data: {path} holds one JSON document spanning lines: read {how} ({len(items)} rows)")
        return list(enumerate(items, 1))
    return list(enumerate(doc, 1)) if isinstance(doc, list) else [(1, doc)]  # a .json's list; a file of one row


def document_error(text):
    """Why a text that looks like one JSON document spanning lines is not one."""
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return f"; nor is the file one JSON document spanning lines (line {e.lineno}: {e.msg})"
    return ""


def load_models(cfg, rt):
    """-> the policy (fp32 master weights, FSDP2; --lora_rank: a bf16 base and fp32 adapters), the reference (beta >
    0), AdamW over what trains, the step to start from and the steps' state (resume; else 0, {})."""
    import transformers.masking_utils
    from transformers import AutoModelForCausalLM, __version__
    if not hasattr(transformers.masking_utils, "find_packed_sequence_indices"):  # what pack_batch's rows need
        raise UserError(f"transformers {__version__} does not read packed sequences: pip install -U transformers")
    if cfg.resume and not rt.ckpt:
        print0(f"--resume: no checkpoint in {cfg.out_dir} yet, starting from {cfg.model}" + (
            " (the run there stopped before its first: it starts again, with its flags)" if run_files(cfg.out_dir)
            else ""))
    if rt.ckpt:
        check_architecture(rt.ckpt, cfg.model)
    lora = cfg.lora_rank > 0  # a LoRA checkpoint holds the adapters only: the base comes from --model
    model = load_policy(cfg.model if lora else rt.ckpt or cfg.model, rt.device, cfg.grad_checkpointing,
                        torch.bfloat16 if lora else torch.float32)
    if lora:
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets.split(","), cfg.seed)
        rt.ckpt and load_adapters(rt.ckpt, model)
    model = shard(model, rt.mesh, torch.bfloat16, cfg.head_matmul)
    ref = model if lora and cfg.beta > 0 else None  # (its adapters off: old_and_ref_logprobs)
    if cfg.beta > 0 and not lora:
        ref = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.bfloat16, attn_implementation="sdpa")
        ref = ref.to(rt.device).eval()
        ref = shard(ref, rt.mesh, torch.bfloat16, cfg.head_matmul, frozen=True).requires_grad_(False)
    # fused: one kernel, no temporaries (foreach AdamW copies a moment per step: a 7B model's OOM on one H200);
    # frozen parameters (LoRA's base) get no gradient, hence no state
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            fused=rt.device.type == "cuda")
    start, state = load_checkpoint(rt.ckpt, model, opt) if rt.ckpt else (0, {})
    if rt.ckpt:
        print0(f"resumed from {rt.ckpt} at step {start}")
    if start >= cfg.steps:
        raise UserError(f"--resume: the checkpoint in {cfg.out_dir} is at step {start} and --steps is {cfg.steps}: "
                        f"nothing left to train (raise --steps)")
    return model, ref, opt, start, state


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


# ---- The SGLang server, through its public HTTP API only. ----------------------------------------

class Server:
    """The SGLang servers: rollouts, the sync check, weight pushes; every wait has a timeout and one clear message."""

    def __init__(self, cfg, rt):
        self.cfg, self.rt, self.urls = cfg, rt, [u for u, _ in rt.servers]
        info = [fail_together(lambda: rt.master and [check_server(cfg, u) for u in self.urls])]  # rank 0 asks
        dist.broadcast_object_list(info, src=0)  # its answers, on every rank
        info = fail_together(check_servers_once, cfg, rt, info[0])
        self.context = min((s["context"] for s in info if s["context"]), default=None)  # tokens: prompt + completion
        self.checker = [bool(s["names"]) for s in info]  # hashes the weights it holds: /weights_checker
        servers = [{"url": u, **s, "device": torch.device("cuda", i) if rt.device.type == "cuda" and i is not None
                    else rt.device} for u, s, i in zip(self.urls, info, rt.server_idx)]  # where rank 0 stages weights
        self.link = None  # rank 0's way to the servers' weights
        if rt.master and rt.sync == "tensor":
            self.link = {"kind": "tensor", "servers": servers, "device": servers[0]["device"]}
        self.link = fail_together(lambda: connect_nccl(cfg, rt.device, servers) if rt.master and rt.sync == "nccl"
                                 else self.link)
        tp = [s["tp"] for s in servers]
        where = f", NCCL group at {self.link['where']}" if self.link and "where" in self.link else ""
        print0(f"layout: training on {rt.device} x {rt.world}{' (server colocated)' if cfg.colocate else ''}; server"
               f"{'s' if len(self.urls) > 1 else ''} at {', '.join(self.urls)}"
               + (f" (tensor parallel: {tp})" if max(tp) > 1 else "") + f"; weight sync: {rt.sync} ({rt.why}{where})")

    def place(self, n_rows, n):
        """-> the server of each of n episodes per prompt row: this rank's row j on (rank * n_rows + j) % servers."""
        return [(self.rt.rank * n_rows + j) % len(self.urls) for j in range(n_rows) for _ in range(n)]

    def sample(self, prompts, budgets, stops, sampling, version, srv):
        """A reply to each prompt (token ids) from its server srv[i] under θ_version, of at most budgets[i] tokens,
        ended by a string of stops[i] -> [(ids, the server's logprobs, finish reason)] in the prompts' order."""
        def request(k):  # server k's share, in one /generate
            sp = [{"temperature": sampling["temperature"], "top_p": sampling["top_p"], "top_k": sampling["top_k"],
                   "max_new_tokens": b, **({"stop": stop} if stop else {})}
                  for b, stop, s in zip(budgets, stops, srv) if s == k]  # SGLang's names only
            return POOL.submit(generate, self.cfg, self.urls[k], [p for p, s in zip(prompts, srv) if s == k],
                               str(version), "sampled", "this rollout",
                               sampling_params=sp[0] if all(x == sp[0] for x in sp) else sp)
        asked = {k: request(k) for k in sorted(set(srv))}  # all in flight, then read: each has its own timeout
        got, outs = {k: iter(f.result()) for k, f in asked.items()}, []
        for k in srv:
            o = next(got[k])
            # SGLang keeps EOS (and its logprob) in output_ids: the policy must learn to stop
            lps = [lp for lp, *_ in o["meta_info"]["output_token_logprobs"]]
            if len(lps) != len(o["output_ids"]):
                raise UserError(f"the server at {self.urls[k]} answered /generate with {len(o['output_ids'])} tokens "
                                f"but {len(lps)} log-probs: the trainer needs one per sampled token (sglang 0.5.16 "
                                f"or newer, started by serve.sh)")
            outs.append((o["output_ids"], lps, (o["meta_info"].get("finish_reason") or {}).get("type", "?")))
        return outs

    def weights_after(self, batch):
        """The rollout's last reply is in: each server it used hashes the weights it holds now (/weights_checker),
        which the check compares with the push it sampled from (weights_verdict): a change of a server's weights
        anywhere between the push and the end of the rollout (between turns, between rounds) shows. -> batch"""
        t0 = time.time()
        asked = {k: POOL.submit(call, self.cfg, self.urls[k], "/weights_checker", {"action": "checksum"})
                 for k in sorted(set(batch["srv"])) if self.checker[k]}
        batch["held"] = {k: waited(f, self.cfg.request_timeout, "/weights_checker") for k, f in asked.items()}
        batch["held_s"] = time.time() - t0
        return batch

    def check(self, batch, version, model, pad_id):
        """-> check(seqs, m), which train() calls before its first update: trainer vs server logprobs under θ_version
        on the batch's own tokens if sampled from it, else (--async) on a few rows their server re-scores now."""
        cfg, srv, eps, T = self.cfg, batch["srv"], batch["episodes"], batch["sampling"]["temperature"]
        if batch["version"] == version:
            def check_batch(seqs, m):
                d = (seqs["lp0"] - seqs["server_lp"]).abs() * seqs["mask"]
                self.verdict(batch, version, torch.stack([d.sum(1), seqs["mask"].sum(1), d.max(1).values], 1).tolist(),
                             srv, m)
            return check_batch
        if not cfg.check_seqs:  # --check_seqs 0: batches one step old go unchecked (the version check stays)
            return lambda seqs, m: self.verdict(batch, version, [], [], m) or m.mean("check_mismatch_mean", 0.0, 0)
        rows = check_rows(srv, -(-cfg.check_seqs // self.rt.world))  # rounded up: never 0 rows on a rank
        pairs = [(eps[i]["prompt"], eps[i]["completion"]) for i in rows]  # whole episodes: the server's own tokens too
        asked = {k: POOL.submit(rescore, cfg, url, [q for q, i in zip(pairs, rows) if srv[i] == k], str(version))
                 for k, url in enumerate(self.urls) if k in {srv[i] for i in rows}}
        t1 = None
        if T != 1:  # SGLang re-scores at temperature 1, so must we: now, before any update
            b = pack_batch([{"prompt": p, "completion": c} for p, c in pairs], pad_id, self.rt.device)
            with torch.no_grad():
                t1 = list(completion_logprobs(model, b, 1.0)[0])

        def check_rescored(seqs, m):  # weights from before the update
            lps = t1 or [seqs["lp0"][i, : len(eps[i]["completion"])] for i in rows]
            what = "re-scoring a batch for the sync check"
            now = fail_together(lambda: {k: iter(waited(f, cfg.request_timeout, what)) for k, f in asked.items()})
            then = lambda i: eps[i]["server_lp"] if T == 1 else None  # its log-probs at T: not staleness at 1
            self.verdict(batch, version, [rescored_stats(t, next(now[srv[i]]), then(i), eps[i]["mask"])
                                   for t, i in zip(lps, rows)], [srv[i] for i in rows], m)
        return check_rescored

    def verdict(self, batch, version, stats, srv, m):
        """stats (|Δ| sum, tokens, |Δ| max[, stale sum, max]) per sequence of srv[i]: stop unless both checks pass."""
        held = [None] * dist.get_world_size()  # every rank's answers of its servers after its rollout, to rank 0
        dist.all_gather_object(held, batch.get("held", {}))
        same = fail_together(self.weights_verdict, m, held, batch["version"], f"at step {version + 1}") or {}
        m.max("time_weights_after", batch.get("held_s", 0.0))
        per = torch.zeros(len(self.urls), 4, dtype=torch.float64)  # |Δ| sum, tokens; rank 0: tensors hashed, held
        for st, k in zip(stats, srv):
            per[k, :2] += torch.tensor(st[:2], dtype=torch.float64)
        for k, hashed in same.items():
            per[k, 2:] = torch.tensor(hashed, dtype=torch.float64)
        total = per.to(self.rt.device)
        dist.all_reduce(total)
        for k, (d, n, hashed, held_n) in enumerate(total.tolist()):
            if n and d / n > self.cfg.mismatch_max:
                gap = (f"on {n:.0f} sampled tokens its logprobs differ from the trainer's, under those weights, by "
                       f"{d / n:.3f} nats on average (--mismatch_max {self.cfg.mismatch_max}; kernel noise is "
                       f"~0.01-0.03)")
                if hashed:  # the weights are in place: the two sides compute differently
                    raise UserError(
                        f"weight sync check failed at step {version + 1}: the server at {self.urls[k]} holds the "
                        f"weights after step {version} ({hashed:.0f} of its {held_n:.0f} tensors hash as pushed), yet "
                        f"{gap}. With the same weights, the gap is the two sides' arithmetic: a server started with "
                        f"other settings than serve.sh's (--dtype, --enable-fp32-lm-head, a quantization), or a policy "
                        f"that blew up (a reward that fell to 0 in a step or two: lower --lr and --resume from a "
                        f"checkpoint before the fall). docs/troubleshooting.md: 'The mismatch error'")
                raise UserError(f"weight sync check failed at step {version + 1}: the server at {self.urls[k]} had "
                                f"the right version tag (the weights after step {version}), but {gap}: it does not "
                                f"generate with the weights it was sent.")
        for st in stats:
            m.mean("check_mismatch_mean", st[0], st[1]), m.max("check_mismatch_max", st[2])
            if len(st) > 3:  # re-scored: the staleness on the same tokens too
                m.mean("staleness_mean", st[3], st[1]), m.max("staleness_max", st[4])
        m.mean("staleness_mean", 0.0, 0)  # (null where not known: on-policy, or re-scored at another temperature)

    def push(self, model, version):
        """θ_version (the weights after `version` steps) to every server, tagged `version`. -> bytes sent (rank 0)."""
        return fail_together(push_weights, self.cfg, model, self.link, str(version))

    def weights_verdict(self, m, held, version, when):
        """Rank 0: each server's hashes after a rollout (held: every rank's {server: /weights_checker answer}) vs ours
        of the push of `version` it sampled from, on the tensors the first comparison bore out. -> {server: (tensors
        that hash as pushed, tensors it holds)} of those compared now"""
        t0, link, same = time.time(), self.link, {}
        for k, srv in enumerate(link["servers"] if link else []):
            answers = [h[k] for h in held if k in h]
            if not srv["recipes"] and "checked" not in srv:  # no checker: said once
                srv["checked"] = print0(f"weight check: 0 of {len(srv['names'])} tensors of the server at {srv['url']}"
                                        f" compared (/weights_checker: {srv['checker']}): only the log-prob check "
                                        f"remains") or True
            for answer in answers if srv["recipes"] else []:  # (none: no checker, or no rollout on this server)
                pushed = link["pushed"][version]
                got = checked_sums(srv["url"], answer, version)
                differ = [t for t, r in srv["recipes"].items() if got.get(t) != pushed.get(r)]
                if "checked" not in srv:  # the first comparison: which tensors are compared from now on
                    known = comparable(self.cfg.out_dir, srv) if self.rt.ckpt else None  # the run's start found these
                    keep = known if known is not None else set(srv["recipes"]) - set(differ)
                    srv["recipes"], srv["checked"] = {t: r for t, r in srv["recipes"].items() if t in keep}, True
                    differ = [t for t in differ if known is not None and t in keep]  # a resume's first push dropped
                    print0(f"weight check: {len(srv['recipes'])} of {len(srv['names'])} tensors of the server at "
                           f"{srv['url']} compared after every rollout" + ("" if srv["recipes"] else
                           ": none holds what was sent, only the log-prob check remains") + (
                           "" if not self.rt.ckpt else " (those the run's first push found it holds as sent)" if known
                           is not None else f" (those this resume's first push bore out: {WEIGHT_CHECK} there has no "
                           f"record of this server's layout)"))
                    self.rt.ckpt or remember_comparable(self.cfg.out_dir, srv)
                if differ:
                    raise UserError(f"weight sync check failed {when}: after the rollout sampled from version "
                                    f"{version} (the weights after step {version}), the server at {srv['url']} holds "
                                    f"other weights than the trainer pushed: {len(differ)} of {len(srv['recipes'])} "
                                    f"tensors differ ({', '.join(n for _, n in differ[:3])}"
                                    f"{', ...' * (len(differ) > 3)}"
                                    f"). It did not load the push (serve.log may say why), or its weights changed "
                                    f"during the rollout (another client updated or reloaded them). Restart it (bash "
                                    f"serve.sh restart), keep other clients off it, then --resume.")
            m.sum("weights_checked", len(srv["recipes"]) if answers else 0)
            if answers and srv["recipes"]:
                same[k] = (len(srv["recipes"]), len(srv["names"]))
        if link:
            m.sum("time_weight_check", link["hash_s"] + time.time() - t0)
        return same

    def close(self):
        def last_push(m):  # the final evaluation's weights, as the servers hold them now
            link = self.link
            held = {k: call(self.cfg, srv["url"], "/weights_checker", {"action": "checksum"})
                    for k, srv in enumerate(link["servers"]) if srv["recipes"]} if link else {}
            self.weights_verdict(m, [held], link and link["version"], "at the end of the run")
        fail_together(last_push, Metrics())
        for srv in self.link["servers"] if self.link and self.link["kind"] == "nccl" else []:
            call(self.cfg, srv["url"], "/destroy_weights_update_group", {"group_name": srv["group_name"]}, timeout=30,
                 retries=0)


def rescored_stats(trainer, now, then, mask):
    """A re-scored sequence -> verdict's stats: trainer (C,) vs the server now (noise) [, the server then vs now], on
    the tokens the model sampled (mask 1): the environment's are no sample of the policy."""
    now, mask = trainer.new_tensor(now), trainer.new_tensor(mask)
    d = (trainer[: len(now)] - now).abs() * mask
    if then is None:
        return d.sum().item(), mask.sum().item(), d.max().item()
    stale = (trainer.new_tensor(then) - now).abs() * mask
    return d.sum().item(), mask.sum().item(), d.max().item(), stale.sum().item(), stale.max().item()


def call(cfg, url, path, payload=None, timeout=None, retries=None):
    """POST (or GET without payload) to the server at `url`, with timeout, retries and backoff. -> JSON or text."""
    retries, t = cfg.request_retries if retries is None else retries, timeout or cfg.request_timeout
    for attempt in range(retries + 1):
        try:
            r = requests.request("GET" if payload is None else "POST", url + path, json=payload,
                                 headers=auth(cfg), timeout=t)
            if r.status_code in (401, 403):
                raise UserError(f"the server at {url} refused {path} (HTTP {r.status_code}): wrong or missing "
                                f"--api_key")
            if r.status_code >= 500 and attempt < retries:  # overloaded or restarting: try again
                raise requests.ConnectionError(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code >= 400:
                raise UserError(f"the server at {url} answered {path} with HTTP {r.status_code}: {r.text[:500]}")
            try:
                return r.json()
            except ValueError:
                return r.text  # /flush_cache answers plain text
        except (requests.ConnectionError, requests.Timeout) as e:
            if isinstance(e, requests.exceptions.SSLError):  # the same at every try: no retry
                import re
                why = next(iter(re.findall(r"\[SSL[^\]]*\][^'\"()]*", str(e))), str(e)[:200]).strip()
                plain = "http://" + url.split("://", 1)[-1]
                raise UserError(f"the TLS handshake with the server at {url} failed ({why}): " + (
                    f"it speaks plain http, not https (as serve.sh starts it): use --server_url {plain}" if
                    "WRONG_VERSION_NUMBER" in why else f"an http server (as serve.sh starts it) needs --server_url "
                    f"{plain}; an https one, a certificate this machine trusts")) from None
            if attempt == retries:
                hint = "Is it running? Start it with: bash serve.sh   (see serve.log)"
                if isinstance(e, requests.ReadTimeout):  # it took the request, then said nothing in time
                    hint = (f"It answered nothing within {t:g} s: it may be alive but busy (see serve.log)"
                            + ("; raise --request_timeout" if timeout is None else ""))
                raise UserError(f"no answer from the SGLang server at {url}{path} after {retries + 1} tries "
                                f"({type(e).__name__}: {str(e)[:200]}).\n{hint}") from None
            time.sleep(min(2 ** attempt, 30))


def auth(cfg):
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def check_server(cfg, url):
    """Before anything heavy: is the server up, serving our model? -> {begin_end, tp, context, port, checker, names}"""
    call(cfg, url, "/health", timeout=10, retries=1)
    info = call(cfg, url, "/model_info", timeout=30)
    if not isinstance(info, dict):
        raise UserError(f"{url} does not answer like an SGLang server (/model_info: {str(info)[:100]!r})")
    served = str(info.get("model_path", ""))
    same = os.path.exists(cfg.model) and os.path.realpath(served) == os.path.realpath(cfg.model)
    if served != cfg.model and not same:
        raise UserError(f"the server at {url} serves {served!r} but the trainer trains {cfg.model!r}.\n"
                        f"Restart it with the trainer's model: MODEL={cfg.model} bash serve.sh restart")
    server_info = call(cfg, url, "/server_info", timeout=30)
    server_info = server_info if isinstance(server_info, dict) else {}
    try:  # the OpenAI-style model card says the server's real context length (its --context-length included)
        context = call(cfg, url, "/v1/models", timeout=30, retries=0)["data"][0].get("max_model_len")
    except (UserError, KeyError, IndexError, TypeError):
        context = None
    # SGLang >= 0.5.21 updates weights only within /begin_weight_update .. /end_weight_update (a GET there: 405)
    try:
        r = requests.get(url + "/begin_weight_update", headers=auth(cfg), timeout=cfg.request_timeout)
        sums = requests.post(url + "/weights_checker", json={"action": "checksum"}, headers=auth(cfg),
                             timeout=cfg.request_timeout)  # the names of the tensors it holds (older servers: 404)
    except requests.RequestException as e:
        raise UserError(f"the SGLang server at {url} stopped answering ({e})") from None
    checker, names = f"HTTP {sums.status_code}", []
    if sums.status_code == 200:
        try:
            names = sorted(checksums(sums.json()))
        except (ValueError, KeyError, TypeError, AttributeError):  # cut JSON, a proxy's HTML page: no usable checker
            checker = f"HTTP 200, but no checksums: {sums.text[:200]!r}"
    return {"begin_end": r.status_code == 405, "tp": int(server_info.get("tp_size") or 1), "context": context,
            "port": server_info.get("port"), "checker": checker, "names": names}


def check_servers_once(cfg, rt, info):
    """No server named twice (it would get every push twice); a TP server here needs all its GPUs in --server_gpu."""
    where = [address(u) for u, _ in rt.servers]
    for j, ((host, port), s) in enumerate(zip(where, info)):
        for i in range(j):
            here = on_this_host(host) and on_this_host(where[i][0]) and s["port"] and s["port"] == info[i]["port"]
            if (host, port) == where[i] or here:
                raise UserError(f"--server_url names one server twice, as {rt.servers[i][0]} and {rt.servers[j][0]}: "
                                f"list each server once (else it gets every push twice)")
    for (url, gpus), s, (host, _) in zip(rt.servers, info, where):
        if on_this_host(host) and len(gpus) != s["tp"] and not (cfg.colocate and len(rt.servers) == 1):
            raise UserError(f"--server_gpu gives the server at {url} {len(gpus)} GPU(s) ({'+'.join(map(str, gpus))}), "
                            f"but it is tensor-parallel over {s['tp']}: name all its GPUs joined by '+' (e.g. 2+3), as "
                            f"serve.sh prints them, so that no training rank lands on one of them")
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


def generate(cfg, url, input_ids, version, did, what, **req):
    """One batched /generate -> its answers, each from weights `version` (the last push's tag) or we stop."""
    out = call(cfg, url, "/generate", {"input_ids": input_ids, "return_logprob": True, **req})
    n = len(out) if isinstance(out, list) else None
    bad = (f"{n} answers for {len(input_ids)} prompts" if n is not None and n != len(input_ids) else
           f"a {type(out).__name__}, not a list of answers" if n is None else
           next((f"an answer without {k}" for o in out for k in ("output_ids", "meta_info")
                 if not isinstance(o, dict) or k not in o), None) or
           next((f"an answer without meta_info's {k}" for o in out for k in ("output_token_logprobs",
                 "weight_version") if k not in o["meta_info"]), None))
    if bad:
        raise UserError(f"the server at {url} answered /generate with {bad} ({str(out)[:150]!r}): it is not an SGLang "
                        f"server this trainer speaks to (sglang 0.5.16 or newer, started by serve.sh), or something "
                        f"in between changes its answers. Check --server_url and serve.log")
    for o in out:
        if str(o["meta_info"].get("weight_version")) != version:
            raise UserError(f"the server at {url} {did} with weights of version "
                            f"{o['meta_info'].get('weight_version')!r}, but {what} must come from version {version!r} "
                            f"(the trainer's weights after step {version}). A weight push was skipped, rejected or "
                            f"reordered, or another client changed the server's weights. Stopping rather than "
                            f"training on another policy's samples.")
    return out


def rescore(cfg, url, seqs, version):
    """[(prompt, completion ids)] -> the server's logprobs of each completion under `version` (a prefill at T = 1, one
    token early: the first is None); its token ids must be ours (SGLang says 0 for ids >= vocab_size - 1)."""
    out = generate(cfg, url, [p + c for p, c in seqs], version, "re-scored the batch", "this check",
                   sampling_params={"max_new_tokens": 0}, logprob_start_len=[len(p) - 1 for p, _ in seqs])
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
    """About k of a rank's rows (srv: their servers), evenly spaced, at least one per server: each server is checked."""
    per, rows = -(-k // len(set(srv))), []
    for server in sorted(set(srv)):
        idx = [i for i, s in enumerate(srv) if s == server]
        rows += idx if per >= len(idx) else [idx[j * len(idx) // per] for j in range(per)]
    return sorted(rows)


POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64)  # requests (to every server), NCCL sends, rollouts
ENV_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=32)  # environments (a Python tool's sandboxes): 32 at once


def env_answers(tasks, eps, warn):
    """Each episode's environment on its last reply, all at once in ENV_POOL's threads -> (the next user message, or
    None: the episode is done, per episode; the seconds it took). Their warnings are added to warn (each call counts
    into a Counter of its own: one Counter is not safe across threads). A task without an environment answers None."""
    def answer(e):
        env, w = tasks[e["task"]].env, Counter()
        return (env and reward_fns.safe_env(env, e["messages"], e["answer"], w)), w
    t0 = time.time()
    got = list(ENV_POOL.map(answer, eps))
    for _, w in got:
        reward_fns.merge_warnings(warn, w)
    return [said for said, _ in got], time.time() - t0


def waited(future, timeout=None, what=None, hint=None):
    """future.result(), its UserError with `hint` on a line of its own, and a timeout: a clear message, no hang."""
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        raise UserError(f"{what} did not finish within {timeout:.0f}s (--request_timeout): is the server still alive? "
                        f"Its log (serve.log) says more.") from None
    except UserError as e:
        raise UserError(f"{e}\n{hint}" if hint else str(e)) from None


def fail_together(fn, *args):
    """fn(*args) here; a UserError on ANY rank is raised on every rank: none waits in a collective forever."""
    try:
        out, err = fn(*args), None
    except UserError as e:
        out, err = None, str(e)
    errs = [None] * dist.get_world_size()
    dist.all_gather_object(errs, err)
    if any(errs):
        raise UserError(next(e for e in errs if e))
    return out


# ---- Weight sync: rank 0's weights into the servers after every optimizer step, one of two ways.
#   tensor  A server sees only its own GPU, so rank 0 (which sees all under torchrun) copies the weights into flat
#           buckets ON THE SERVER'S GPU and sends their CUDA-IPC handles (SGLang's serializer names a GPU by UUID).
#   nccl    Rank 0 and each server's TP ranks form a process group: rank 0 broadcasts each bucket while the server's
#           /update_weights_from_distributed request receives it. Works across hosts.

def gpu_layout(servers, colocate, local_rank, local_world, visible, n_devices):
    """-> (this rank's CUDA index, each server's first GPU in our numbering or None); --colocate: GPUs may be shared."""
    if local_world > n_devices:
        raise UserError(f"{local_world} training ranks but only {n_devices} visible GPUs")
    if colocate and len(servers) == 1:
        return local_rank, [0]
    ids = [s.strip() for s in visible.split(",")] if visible is not None else [str(i) for i in range(n_devices)]
    firsts = []
    for url, gpus in servers:
        if not on_this_host(urlparse(url).hostname or ""):  # a server on another machine: its GPUs are not ours
            firsts.append(None)
            continue
        stages = [ids.index(str(g)) if str(g) in ids else None for g in gpus]
        for gpu, stage in zip(gpus, stages):
            if stage is not None and stage < local_world and not colocate:
                raise UserError(f"training rank {stage} would run on GPU {gpu}, which the SGLang server at {url} "
                                f"uses. Ranks take the visible GPUs 0..n-1 in order: use fewer ranks or list the "
                                f"server's GPU last in CUDA_VISIBLE_DEVICES, move the server (GPU=<id> bash serve.sh, "
                                f"--server_gpu <id>), or pass --colocate to share it on purpose.")
        firsts.append(stages[0])
    return local_rank, firsts


def pick_sync(cfg, servers, server_idx, visible):
    """-> ('tensor' or 'nccl', why). The tensor path needs rank 0 to see every server's GPU on this host."""
    hosts = [urlparse(u).hostname or "" for u, _ in servers]
    away = [h for h in hosts if not on_this_host(h)]
    if cfg.sync == "nccl":
        return "nccl", "--sync nccl"
    if not away and None not in server_idx:
        return "tensor", ("on the CPU: tensors shared through files" if server_idx[0] == "cpu"
                          else "the server shares rank 0's GPU" if cfg.colocate and len(servers) == 1
                          else f"rank 0 sees the servers' GPU {cfg.server_gpu}")
    hidden = [gpus[0] for (_, gpus), i in zip(servers, server_idx) if i is None]
    seen = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "no such GPU here"
    why = (f"the server ({away[0]}) is on another host" if away
           else f"the server's GPU {hidden[0]} (--server_gpu) is not visible to the trainer ({seen})")
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


def merged_weight(w, a, b, scale):
    """What the server serves for an adapted Linear: W + s B A, with A and B in W's dtype (bf16: as the forward gets
    them), summed in fp32, rounded once."""
    return torch.addmm(w.float(), b.to(w.dtype).float(), a.to(w.dtype).float(), alpha=scale).to(w.dtype)


def served(model):
    """-> [(name, parameter)] of the tensors the server holds: all but LoRA's adapters (merged into their weight)."""
    return [(n, p) for n, p in model.named_parameters() if not n.endswith((".lora_A", ".lora_B"))]


def weight_buckets(model, limit, keep):
    """All ranks: -> (bucket [(name, full tensor)] of ~`limit` bf16 bytes, last?); a `keep` rank holds the tensors.
    An adapted Linear's weight goes merged with its adapters (merged_weight), as the server is to serve it."""
    from torch.distributed.tensor import DTensor
    params, one_rank = served(model), dist.get_world_size() == 1
    gather = lambda t: (t.to_local() if one_rank else t.full_tensor()) if isinstance(t, DTensor) else t
    adapted = {n + ".weight": m for n, m in model.named_modules() if hasattr(m, "lora_A")}
    bucket, size = [], 0
    for i, (name, p) in enumerate(params):
        full = gather(p.data)
        if name in adapted:
            m = adapted[name]
            full = merged_weight(full, gather(m.lora_A.data), gather(m.lora_B.data), m.lora_scale)
        size += full.numel() * 2
        bucket += [(name, full)] if keep else []
        last = i == len(params) - 1
        if last or size >= limit:
            yield bucket, last
            bucket, size = [], 0


def pack(named, device):
    """[(name, tensor)] -> SGLang's FlattenedTensorBucket (flat uint8 buffer, metadata) of them in bf16 on `device`."""
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
    bucket = FlattenedTensorBucket(named_tensors=[(name, t.to(device, torch.bfloat16)) for name, t in named])
    flat = bucket.get_flattened_tensor()
    if flat.is_cuda:  # the gathers and copies are done (on our GPU and the buffer's) before anyone reads it
        torch.cuda.synchronize()
        torch.cuda.synchronize(device)
    return flat, bucket.get_metadata()


def send_bucket(cfg, link, flat, meta, last, version):
    """POST one bucket to each server (the last flushes prefix caches, sets the version tag) -> wait(); `flat` lives
    till then. nccl: every request is in flight before the broadcasts (side thread) are waited on, or a deadlock."""
    req = {"load_format": "flattened_bucket", "flush_cache": last, "weight_version": version if last else None}
    flats, sent, hint = {}, None, None
    if link["kind"] == "tensor":
        for d in {srv["device"] for srv in link["servers"]}:
            flats[d] = flat.to(d)  # the same tensor where it already is
            if flat.is_cuda:
                torch.cuda.synchronize(d)
        # one serialization per receiving rank: each holds one reference to the shared memory, which its rebuild drops
        posts = [POOL.submit(call, cfg, s["url"], "/update_weights_from_tensor", {
            **req, "serialized_named_tensors": [serialize_bucket(flats[s["device"]], meta) for _ in range(s["tp"])]})
                 for s in link["servers"]]
    else:
        req.update(names=[m.name for m in meta], dtypes=["bfloat16"] * len(meta), shapes=[list(m.shape) for m in meta])
        posts = [POOL.submit(call, cfg, s["url"], "/update_weights_from_distributed",
                             {**req, "group_name": s["group_name"]}, retries=0)  # a retry would expect a second send
                 for s in link["servers"]]
        sent = POOL.submit(lambda: [broadcast(flat, s["group"]) for s in link["servers"]])
        hint = ("The NCCL broadcast of a weight bucket did not complete. If the servers are alive, NCCL could not "
                "connect the ends: run both sides with NCCL_DEBUG=INFO (docs/design.md).")

    def wait():
        for srv, answered in zip(link["servers"], posts):
            r = waited(answered, hint=hint)  # the request has its own timeout: nothing here waits on NCCL
            if not (isinstance(r, dict) and r.get("success")):
                raise UserError(f"the server at {srv['url']} rejected the weight update: {r}. Training on would "
                                f"sample from stale weights, so we stop.")
        if sent:
            waited(sent, cfg.request_timeout, "the NCCL send of a weight bucket")
        return flat.numel()
    return wait


def checksums(answer):
    """SGLang's /weights_checker answer -> {(its rank, the tensor's name): its hash}."""
    return {(r["parallelism_info"].get("rank", k), n): h for k, r in enumerate(answer["ranks"])
            for n, h in r["checksums"].items()}


WEIGHT_CHECK = "weight_check.json"  # in out_dir: which tensors each server layout hashes as sent, for a resume


def comparable(out_dir, srv):
    """--resume: the tensors of `srv` (its (rank, name)s) that the run's fresh first push found it holds as sent, if
    the run recorded a server of this layout (tensor-parallel size and names), else None. A fresh run's first push
    sends the weights the server loaded at start (--model's), so a tensor whose hash differs there is one the server
    holds in another form (a tensor-parallel shard, another dtype): known not to hash as sent. A resume's first push
    sends the checkpoint's weights, which a server that drops pushes never holds: it cannot tell the two apart."""
    try:
        layouts = json.load(open(os.path.join(out_dir, WEIGHT_CHECK)))
    except (OSError, ValueError):
        return None
    mine = sorted(map(tuple, srv["names"]))
    for lay in layouts if isinstance(layouts, list) else []:
        with contextlib.suppress(AttributeError, TypeError, KeyError):  # (an entry edited by hand: not this layout's)
            if lay["tp"] == srv["tp"] and sorted(map(tuple, lay["names"])) == mine:
                return {tuple(k) for k in lay["compared"]} & set(srv["recipes"])
    return None


def remember_comparable(out_dir, srv):
    """A fresh run's first push: which tensors of srv's layout it compares (comparable() reads it on a resume)."""
    path, old = os.path.join(out_dir, WEIGHT_CHECK), []
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):  # (none yet, or unreadable: replaced)
        old = [lay for lay in json.load(open(path)) if lay.get("names") != [list(k) for k in srv["names"]]]
    with contextlib.suppress(OSError):  # (a full disk: a resume then checks as a fresh start does, and says so)
        write_whole(path, json.dumps(old + [{"tp": srv["tp"], "names": [list(k) for k in srv["names"]],
                                            "compared": [list(k) for k in srv["recipes"]]}]))


def checked_sums(url, answer, version):
    """checksums(answer), or one error naming the server and what it answered instead (cut JSON, a proxy's page)."""
    try:
        return checksums(answer)
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UserError(f"the server at {url} answered /weights_checker, after a rollout sampled from version "
                        f"{version}, with no checksums: {str(answer)[:200]!r}. The weight check cannot go on: is "
                        f"something in between (a proxy), or is the server failing (serve.log)? Fix it, then --resume"
                        ) from None


def recipes(server, trainer):
    """Server tensors [(rank, name)], our names -> {(rank, name): our tensors it should hold}: its namesake, else its
    parent's leaves no server tensor names, concatenated (qkv_proj: q, k, v): a guess weights_verdict checks."""
    names, up = {n for _, n in server}, lambda n: n.count(".") > 1 and (n.rsplit(".", 2)[0], n.rsplit(".", 1)[1])
    fused = lambda s: tuple(t for t in trainer if t not in names and up(t) == up(s))
    return {(r, s): (s,) if s in trainer else fused(s) for r, s in server if s in trainer or up(s) and fused(s)}


def tensor_hash(t):
    """SGLang's /weights_checker hash: its GPU Triton kernel (4-byte words: mid-word starts copied), else sha256."""
    if t.is_cuda:
        from sglang.kernels.ops.memory.gpu_tensor_hash import gpu_tensor_hash
        with torch.cuda.device(t.device):
            return f"{gpu_tensor_hash(t if t.storage_offset() % 4 == 0 else t.clone()):016x}"
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy()).hexdigest()[:16]


def hash_sent(link, flat, meta, held):
    """Rank 0, per bucket (+ `held` parts): each recipe's hash once its parts are in -> the parts still wanted."""
    t0, done = time.time(), link["hashes"]
    held = {**held, **{m.name: flat[m.start_idx: m.end_idx] for m in meta}}
    todo = {r for srv in link["servers"] for r in srv["recipes"].values()} - done.keys()
    for r in todo:
        if all(p in held for p in r):
            done[r] = tensor_hash(held[r[0]] if len(r) == 1 else torch.cat([held[p] for p in r]))
    need = {p for r in todo - done.keys() for p in r}
    link["hash_s"] += time.time() - t0
    return {n: t.clone() for n, t in held.items() if n in need}


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
    """Rank 0: a group per server (us rank 0, its TP ranks 1..tp); not one for all: NCCL refuses two ranks on a GPU."""
    from datetime import timedelta
    from sglang.srt.utils import init_custom_process_group
    from torch.distributed.elastic.utils.distributed import get_free_port
    addr = cfg.nccl_master_addr or local_address(urlparse(servers[0]["url"]).hostname or "127.0.0.1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    # under torchrun, tcp:// rendezvous would only be a client of torchrun's store; we must host this one
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    joins = []
    for k, srv in enumerate(servers):
        port = cfg.nccl_port + k if cfg.nccl_port else get_free_port()
        srv.update(group_name=f"grpo_sglang_{socket.gethostname()}_{os.getpid()}_{k}", where=f"{addr}:{port}")
        group = {"backend": backend, "world_size": 1 + srv["tp"], "group_name": srv["group_name"]}  # on both ends
        joins.append((POOL.submit(call, cfg, srv["url"], "/init_weights_update_group",
                                  {**group, "master_address": addr, "master_port": port, "rank_offset": 1}, retries=0),
                      POOL.submit(init_custom_process_group, **group, init_method=f"tcp://{addr}:{port}", rank=0,
                                  timeout=timedelta(seconds=cfg.request_timeout))))
    for srv, (joined, group) in zip(servers, joins):  # our end hosts the rendezvous: if its port is taken, say so now
        concurrent.futures.wait([joined, group], cfg.request_timeout, concurrent.futures.FIRST_EXCEPTION)
        if group.done() and "EADDRINUSE" in str(group.exception()):  # (the server would wait on another's socket)
            raise UserError(f"the NCCL group's port {srv['where']} is in use on this host: pick another --nccl_port "
                            f"(server k uses --nccl_port + k), or 0 for free ones")
        r = waited(joined, hint=f"The server at {srv['url']} did not join the NCCL group at {srv['where']}: it must "
                                f"reach this address and port (--nccl_master_addr, --nccl_port, firewall; "
                                f"NCCL_SOCKET_IFNAME picks the interface).")
        if not (isinstance(r, dict) and r.get("success")):
            raise UserError(f"the server at {srv['url']} could not join the NCCL weight-update group: {r}")
        srv["group"] = waited(group, cfg.request_timeout, "joining the NCCL group")
    return {"kind": "nccl", "servers": servers, "device": device, "where": ", ".join(s["where"] for s in servers)}


def push_weights(cfg, model, link, version):
    """All ranks gather each full parameter; rank 0 (the `link`) packs and sends bf16 buckets, bucket k in flight while
    it gathers k+1 (NCCL and several ranks: each send ends before the next gather; FSDP's collectives beside the sends
    deadlocked TRL). The last flushes the prefix caches (old weights' KV) and tags `version`. -> bytes sent (rank 0)"""
    serial = link and link["kind"] == "nccl" and dist.get_world_size() > 1
    for srv in link["servers"] if link else []:
        if "recipes" not in srv:  # the first push: which bytes of it each server tensor should hash to
            srv["recipes"] = recipes(srv["names"], [n for n, _ in served(model)])
        if srv["begin_end"]:
            call(cfg, srv["url"], "/begin_weight_update", {"selector": "all"})
    sent, in_flight, held = 0, None, {}
    link and link.update(version=int(version), hashes={}, hash_s=0.0)
    if link:  # our hashes of each push, kept for the check after the rollouts sampled from it (this and the last)
        link["pushed"] = {v: h for v, h in link.get("pushed", {}).items() if v >= int(version) - 1}
        link["pushed"][int(version)] = link["hashes"]
    for bucket, last in weight_buckets(model, cfg.sync_bucket_mb * 2**20, keep=link is not None):
        if not link:
            continue
        flat, meta = pack(bucket, link["device"])
        held = hash_sent(link, flat, meta, held)  # while the last bucket is in flight
        sent += in_flight() if in_flight else 0  # one update at a time
        in_flight = send_bucket(cfg, link, flat, meta, last, version)
        if serial:
            sent, in_flight = sent + in_flight(), None
    sent += in_flight() if in_flight else 0
    for srv in link["servers"] if link else []:
        if srv["begin_end"]:
            call(cfg, srv["url"], "/end_weight_update", {})
    return sent


# ---- The trainer's model: FSDP2, the LM head, checkpoints. ---------------------------------------

# LoRA (--lora_rank; Hu et al. 2021): W x + (alpha / r) B A x in each target Linear, W frozen, A and B trained.

def add_lora(model, rank, alpha, targets, seed=0):
    """Adapters on the Linears named in `targets`: A (r, in) random as peft's, B (out, r) zeros, so at the start the
    model computes what it did. Every other parameter is frozen (no gradient, no optimizer state). -> the model"""
    model.requires_grad_(False)
    gen, found = torch.Generator().manual_seed(seed), []  # the same adapters on every rank and at any world size
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            if m is model.get_output_embeddings():  # token_logprobs reads its weight: the adapter would never train
                raise UserError(f"--lora_targets {name}: the LM head takes no adapter here (the trainer's head "
                                f"computes log-probs itself); adapt the attention and MLP projections")
            a = torch.empty(rank, m.in_features).uniform_(-1, 1, generator=gen) / math.sqrt(m.in_features)
            m.lora_A = torch.nn.Parameter(a.to(m.weight.device))  # fp32: the master weights that train
            m.lora_B = torch.nn.Parameter(torch.zeros(m.out_features, rank, device=m.weight.device))
            m.lora_scale, m.lora_on, m.forward = alpha / rank, True, lora_forward.__get__(m)
            found.append(name)
    missing = [t for t in targets if t not in {n.rsplit(".", 1)[-1] for n in found}]  # a typo trains the rest alone
    if missing:
        have = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise UserError(f"--lora_targets {','.join(missing)}: {type(model).__name__} has no Linear of "
                        f"{'these names' if len(missing) > 1 else 'this name'}; its Linears are named {','.join(have)}")
    return model


def lora_forward(m, x):
    """(..., in) -> (..., out): x (W + s B A)^T with the merged weight the server is sent, bit for bit (the sync check
    compares log-probs under the same weights); the gradient reaches A and B by the adapter's path s (x A^T) B^T."""
    if not m.lora_on:
        return torch.nn.functional.linear(x, m.weight, m.bias)
    with torch.no_grad():
        w = merged_weight(m.weight, m.lora_A, m.lora_B, m.lora_scale)
    y = torch.nn.functional.linear(x, w, m.bias)  # x's gradient: through W + s B A
    if not torch.is_grad_enabled():
        return y
    z = m.lora_scale * (x.detach() @ m.lora_A.T) @ m.lora_B.T  # A's and B's: z's, whose value cancels (z - z = 0)
    return y + (z - z.detach())


@contextlib.contextmanager
def adapters_off(model, off=True):
    """--lora_rank with --beta: the reference model is the policy with its adapters off: the frozen base."""
    adapted = [m for m in model.modules() if hasattr(m, "lora_A")] if off else []
    for m in adapted:
        m.lora_on = False
    try:
        yield
    finally:
        for m in adapted:
            m.lora_on = True


def load_policy(path, device, grad_checkpointing, dtype=torch.float32):
    """fp32 master weights (LoRA: a bf16 base) in training mode, dropout 0: the server samples without it (else
    ratio != 1 at mu = 1)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(path)
    for k, v in config.to_dict().items():
        if isinstance(v, float) and ("dropout" in k or "pdrop" in k):
            setattr(config, k, 0.0)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype,
                                                 attn_implementation="sdpa").to(device).train()
    if grad_checkpointing:
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)(  # newer name first
            {"use_reentrant": False})
        model.config.use_cache = False
    return model


class HeadLogprobs(torch.autograd.Function):
    """(N, H) final hidden states, (V, H) LM head weight, (N,) targets -> (N,) log p(target) and (N,) the entropy of
    softmax(z), z = cap(x W^T) / temperature, in fp32, ~2^27 logits at a time: the (N, V) logits never exist; backward
    recomputes them (Liger's fused linear cross-entropy). cap: Gemma's soft-cap. mm (--head_matmul): 'bf16', x and W
    rounded to bf16 (as the server holds them), fp32 products and sums, bf16 gradient matmuls; 'fp32': exact."""
    @staticmethod
    def forward(ctx, x, w, targets, temperature, cap, mm, chunk):
        lp, ent, lse = (torch.empty(len(x), device=x.device) for _ in range(3))
        wl = w.bfloat16() if mm == "bf16" else w  # cast once, not per chunk
        for r in (slice(s, s + chunk) for s in range(0, len(x), chunk)):
            z = HeadLogprobs.logits(x[r], wl, temperature, cap, mm)[0]  # (chunk, V)
            lse[r] = z.gather(1, targets[r, None]).squeeze(1)  # z at the target, for now
            logp = torch.log_softmax(z, -1)
            del z  # one (chunk, V) tensor fewer from here on
            lp[r] = logp.gather(1, targets[r, None]).squeeze(1)
            lse[r] -= lp[r]  # logsumexp(z) = z_target - log p_target, for backward
            ent[r] = -logp.exp().mul_(logp).sum(-1)  # -Σ p log p (not einsum: a slow bmm)
            del logp
        ctx.save_for_backward(x, w, targets, lse, ent)
        ctx.args = temperature, cap, mm, chunk
        ctx.set_materialize_grads(False)  # an output nobody used (the entropy, mostly) has no gradient to compute
        return lp, ent

    @staticmethod
    def logits(x, w, temperature, cap, mm):
        """-> the rows' z, and dz/d(x W^T) / temperature where a soft-cap makes it more than that (else None)."""
        if mm == "bf16":  # the products of bf16 values are exact in fp32: one kernel, bf16 in, fp32 out (CUDA)
            x, w = x.bfloat16(), w.bfloat16()
            raw = torch.mm(x, w.T, out_dtype=torch.float32) if x.is_cuda else x.float() @ w.float().T
        else:
            raw = x.float() @ w.float().T
        if not cap:
            return raw if temperature == 1 else raw / temperature, None  # at T = 1, one pass over (chunk, V) fewer
        t = torch.tanh(raw / cap)
        return cap * t / temperature, 1 - t * t

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        """d log p_target / dz = onehot - p;  d entropy / dz = -p (log p + entropy). A vocabulary slice at a time, all
        rows: each slice's rows of dW are written once (no (V, H) sum per chunk of rows). With only the log-probs'
        gradient and no soft-cap, d loss / dz = row (p - onehot), row = -g_lp / T: on the (N, H) side."""
        x, w, targets, lse, ent = ctx.saved_tensors
        temperature, cap, mm, chunk = ctx.args
        short = g_ent is None and not cap
        dt = torch.float32 if mm == "fp32" else torch.bfloat16  # the gradient's matmuls: bf16 (as every block's)
        row = -g_lp[:, None].float() / temperature if short else 1 / temperature
        xr = (x.float() * row).to(dt)
        xl = x.bfloat16() if mm == "bf16" else x  # the logits' input, cast once (as the forward casts W once)
        acc = torch.zeros(x.shape, device=x.device)  # Σ over slices of gz @ W, (N, H)
        # in w's dtype, each slice cast as written (W's as read): a bf16 (V, H) copy would cost 1.1 GB at 7B's head
        dw = torch.empty(w.shape, device=w.device, dtype=w.dtype) if ctx.needs_input_grad[1] else None
        # as many logits as a forward chunk, W's slice at most 2^26 values (with few rows, as at 7B, else most of W)
        cols = max(1, min(chunk * len(w) // max(1, len(x)), 2**26 // w.shape[1]))
        for c in (slice(s, s + cols) for s in range(0, len(w), cols)):
            wc = w[c].bfloat16() if mm == "bf16" else w[c]  # bf16: one cast, for the logits and the gradient
            z, dcap = HeadLogprobs.logits(xl, wc, temperature, cap, mm)  # (N, cols), fp32: p as the forward's
            logp = z.sub_(lse[:, None])  # in place: z is not needed again
            here = ((targets >= c.start) & (targets < c.start + z.shape[1]))[:, None]  # the target is in this slice
            at = (targets - c.start).clamp(0, z.shape[1] - 1)[:, None]
            if short:  # p - onehot, written in dt by the exp itself (no pass to cast it)
                gz = torch.exp(logp, out=torch.empty(logp.shape, device=x.device, dtype=dt))
                gz.scatter_add_(1, at, -here.to(dt))
            else:
                p = logp.exp()
                gz = -p * (logp + ent[:, None]) * g_ent[:, None] if g_ent is not None else torch.zeros_like(p)
                if g_lp is not None:
                    gz -= p * g_lp[:, None]
                    gz.scatter_add_(1, at, here * g_lp[:, None].float())
                gz = (gz * dcap if dcap is not None else gz).to(dt)
            del z, logp
            acc += gz @ wc.to(dt)
            if dw is not None:
                dw[c] = gz.T @ xr
        dx = (acc * row).to(x.dtype) if ctx.needs_input_grad[0] else None
        return dx, dw, None, None, None, None, None


def token_logprobs(model, ids, pos, src, tgt, temperature, head_matmul="fp32"):
    """(R, L) packed rows -> (n,) log p of each target token `tgt` and (n,) the entropy of its distribution,
    from the model's last hidden states at `src` and its LM head's weight (HeadLogprobs: the logits of only those
    positions, a chunk at a time). shard() makes it the model's method model.token_logprobs, which FSDP runs as a
    forward: it gathers the root's weights (embeddings, final norm, head) around it."""
    hidden = model.get_decoder()(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
    weight, cap = model.get_output_embeddings().weight, getattr(model.config, "final_logit_softcapping", None)
    chunk = max(1, 2**27 // weight.shape[0])  # rows of fp32 logits per chunk: 512 MB
    return HeadLogprobs.apply(hidden.flatten(0, 1)[src], weight, tgt, temperature, cap, head_matmul, chunk)


def reshard_after_no_grad(model, forward):
    """forward, then, if it ran without gradients, every FSDP unit gives back its gathered weights (else
    parameters() lists the copies, and the root keeps its own until a backward that never comes)."""
    def run(*args, **kwargs):
        out = forward(*args, **kwargs)
        if not torch.is_grad_enabled():
            from torch.distributed.fsdp import FSDPModule
            for mod in model.modules():
                if isinstance(mod, FSDPModule):
                    mod.reshard()
        return out
    return run


def fuse_rms_norms(model):
    """Each RMSNorm (x / rms(x) * weight, fp32) through torch's fused kernel (one each way, for ~8 passes forward, ~12
    backward), rounded once after the weight as SGLang; one that differs (Gemma's) fails a probe."""
    fused = lambda m, x: torch.nn.functional.rms_norm(x, m.weight.shape, m.weight.to(x.dtype), m.fused_eps)
    for m in model.modules():
        w, eps = getattr(m, "weight", None), getattr(m, "variance_epsilon", getattr(m, "eps", None))
        if not type(m).__name__.endswith("RMSNorm") or w is None or w.dim() != 1 or not isinstance(eps, float):
            continue
        m.fused_eps, x = eps, torch.linspace(-3, 2, 3 * len(w), device=w.device).view(3, -1)  # (no RNG drawn)
        with torch.no_grad():
            if torch.allclose(m(x).float(), fused(m, x).float(), rtol=1e-4, atol=1e-5):
                m.forward = fused.__get__(m)


def shard(model, mesh, param_dtype, head_matmul="fp32", frozen=False, unit_params=1e8, keep_params=2e9):
    """FSDP2: transformer blocks in units of ~`unit_params` parameters (hooks cost CPU per unit), bf16 compute. Under
    `keep_params`, gathered weights stay from forward to backward and over an update's micro-batches (`frozen`: step to
    step): ~0.29 -> 0.21 s a SmolLM2 train phase. The root runs in fp32: bf16 logits step by 0.125 at |logit| ~ 20."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils._pytree import tree_map
    to_compute = lambda t: t.to(param_dtype) if torch.is_tensor(t) and t.is_floating_point() else t  # a block's input
    block = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    fuse_rms_norms(model)
    units, keep = [[]], sum(p.numel() for p in model.parameters()) < keep_params
    for m in (m for m in model.modules() if type(m).__name__ in (model._no_split_modules or [])):
        if sum(p.numel() for b in units[-1] for p in b.parameters()) >= unit_params:
            units.append([])
        units[-1].append(m)
        # cast here too: FSDP does not when checkpointing re-runs a block (fp32 rotary cos/sin met bf16 values)
        m.register_forward_pre_hook(lambda m, args, kwargs: tree_map(to_compute, (args, kwargs)), with_kwargs=True)
    for unit in units if units[0] else []:
        fully_shard(unit, mesh=mesh, mp_policy=block, reshard_after_forward=not keep)
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        raise UserError(f"{type(model).__name__}'s LM head is a {type(head).__name__} (with its bias, if any): the "
                        f"trainer's head (HeadLogprobs) takes a Linear without bias, as Llama, Qwen and Gemma have")
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32))
    from torch.distributed.fsdp import register_fsdp_forward_method
    model.token_logprobs = functools.partial(token_logprobs, model, head_matmul=head_matmul)
    register_fsdp_forward_method(model, "token_logprobs")  # FSDP gathers the weights it needs around it
    if not frozen:  # (a frozen reference keeps them gathered from step to step)
        model.token_logprobs = reshard_after_no_grad(model, model.token_logprobs)
    model.keeps_gathered = keep  # (fsdp_sync_grads)
    return model


def save_checkpoint(cfg, model, opt, tok, step, state=None):
    """out_dir/step_{step}: the weights (LoRA: the adapters), the tokenizer, and trainer_state.pt: the optimizer, the
    step, each rank's RNG states and each rank's `state` (what main() keeps across steps: a dict of plain values,
    lists, strings and tensors), then 'latest' names it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)  # LoRA: the adapters
    msd, osd = get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)
    rng = [None] * dist.get_world_size()
    dist.all_gather_object(rng, {"torch": torch.get_rng_state(), "python": random.getstate(),
                                 "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
                                 "state": state or {}})
    n_params = sum(t.numel() for t in msd.values())

    def write():  # rank 0
        # a new folder, then 'latest' at it (one atomic rename), then drop the old: a crash (kill -9) leaves one whole
        import shutil
        d = os.path.join(cfg.out_dir, f"step_{step}")
        shutil.rmtree(d, ignore_errors=True)
        try:
            if cfg.lora_rank:  # the adapters as peft writes them, and the base's config.json (check_architecture)
                save_adapters(d, msd, cfg)
                model.config.save_pretrained(d)
            else:
                model.save_pretrained(d, state_dict=msd)
            tok.save_pretrained(d)
            torch.save({"optimizer": osd, "step": step, "rng": rng, "config": saved_config(cfg)},
                       os.path.join(d, "trainer_state.pt"))
            write_whole(os.path.join(cfg.out_dir, "latest"), f"step_{step}")
        except Exception as e:  # a full disk, a quota, permissions: say so, clean up
            shutil.rmtree(d, ignore_errors=True)
            raise UserError(f"could not write the checkpoint {d} ({type(e).__name__}: {str(e)[:200]}). Is the disk "
                            f"full? A checkpoint holds fp32 weights and Adam's two moments, ~{12 * n_params / 1e9:.1f} "
                            f"GB: free space or use another --out_dir. The previous checkpoint there is intact "
                            f"(--resume).") from None
        for old in old_checkpoints(cfg.out_dir, step, cfg.keep_checkpoints):
            shutil.rmtree(old, ignore_errors=True)
    fail_together(lambda: dist.get_rank() == 0 and write())  # every rank stops if the write failed


def old_checkpoints(out_dir, step, keep):
    """-> the run's checkpoints before step_{step} past its newest `keep` (0: none): folders step_N whose
    trainer_state.pt says step N. Never another folder (a user's copy, a run's later one that a rollback left)."""
    def step_of(d):
        try:  # mmap: the optimizer state is not read
            return torch.load(os.path.join(out_dir, d, "trainer_state.pt"), weights_only=True, mmap=True)["step"]
        except Exception:
            return None
    ours = sorted(int(d[5:]) for d in os.listdir(out_dir) if d.startswith("step_") and d[5:].isdigit()
                  and int(d[5:]) < step and d == f"step_{int(d[5:])}" and step_of(d) == int(d[5:]))
    return [os.path.join(out_dir, f"step_{n}") for n in (ours[: max(len(ours) - keep + 1, 0)] if keep else [])]


def load_checkpoint(ckpt_dir, model, opt):
    """Optimizer and this rank's RNG states from save_checkpoint's folder (weights: with the model). -> the step, this
    rank's state (main()'s; {} in a checkpoint from before it was kept)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    st = torch.load(os.path.join(ckpt_dir, "trainer_state.pt"), weights_only=True)
    set_optimizer_state_dict(model, opt, st["optimizer"], options=StateDictOptions(full_state_dict=True))
    rng = st["rng"][dist.get_rank()]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return st["step"], rng.get("state", {})


def save_adapters(d, adapters, cfg):
    """--lora_rank: {name.lora_A/B: tensor} -> d/adapter_model.safetensors and adapter_config.json in peft's layout."""
    from safetensors.torch import save_file
    os.makedirs(d, exist_ok=True)
    save_file({f"base_model.model.{n}.weight": t.contiguous() for n, t in adapters.items()  # (a tied head is not
               if n.endswith((".lora_A", ".lora_B"))},  # frozen to ignore_frozen_params: not a parameter of its own)
              os.path.join(d, "adapter_model.safetensors"))
    write_whole(os.path.join(d, "adapter_config.json"), json.dumps(
        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": cfg.model, "r": cfg.lora_rank,
         "lora_alpha": cfg.lora_alpha, "target_modules": cfg.lora_targets.split(","), "lora_dropout": 0.0,
         "bias": "none"}, indent=1))


def load_adapters(ckpt, model):
    """save_adapters' file -> the model's adapters (before shard), which must be the same ones."""
    from safetensors.torch import load_file
    try:
        got = load_file(os.path.join(ckpt, "adapter_model.safetensors"))
    except Exception as e:  # a copy cut short, a disk error
        raise UserError(f"{ckpt}/adapter_model.safetensors cannot be read ({type(e).__name__}: "
                        f"{str(e).split('. ')[0][:150]}): the file is damaged (a copy cut short?); use another "
                        f"checkpoint") from None
    mine = {f"base_model.model.{n}.weight": p for n, p in model.named_parameters() if n.endswith(("lora_A", "lora_B"))}
    bad = [k for k in mine.keys() | got.keys() if k not in got or k not in mine or got[k].shape != mine[k].shape]
    if bad:
        raise UserError(f"{ckpt}/adapter_model.safetensors does not hold this model's adapters ({len(bad)} differ, "
                        f"e.g. {bad[0]}): resume with the --model, --lora_rank and --lora_targets it was trained with")
    with torch.no_grad():
        for k, p in mine.items():
            p.copy_(got[k])


def export_merged(ckpt, out, base=None):
    """A LoRA checkpoint -> `out`, a plain HF model folder (bf16, each adapter merged into its weight) that serve.sh
    serves: python -c "import grpo_sglang as g; g.export_merged('runs/grpo/step_100', 'runs/merged')"
    base: the base model, if it is no longer where training found it (adapter_config.json's base_model_name_or_path).
    A mistake is one line, `error: ...` (print_user_error), not a traceback."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    c = adapter_config(ckpt)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise UserError(f"export_merged: {out} " + ("is a file" if not os.path.isdir(out) else "exists and is not "
                        "empty") + ": export into a new folder")
    base = base or c["base_model_name_or_path"]
    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    except (OSError, ValueError) as e:  # a folder moved (or a path relative to another directory), not on the hub
        where = f"no folder {os.path.abspath(base)}" if not os.path.isdir(base) else str(e).split("\n")[0][:200]
        raise UserError(f"export_merged: the base model of {ckpt}, {base!r}, cannot be loaded ({where}). If it moved "
                        f"since training, say where it is now: export_merged({ckpt!r}, {out!r}, base='/path/to/it')"
                        ) from None
    add_lora(model, c["r"], c["lora_alpha"], c["target_modules"])
    load_adapters(ckpt, model)
    for m in [m for m in model.modules() if hasattr(m, "lora_A")]:
        m.weight.data = merged_weight(m.weight, m.lora_A, m.lora_B, m.lora_scale)
        del m.lora_A, m.lora_B, m.forward  # a plain Linear again
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(ckpt).save_pretrained(out)


def adapter_config(ckpt):
    """export_merged: a LoRA checkpoint's adapter_config.json; else one error that says what `ckpt` is instead."""
    path = os.path.join(ckpt, "adapter_config.json")
    if not os.path.isdir(ckpt):
        raise UserError(f"export_merged: {ckpt}: " + ("no such folder" if not os.path.exists(ckpt) else "a file, not "
                        "a folder") + ": give a checkpoint of a LoRA run (runs/grpo/step_100)")
    if not os.path.exists(path):
        steps = sorted((f for f in os.listdir(ckpt) if f.startswith("step_")), key=lambda f: (len(f), f))
        if steps or os.path.exists(os.path.join(ckpt, "latest")):
            raise UserError(f"export_merged: {ckpt} is a run's folder, not a checkpoint: give one of its checkpoints, "
                            + (", ".join(os.path.join(ckpt, f) for f in steps) or "(none yet)")
                            + (f" (the last: {latest_checkpoint(ckpt)})" if latest_checkpoint(ckpt) else ""))
        if os.path.exists(os.path.join(ckpt, "trainer_state.pt")):
            raise UserError(f"export_merged: {ckpt} is a full fine-tune's checkpoint (no adapter_config.json): it "
                            f"holds the whole trained model, nothing to merge: serve it as it is (MODEL={ckpt} bash "
                            f"serve.sh)")
        if os.path.exists(os.path.join(ckpt, "config.json")):
            raise UserError(f"export_merged: {ckpt} is a model's folder, not a checkpoint of a training run (no "
                            f"adapter_config.json, no trainer_state.pt): give a checkpoint of a LoRA run "
                            f"(runs/grpo/step_100)")
        raise UserError(f"export_merged: {ckpt} has no adapter_config.json: it is not a checkpoint of a LoRA run")
    try:
        c = json.load(open(path))
        c = {k: c[k] for k in ("base_model_name_or_path", "r", "lora_alpha", "target_modules")}
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} cannot be read ({type(e).__name__}: {e}): the checkpoint is damaged; use another "
                        f"checkpoint") from None
    return c


def print_user_error(kind, e, tb, hook=sys.excepthook):
    """A UserError that reaches the top (python -c "import grpo_sglang as g; g.export_merged(...)") prints as one line,
    `error: ...`, not a traceback; any other exception as Python prints it."""
    if issubclass(kind, UserError):
        print(f"error: {e}", file=sys.stderr)
    else:
        hook(kind, e, tb)


sys.excepthook = print_user_error


def run_files(out_dir):
    """-> the files in out_dir that a run writes (and would overwrite): config.json, metrics.jsonl, latest, step_*/."""
    names = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    return [f for f in names if f in ("config.json", "metrics.jsonl", "latest")
            or f.startswith("step_") and os.path.isdir(os.path.join(out_dir, f))]


def lock_out_dir(out_dir):
    """Rank 0 locks out_dir while it runs (freed at exit, even kill -9): a second trainer there would mix files in."""
    import fcntl
    f = open(os.path.join(out_dir, ".lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        raise UserError(f"--out_dir {out_dir} is in use by another run (pid {f.read().strip() or '?'}): wait for it "
                        f"to end (or stop it), or use another --out_dir") from None
    except OSError as e:  # a file system without locks (Lustre mounted without flock): run, unguarded
        print0(f"warning: cannot lock {f.name} ({e.strerror}): a second trainer there would not be refused")
    with contextlib.suppress(OSError):  # (a full disk: no pid to name)
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
    return f


def latest_checkpoint(out_dir):
    """-> path of the last complete checkpoint in out_dir, or None."""
    try:
        return os.path.join(out_dir, open(os.path.join(out_dir, "latest")).read().strip())
    except OSError:
        return None


def checkpoint_to_resume(out_dir, world=1, resume=True):
    """-> the checkpoint out_dir/latest names (--resume) or None (no run there, or one stopped before its first
    checkpoint: it starts again); anything else: one error with a fix."""
    d, latest, why, there = latest_checkpoint(out_dir), os.path.join(out_dir, "latest"), None, run_files(out_dir)
    complete = lambda c: all(os.path.exists(os.path.join(c, f)) for f in ("config.json", "trainer_state.pt"))
    unsaved = d is None and set(there) <= {"config.json", "metrics.jsonl"} and not past_first_save(out_dir)
    if there and not resume:  # it would overwrite that run's checkpoints and mix the two in metrics.jsonl
        raise UserError(f"--out_dir {out_dir} already holds a run ({', '.join(there)}): " + (
            "it stopped before its first checkpoint: --resume starts it again from --model with its flags, "
            if unsaved else "continue it with --resume, ") + "or start this one in another --out_dir (or delete that "
            "one)")
    if d is None:
        if not there or unsaved:  # a resume from step 0: the rows of the steps it redoes are dropped, as always
            return None
        why = f"{out_dir} holds a run ({', '.join(there)}) but no {latest}, and a resume never starts over"
    elif not os.path.isdir(d) or not complete(d):
        why = "that folder is gone" if not os.path.isdir(d) else "it is incomplete (no config.json or trainer_state.pt)"
    else:
        from safetensors import safe_open
        try:  # mmap: the optimizer state is not read; safe_open reads a header and checks that the file covers it
            st = torch.load(f := os.path.join(d, "trainer_state.pt"), weights_only=True, mmap=True)
            why = next((f"{f} has no {k!r}" for k in ("optimizer", "step", "rng") if k not in st), None)
            for f in (os.path.join(d, w) for w in sorted(os.listdir(d)) if w.endswith(".safetensors")):
                safe_open(f, "pt").keys()
        except Exception as e:  # a copy cut short, a disk error
            why = f"{f} cannot be read ({type(e).__name__}: {str(e).split('. ')[0][:150]})"
        if not why and len(st["rng"]) != world:
            raise UserError(f"--resume: {d} was written by {len(st['rng'])} rank(s) and this run has {world}: resume "
                            f"with {len(st['rng'])} (each rank continues its own random state: an exact resume)")
        if not why:
            return d
    others = sorted((c for c in os.listdir(out_dir) if c.startswith("step_") and c != os.path.basename(d or "")
                     and complete(os.path.join(out_dir, c))), key=lambda c: int(c[5:]) if c[5:].isdigit() else -1)
    fix = (f"Complete checkpoints here: {', '.join(others)}; to resume from the last one: echo {others[-1]} > {latest}"
           if others else "There is no other complete checkpoint here: start afresh in another --out_dir.")
    raise UserError(f"--resume: {why if d is None else f'{latest} names {os.path.basename(d)}, but {why}'}. {fix}")


def check_lora_resume(cfg, ckpt):
    """--resume: a LoRA checkpoint (adapter_config.json) needs --lora_rank, a full one none. They differ only where
    the run's config.json is gone, and its flags with it: say which flags the checkpoint was trained with."""
    lora, lost = os.path.join(ckpt, "adapter_config.json"), os.path.join(cfg.out_dir, "config.json")
    why = f" ({lost}, which held the run's flags, is gone)" if not os.path.exists(lost) else ""
    if os.path.exists(lora) and not cfg.lora_rank:
        try:
            c = json.load(open(lora))
            flags = (f"--lora_rank {c['r']} --lora_alpha {c['lora_alpha']:g} --lora_targets "
                     f"{','.join(c['target_modules'])}")
        except (ValueError, KeyError, TypeError):
            flags = "its --lora_rank, --lora_alpha and --lora_targets"
        raise UserError(f"--resume: {ckpt} is a LoRA checkpoint (it holds adapter_config.json), but this run has no "
                        f"--lora_rank{why}. Resume with {flags}, and the run's other flags")
    if cfg.lora_rank and not os.path.exists(lora):
        raise UserError(f"--resume: {ckpt} is a full fine-tune's checkpoint (no adapter_config.json), but this run has "
                        f"--lora_rank {cfg.lora_rank}{why}. Resume without the LoRA flags")


def past_first_save(out_dir):
    """Whether the run in out_dir logged a step at which its flags (config.json) had a checkpoint written: then its
    checkpoints were deleted, and a resume would start it over. Unreadable files: assume so."""
    rows, metrics = [], os.path.join(out_dir, "metrics.jsonl")
    try:
        saved = json.load(open(os.path.join(out_dir, "config.json")))
        first = min(int(saved["save_every"]) or int(saved["steps"]), int(saved["steps"]))
        for line in open(metrics) if os.path.exists(metrics) else []:
            with contextlib.suppress(ValueError):  # (a row a kill cut short)
                rows.append(json.loads(line))
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return any(isinstance(r, dict) and "loss" in r and r.get("step", 0) >= first for r in rows)


def all_reduce_named(values, op, device):
    """{name: number or 0-d tensor} -> {name: float} reduced over ranks (sorted names: one order everywhere)."""
    keys = sorted(values)
    if not keys:
        return {}
    t = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=device).reshape(()) for k in keys])
    dist.all_reduce(t, op=op)
    return dict(zip(keys, t.tolist()))


def exit_now(code, message=None):
    """Exit with `code`, the message said once (torchrun: each rank's error file, rank 0 first); os._exit: no hang."""
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


def collective_timed_out(e):
    """A collective that waited --collective_timeout for ranks that never came -> one line: the step main() was at
    (its frame's `step`, the loop's 0-based index), where this rank waited, the likely cause. Else None. (gloo raises
    here; on GPUs NCCL's watchdog ends the process itself, with its own message.)"""
    import traceback
    if not isinstance(e, RuntimeError) or "Timed out" not in str(e):
        return None
    ours = [f for f, _ in traceback.walk_tb(e.__traceback__) if f.f_code.co_filename == main.__code__.co_filename
            and f.f_code.co_name[0] != "<"]  # this file's functions, main() first
    at = next(f.f_locals for f in ours if f.f_code is main.__code__)  # main() raised it: its variables
    where = f"step {at['step'] + 1}" if "step" in at else "before the first step"
    return (f"{where}: rank {os.environ.get('RANK', 0)} waited {at['cfg'].collective_timeout:g} s "
            f"(--collective_timeout) in a collective "
            f"({' -> '.join(f.f_code.co_name + '()' for f in ours)}) that another rank never reached. "
            f"Likely cause: a hack that calls a collective (an all-reduce; advantages() with --scale_rewards batch) a "
            f"different number of times on each rank, e.g. once per reply: have every rank call it as often (agree "
            f"on the count first, with one all-reduce of its max). If a rank was only slower (a long rollout), raise "
            f"--collective_timeout")


if __name__ == "__main__":
    try:
        main(parse_config())
    except UserError as e:
        exit_now(1, f"error: {e}")
    except RuntimeError as e:  # ranks that disagree end here, said once, instead of hanging
        if collective_timed_out(e) is None:
            raise
        exit_now(1, f"error: {collective_timed_out(e)}")
    except KeyboardInterrupt:
        exit_now(130, "interrupted: the last checkpoint in --out_dir is intact; continue with --resume")
    exit_now(0)
