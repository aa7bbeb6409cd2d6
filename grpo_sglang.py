"""
GRPO in one file, with rollouts from an SGLang server.

    bash serve.sh && torchrun --nproc_per_node 3 grpo_sglang.py        # 4 GPUs: server on 3, training on 0-2
    GPU=0 bash serve.sh && torchrun --nproc_per_node 1 grpo_sglang.py --colocate   # 1 GPU, shared
    python grpo_sglang.py --help                                        # every flag

Each step: the training ranks send their prompts to the SGLang server (`/generate`,
token ids in, token ids + logprobs out), score the completions with a reward function,
turn rewards into group-relative advantages, take `mu` optimizer steps on the clipped
GRPO loss, and push the new weights to the server (`/update_weights_from_tensor`).
After every push we ask the server for the logprobs of a fixed probe sequence and
compare them with our own: if they disagree, the server is not generating with our
weights and we stop.

The GRPO choices this file makes (each a flag):
  advantages   (r - mean(group)) / std(group), or without the std (Dr. GRPO, --no-scale_rewards)
  loss         PPO-style clipped surrogate, separate low/high clip range (DAPO's "clip higher")
  aggregation  token mean over the batch (DAPO, default), per-sequence mean (original GRPO),
               or a constant divisor (Dr. GRPO)
  KL           k3 estimator to a frozen reference model, only when --beta > 0 (default 0:
               DAPO and Dr. GRPO drop it and it costs a second model)
  updates      mu optimizer steps per rollout batch (mu=1: the ratio is 1 and clipping is moot)
  TIS          optional truncated importance sampling with the server's logprobs (--tis_cap)
Note: the loss value is not a progress signal in GRPO (it is ~0 by construction when
advantages are centred); watch the reward.
"""
import dataclasses
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import requests
import torch
import torch.distributed as dist

import reward_fns


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    # model and server
    model: str = arg("Qwen/Qwen2.5-0.5B-Instruct", "HF model name or local path; the server must serve the same")
    server_url: str = arg("http://127.0.0.1:30000", "SGLang server started by serve.sh")
    api_key: str = arg("", "server API key (default: $SGLANG_API_KEY), sent as a Bearer token")
    server_gpu: int = arg(3, "GPU the server runs on (serve.sh's GPU); training ranks never use it")
    colocate: bool = arg(False, "the server shares rank 0's GPU on purpose (one-GPU machines)")
    request_timeout: float = arg(300.0, "seconds before one HTTP request to the server is given up")
    request_retries: int = arg(3, "retries (with backoff) for a failed request before stopping")
    # data
    dataset: str = arg("openai/gsm8k", "HF dataset name, a local .json/.jsonl file, or 'builtin' (no download)")
    dataset_config: str = arg("main", "HF dataset config name ('' for none)")
    train_split: str = arg("train", "split to train on")
    eval_split: str = arg("test", "held-out split ('' = hold out eval_size rows of the train split)")
    prompt_field: str = arg("question", "column with the question")
    answer_field: str = arg("answer", "column with the reference answer")
    instruction: str = arg("auto", "text appended to each question ('auto': fits the task)")
    reward: str = arg("auto", f"reward function in reward_fns.py: {sorted(reward_fns.REWARD_FNS)} or 'auto'")
    builtin_max_operand: int = arg(20, "built-in task: operands of 'a + b' are drawn from 0..this")
    max_prompt_tokens: int = arg(256, "longer prompts are skipped (and counted)")
    eval_size: int = arg(200, "held-out prompts per evaluation")
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
    max_grad_norm: float = arg(1.0, "gradient clipping")
    beta: float = arg(0.0, "KL coefficient to the reference model (0: no reference model is loaded)")
    clip_low: float = arg(0.2, "ratio clip below 1 - clip_low")
    clip_high: float = arg(0.2, "ratio clip above 1 + clip_high (DAPO uses 0.28)")
    loss_agg: str = arg("token", "'token' (DAPO), 'seq' (original GRPO) or 'constant' (Dr. GRPO)")
    scale_rewards: bool = arg(True, "divide advantages by the group's std (off: Dr. GRPO)")
    mu: int = arg(1, "optimizer steps per rollout batch")
    tis_cap: float = arg(0.0, "truncated importance sampling cap with the server's logprobs (0 = off)")
    micro_batch: int = arg(32, "sequences per forward/backward on one rank (larger is faster, if memory allows)")
    grad_checkpointing: bool = arg(False, "recompute activations in backward to save memory")
    max_nonfinite_steps: int = arg(3, "stop after this many steps in a row with a NaN/Inf gradient (each is skipped)")
    # weight sync
    sync_bucket_mb: float = arg(1024.0, "size (MiB) of one flattened weight bucket pushed to the server")
    sync_check_max: float = arg(0.3, "stop when max |server - trainer| probe logprob (nats) exceeds this "
                                     "on two steps in a row, or twice this once")
    debug_skip_sync: str = arg("", "steps whose weight push is skipped, e.g. '40' or '40-60' (negative control)")
    # eval, checkpoints, logging
    eval_every: int = arg(50, "evaluate (greedy, via the server) every N steps; 0 = only at start and end")
    save_every: int = arg(100, "checkpoint every N steps (0 = only at the end)")
    out_dir: str = arg("runs/grpo", "checkpoints, metrics.jsonl and config.json go here")
    resume: bool = arg(False, "continue from the last checkpoint in out_dir")
    sample_every: int = arg(10, "print one completion every N steps")
    seed: int = arg(0, "seed for data order and torch")
    device: str = arg("auto", "'cuda', 'cpu' (tests) or 'auto'")
    wandb: bool = arg(False, "log to Weights & Biases")
    wandb_project: str = arg("grpo_sglang", "wandb project")


def parse_config(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Config):
        kind = type(f.default)
        if kind is bool:
            p.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            p.add_argument(f"--{f.name}", type=kind, default=f.default, help=f.metadata["help"])
    return Config(**vars(p.parse_args(argv)))


class UserError(Exception):
    """A problem the user can fix; printed as one clear message, never a traceback."""


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
    logits = logits.float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def kl_k3(logp, ref_logp):
    """(B, T) -> (B, T). Schulman's k3 estimator of KL(pi || ref): e^(ref-logp) - (ref-logp) - 1 >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def clipped_surrogate(logp, old_logp, adv, clip_low, clip_high):
    """(B, T), (B, T), (B,) -> per-token loss (B, T) and where clipping was active (B, T).
    PPO: -min(ratio * A, clip(ratio, 1 - low, 1 + high) * A)."""
    ratio = torch.exp(logp - old_logp)
    a = adv.unsqueeze(1)  # (B, 1)
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * a
    return -torch.min(unclipped, clipped), (clipped < unclipped)


def tis_weights(old_logp, server_logp, cap):
    """(B, T) -> (B, T). Truncated importance weight min(pi_trainer / pi_server, cap) for the
    gap between the server's sampler and the trainer's kernels (Yao et al. 2025, "TIS")."""
    return torch.clamp(torch.exp(old_logp - server_logp), max=cap)


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


def sync_check_fails(diff_max, previous_over, limit):
    """-> (stop?, over?). Server-vs-trainer probe gap after a push. A single token can spike (the
    server's kernels are not HF's: on our H200 run correct pushes gave up to 0.31 nats once), while a
    missed push or wrong weights stay wrong: stop on two steps over `limit` in a row, or one over 2x."""
    over = diff_max > limit
    return (over and previous_over) or diff_max > 2 * limit, over


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
    """-> (train rows, eval rows), each a list of {'question', 'answer'} dicts (unvalidated)."""
    if cfg.dataset == "builtin":
        rows = builtin_rows(cfg.builtin_max_operand)
        n_eval = min(cfg.eval_size, len(rows) // 4)
        return rows[n_eval:], rows[:n_eval]  # disjoint: eval problems are never trained on
    import datasets
    try:
        if cfg.dataset.endswith((".json", ".jsonl")):
            if not os.path.exists(cfg.dataset):
                raise UserError(f"data file {cfg.dataset} does not exist")
            ds = {"train": datasets.load_dataset("json", data_files=cfg.dataset, split="train")}
            train_split, eval_split = "train", ""
        else:
            ds = datasets.load_dataset(cfg.dataset, cfg.dataset_config or None)
            train_split, eval_split = cfg.train_split, cfg.eval_split
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"could not load dataset {cfg.dataset!r}: {e}") from None
    if train_split not in ds:
        raise UserError(f"dataset {cfg.dataset!r} has no split {train_split!r} (it has {list(ds)})")
    train = [dict(r) for r in ds[train_split]]
    if eval_split and eval_split in ds:
        return train, [dict(r) for r in ds[eval_split]][: cfg.eval_size]
    random.Random(cfg.seed).shuffle(train)  # no held-out split: hold out rows of the train split
    n_eval = min(cfg.eval_size, len(train) // 10)
    return train[n_eval:], train[:n_eval]


def tokenize_rows(rows, tok, cfg, instruction, skipped):
    """Chat-template each question once. Unusable rows are counted in `skipped`, never fatal."""
    out = []
    for r in rows:
        q, a = r.get(cfg.prompt_field), r.get(cfg.answer_field)
        if not isinstance(q, str) or not q.strip():
            skipped["empty or missing prompt"] += 1
            continue
        if a is None or reward_fns.extract_number(str(a)) is None:
            skipped["answer without a number"] += 1
            continue
        msgs = [{"role": "user", "content": f"{q.strip()}\n{instruction}".strip()}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) > cfg.max_prompt_tokens:
            skipped[f"prompt longer than max_prompt_tokens={cfg.max_prompt_tokens}"] += 1
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
# The SGLang server, through its public HTTP API only. Plumbing: try not to modify.

def call(cfg, path, payload=None, timeout=None, retries=None):
    """POST (or GET without payload) with timeout, retries and backoff. -> parsed JSON or text."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    retries = cfg.request_retries if retries is None else retries
    for attempt in range(retries + 1):
        try:
            if payload is None:
                r = requests.get(cfg.server_url + path, headers=headers, timeout=timeout or cfg.request_timeout)
            else:
                r = requests.post(cfg.server_url + path, json=payload, headers=headers, timeout=timeout or cfg.request_timeout)
            if r.status_code in (401, 403):
                raise UserError(f"the server refused {path} (HTTP {r.status_code}): wrong or missing --api_key")
            if r.status_code >= 500 and attempt < retries:  # overloaded or restarting: try again
                raise requests.ConnectionError(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code >= 400:
                raise UserError(f"the server answered {path} with HTTP {r.status_code}: {r.text[:500]}")
            try:
                return r.json()
            except ValueError:
                return r.text  # /flush_cache answers plain text
        except (requests.ConnectionError, requests.Timeout) as e:
            if attempt == retries:
                raise UserError(f"no answer from the SGLang server at {cfg.server_url}{path} after "
                                f"{retries + 1} tries ({type(e).__name__}: {str(e)[:200]}).\n"
                                f"Is it running? Start it with: bash serve.sh   (see serve.log)") from None
            time.sleep(min(2 ** attempt, 30))


def check_server(cfg):
    """Before anything heavy: is the server up, and does it serve our model?"""
    call(cfg, "/health", timeout=10, retries=1)
    info = call(cfg, "/model_info", timeout=30)
    served = str(info.get("model_path", "")) if isinstance(info, dict) else ""
    same = served == cfg.model or (os.path.exists(cfg.model) and os.path.realpath(served) == os.path.realpath(cfg.model))
    if not same:
        raise UserError(f"the server serves {served!r} but the trainer trains {cfg.model!r}.\n"
                        f"Restart it with the same model: bash serve.sh stop && MODEL={cfg.model} bash serve.sh")
    server_info = call(cfg, "/server_info", timeout=30)
    if isinstance(server_info, dict) and int(server_info.get("tp_size", 1) or 1) != 1:
        raise UserError("the server runs with tensor parallelism > 1; this trainer pushes weights to one GPU (tp_size 1)")
    # SGLang >= 0.5.21 refuses weight updates outside a /begin_weight_update ... /end_weight_update
    # session; 0.5.16 has neither route. A GET on a POST-only route answers 405 where it exists.
    try:
        r = requests.get(cfg.server_url + "/begin_weight_update", timeout=cfg.request_timeout,
                         headers={"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {})
    except requests.RequestException as e:
        raise UserError(f"the SGLang server at {cfg.server_url} stopped answering ({e})") from None
    return {"begin_end": r.status_code == 405}


def generate(cfg, prompt_ids, n, greedy=False):
    """n completions for each prompt (token ids) -> list of (completion ids, server logprobs, finish).
    One batched request: the server schedules all of it (and every rank's) together."""
    sp = {"max_new_tokens": cfg.max_new_tokens, "temperature": 0.0 if greedy else cfg.temperature,
          "top_p": cfg.top_p, "top_k": cfg.top_k}
    batch = [p for p in prompt_ids for _ in range(n)]
    out = call(cfg, "/generate", {"input_ids": batch, "sampling_params": sp, "return_logprob": True})
    if not isinstance(out, list) or len(out) != len(batch):
        raise UserError(f"/generate returned {type(out).__name__} of unexpected size (wanted {len(batch)} items)")
    results = []
    for o in out:  # SGLang keeps the EOS token in output_ids (and its logprob): the policy must learn
        ids, meta = o["output_ids"], o["meta_info"]  # to stop, so EOS needs a gradient too
        lps = [lp for lp, *_ in meta["output_token_logprobs"]]
        if len(lps) != len(ids):
            raise UserError(f"/generate returned {len(ids)} tokens but {len(lps)} logprobs: unexpected server version?")
        results.append((ids, lps, (meta.get("finish_reason") or {}).get("type", "?")))
    return results


def server_logprobs(cfg, ids, n_prompt):
    """Server's logprobs of ids[n_prompt:] given the prefix, no sampling. -> list of floats."""
    out = call(cfg, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 0},
                                  "return_logprob": True, "logprob_start_len": n_prompt - 1})
    rows = out["meta_info"]["input_token_logprobs"][1:]  # entry 0 is always None (no prefix scored)
    got = [int(t) for _, t, *_ in rows]
    if got != ids[n_prompt:]:
        raise UserError("the server's probe logprobs are for other tokens than sent: unexpected /generate format")
    return [float(lp) for lp, *_ in rows]


# ----------------------------------------------------------------------------------------
# Weight sync. The server process sees only its own GPU, so a CUDA-IPC handle of a tensor on a
# training GPU is useless to it. Rank 0 (which sees every GPU under torchrun) gathers the full
# weights, copies them into flat buckets that live ON THE SERVER'S GPU, and sends their IPC handles
# serialized with SGLang's own helpers (which name the device by UUID, not by index, since the
# server's cuda:0 is our cuda:3). The server opens the handles and copies from its own GPU.

def gpu_layout(server_gpu, colocate, local_rank, local_world, visible, n_devices):
    """-> (this rank's CUDA index, CUDA index to stage weights on, as seen by this process).
    `visible` is CUDA_VISIBLE_DEVICES (None if unset). Raises UserError on impossible layouts."""
    if local_world > n_devices:
        raise UserError(f"{local_world} training ranks but only {n_devices} visible GPUs")
    if colocate:
        return local_rank, 0  # the server shares rank 0's GPU
    ids = [s.strip() for s in visible.split(",")] if visible is not None else [str(i) for i in range(n_devices)]
    if str(server_gpu) not in ids:
        why = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else f"this machine shows {n_devices} GPU(s)"
        raise UserError(f"GPU {server_gpu} (the server's, --server_gpu) is not visible to the trainer ({why}); rank 0 "
                        f"must see it to stage weights there. Unset CUDA_VISIBLE_DEVICES or include {server_gpu}, "
                        f"or pass --colocate if the server shares rank 0's GPU.")
    stage = ids.index(str(server_gpu))
    if stage < local_world:
        raise UserError(f"training rank {stage} would run on GPU {server_gpu}, which the SGLang server uses. "
                        f"Ranks take the visible GPUs 0..n-1 in order: use fewer ranks or list the server's GPU last "
                        f"in CUDA_VISIBLE_DEVICES, move the server "
                        f"(GPU=<id> bash serve.sh, --server_gpu <id>), or pass --colocate to share it on purpose.")
    return local_rank, stage


def make_payload(named, device):
    """[(name, tensor)] -> (serialized bucket, flat buffer). The tensors are cast to bf16 and copied
    into ONE flat buffer on `device` (the server's GPU), described by SGLang's own bucket class.
    The buffer must stay alive until the server has answered: only its IPC handle travels."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket, FlattenedTensorMetadata
    flat = torch.empty(sum(t.numel() * 2 for _, t in named), dtype=torch.uint8, device=device)
    meta, off = [], 0
    for name, t in named:
        n = t.numel() * 2
        flat[off: off + n].view(torch.bfloat16).copy_(t.reshape(-1))  # cast + cross-GPU copy
        meta.append(FlattenedTensorMetadata(name=name, shape=t.shape, dtype=torch.bfloat16,
                                            start_idx=off, end_idx=off + n, numel=n))
        off += n
    if flat.is_cuda:
        torch.cuda.synchronize(device)  # the server must not read the buffer before the copies land
    bucket = FlattenedTensorBucket(flattened_tensor=flat, metadata=meta)
    payload = MultiprocessingSerializer.serialize(
        {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}, output_str=True)
    return payload, flat


def push_weights(cfg, model, stage_device, begin_end):
    """All ranks: gather each full parameter; rank 0: pack buckets on the server's GPU and POST them,
    one at a time, then flush the server's prefix cache once. -> bytes pushed (rank 0)."""
    from torch.distributed.tensor import DTensor
    rank0, limit, pending, pending_bytes, pushed = dist.get_rank() == 0, cfg.sync_bucket_mb * 2**20, [], 0, 0
    if rank0 and begin_end:
        call(cfg, "/begin_weight_update", {"selector": "all"})
    params, one_rank = list(model.named_parameters()), dist.get_world_size() == 1
    for i, (name, p) in enumerate(params):
        full = p.data
        if isinstance(full, DTensor):  # gather the shards: a collective, every rank takes part
            full = full.to_local() if one_rank else full.full_tensor()
        if not rank0:
            continue
        pending.append((name, full))
        pending_bytes += full.numel() * 2  # bf16
        last = i == len(params) - 1
        if last or pending_bytes >= limit:
            payload, flat = make_payload(pending, stage_device)
            r = call(cfg, "/update_weights_from_tensor", {"serialized_named_tensors": [payload],
                     "load_format": "flattened_bucket", "flush_cache": last})
            if not (isinstance(r, dict) and r.get("success")):
                raise UserError(f"the server rejected the weight update: {r}. Training on would sample "
                                f"from stale weights, so we stop.")
            pushed += flat.numel()
            pending, pending_bytes, flat = [], 0, None  # only now may the buffer go: the server copied it
    if rank0 and begin_end:
        call(cfg, "/end_weight_update", {})
    return pushed


# ----------------------------------------------------------------------------------------
# The trainer side: model, log-probs of completions, checkpoints.

def shard(model, mesh, param_dtype):
    """FSDP2: each transformer block its own unit computing in bf16; fp32 master weights and grads.
    The root unit (embeddings, final norm, LM head) computes in fp32: bf16 logits are rounded in
    steps of 0.125 at |logit| ~ 20, and our first H200 run showed trainer/server logprob gaps of exactly
    0.125 and 0.25 (serve.sh starts SGLang with --enable-fp32-lm-head to match; MiniMax-M1 did the same)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    for m in model.modules():
        if type(m).__name__ in (model._no_split_modules or []):
            fully_shard(m, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32))
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32))
    return model


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


def completion_logprobs(model, ids, attn, P, temperature):
    """(B, P+C) -> (B, C) log-probs of the completion tokens under `model`."""
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # positions ignore the left padding
    C = ids.shape[1] - P
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=C + 1).logits
    return token_logprobs(logits[:, :-1], ids[:, P:], temperature)  # (B, C)


def save_checkpoint(cfg, model, opt, tok, step):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)
    rng = [None] * dist.get_world_size()
    dist.all_gather_object(rng, {"torch": torch.get_rng_state(), "python": random.getstate(),
                                 "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None})
    if dist.get_rank() == 0:
        # Write a new folder, then point 'latest' at it with one atomic rename, then drop the old
        # one: a crash (even kill -9) at any moment leaves the previous checkpoint usable.
        import shutil
        d = os.path.join(cfg.out_dir, f"step_{step}")
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d, state_dict=msd)
        tok.save_pretrained(d)
        torch.save({"optimizer": osd, "step": step, "rng": rng, "config": dataclasses.asdict(cfg)},
                   os.path.join(d, "trainer_state.pt"))
        old = latest_checkpoint(cfg.out_dir)
        with open(os.path.join(cfg.out_dir, "latest.tmp"), "w") as f:
            f.write(f"step_{step}")
        os.replace(os.path.join(cfg.out_dir, "latest.tmp"), os.path.join(cfg.out_dir, "latest"))
        if old and os.path.basename(old) != f"step_{step}":
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def latest_checkpoint(out_dir):
    """-> path of the last complete checkpoint in out_dir, or None."""
    try:
        return os.path.join(out_dir, open(os.path.join(out_dir, "latest")).read().strip())
    except OSError:
        return None


# ----------------------------------------------------------------------------------------
# Distributed setup and the training loop.

def main(cfg):
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    master = rank == 0
    print0 = lambda *a: print(*a, flush=True) if master else None
    cfg.api_key = cfg.api_key or os.environ.get("SGLANG_API_KEY", "")

    # fail fast: impossible combinations, then the server, all before loading anything heavy
    if cfg.prompts_per_step % world:
        raise UserError(f"--prompts_per_step {cfg.prompts_per_step} must divide by the world size {world}")
    if cfg.loss_agg not in ("token", "seq", "constant"):
        raise UserError(f"--loss_agg must be token, seq or constant, not {cfg.loss_agg!r}")
    if cfg.group_size < 2:
        raise UserError("--group_size must be >= 2: advantages compare completions of the same prompt")
    if cfg.mu < 1 or cfg.steps < 1 or cfg.micro_batch < 1 or cfg.max_new_tokens < 1:
        raise UserError("--mu, --steps, --micro_batch and --max_new_tokens must be >= 1")
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        dev_idx, stage_idx = gpu_layout(cfg.server_gpu, cfg.colocate, local_rank, local_world,
                                        os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count())
        device, stage_device = torch.device("cuda", dev_idx), torch.device("cuda", stage_idx)
        torch.cuda.set_device(device)
    else:
        device = stage_device = torch.device("cpu")
        torch.multiprocessing.set_sharing_strategy("file_system")  # CPU tensors by file name (tests)
    server = check_server(cfg) if master else None

    if "RANK" not in os.environ:  # plain `python grpo_sglang.py`: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29511"), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)
    holder = [server]
    dist.broadcast_object_list(holder)
    server = holder[0]
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(cfg.seed + rank)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    if use_cuda:  # CUDA-IPC handles then name the GPU by UUID (see push_weights); CUDA tensors only
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        monkey_patch_torch_reductions()

    # data: tokenized once, unusable rows counted
    tok = AutoTokenizer.from_pretrained(cfg.model)
    task = "arithmetic" if cfg.dataset == "builtin" else "gsm8k"
    reward_name = task if cfg.reward == "auto" else cfg.reward
    try:
        reward_fn = reward_fns.get_reward_fn(reward_name)
    except ValueError as e:
        raise UserError(f"--reward: {e}") from None
    instruction = INSTRUCTIONS[task] if cfg.instruction == "auto" else cfg.instruction
    skipped = Counter()
    raw_train, raw_eval = load_splits(cfg)
    train, evals = tokenize_rows(raw_train, tok, cfg, instruction, skipped), tokenize_rows(raw_eval, tok, cfg, instruction, skipped)
    print0(f"data: {len(train)} train / {len(evals)} eval prompts from {cfg.dataset}; skipped "
           f"{sum(skipped.values())} rows" + (f" ({dict(skipped)})" if skipped else ""))
    if not train or not evals:
        raise UserError("no usable rows left for training or evaluation (see the skipped counts above)")

    # models: fp32 master weights sharded with FSDP2; the reference model only when beta > 0
    ckpt_dir = latest_checkpoint(cfg.out_dir) if cfg.resume else None
    resume = ckpt_dir is not None
    if cfg.resume and not resume:
        print0(f"--resume: no checkpoint in {cfg.out_dir} yet, starting from {cfg.model}")
    compute_dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(ckpt_dir if resume else cfg.model, dtype=torch.float32).to(device)
    if cfg.grad_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model = shard(model, mesh, compute_dtype)
    ref = None
    if cfg.beta > 0:
        ref = shard(AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.bfloat16).to(device).eval(), mesh, compute_dtype)
        ref.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if resume:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        st = torch.load(os.path.join(ckpt_dir, "trainer_state.pt"), weights_only=True)
        set_optimizer_state_dict(model, opt, st["optimizer"], options=StateDictOptions(full_state_dict=True))
        start, rng = st["step"], st["rng"][rank]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if rng["cuda"] is not None and use_cuda:
            torch.cuda.set_rng_state(rng["cuda"])
        print0(f"resumed from {ckpt_dir} at step {start}")

    n_local = cfg.prompts_per_step // world
    B = cfg.prompts_per_step * cfg.group_size
    print0(f"batch: {cfg.prompts_per_step} prompts x {cfg.group_size} completions = {B} sequences per step; "
           f"{n_local} prompts ({n_local * cfg.group_size} sequences) per rank x {world} ranks; "
           f"micro-batch {cfg.micro_batch}; {cfg.mu} optimizer step(s) per rollout; "
           f"{cfg.steps} steps = {cfg.steps * cfg.prompts_per_step / len(train):.2f} epochs")
    print0(f"layout: training on {device} x {world}, server GPU staged as {stage_device}"
           f"{' (colocated)' if cfg.colocate else ''}; server at {cfg.server_url}")
    os.makedirs(cfg.out_dir, exist_ok=True)
    if master:
        json.dump(dataclasses.asdict(cfg), open(os.path.join(cfg.out_dir, "config.json"), "w"), indent=1)
    metrics_file = open(os.path.join(cfg.out_dir, "metrics.jsonl"), "a") if master else None
    if cfg.wandb and master:
        import wandb
        wandb.init(project=cfg.wandb_project, config=dataclasses.asdict(cfg))
    skip_sync = set()
    for part in filter(None, cfg.debug_skip_sync.replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        skip_sync.update(range(int(lo), int(hi or lo) + 1))

    # the probe: a fixed held-out prompt and its reference answer, re-scored after every push
    probe_ans = tok(evals[0]["answer"] + tok.eos_token, add_special_tokens=False)["input_ids"]
    probe = evals[0]["ids"] + probe_ans

    def agree(err):
        """Every rank learns of an error on any rank, so none of them hangs in a collective."""
        errs = [None] * world
        dist.all_gather_object(errs, err)
        errs = [e for e in errs if e]
        if errs:
            raise UserError(errs[0])

    last_probe, over = None, False  # the previous step's probe logprobs; was it over the limit?

    def sync_and_check(step, push=True):
        nonlocal last_probe, over
        t0 = time.time()
        err, nbytes, stats = None, 0, {}
        try:
            if push:
                nbytes = push_weights(cfg, model, stage_device, server and server["begin_end"])
        except UserError as e:
            err = str(e)
        agree(err)
        t_sync = time.time() - t0
        with torch.no_grad():
            mine = completion_logprobs(model, torch.tensor([probe], device=device),
                                       torch.ones(1, len(probe), dtype=torch.long, device=device),
                                       len(evals[0]["ids"]), 1.0)[0].float().cpu()
        if master:
            try:
                theirs = torch.tensor(server_logprobs(cfg, probe, len(evals[0]["ids"])))
                d = (theirs - mine).abs()
                stats = {"sync_logprob_diff_mean": d.mean().item(), "sync_logprob_diff_max": d.max().item(),
                         # how far one training step moved the probe: a skipped push is only
                         # visible to the check when this exceeds the kernel noise (~0.05 nats)
                         "probe_step_change_max": (mine - last_probe).abs().max().item() if last_probe is not None else 0.0}
                last_probe = mine
                stop, over = sync_check_fails(stats["sync_logprob_diff_max"], over, cfg.sync_check_max)
                if stop:
                    err = (f"sync check failed at step {step}: the server's logprobs on the probe differ from the "
                           f"trainer's by up to {d.max():.3f} nats (mean {d.mean():.3f}; --sync_check_max "
                           f"{cfg.sync_check_max}). The server is not generating with the trainer's weights: "
                           f"was a push skipped or rejected, or does the server serve another model?")
            except UserError as e:
                err = str(e)
        agree(err)
        return {"time_sync": t_sync, "sync_bytes": nbytes, **stats}

    def evaluate(step):
        acc = None
        if master:
            t0 = time.time()
            outs = generate(cfg, [e["ids"] for e in evals], 1, greedy=True)
            warn = Counter()
            rs = [reward_fns.safe_reward(reward_fn, tok.decode(o[0], skip_special_tokens=True), e["answer"], warn)
                  for o, e in zip(outs, evals)]
            acc = sum(rs) / len(rs)
            print0(f"eval step {step}: accuracy {acc:.3f} on {len(rs)} held-out prompts (greedy, {time.time() - t0:.1f}s)")
            metrics_file.write(json.dumps({"step": step, "eval_accuracy": acc}) + "\n")
            metrics_file.flush()
        dist.barrier()
        return acc

    s0 = sync_and_check(start)  # the server must start from our weights (also after a resume)
    print0(f"initial sync: {s0['sync_bytes'] / 2**20:.0f} MiB in {s0['time_sync']:.2f}s, probe |diff| mean "
           f"{s0.get('sync_logprob_diff_mean', 0):.4f} max {s0.get('sync_logprob_diff_max', 0):.4f}")
    evaluate(start)

    nonfinite_run = 0
    for step in range(start, cfg.steps):
        # 1. rollout: this rank's share of the step's prompts, G completions each
        t0 = t_step = time.time()
        rows = [train[i] for i in prompts_for_step(len(train), step, cfg.prompts_per_step, cfg.seed)]
        rows = rows[rank * n_local: (rank + 1) * n_local]
        err, outs = None, []
        try:
            outs = generate(cfg, [r["ids"] for r in rows], cfg.group_size)
        except UserError as e:
            err = str(e)
        agree(err)
        t_rollout = time.time() - t0

        # 2. rewards and group-relative advantages (groups never straddle ranks)
        warn = Counter()
        samples = []
        for k, (ids, lps, fin) in enumerate(outs):
            row = rows[k // cfg.group_size]
            text = tok.decode(ids, skip_special_tokens=True)
            samples.append({"prompt": row["ids"], "completion": ids, "server_lp": lps, "finish": fin, "text": text,
                            "reward": reward_fns.safe_reward(reward_fn, text, row["answer"], warn)})
        if warn:  # rewards that raised or returned NaN/None count as 0; say which (this rank's)
            print0(f"reward warnings at step {step + 1}: {dict(warn)}")
        rewards = torch.tensor([s["reward"] for s in samples])
        adv = group_advantages(rewards, cfg.group_size, cfg.scale_rewards)
        n_tok_local = sum(len(s["completion"]) for s in samples)
        totals = torch.tensor([len(samples), n_tok_local], dtype=torch.float64, device=device)
        dist.all_reduce(totals)  # loss normalisers count the whole batch, all ranks
        n_seqs, n_tokens = totals.tolist()

        # 3. old / reference / server log-probs, then mu optimizer steps on the clipped loss
        t0 = time.time()
        mbs = [list(range(i, min(i + cfg.micro_batch, len(samples)))) for i in range(0, len(samples), cfg.micro_batch)]
        batches = []
        with torch.no_grad():
            for mb in mbs:
                ids, attn, cmask, P = pad_batch([samples[i] for i in mb], tok.pad_token_id or 0, device)
                b = {"ids": ids, "attn": attn, "mask": cmask, "P": P, "adv": adv[mb].to(device)}
                if cfg.mu > 1 or cfg.tis_cap > 0:  # with mu = 1 the old policy is the current one
                    b["old"] = completion_logprobs(model, ids, attn, P, cfg.temperature)
                if ref is not None:
                    b["ref"] = completion_logprobs(ref, ids, attn, P, cfg.temperature)
                if cfg.tis_cap > 0:
                    slp = torch.zeros_like(cmask)
                    for j, i in enumerate(mb):
                        slp[j, : len(samples[i]["server_lp"])] = torch.tensor(samples[i]["server_lp"])
                    b["server"] = slp
                batches.append(b)
        t_ref = time.time() - t0
        t0 = time.time()
        stat = torch.zeros(4, dtype=torch.float64, device=device)  # kl sum, clipped tokens, tokens, loss
        nan_skips = 0
        for _ in range(cfg.mu):
            for k, b in enumerate(batches):
                model.set_requires_gradient_sync(k == len(batches) - 1)  # reduce grads once per step
                logp = completion_logprobs(model, b["ids"], b["attn"], b["P"], cfg.temperature)
                old = b.get("old", logp.detach())
                per_tok, clipped = clipped_surrogate(logp, old, b["adv"], cfg.clip_low, cfg.clip_high)
                if cfg.tis_cap > 0:
                    per_tok = per_tok * tis_weights(old, b["server"], cfg.tis_cap)
                if ref is not None:
                    kl = kl_k3(logp, b["ref"])
                    per_tok = per_tok + cfg.beta * kl
                    stat[0] += (kl.detach() * b["mask"]).sum()
                # FSDP averages gradients over ranks, so scale by world to get the batch sum
                loss = aggregate(per_tok, b["mask"], cfg.loss_agg, n_seqs, n_tokens, cfg.max_new_tokens) * world
                loss.backward()
                stat[1] += (clipped.float() * b["mask"]).sum()
                stat[2] += b["mask"].sum()
                stat[3] += loss.detach() / world
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            if torch.isfinite(grad_norm):
                opt.step()
            else:  # a non-finite gradient would poison the weights and the server with them
                nan_skips += 1
            opt.zero_grad(set_to_none=True)
        t_train = time.time() - t0

        # 4. push the new weights to the server, and check that it now generates with them
        sync = sync_and_check(step + 1, push=step + 1 not in skip_sync)

        # 5. log (reduce over ranks), checkpoint, evaluate
        lens = [len(s["completion"]) for s in samples]
        agg = torch.tensor([rewards.sum().item(), (rewards >= 1).sum().item(), len(samples), sum(lens),
                            sum(s["finish"] == "length" for s in samples),
                            float((rewards.view(-1, cfg.group_size).std(1) == 0).sum()), len(samples) / cfg.group_size,
                            sum(warn.values()), nan_skips], dtype=torch.float64, device=device)
        dist.all_reduce(agg)
        dist.all_reduce(stat)
        if master:
            m = {"step": step + 1, "reward_mean": agg[0].item() / agg[2].item(), "accuracy": agg[1].item() / agg[2].item(),
                 "kl": stat[0].item() / max(stat[2].item(), 1) * cfg.mu if ref is not None else 0.0,
                 "clip_frac": stat[1].item() / max(stat[2].item(), 1), "loss": stat[3].item() / cfg.mu,
                 "grad_norm": grad_norm.item(), "completion_len_mean": agg[3].item() / agg[2].item(),
                 "truncated_frac": agg[4].item() / agg[2].item(), "zero_std_groups_frac": agg[5].item() / agg[6].item(),
                 "reward_warnings": int(agg[7].item()), "nonfinite_skips": int(agg[8].item()) // world,
                 "time_rollout": t_rollout, "time_ref": t_ref, "time_train": t_train, **sync,
                 "time_step": time.time() - t_step, "sync_skipped": step + 1 in skip_sync,
                 "rollout_tokens_per_s": agg[3].item() / max(t_rollout, 1e-9)}
            print0(f"step {m['step']:4d} | reward {m['reward_mean']:.3f} acc {m['accuracy']:.3f} | kl {m['kl']:.4f} "
                   f"clip {m['clip_frac']:.3f} | len {m['completion_len_mean']:.0f} | rollout {t_rollout:.2f}s "
                   f"train {t_train:.2f}s sync {sync['time_sync']:.2f}s | {m['rollout_tokens_per_s']:.0f} tok/s | "
                   f"probe |diff| {sync.get('sync_logprob_diff_max', float('nan')):.3f}")
            if cfg.sample_every and m["step"] % cfg.sample_every == 0:
                print0(f"  sample (reward {samples[0]['reward']}): {samples[0]['text'][:300]!r}")
            metrics_file.write(json.dumps(m) + "\n")
            metrics_file.flush()
            if cfg.wandb:
                wandb.log(m, step=m["step"])
        nonfinite_run = nonfinite_run + 1 if nan_skips else 0  # grad_norm is global: all ranks agree
        if nan_skips:
            print0(f"warning: NaN/Inf gradient at step {step + 1}: {nan_skips} of {cfg.mu} update(s) skipped")
        if nonfinite_run >= cfg.max_nonfinite_steps:
            raise UserError(f"NaN/Inf gradients in {nonfinite_run} steps in a row (--max_nonfinite_steps); the weights "
                            f"were left as they were. Lower --lr, check the rewards and --tis_cap, then --resume "
                            f"from the last checkpoint in {cfg.out_dir}.")
        last = step + 1 == cfg.steps
        if (cfg.save_every and (step + 1) % cfg.save_every == 0) or last:
            save_checkpoint(cfg, model, opt, tok, step + 1)
        if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last:
            evaluate(step + 1)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main(parse_config())
    except UserError as e:
        print(f"\nerror: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
