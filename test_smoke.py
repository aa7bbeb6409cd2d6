"""CPU tests of grpo_sglang.py, no GPU and no model hub. They run the real script (a subprocess: 1 process, then
torchrun with 2; forked from a Python that has imported the libraries once, see Forked) or its functions in-process,
on a tiny model built from a config (build_tiny), against a stand-in server (StandIn) that speaks SGLang's endpoints
and loads the weights it is sent. First come the helpers, all in one part; then the tests, in these sections (each a
header `# N. title` below):

 1. the GRPO math and the logged metrics on hand-computed values
 2. rewards: parsing answers, the registry, scoring, a user's own reward
 3. data: the prompts of each step, prompt formats, data files, splits and held-out rows
 4. the weight payload, read back with SGLang's own classes
 5. GPU layouts, servers and flags: what is accepted, and what is refused before anything loads
 6. one step and FSDP in-process: log-probs, norms, micro-batches, sharding, the train step
 7. the script end to end against the stand-in server (1 process, then torchrun with 2)
 8. the sync check and the weight check: a server that holds other weights stops the run
 9. async: rollouts one step off, the re-scored check, a resume, a server failing mid-generation
10. faults: a server, a step or a process that fails stops with one clear message (or recovers)
11. resume, checkpoints and the out_dir: a resumed run is the run it resumes, nothing is overwritten
12. the GRPO variants of TRL, verl and slime, each a flag: hand values against the formula written here
13. docs and tools: the README's recipes, the docs' flags, the plot tool and the metrics, this index
14. serve.sh: its settings, layouts and ports, and its start and stop
15. LoRA: adapters that start at 0, their gradients, the merged push, the base as reference, checkpoints and resume
16. episodes: multi-turn rollouts, the environment's tokens (mask 0), the check, ranks, resume; dynamic sampling
17. against a real SGLang server on a GPU (skipped where there is no GPU or no SGLang: CI is CPU-only)
18. inputs once taken without a word, one-line bugs no test saw, the finish of a cut last reply
19. several tasks in one run: each row's task, groups of one task, per-task metrics, the weights, resume

Bad input of one topic (a data file, a flag, a checkpoint, a reward name, a serve.sh setting) is tested in that
topic's section; section 10 holds the faults of no one topic. The maintainers' tools (dev/: benchmarks, the GPU
pipeline, the mutation check) have tests of their own in dev/test_dev.py; nothing here needs dev/.

Run them all:        python -m pytest -q -n 2 test_smoke.py            (pytest-xdist: about 5-7 minutes on 2 cores)
Run section N:       python test_smoke.py N [pytest's flags]           (e.g. python test_smoke.py 14 -x)
Run tests by name:   python -m pytest -q test_smoke.py -k 'WORDS'      (words of test names, joined by or/and/not)

A test's name says what it checks, most often naming the function. Each function of grpo_sglang.py's story (above
its fence) and of its main plumbing -> the -k words that select the tests that check it:
  arg, GRPOConfig, Config -> help_lists_every_flag or flags_out_of_range or policy_loss_reads_the_flags
  group_advantages, flat_groups -> group_advantages or rloo_and_batch_std or scale_rewards_batch or filters_set_weights
  overlong_penalty -> overlong_penalty or overlong_buffer
  lr_factor, set_lr -> lr_schedule
  kl_k3 -> kl_k3 or kl_and_tis or kl_metric or kl_is_logged
  log_ratio -> gspo or ratio_level
  tis_weights -> tis_weights or importance_sampling_modes or importance_weights or tis_mode
  per_token -> advantages_may_be_per_token
  aggregate, loss_norm -> aggregate_modes or advantages_may_be_per_token
  prompts_for_step -> prompts_for_step or epochs_are_shuffled or resumed_run_samples_and_trains_exactly
  rollout, env_ids -> an_episode_appends or template_that_rewrites or episodes_train or ends_after_one_turn
  sample_groups, rank_rounds -> dynamic_sampling or rounds_of_prompts
  sequences, samples, score -> score_counts_correctness or a_reward_part_is_its_mean
  identical_groups -> identical
  score_metrics, rollout_metrics, train_metrics -> score_counts_correctness or metrics_are_logged or dynamic_sampling
  micro_batches -> micro_batches
  rows_of -> train_step_is_the_grpo_objective or per_token_advantages_of_the_table
  old_and_ref_logprobs -> old_policy_and_reference_logprobs or kl_metric_counts
  shape_rewards, weights -> filters_set_weights_and_shaping or overlong_penalty_reaches or weights_are_all_0
  advantages, batch_std -> scale_rewards_batch or train_step_is_the_grpo_objective or rloo_and_batch_std
  completion_logprobs -> packed_batch_logprobs or head_logprobs
  policy_loss -> policy_loss or clipped_surrogate or grpo_token_loss or gspo or cispo or ratio_level or entropy_bonus
  train -> train_step_is_the_grpo_objective or weights_are_all_0 or kl_metric_counts or entropy_with_mu_2
  split_by_tokens, batch_counts, fsdp_sync_grads -> micro_batches or different_numbers_of_micro or one_rank_and_two
  main -> script_trains_and_server_gets_the_weights or one_rank_and_two_ranks or a_step_on_a_known_reward
  add_lora, lora_forward, merged_weight, adapters_off -> lora
  HeadLogprobs, token_logprobs -> head_logprobs or packed_batch
  pack_batch -> packed_batch
  fuse_rms_norms -> fused_rms_norm
  shard, load_policy -> fsdp or checkpointed_blocks or frozen_model_kept_gathered
  clip_grads -> clip_grads or max_grad_norm_0
  Metrics, mismatch_stats -> metrics_are_logged or metric_only_one_rank or mismatch_stats or is_truncated_frac
  parse_config, check_config -> flags_out_of_range or bad_flag or one_error_said_once
  restore_config, check_architecture -> resumed_run_restores_its_flags or another_architecture
  parse_servers, gpu_layout, pick_sync -> gpu_layout or several_servers or two_names or tensor_parallel
  load_data, load_splits, tokenize_rows -> data_files or data_folder or unusable_rows or held_out or plain_prompts
  Server, call, check_server, generate -> server_not_running or wrong_model or api_key or slower_than or server_dies
  rescore -> sync_check or rescored or async_check
  push_weights, weight_buckets, pack, serialize_bucket -> payload_roundtrip or several_buckets or script_trains
  connect_nccl, broadcast -> nccl_path
  recipes, checksums, hash_sent -> recipes or weight_check or weights_dropped or fuses_tensors
  save_checkpoint, load_checkpoint, latest_checkpoint, checkpoint_to_resume -> checkpoint or resume
  lock_out_dir, run_files, MetricsLog -> second_trainer or never_writes or full_disk
"""
import collections
import contextlib
import copy
import dataclasses
import glob
import inspect
import io
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

import grpo_sglang as g
import reward_fns
from reward_fns import (arithmetic_reward, extract_number, format_reward, get_reward_fn, gsm8k_reward,
                        safe_reward)

# the registries as reward_fns.py makes them (a student's own tasks and rewards included), before a test adds any:
# the messages that list them are derived from these, so registering a task or a reward changes no test
TASK_NAMES, REWARD_NAMES = ", ".join(sorted(reward_fns.TASKS)), ", ".join(sorted(reward_fns.REWARD_FNS))


# ---------------------------------------------------------------------------------------------
# Helpers: the fixtures, the stand-in server, the run helpers, the in-process step helpers, the serve.sh fake,
# and every constant that several tests share (one that a single test uses stands just above that test).

# -- a tiny model from a config, a free port, a process group of one

HERE = os.path.dirname(os.path.abspath(__file__))
# One thread for this process's own torch work (the stand-in's sampling, the in-process steps), as run() gives the
# script: with a thread per core, each op waits for every thread, and on cores that other processes also use that
# made the stand-in's rollouts 20-50x slower (a 4-step run 106 s against 35 s on 2 busy cores).
torch.set_num_threads(1)


WORDS = ["user", "assistant", "What", "is", "+", "?", "Answer", "with", "the", "number", "only", "."]


def build_tiny(d, arch="llama", chat_template=True, **overrides):
    """A 2-layer model of `arch` and a word-level tokenizer (with a chat template, unless a base model
    is wanted), built offline. Tiny configs of the architectures people train."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config
    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS + [str(d) for d in range(10)])}  # every answer of the task
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"], chat_template=template if chat_template else None)
    tok.save_pretrained(d)
    torch.manual_seed(0)
    common = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, eos_token_id=vocab["<|im_end|>"], pad_token_id=0,
                  bos_token_id=None)
    config = {"llama": lambda: LlamaConfig(**common, tie_word_embeddings=True),
              "llama_untied": lambda: LlamaConfig(**common, tie_word_embeddings=False),
              "qwen2": lambda: Qwen2Config(**common, tie_word_embeddings=True),
              "qwen3": lambda: Qwen3Config(**common, head_dim=8, tie_word_embeddings=False),
              "gemma2": lambda: Gemma2Config(**common, head_dim=8, sliding_window=16, final_logit_softcapping=2.0),
              "gemma3": lambda: Gemma3TextConfig(**common, head_dim=8, sliding_window=16, tie_word_embeddings=True)}[arch]()
    for k, v in overrides.items():
        setattr(config, k, v)
    AutoModelForCausalLM.from_config(config).save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama (tied embeddings) and a word-level tokenizer with a chat template."""
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def free_port(n=1):
    """A port P with P .. P + n - 1 free now (--nccl_port P: server k's group meets on P + k)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        with contextlib.ExitStack() as held:
            try:
                for k in range(1, n):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", p + k))
                return p
            except OSError:  # P + k is taken: another P
                continue


def dist_init():
    """A process group of one (gloo), as the trainer has on one CPU rank."""
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)


# -- the stand-in server: SGLang's endpoints, and the weights it is sent loaded the way SGLang loads them

def sglang_checksums(held, fuse=False):
    """What SGLang's /weights_checker answers for what one rank holds ({HF name: bf16 tensor}): the hash of each tensor
    (for CPU tensors, sglang.srt.managers.mm_utils.tensor_hash: the first 8 bytes of the sha256 of its bytes, as an
    integer, in hex), by SGLang's names: with `fuse`, q/k/v (weights and biases) as one qkv_proj, gate/up as one
    gate_up_proj, as SGLang holds them."""
    import hashlib
    held = dict(held)
    for n in [n for n in held if fuse and n.endswith(("q_proj.weight", "q_proj.bias", "gate_proj.weight"))]:
        fused, parts = (("qkv_proj", ("q_proj", "k_proj", "v_proj")) if "q_proj" in n else
                        ("gate_up_proj", ("gate_proj", "up_proj")))
        held[n.replace(parts[0], fused)] = torch.cat([held.pop(n.replace(parts[0], q)) for q in parts])
    sha = lambda t: hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy()).digest()
    return {n: "%016x" % int.from_bytes(sha(t)[:8], "big") for n, t in held.items()}


# The sampling parameters SGLang 0.5.16's /generate takes (sglang.srt.sampling.sampling_params.SamplingParams' API
# fields): any other key fails the request.
SGLANG_SAMPLING_PARAMS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "custom_params", "stream_interval", "logit_bias", "sampling_seed"}


class StandIn:
    """Speaks the SGLang endpoints the trainer uses; generates with a real copy of the model and
    loads every weight push with SGLang's own deserializer and bucket class: CUDA-IPC style payloads
    (/update_weights_from_tensor) and broadcasts over a gloo group joined with SGLang's own helper
    (/init_weights_update_group, /update_weights_from_distributed). Tracks the weight version like
    SGLang (the `weight_version` of the last update, reported in every /generate answer) and logs the
    flags of every push."""

    def __init__(self, model_dir, served_path=None, reject_updates=False, api_key="", fail_generate_after=None,
                 nan_logprobs=False, stall_generate_after=None, die_at_init=False, die_in_broadcast=False,
                 slow_generate=0.0, tp=1, miss_pushes=(), drop_weights=(), garble_rescores=None, drop_half=(),
                 fuse=False, checker=True, hold_generate_after=None, lp_shift=0.0, reload_after=None,
                 deterministic=False):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.eos = self.tok.eos_token_id
        self.served_path, self.reject, self.api_key = served_path or model_dir, reject_updates, api_key
        self.fail_after, self.nan, self.stall_after = fail_generate_after, nan_logprobs, stall_generate_after
        self.die_at_init, self.die_in_broadcast, self.slow = die_at_init, die_in_broadcast, slow_generate
        self.hold_after, self.release = hold_generate_after, threading.Event()  # /generate past N waits for release
        self.fault_at = None  # when it first failed a request (stalled, died, refused) as it was told to
        self.pushes, self.calls, self.lock, self.rollouts, self.rescores = [], collections.Counter(), threading.Lock(), [], []
        self.push_log, self.version, self.groups, self.generations = [], "default", {}, []
        self.in_flight, self.pushed_during_generation = collections.Counter(), []
        # tensor parallel: what each rank holds (bf16, by HF name); faults: versions whose push is acknowledged but
        # not applied at all (a missed push), whose tag is applied without the weights (dropped weights), or with only
        # every other tensor of each bucket (drop_half)
        self.tp, self.miss, self.drop, self.half = tp, set(miss_pushes), set(drop_weights), set(drop_half)
        self.ranks = [{n: p.detach().to(torch.bfloat16) for n, p in self.model.named_parameters()} for _ in range(tp)]
        self.fuse, self.checker = fuse, checker  # /weights_checker: q/k/v, gate/up fused as SGLang holds them; or none
        # (or (n, text): after n answers, `text` with HTTP 200, as a proxy's page or JSON cut short)
        self.garble = garble_rescores  # every re-scored sequence gets one logprob too few ("short"), the last one
        # None ("none"), for another token ("other_token") or its id reported as 0 ("id_0")
        self.digest, self.inits = self.weights_digest(), []
        self.dropped = []  # drop_half: the tensors it left out
        # what /update_weights_from_disk reloads (the model it serves), and after which training rollout request it
        # reloads them itself, tag kept (another client's reload between two turns or two rounds of a step)
        self.base, self.reload_after = copy.deepcopy(self.model.state_dict()), reload_after
        self.asked_text = []  # text prompts /generate was given (environments that ask the model)
        self.deterministic = deterministic  # every copy of a prompt sampled with the same seed
        self.shift = lp_shift  # added to every log-prob it reports (sampled and re-scored): a known sync-check gap
        self.context = self.model.config.max_position_embeddings
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def weights_digest(self):
        """Sampling is seeded by the weights it samples with: same weights, same completions."""
        import hashlib
        h = hashlib.sha1()
        for p in self.model.parameters():
            h.update(p.detach().to(torch.bfloat16).view(torch.int16).numpy().tobytes())
        return int(h.hexdigest()[:8], 16)

    def faulted(self):
        import time
        self.fault_at = self.fault_at or time.time()

    def close(self):
        self.http.shutdown()
        self.http.server_close()

    @torch.no_grad()
    def logprobs(self, ids):  # -> (len(ids)-1,) logprob of ids[i+1] given ids[:i+1]
        logits = self.model(torch.tensor([ids])).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def sample(self, ids, sp, seed, nan=False):
        gen, out, lps, fin = torch.Generator().manual_seed(seed), [], [], {"type": "length", "length": sp["max_new_tokens"]}
        for _ in range(sp["max_new_tokens"]):
            logits = self.model(torch.tensor([ids + out])).logits[0, -1].float()
            t = sp.get("temperature", 1.0)
            lp = torch.log_softmax(logits / (t if t > 0 else 1.0), -1)
            nxt = int(lp.argmax()) if t == 0 else int(torch.multinomial(lp.exp(), 1, generator=gen))
            out.append(nxt)
            lps.append([float("nan") if nan else float(lp[nxt]) + self.shift, nxt, None])
            if nxt == self.eos:  # like SGLang: the EOS token is part of output_ids
                fin = {"type": "stop", "matched": nxt}
                break
            said = self.tok.decode(out, skip_special_tokens=True)  # like SGLang: a stop string ends the reply, its
            hit = next((x for x in sp.get("stop") or [] if x in said), None)  # tokens kept in output_ids
            if hit is not None:
                fin = {"type": "stop", "matched": hit}
                break
        return {"text": "", "output_ids": out, "meta_info": {"output_token_logprobs": lps, "finish_reason": fin,
                                                              "completion_tokens": len(out), "weight_version": self.version}}

    def prefill(self, ids, start):
        """Like SGLang: the raw logprobs (temperature 1) of ids[start:], the first one None (its context is not
        scored), and no new token."""
        lps, top = [None] + (self.logprobs(ids)[start:] + self.shift).tolist(), self.model.config.vocab_size - 1  # ids >= top: 0
        return {"text": "", "output_ids": [], "meta_info": {"input_token_logprobs": [[lp, t if t < top else 0, None]
                                                                                     for lp, t in zip(lps, ids[start:])],
                                                             "output_token_logprobs": [], "weight_version": self.version,
                                                             "finish_reason": {"type": "length", "length": 0}}}

    def load(self, named, req, rank=0):
        version = req.get("weight_version")
        if version in self.miss | self.drop:  # acknowledged, not applied; a server that drops weights keeps the tag
            self.version = version if version in self.drop and rank == 0 else self.version
            return
        if version in self.half:  # every other tensor of the bucket loaded, the rest dropped (their names kept)
            self.dropped += [n for n, _ in named[1::2]] if rank == 0 else []
            named = named[::2]
        self.ranks[rank].update({n: t.to(torch.bfloat16).clone() for n, t in named})
        if rank:
            return
        sd = self.model.state_dict()
        for name, t in named:
            sd[name].copy_(t)
        self.digest = self.weights_digest()
        self.push_log.append({k: req.get(k) for k in ("flush_cache", "weight_version", "load_format")})
        if req.get("weight_version") is not None:
            self.version = req["weight_version"]
        self.pushes.append({n: t.clone() for n, t in named})

    def reload(self, req):
        """/update_weights_from_disk of the model it serves: its weights as loaded at start; the tag only if given."""
        self.model.load_state_dict(self.base)
        self.ranks = [{n: p.detach().to(torch.bfloat16) for n, p in self.model.named_parameters()} for _ in range(self.tp)]
        self.digest = self.weights_digest()
        self.version = req.get("weight_version") or self.version

    def checksums(self, rank):  # tensor parallel: of each matrix the rank's shard of rows, as a TP server holds it
        return sglang_checksums({n: t.chunk(self.tp)[rank] if t.dim() > 1 else t for n, t in self.ranks[rank].items()},
                                self.fuse)

    def load_tensor(self, req):
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
        assert len(req["serialized_named_tensors"]) == self.tp, "one payload per TP rank"
        for rank, payload in enumerate(req["serialized_named_tensors"]):
            obj = MultiprocessingSerializer.deserialize(payload)
            self.load(FlattenedTensorBucket(flattened_tensor=obj["flattened_tensor"], metadata=obj["metadata"]).reconstruct_tensors(),
                      req, rank)

    def join_group(self, req):
        """Every TP rank joins at rank_offset + its rank, at the same time (each blocks until all have joined). One
        rank: with SGLang's own helper. Several in this one process: torch registers a group by name once per process,
        so each rank builds the same group unregistered, its store keys prefixed as SGLang's helper and torch prefix them."""
        import torch.distributed as dist
        from datetime import timedelta
        from sglang.srt.utils import init_custom_process_group  # what SGLang's server calls
        self.groups[req["group_name"]] = groups = [None] * self.tp
        init, world, name = f"tcp://{req['master_address']}:{req['master_port']}", req["world_size"], req["group_name"]

        def join(rank):
            if self.tp == 1:
                groups[rank] = init_custom_process_group(backend=req["backend"], init_method=init, world_size=world,
                                                         rank=req["rank_offset"], group_name=name)
                return
            store, _, _ = next(dist.rendezvous(init, req["rank_offset"] + rank, world, timeout=timedelta(seconds=60)))
            store = dist.PrefixStore("cpu/", dist.PrefixStore(f"{name}/", dist.PrefixStore(name, store)))  # the helper's keys
            groups[rank] = dist.ProcessGroupGloo(store, req["rank_offset"] + rank, world, timedelta(seconds=60))
        self.each_rank(join)

    def each_rank(self, fn):
        threads = [threading.Thread(target=fn, args=(rank,)) for rank in range(self.tp)]
        [t.start() for t in threads]
        [t.join() for t in threads]

    def load_distributed(self, req):
        """Like SGLang 0.5.16's flattened_bucket path: one receive buffer laid out by its bucket class."""
        import torch.distributed as dist
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
        assert req["load_format"] == "flattened_bucket" and set(req["dtypes"]) == {"bfloat16"}, req
        buckets = [FlattenedTensorBucket(named_tensors=[(n, torch.empty(shape, dtype=getattr(torch, d))) for n, d, shape in
                                                        zip(req["names"], req["dtypes"], req["shapes"])]) for _ in range(self.tp)]
        group = self.groups[req["group_name"]]
        recv = (lambda rank: dist.broadcast(buckets[rank].get_flattened_tensor(), src=0, group=group[rank])) if self.tp == 1 else (
            lambda rank: group[rank].broadcast([buckets[rank].get_flattened_tensor()], dist.BroadcastOptions()).wait())
        self.each_rank(recv)
        for rank in reversed(range(self.tp)):  # rank 0 last: it sets the version
            self.load(buckets[rank].reconstruct_tensors(), req, rank)

    def _handler(self):
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, obj, code=200):
                body = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def authorized(self):
                if srv.api_key and self.headers.get("Authorization") != f"Bearer {srv.api_key}":
                    self.reply({"error": "Unauthorized"}, 401)
                    return False
                return True

            def do_GET(self):
                srv.calls[self.path] += 1
                if not self.authorized():
                    return
                if self.path in ("/health", "/health_generate"):
                    return self.reply("")
                if self.path == "/model_info":
                    return self.reply({"model_path": srv.served_path, "is_generation": True, "weight_version": srv.version})
                if self.path == "/server_info":
                    return self.reply({"tp_size": srv.tp, "port": srv.http.server_address[1]})
                if self.path == "/v1/models":  # the server's context length, as SGLang's model card says it
                    return self.reply({"data": [{"id": srv.served_path, "max_model_len": srv.context}]})
                self.reply({"detail": "Not Found"}, 404)

            def do_POST(self):
                srv.calls[self.path] += 1
                if "update_weights" in self.path:  # was a generation still running when this push arrived?
                    srv.pushed_during_generation.append(srv.in_flight["/generate"])
                srv.in_flight[self.path] += 1
                try:
                    self.post()
                finally:
                    srv.in_flight[self.path] -= 1

            def post(self):
                if not self.authorized():
                    return
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/generate" and srv.stall_after is not None and srv.calls["/generate"] > srv.stall_after:
                    import time
                    srv.faulted()
                    time.sleep(20)  # a hung scheduler: accepts the request, never answers in time
                if self.path == "/generate" and srv.hold_after is not None and srv.calls["/generate"] > srv.hold_after:
                    srv.release.wait(120)  # held until the test lets it go
                if self.path == "/init_weights_update_group":
                    if srv.die_at_init:  # the server is gone: the connection drops, nobody joins the group
                        srv.faulted()
                        self.close_connection = True
                        return
                    srv.inits.append(req)
                    srv.join_group(req)  # blocks until the trainer joins, as SGLang's does
                    return self.reply({"success": True, "message": "Succeeded to initialize custom process group."})
                with srv.lock:
                    if self.path == "/generate":
                        if srv.fail_after is not None and srv.calls["/generate"] > srv.fail_after:
                            srv.faulted()
                            return self.reply({"error": "stand-in: scheduler died"}, 503)
                        try:
                            return self.reply(self.generate(req))
                        except ValueError as e:  # a request SGLang refuses: HTTP 400, its reason
                            return self.reply({"object": "error", "message": str(e)}, 400)
                    if self.path in ("/update_weights_from_tensor", "/update_weights_from_distributed"):
                        if srv.reject:
                            srv.faulted()
                            return self.reply({"success": False, "message": "Failed to update weights: test"}, 400)
                        if self.path == "/update_weights_from_tensor":
                            srv.load_tensor(req)
                        elif srv.die_in_broadcast:  # gone mid-update: no receive, no answer
                            srv.faulted()
                            self.close_connection = True
                            return
                        else:
                            srv.load_distributed(req)
                        return self.reply({"success": True, "message": "Succeeded to update model weights."})
                    if self.path == "/update_weights_from_disk":
                        srv.reload(req)
                        return self.reply({"success": True, "message": "Succeeded to update model weights."})
                    if self.path == "/update_weight_version":
                        srv.version = req["new_version"]
                        return self.reply({"success": True, "new_version": srv.version})
                    if self.path == "/destroy_weights_update_group":
                        return self.reply({"success": srv.groups.pop(req["group_name"], None) is not None, "message": ""})
                    if self.path == "/flush_cache":
                        return self.reply("Cache flushed.")
                    if self.path == "/weights_checker" and type(srv.checker) is tuple and (
                            srv.calls[self.path] > srv.checker[0]):
                        return self.reply(srv.checker[1])
                    if self.path == "/weights_checker" and srv.checker and req.get("action") == "checksum":
                        return self.reply({"success": True, "message": "", "ranks": [
                            {"checksums": srv.checksums(r), "per_gpu_checksum": "", "parallelism_info": {
                                "tp_rank": r, "tp_size": srv.tp, "dp_rank": 0, "dp_size": 1, "pp_rank": 0, "pp_size": 1,
                                "rank": r, "size": srv.tp}} for r in range(srv.tp)]})
                self.reply({"detail": "Not Found"}, 404)

            def generate(self, req):
                if "text" in req:  # a text prompt (an environment asking the model): its text back, as SGLang
                    sp = req.get("sampling_params", {})
                    o = srv.sample(srv.tok(req["text"])["input_ids"], {"max_new_tokens": 16, **sp}, seed=0)
                    srv.asked_text.append(req["text"])
                    return {**o, "text": srv.tok.decode(o["output_ids"], skip_special_tokens=True)}
                ids, sp = req["input_ids"], req.get("sampling_params", {})
                sps = sp if isinstance(sp, list) else [sp] * len(ids)  # one per prompt, or one for all (as SGLang)
                sp = sps[0] if sps else {}
                unknown = {k for q in sps for k in q} - SGLANG_SAMPLING_PARAMS
                if unknown:  # SGLang's SamplingParams takes no other keyword: the request fails
                    raise ValueError(f"SamplingParams got unexpected keyword arguments {sorted(unknown)}")
                if sp.get("max_new_tokens") == 0:  # a prefill: logprobs of the input tokens, as SGLang returns them
                    starts = req["logprob_start_len"]
                    srv.rescores.append([tuple(p) for p in ids])
                    out = [srv.prefill(p, start) for p, start in zip(ids, starts if isinstance(starts, list) else [starts] * len(ids))]
                    for lps in (o["meta_info"]["input_token_logprobs"] for o in out if srv.garble):
                        if srv.garble == "short":
                            lps.pop()
                        else:  # the last logprob None, that of another token, or its id reported as 0 (SGLang's >= V - 1)
                            lp, t = lps[-1][:2]
                            lps[-1] = {"none": [None, t, None], "other_token": [lp, t + 1, None], "id_0": [lp, 0, None]}[srv.garble]
                    return out
                if sp.get("temperature", 1.0) > 0:
                    srv.rollouts.append([tuple(p) for p in ids])  # what each training rollout asked for
                    import time
                    time.sleep(srv.slow)  # a server busy long enough that a premature push would overlap
                # the k-th copy of a prompt gets the k-th seed, wherever it sits in the request: the same
                # prompts give the same samples whether one rank or two ask for them
                seen, seeds = collections.Counter(), []
                for p in ids:
                    seen[tuple(p)] += 1
                    seeds.append(hash((tuple(p), 0 if srv.deterministic else seen[tuple(p)], srv.digest)) % 2**31)
                nan = srv.nan is True or (sp.get("temperature", 1.0) > 0 and len(srv.rollouts) in (srv.nan or ()))
                out = [srv.sample(p, q, seed=s, nan=nan) for p, q, s in zip(ids, sps, seeds)]
                if sp.get("temperature", 1.0) > 0:  # training rollouts: (prompt, completion, logprobs)
                    srv.generations += [(p, o["output_ids"], [lp for lp, *_ in o["meta_info"]["output_token_logprobs"]])
                                        for p, o in zip(ids, out)]
                    if len(srv.rollouts) == srv.reload_after:  # then another client reloads its weights from disk
                        srv.reload({})
                return out

        return H


@pytest.fixture
def server(tiny_model):
    s = StandIn(tiny_model)
    yield s
    s.close()


def assert_server_has(pushed, trainer):
    assert set(pushed) == set(trainer), (sorted(pushed), sorted(trainer))
    for n, t in trainer.items():
        assert torch.equal(pushed[n], t.to(torch.bfloat16)), n


def assert_every_rank_has(s, trainer):
    for rank, held in enumerate(s.ranks):
        assert set(held) == set(trainer), rank
        assert all(torch.equal(held[n], t.to(torch.bfloat16)) for n, t in trainer.items()), rank


def held_differ(s, out_dir, step=None):
    """(how many of the tensors a stand-in holds, by its names, differ from the trainer's last checkpoint (or that of
    `step`) in bf16, how many it holds)"""
    held = sglang_checksums(s.ranks[0], s.fuse)
    trainer = sglang_checksums({n: t.to(torch.bfloat16) for n, t in ckpt_weights(out_dir, step).items()}, s.fuse)
    return sum(held[n] != trainer[n] for n in held), len(held)


# -- the script run as a user runs it: a subprocess, 1 process or torchrun with 2

# A user's rewards, registered the way reward_fns.py says, for runs that need a signal whatever the tiny model samples
# ('has_number': the completion holds the word 'number', which it does in some of a group and not in others)
# or a reward that cannot be the accuracy ('always_1').
WITH_REWARDS = os.path.join(HERE, "runs", "with_test_rewards.py")
# A user's tasks of episodes, registered the way reward_fns.py says: 'talk' asks "What is the number ?" after the
# first reply and ends after the second (its reward: has_number on the last reply); 'one_turn' is arithmetic with
# an environment that ends every episode at once.
TEST_TASKS = """
def talk_env(messages, answer):
    return None if len(messages) >= 4 else "What is the number ?"
reward_fns.TASKS["talk"] = reward_fns.Task("has_number", lambda c, a: "number" in c.split(), env=talk_env, max_turns=3,
                                           rows=reward_fns.arithmetic_rows)
reward_fns.TASKS["one_turn"] = dataclasses.replace(reward_fns.TASKS["arithmetic"], env=lambda m, a: None, max_turns=3)
def raising_env(messages, answer):  # a student's environment that reads a number the reply may not hold
    return "the number ?" if int("reply: " + messages[-1]["content"]) else None
reward_fns.TASKS["raising"] = dataclasses.replace(reward_fns.TASKS["talk"], env=raising_env)
reward_fns.TASKS["lookup"] = reward_fns.Task("has_number", lambda c, a: "number" in c.split(), rows=lambda: [
    {"question": f"What is the number {k} ?", "answer": str(k)} for _ in range(10) for k in range(8)])
reward_fns.TASKS["reward_fn_given"] = reward_fns.Task(reward_fns.gsm8k_reward, reward_fns.gsm8k_correct)
def rank_env(messages, answer):  # rank 1's episodes take up to 3 replies, rank 0's one: the ranks' batches differ
    return "What is the number ?" if __import__("os").environ.get("RANK") == "1" and len(messages) < 6 else None
reward_fns.TASKS["rank_turns"] = dataclasses.replace(reward_fns.TASKS["talk"], env=rank_env)
def sandboxed_env(messages, answer, warnings):  # 'talk', whose first reply runs code in the real sandbox: refused
    reply = [{"role": "assistant", "content": "python: import socket"}]
    return reward_fns.python_env(reply, answer, warnings) if len(messages) < 4 else None
reward_fns.TASKS["sandboxed"] = dataclasses.replace(reward_fns.TASKS["talk"], env=sandboxed_env)
"""


def train_cmd(model_dir, url, out_dir, *extra, nproc=1, rewards=False):
    if rewards:
        os.makedirs(os.path.dirname(WITH_REWARDS), exist_ok=True)
        with open(WITH_REWARDS + f".{os.getpid()}", "w") as f:  # then one atomic rename: tests may run in parallel
            f.write(f"import dataclasses, runpy, sys\nsys.path.insert(0, {HERE!r})\nimport reward_fns\n"
                    "reward_fns.REWARD_FNS.update(has_number=lambda c, a: float('number' in c.split()), always_1=lambda c, a: 1.0)\n"
                    "reward_fns.REWARD_FNS['boom'] = lambda c, a: 1 / 0  # a student's reward that raises\n"
                    "reward_fns.TASKS['boom'] = reward_fns.Task('boom', lambda c, a: False, rows=reward_fns.arithmetic_rows)\n"
                    + TEST_TASKS +
                    f"runpy.run_path({os.path.join(HERE, 'grpo_sglang.py')!r}, run_name='__main__')\n")
        os.replace(WITH_REWARDS + f".{os.getpid()}", WITH_REWARDS)
    script = WITH_REWARDS if rewards else os.path.join(HERE, "grpo_sglang.py")
    small = () if "--dataset" in extra else ("--builtin_max_operand", "2")  # (it sizes the built-in rows only)
    flags = ["--model", model_dir, "--server_url", url, "--out_dir", str(out_dir), "--dataset", "builtin",
             *small, "--eval_size", "2", "--steps", "2", "--prompts_per_step", "2",
             "--group_size", "4", "--max_new_tokens", "5", "--lr", "3e-2", "--micro_batch", "4", "--device", "cpu",
             "--save_every", "1", "--eval_every", "2", "--request_retries", "1", "--no-async", *extra]  # --async: later wins
    if nproc == 1:
        return [sys.executable, script, *flags]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), f"--master_port={free_port()}",
            script, *flags]


def run(cmd, timeout=300):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1")
    # output to a file, not a pipe: torch's shared-memory manager (CPU tensors shared by file name)
    # outlives the trainer and would hold a pipe open
    import tempfile
    with tempfile.NamedTemporaryFile("w+") as f:
        p = Forked.start(cmd, env, f.name) or subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True,
                                                               env=env, cwd=HERE)
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:  # a hung run must not slow every later test: end all of it
            kill_tree(p.pid)
            raise
        f.seek(0)
        return code, f.read()


ZYGOTE = r"""import json, os, runpy, signal, sys, traceback, warnings
os.environ.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # as run() gives every run
import requests, safetensors.torch, torch, torch.distributed.fsdp, torch.distributed.checkpoint.state_dict
import torch.distributed.run, torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler as sh
import transformers, transformers.masking_utils
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from sglang.srt.utils import MultiprocessingSerializer
from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
FRESH = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}


def python(argv, env, out=None, worker=False):
    # in a forked child: `python [-u] SCRIPT ARGS` as a fresh interpreter runs it (its signal handlers, environment,
    # argv, sys.path, unbuffered output: to the file `out`, else to this process's); a worker of torchrun's ends
    # without its launcher's atexit handlers
    for sig, handler in FRESH.items():
        signal.signal(sig, handler)
    if out:
        fd = os.open(out, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1), os.dup2(fd, 2), os.close(fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")
    os.environ.clear(), os.environ.update(env)
    argv = argv[1:] if argv[0] == "-u" else argv
    try:
        if argv[:2] == ["-m", "torch.distributed.run"]:  # torchrun itself; it forks its workers (below)
            sys.argv = ["torchrun", *argv[2:]]
            runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[0] = argv, os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:  # as Python exits: an int, None (0) or a message (printed, 1)
        code = e.code if isinstance(e.code, int) or e.code is None else print(e.code) or 1
    except BaseException:
        traceback.print_exc()
        code = 1
    if worker:
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)  # (atexit handlers and non-daemon threads as at any interpreter's end)


class Worker:
    # torchrun's worker, forked (not `python -u SCRIPT`), in a session of its own as torchrun starts it
    def __init__(self, handler, args, env):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # (torchrun's store runs a thread)
            self.pid, self.returncode, self.args = os.fork(), None, args
        if self.pid == 0:
            os.setsid()
            python(list(args[1:]), env, worker=True)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            self.returncode = os.waitstatus_to_exitcode(status) if pid else None
        return self.returncode

    def wait(self, timeout=None):
        import subprocess, time
        end = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if end is not None and time.time() > end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode


sh.SubprocessHandler._popen = lambda self, args, env: Worker(self, args, env)
assert len(os.listdir("/proc/self/task")) == 1  # no thread when it forks (datasets' pyarrow would start one)
for line in sys.stdin:  # {argv, env, out} -> the run's pid, then its exit code
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        python(req["argv"], req["env"], req["out"])
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class Forked:
    """A run of a script (in one process, or torchrun's) forked from a Python that has imported torch,
    transformers and SGLang's classes once (the zygote, one per test process), and not started afresh: the imports
    are most of a run's start-up (~9 s of a 10 s 2-step run; ~15 s of torchrun's with 2 workers). The run is a
    child of its own with the script as __main__, as `python SCRIPT ARGS` runs it, and nothing of the tests' process
    in it: none of this project's modules are imported before it runs. torchrun runs as itself and forks its workers
    where it would start them (each in a session of its own). Tests that start a run themselves (a signal, a second
    trainer) run a fresh Python (but kill -9's, which forks it here too), and so does a run while another is on (a
    thread's), and every run once the zygote has failed (its error is in the test's output)."""
    lock, zygote, pending = threading.Lock(), None, False

    def __init__(self, pid, cmd):
        self.pid, self.cmd = pid, cmd

    @classmethod
    def line(cls, timeout=None):
        """The zygote's next line, read unbuffered (select then sees all that is left), or None after `timeout`."""
        import select
        got = b""
        while not got.endswith(b"\n"):
            if not select.select([cls.zygote.stdout], [], [], timeout)[0]:
                return None
            got += os.read(cls.zygote.stdout.fileno(), 1) or b"?\n"  # (b"": it died)
        return got.decode()

    @classmethod
    def start(cls, cmd, env, out):
        """-> the run (pid, wait(timeout)), or None: not a script's run, the zygote busy or gone."""
        if cmd[0] != sys.executable or not (cmd[1].endswith(".py") or cmd[1:3] == ["-m", "torch.distributed.run"]):
            return None
        if cls.zygote is False:
            return None
        if not cls.lock.acquire(blocking=False):
            return None
        try:
            if cls.pending:  # the exit code of a run that timed out (and was killed)
                cls.line()
                cls.pending = False
            if cls.zygote is None or cls.zygote.poll() is not None:
                cls.zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, cwd=HERE, env=dict(os.environ, OMP_NUM_THREADS="1"))
            cls.zygote.stdin.write((json.dumps({"argv": cmd[1:], "env": env, "out": out}) + "\n").encode())
            cls.zygote.stdin.flush()
            pid = int(cls.line())
        except (OSError, ValueError):  # it died: a fresh Python runs this run and every later one
            cls.zygote = False
            cls.lock.release()
            return None
        return cls(pid, cmd)

    def wait(self, timeout=None):
        try:
            code = self.line(timeout)
            if code is None:
                Forked.pending = True
                raise subprocess.TimeoutExpired(self.cmd, timeout)
            return int(code)
        finally:
            Forked.lock.release()

    def kill(self):
        os.kill(self.pid, 9)


def kill_tree(pid):
    """Kill a process and every descendant: torchrun starts each worker in a session of its own, so killing
    torchrun (or its process group) leaves them running."""
    import psutil
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for q in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            q.kill()
    psutil.wait_procs(procs, timeout=10)


def ckpt_weights(out_dir, step=None):
    from transformers import AutoModelForCausalLM
    d = g.latest_checkpoint(str(out_dir)) if step is None else out_dir if step == "base" else os.path.join(
        out_dir, f"step_{step}")  # ("base": a model's own folder)
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    return {n: p.detach() for n, p in m.named_parameters()}


def read_metrics(out_dir):
    return [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]


def run_against(model_dir, tmp_path, fault, *flags, tool=()):
    """The script (or a `tool` that runs it: its path and flags) against a stand-in with `fault` (StandIn options)
    -> (exit code, output, seconds from the stand-in's first fault to the run's end (from its start if none: a
    start-up that a slow machine makes long is not counted), stand-in)."""
    import time
    s = StandIn(model_dir, **fault)
    try:
        t0 = time.time()
        cmd = train_cmd(model_dir, s.url, tmp_path, *flags)
        code, out = run([cmd[0], *tool, *cmd[2:]] if tool else cmd, timeout=120)
        return code, out, time.time() - (s.fault_at or t0), s
    finally:
        s.close()


def mixed_lengths_data(path, n=40):
    """Questions of different token lengths (as GSM8K's), in the tiny model's vocabulary."""
    q = lambda i: "What is " + " + ".join(["1"] * (1 + i % 7)) + " ?"
    path.write_text("".join(json.dumps({"question": q(i), "answer": str(1 + i % 7)}) + "\n" for i in range(n)))
    return str(path)


# -- runs and checkpoints that several tests share, and the ways to break a checkpoint

@pytest.fixture(scope="session")
def two_step_run(tiny_model, tmp_path_factory):
    """A finished 2-step run (its checkpoint step_2 alone, metrics of steps 0-2), for tests to copy and break."""
    d, s = tmp_path_factory.mktemp("two_step_run"), StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, d, "--keep_checkpoints", "1"))
        assert code == 0, out
    finally:
        s.close()
    return d


def files_of(d):
    """-> {path: bytes} of every file under d but the run's lock."""
    import pathlib
    return {p: p.read_bytes() for p in sorted(pathlib.Path(d).rglob("*")) if p.is_file() and p.name != ".lock"}


def cut_in_half(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def edit_state(p, **kw):
    torch.save({k: v for k, v in {**torch.load(p, weights_only=True), **kw}.items() if v is not None}, p)


def edit_config(d, **kw):
    (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), **kw}, indent=1))


class Killed(Exception):
    """A run stopped dead right after a checkpoint, as kill -9 would stop it."""


def run_here(model_dir, url, out_dir, *extra, spy=None, kill_after=None):
    """The script's main() in this process (a run of one rank, no torchrun), on the stand-in at `url`, with the
    test rewards registered; spy(seqs, cfg) sees the step's table as train() gets it; kill_after: stop dead once the
    checkpoint of that step is written."""
    import torch.distributed as dist
    cfg = g.parse_config(train_cmd(model_dir, url, out_dir, *extra)[2:])
    train, save, sharing = g.train, g.save_checkpoint, torch.multiprocessing.get_sharing_strategy()

    def spied(cfg, model, opt, seqs, *a):
        spy and spy(seqs, cfg)
        return train(cfg, model, opt, seqs, *a)

    def saved(cfg, model, opt, tok, step, state=None):  # (the steps' state passed through)
        save(cfg, model, opt, tok, step, state)
        if step == kill_after:
            raise Killed
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(g, "train", spied), mp.setattr(g, "save_checkpoint", saved)
        mp.setitem(reward_fns.REWARD_FNS, "has_number", lambda c, a: float("number" in c.split()))
        mp.setattr(reward_fns, "TASKS", dict(reward_fns.TASKS))
        exec(TEST_TASKS, {"reward_fns": reward_fns, "dataclasses": dataclasses})
        try:
            g.main(cfg)
        except Killed:
            pass
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            torch.multiprocessing.set_sharing_strategy(sharing)


def stopped_and_resumed(model_dir, out_dir, *flags, script=None):
    """A run of 4 steps at once ('ref'), and the same stopped after step 2 and resumed ('resumed'), each against a
    stand-in of its own (the test rewards and tasks registered; `script`: a copy of the trainer) -> {key: (its training
    rows without timings, its final weights, its stand-in)}."""
    got = {}
    for key, steps in (("ref", ("4",)), ("resumed", ("2", "4"))):
        s = StandIn(model_dir)
        try:
            for n in steps:
                resume = ("--resume",) if n == "4" and key == "resumed" else ()
                cmd = train_cmd(model_dir, s.url, out_dir / key, *flags, "--steps", n, "--save_every", "2", *resume,
                                rewards=script is None)
                code, out = run(cmd if script is None else [cmd[0], script, *cmd[2:]])
                assert code == 0, out
        finally:
            s.close()
        got[key] = ([{k: v for k, v in r.items() if not k.startswith(("time", "span", "rollout_"))}
                     for r in read_metrics(out_dir / key) if "loss" in r], ckpt_weights(out_dir / key), s)
    return got


# The runs that a few tests below share: 5 steps, checkpoints every 2 (and at the end) of which the newest 2 are kept,
# a warmup and a cosine decay, DAPO's overlong penalty, a seed that is not the default; once uninterrupted, once
# stopped dead after its step-2 checkpoint and resumed (without --seed: the run's own comes back).
RESUMED_FLAGS = ("--steps", "5", "--save_every", "2", "--keep_checkpoints", "2", "--lr_warmup_steps", "1",
                 "--lr_schedule", "cosine", "--min_lr_ratio", "0.5", "--max_new_tokens", "6", "--overlong_buffer", "4",
                 "--overlong_penalty", "0.5", "--reward", "has_number", "--eval_every", "0")


@pytest.fixture(scope="module")
def resumed_runs(tiny_model, tmp_path_factory):
    from types import SimpleNamespace
    d = tmp_path_factory.mktemp("resumed")
    got = {}
    for key in ("ref", "resumed"):
        s, tables = StandIn(tiny_model), []
        spy = lambda seqs, cfg: tables.append({k: seqs[k].clone() if torch.is_tensor(seqs[k]) else list(seqs[k])
                                               for k in ("adv", "length", "text", "reward")})
        try:
            run_here(tiny_model, s.url, d / key, *RESUMED_FLAGS, "--seed", "7", spy=spy,
                     kill_after=2 if key == "resumed" else None)
            n = len(s.generations)
            if key == "resumed":
                run_here(tiny_model, s.url, d / key, *RESUMED_FLAGS, "--resume", spy=spy)
        finally:
            s.close()
        got[key] = SimpleNamespace(dir=d / key, metrics=[r for r in read_metrics(d / key) if "loss" in r],
                                   stand_in=s, tables=tables, served_first=n)
    return got["ref"], got["resumed"]


# -- one step in-process: a rollout whose rewards the tests know, the step main() takes, FSDP's steps

def grpo_advantages(rewards, G, std=None, eps=1e-4):
    """GRPO's advantages written out here: (r - the group's mean) / (the group's unbiased std, or `std`, + eps); a
    group of equal rewards gets 0."""
    import statistics
    out = []
    for k in range(0, len(rewards), G):
        grp = rewards[k: k + G]
        s = statistics.stdev(grp) if std is None else std
        out += [0.0 if max(grp) == min(grp) else (r - sum(grp) / G) / (s + eps) for r in grp]
    return out


def scoring(model):
    """What shard() gives a model, here without FSDP: its method token_logprobs (completion_logprobs calls it)."""
    import functools
    model.token_logprobs = functools.partial(g.token_logprobs, model)
    return model


def sharded(path, frozen=False, noise=0.0):
    """The trainer's policy (or, frozen, its reference) on one CPU rank; `noise`: its weights moved at random."""
    from torch.distributed.device_mesh import init_device_mesh
    model = g.load_policy(path, torch.device("cpu"), False)
    with torch.no_grad():
        for p in model.parameters() if noise else ():
            p.add_(noise * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return g.shard(model, init_device_mesh("cpu", (1,)), torch.bfloat16, frozen=frozen)


def as_trained(model, seqs, micro_batch, temperature):
    """(N, C) log-probs and (N, C) entropies of the table's sequences scored through the micro-batches train() cuts
    (the same packed forwards as the step's own: the same numbers, bit for bit, on any CPU)."""
    lp, ent = torch.zeros_like(seqs["mask"]), torch.zeros_like(seqs["mask"])
    with torch.no_grad():
        for b in g.micro_batches(seqs, micro_batch, 0):
            lp[b["rows"], : b["C"]], ent[b["rows"], : b["C"]] = g.completion_logprobs(model, b, temperature)
    return lp, ent


# A step's rollout whose rewards the tests know: 3 prompts x 4 completions of 2-5 tokens (EOS last), 5 of them
# rewarded ('good'): two in group 0, two in group 1, one in group 2.
PROMPTS = [[4, 5, 6, 8], [6, 7], [9, 4, 10]]
COMPLETIONS = [[11 + (k * 5 + j) % 13 for j in range(1 + k % 4)] + [3] for k in range(12)]
GOOD = [0, 3, 5, 6, 9]


class KnownTok:
    def decode(self, ids, skip_special_tokens):
        return "good" if COMPLETIONS.index(list(ids)) in GOOD else "bad"


def single_turns(rows, outs, tok, group_size, temperature=1.0, version=0):
    """A rollout batch of one-turn episodes, as rollout() builds it: outs [(completion ids, the server's log-probs,
    finish)], completion k of prompt row k // group_size, its text decoded by `tok`."""
    eps = [{"prompt": rows[k // group_size]["ids"], "completion": list(c), "mask": [1] * len(c), "server_lp": list(lps),
            "answer": rows[k // group_size]["answer"], "task": rows[k // group_size].get("task", "t"), "turns": 1,
            "finish": fin,
            "messages": [{"role": "user", "content": "?"},
                         {"role": "assistant", "content": tok.decode(c, skip_special_tokens=True)}]}
           for k, (c, lps, fin) in enumerate(outs)]
    return {"rows": rows, "version": version, "srv": [0] * len(outs), "episodes": eps, "span": (0.0, 0.0),
            "sampling": {"temperature": temperature, "top_p": 1.0, "top_k": -1, "max_new_tokens": 256}}


def table(rows, outs, tok, group_size, temperature=1.0):
    """-> the step's table of one-turn episodes (single_turns)."""
    return g.sequences(single_turns(rows, outs, tok, group_size, temperature), group_size, "cpu")


def one_task(loaded):
    """load_data's answer of a run of one task -> (tokenizer, train rows, eval rows, the task)."""
    (task,) = loaded[3].values()
    return (*loaded[:3], task)


def task_of(reward, correct=lambda c, a: 0.0):
    """The tasks as load_data makes them, for score(), of one task "t" (single_turns' rows): reward_fn(sample, warnings)
    -> (reward, parts), correct(text, answer)."""
    from types import SimpleNamespace
    return {"t": SimpleNamespace(reward_fn=reward, correct=correct)}


def known_batch(temperature=1.0):
    """PROMPTS x COMPLETIONS as the server's rollout of version 0 (its log-probs: any)."""
    return single_turns([{"ids": p, "answer": "1"} for p in PROMPTS], [(c, [-3.0] * len(c), "stop") for c in COMPLETIONS],
                        KnownTok(), 4, temperature)


def one_step(cfg, model, batch, tok, reward, weight=None, ref=None):
    """One step in-process, the way main() runs it: the table, micro-batches, the no-grad forwards, rewards,
    advantages and weights, then train(). batch: a rollout batch (known_batch), or {rows, outs} of one-turn episodes
    sampled at cfg.temperature. -> (the table, the step's metrics)."""
    if "outs" in batch:
        batch = single_turns(batch["rows"], batch["outs"], tok, cfg.group_size, cfg.temperature)
    seqs = g.sequences(batch, cfg.group_size, "cpu")
    mbs = g.micro_batches(seqs, cfg.micro_batch, 0)
    g.old_and_ref_logprobs(cfg, model, ref, seqs, mbs)
    m = g.Metrics()
    g.score(seqs, task_of(lambda s, w: (reward(s["text"], s["answer"]), {})), cfg.group_size, m)
    seqs["adv"] = g.advantages(cfg, seqs["reward"])
    seqs["weight"] = torch.ones_like(seqs["adv"]) if weight is None else weight
    g.train(cfg, model, torch.optim.SGD(model.parameters(), lr=0.05), seqs, mbs, 1, lambda seqs, m: None, m)
    return seqs, m.reduce("cpu")


def fsdp_steps(d, checkpointing, steps=3, **shard_kw):
    """shard() a tiny policy and run `steps` optimizer steps the way the trainer orders its forwards: a no-grad
    forward (the old policy's / the sync check's), then forward, backward, AdamW. -> (every log-prob, the final
    weights, whether the blocks' weights were still gathered after a forward, the first step's gradients)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    torch.manual_seed(0)
    model = g.shard(g.load_policy(d, torch.device("cpu"), checkpointing), init_device_mesh("cpu", (1,)), torch.bfloat16,
                    **shard_kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = g.pack_batch([{"prompt": [4, 5, 6], "completion": [7, 8, 9]}, {"prompt": [5], "completion": [10, 11]}],
                         0, "cpu")
    lps, grads = [], None
    for _ in range(steps):
        with torch.no_grad():
            lps.append(g.completion_logprobs(model, batch, 0.7)[0])
        assert all(isinstance(p, DTensor) for p in model.parameters()) != shard_kw.get("frozen", False)  # frozen:
        # the weights stay gathered from step to step; else none is left gathered by a no-grad forward
        lp = g.completion_logprobs(model, batch, 0.7)[0]
        gathered = not isinstance(model.model.layers[0].mlp.up_proj.weight, DTensor)  # FSDP2 swaps full tensors in
        (lp * torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 0.0]])).sum().backward()
        grads = grads or {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        lps.append(lp.detach())
    return lps, {n: p.full_tensor() for n, p in model.named_parameters()}, gathered, grads


def check_fused_norm_in_bf16(norm, device):
    """A fused norm's bf16 output and gradients (x, weight) against float64 autograd of x / rms(x) * weight."""
    norm = copy.deepcopy(norm).to(device=device, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(64, norm.weight.shape[0], generator=gen) * 3).bfloat16()
    gy = torch.randn(x.shape, generator=gen)
    x64, w64 = x.double().requires_grad_(), norm.weight.detach().double().cpu().requires_grad_()
    want = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + norm.fused_eps) * w64
    want_g = torch.autograd.grad((want * gy.double()).sum(), (x64, w64))
    xd = x.to(device).requires_grad_()
    y = norm(xd)
    got_g = torch.autograd.grad((y.float() * gy.to(device)).sum(), (xd, norm.weight))
    assert y.dtype == torch.bfloat16 and ((y.double().cpu() - want).abs() <= want.abs() * 2**-8 + 1e-30).all()
    rel = lambda a, b: ((a.double().cpu() - b).norm() / b.norm()).item()
    assert rel(got_g[0], want_g[0]) < 1e-2 and rel(got_g[1], want_g[1]) < 1e-2, (rel(got_g[0], want_g[0]),
                                                                              rel(got_g[1], want_g[1]))
    return y


# -- the docs and this file's own index

def check_registry(rf):
    """Every reward registered in the reward_fns module `rf` is reachable by name and returns a finite number, or a
    dict of them (one that takes the sample gets one); every task's check agrees with that task's reward."""
    row = g.samples(g.sequences(known_batch(), 4, "cpu"))[0]  # a real row of the table: every column a reward sees
    sample = lambda c: {**row, "text": c, "answer": "3", "messages": [{"role": "user", "content": "?"},
                                                                      {"role": "assistant", "content": c}]}
    call = lambda fn, c: fn(c, "3", sample(c)) if "sample" in inspect.signature(fn).parameters else fn(c, "3")
    for name, fn in rf.REWARD_FNS.items():
        assert rf.get_reward_fn(name) is fn
        for completion in ("#### 3", "1 + 2 = 3", "", "no number", "\\boxed{3}"):
            got = call(fn, completion)
            assert all(math.isfinite(v) for v in (got.values() if isinstance(got, dict) else [got])), (name, got)
    for name, task in rf.TASKS.items():
        for completion in ("#### 3", "so 3", "#### 4", ""):
            assert task.correct(completion, "3") == (call(rf.get_reward_fn(task.reward), completion) == 1.0), name
    with pytest.raises(ValueError, match="valid names: " + ", ".join(sorted(rf.REWARD_FNS))) as e:
        rf.get_reward_fn("gsm9k")
    assert "gsm9k" in str(e.value)


def token_loss(logp, old, adv, mask, clip_low, clip_high, level="token", tis=None, ref=None, beta=0.0, loss_type="grpo"):
    """g.policy_loss on these tensors, with the flags they stand for; `tis`, the TIS weights (None: off), comes in as
    the sampler's log-probs that give them, under a cap above them all. -> (loss, clipped, kl), each (B, T)."""
    cfg = g.Config(clip_low=clip_low, clip_high=clip_high, ratio_level=level, beta=beta, loss_type=loss_type,
                   tis_cap=0.0 if tis is None else float(tis.max()) + 1.0)
    x = {"adv": adv, "mask": mask, "server_lp": old if tis is None else old - torch.log(tis),
         **({} if ref is None else {"ref_lp": ref})}
    return g.policy_loss(cfg, x, logp, old, None)


def readme_recipes():
    """The Hacking guide (docs/hacking.md, the README's index): {recipe: [(file, function, mode, anchor, code)]}, from
    the comment before each code block (<!-- recipe NAME: FILE FUNCTION MODE "ANCHOR" -->), in the guide's order."""
    readme = open(os.path.join(HERE, "docs", "hacking.md")).read()
    got = collections.defaultdict(list)
    for name, file, fn, mode, anchor, code in re.findall(r'<!-- recipe (\w+): (\S+) (\S+) (\w+)(?: "([^\n]*)")? -->\n'
                                                         r"```\w*\n(.*?)```", readme, re.S):
        got[name].append((file, fn, mode, anchor, code))
    return got


def apply_recipe(edits, root):
    """A recipe's edits, made as a reader makes them, in the copies of its files under root: each anchor must be in
    the function (or class) the README names, once: else the README no longer says where the code goes. An edit the
    file already holds is not made twice (a student who made it runs these tests on the edited file)."""
    for file, fn, mode, anchor, code in edits:
        if mode in ("file", "command"):
            continue
        path = os.path.join(root, file)
        src = open(path).read()
        if code.strip() in src:
            continue
        if mode == "end":
            src = src.rstrip("\n") + "\n\n\n" + code
        else:
            start = src.index(f"def {fn[:-2]}(" if fn.endswith("()") else f"class {fn}")  # a function or a class
            end = src.find("\ndef ", start + 1) % (len(src) + 1)
            at = src.find(anchor, start, end)
            assert at >= 0 and src.count(anchor, start, end) == 1, (file, fn, anchor)
            line = src.rindex("\n", 0, at) + 1  # the anchor's line
            eol = src.index("\n", at) + 1
            src = {"before": src[:line] + code + src[line:], "after": src[:eol] + code + src[eol:],
                   "replace": src[:line] + code + src[eol:]}[mode]
        open(path, "w").write(src)


def config_flags():
    return {"--" + f.name.rstrip("_") for f in dataclasses.fields(g.Config)} | {
        "--no-" + f.name.rstrip("_") for f in dataclasses.fields(g.Config) if type(f.default) is bool}


def sections():
    """This file's test sections -> [(N, title, [the tests under the header '# N. title'])], in the file's order."""
    out = []
    for line in open(__file__):
        if re.match(r"# \d+\. ", line):
            n, title = line[2:].rstrip("\n").split(". ", 1)
            out.append((int(n), title, []))
        elif out and line.startswith("def test_"):
            out[-1][2].append(line[4:line.index("(")])
    return out


# -- serve.sh against a fake SGLang

SERVE_SH_SETTINGS = ("MODEL", "GPU", "TP", "SERVERS", "HOST", "PORT", "MEM_FRACTION", "ATTENTION_BACKEND", "DTYPE",
                     "SEED", "FP32_LM_HEAD", "SGLANG_API_KEY", "EXTRA_ARGS", "TIMEOUT", "LOG", "PIDFILE", "PYTHON")
ANSWERS = """import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), H).serve_forever()
"""  # a server that answers on its --port at once (fails there if the port is taken)


def wait_until(holds, what, timeout=60):
    """Poll holds() until it is true; after `timeout` seconds fail, naming `what` (a busy machine only waits longer)."""
    import time
    end = time.time() + timeout
    while not holds():
        if time.time() > end:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def _fake_sglang(tmp_path, server=None):
    """A fake `python` for serve.sh: `-m sglang.launch_server ARGS` appends its CUDA_VISIBLE_DEVICES and ARGS to
    tmp_path/starts, then runs `server` (Python, given ARGS) or, without one, exits 1 at once (a server that dies at
    start); anything else runs in this Python. -> its path."""
    if server:
        (tmp_path / "server.py").write_text(server)
    fake = tmp_path / "fakepython"
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-m" ]; then
  printf '%s\\0' "$CUDA_VISIBLE_DEVICES" "$@" >> {tmp_path}/starts && echo >> {tmp_path}/starts
  {f'exec {sys.executable} {tmp_path}/server.py "$@"' if server else 'exit 1'}
fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    return fake


def _starts(tmp_path):
    """-> [[CUDA_VISIBLE_DEVICES, *the arguments], one per server serve.sh started]."""
    f = tmp_path / "starts"
    return [s.split("\0") for s in f.read_text().split("\0\n")[:-1]] if f.exists() else []


def _run_serve_sh(tmp_path, *args, popen=False, **settings):
    """bash serve.sh ARGS with these settings only (none of the caller's), against tmp_path's fakepython ->
    (the finished run, or the running one with popen, its environment)."""
    env = {k: v for k, v in os.environ.items() if k not in SERVE_SH_SETTINGS}
    env.update(PYTHON=str(tmp_path / "fakepython"), LOG=str(tmp_path / "serve.log"), TIMEOUT="30",
               PIDFILE=str(tmp_path / "serve.pid"))
    env.update(settings)
    cmd = ["bash", os.path.join(HERE, "serve.sh"), *args]
    if popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), env
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90), env


def _two_free_ports():
    """-> p, with ports p and p + 1 both free."""
    while True:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", (p := free_port()) + 1))
                return p
            except OSError:
                pass


def _alive(pid):
    """-> whether process pid runs (a zombie, killed but not yet reaped, does not)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# What SGLang gets from serve.sh: the defaults (D), and each setting changed on its own (D edited by hand). Every case
# but the first runs on a free port; the first on the default 30000.
D = ("-m sglang.launch_server --model-path Qwen/Qwen2.5-0.5B-Instruct --host 127.0.0.1 --port 30000 "
     "--mem-fraction-static 0.85 --dtype bfloat16 --random-seed 0 --enable-fp32-lm-head")
SERVE_SH_ARGS = [  # (settings, serve.sh's own arguments, CUDA_VISIBLE_DEVICES, SGLang's arguments)
    ({}, [], "3", D),
    ({"MODEL": "/models/my model"}, [], "3", D.replace("Qwen/Qwen2.5-0.5B-Instruct", "'/models/my model'")),
    ({"GPU": "1"}, [], "1", D),
    ({"GPU": "1,2", "TP": "2"}, [], "1,2", D.replace("--random-seed 0", "--random-seed 0 --tp-size 2")),
    ({"HOST": "0.0.0.0"}, [], "3", D.replace("--host 127.0.0.1", "--host 0.0.0.0")),
    ({"MEM_FRACTION": "0.5"}, [], "3", D.replace("--mem-fraction-static 0.85", "--mem-fraction-static 0.5")),
    ({"ATTENTION_BACKEND": "triton"}, [], "3", D + " --attention-backend triton"),
    ({"DTYPE": "float16"}, [], "3", D.replace("--dtype bfloat16", "--dtype float16")),
    ({"FP32_LM_HEAD": "0"}, [], "3", D.replace(" --enable-fp32-lm-head", "")),
    ({"SEED": "7"}, [], "3", D.replace("--random-seed 0", "--random-seed 7")),
    ({"SGLANG_API_KEY": "sekret"}, [], "3", D + " --api-key sekret"),
    ({"EXTRA_ARGS": "--context-length 4096 --sampling-backend pytorch"}, [], "3",
     D + " --context-length 4096 --sampling-backend pytorch"),
    ({"EXTRA_ARGS": "--context-length 4096"}, ["--", "--chunked-prefill-size", "512"], "3",
     D + " --context-length 4096 --chunked-prefill-size 512"),
]


def _sglang_flags():
    """-> {flag: whether it takes a value} of the installed SGLang's launch_server, read from the source of its
    ServerArgs (not imported: SGLang is installed here without its dependencies): a field f is --f-with-dashes (or
    its Arg's cli_name) and its Arg's aliases, a bool takes no value (add_cli_args_from_dataclass's rules)."""
    import ast
    import importlib.util
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("needs SGLang installed (CI has it, without its dependencies)")
    src = os.path.join(os.path.dirname(importlib.util.find_spec("sglang").origin), "srt", "server_args.py")
    cls = next(n for n in ast.parse(open(src).read()).body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    flags = {}
    for f in cls.body:
        if isinstance(f, ast.AnnAssign) and isinstance(f.annotation, ast.Subscript) and isinstance(
                f.annotation.slice, ast.Tuple):  # name: A[type, "help" or Arg(...)]
            kind, meta = f.annotation.slice.elts[:2]
            arg = {k.arg: ast.literal_eval(k.value) for k in getattr(meta, "keywords", [])
                   if k.arg in ("cli_name", "aliases", "no_cli")}
            if not arg.get("no_cli"):
                names = [arg.get("cli_name") or "--" + f.target.id.replace("_", "-")] + arg.get("aliases", [])
                flags.update(dict.fromkeys(names, ast.unparse(kind) not in ("bool", "Optional[bool]")))
    return flags


def _serve_sh(tmp_path, **settings):
    """serve.sh with these settings (and none of the caller's own) against a fake `python` that appends each server's
    CUDA_VISIBLE_DEVICES, arguments and start time to argv and answers on its port -> (the finished run, its
    environment)."""
    fake = tmp_path / "fakepython"
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-m" ]; then
  echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES $@ at $(date +%s.%N)" >> {tmp_path}/argv
  port=$(echo "$@" | sed -E 's/.*--port ([0-9]+).*/\\1/')
  exec {sys.executable} -c "import http.server as h, time
time.sleep(1)
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
h.HTTPServer(('127.0.0.1', $port), H).serve_forever()"
fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    port = free_port()
    while True:  # two free ports in a row
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
                break
            except OSError:
                port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GPU", "TP", "SERVERS", "MEM_FRACTION", "EXTRA_ARGS")}
    env.update(PYTHON=str(fake), PORT=str(port), LOG=str(tmp_path / "serve.log"), PIDFILE=str(tmp_path / "serve.pid"),
               **{"TIMEOUT": "30", **settings})
    return subprocess.run(["bash", os.path.join(HERE, "serve.sh")], env=env, capture_output=True, text=True,
                          timeout=90), env


def _serve_sh_stop(env):
    subprocess.run(["bash", os.path.join(HERE, "serve.sh"), "stop"], env=env, capture_output=True, timeout=90)


# -- a real SGLang server on a GPU (section 16)

def _have_gpu_and_sglang():
    import importlib.util
    # find_spec of a submodule imports its parent: ask for the package first (a GPU machine without SGLang)
    return (torch.cuda.is_available() and importlib.util.find_spec("sglang") is not None
            and importlib.util.find_spec("sglang.launch_server") is not None)


gpu = pytest.mark.skipif(not _have_gpu_and_sglang(), reason="needs a GPU and SGLang")


@pytest.fixture(scope="module")
def real_server():
    model = os.environ.get("GRPO_TEST_MODEL") or os.environ.get("KIT_MODEL_DIR")
    if not model:
        pytest.skip("set GRPO_TEST_MODEL to a small model the server can load")
    n = torch.cuda.device_count()
    srv = {"model": model, "gpu": n - 1, "colocate": n == 1, "port": os.environ.get("GRPO_TEST_PORT", "30010")}
    env = dict(os.environ, MODEL=model, GPU=str(srv["gpu"]), PORT=srv["port"], MEM_FRACTION="0.3",
               PIDFILE=os.environ.get("GRPO_TEST_PIDFILE", "/tmp/grpo_gpu_test.pid"), LOG="/tmp/grpo_gpu_test_serve.log")
    already = subprocess.run(["bash", os.path.join(HERE, "serve.sh")], env=env, capture_output=True, text=True, timeout=900)
    assert already.returncode == 0, already.stdout + already.stderr
    srv["url"] = f"http://127.0.0.1:{srv['port']}"
    yield srv
    if "already running" not in already.stdout:
        subprocess.run(["bash", os.path.join(HERE, "serve.sh"), "stop"], env=env, timeout=120)


# ---------------------------------------------------------------------------------------------
# 1. the GRPO math and the logged metrics on hand-computed values

def test_group_advantages_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    a = g.group_advantages(r, 4, scale=True)
    # group 1: mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866
    assert torch.allclose(a[:4], torch.tensor([0.8660, -0.8660, -0.8660, 0.8660]), atol=1e-3)
    assert torch.equal(a[4:], torch.zeros(4))  # all-equal group: no signal, no NaN
    a = g.group_advantages(r, 4, scale=False)  # Dr. GRPO: only centred
    assert torch.allclose(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    a = g.group_advantages(torch.tensor([3.0, 3.0]), 2)  # eps keeps all-equal groups finite
    assert torch.equal(a, torch.zeros(2))
    # eight rewards of 0.1 (gsm8k_format's format bonus alone): a float std is 8e-9, not 0; the group is still flat
    r = torch.tensor([0.1] * 8 + [0.0] * 7 + [1.1])
    assert torch.equal(g.flat_groups(r, 8), torch.tensor([True, False]))
    assert torch.equal(g.group_advantages(r, 8)[:8], torch.zeros(8)) and g.group_advantages(r, 8)[8:].abs().sum() > 1
    assert g.flat_groups(torch.tensor([0.1] * 8), 8).tolist() == [True]  # alone, their float std is 8e-9 here
    assert torch.equal(g.group_advantages(torch.tensor([0.1] * 8), 8), torch.zeros(8))


def test_kl_k3_hand_values():
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.0, -1.0]])
    # d = ref - logp = [0, 1]: e^0 - 0 - 1 = 0;  e^1 - 1 - 1 = 0.71828
    assert torch.allclose(g.kl_k3(logp, ref), torch.tensor([[0.0, math.e - 2]]))
    assert (g.kl_k3(torch.randn(4, 5), torch.randn(4, 5)) >= 0).all()


def test_clipped_surrogate_hand_values():
    old = torch.zeros(2, 2)
    logp = torch.log(torch.tensor([[1.5, 0.9], [0.5, 1.1]]))  # ratios
    adv = torch.tensor([1.0, -1.0])
    loss, clipped, _ = token_loss(logp, old, adv, torch.ones(2, 2), 0.2, 0.3)
    # row 0 (A=+1): min(1.5, 1.3) = 1.3 (clipped); min(0.9, 0.9) = 0.9
    # row 1 (A=-1): min(-0.5, -0.8) = -0.8 (clipped); min(-1.1, -1.1) = -1.1
    assert torch.allclose(loss, torch.tensor([[-1.3, -0.9], [0.8, 1.1]]), atol=1e-6)
    assert clipped.tolist() == [[True, False], [True, False]]
    # the gradient vanishes where clipping is active, not elsewhere
    lp = logp.clone().requires_grad_(True)
    token_loss(lp, old, adv, torch.ones(2, 2), 0.2, 0.3)[0].sum().backward()
    assert lp.grad[0, 0] == 0 and lp.grad[1, 0] == 0
    assert torch.allclose(lp.grad[0, 1], torch.tensor(-0.9)) and torch.allclose(lp.grad[1, 1], torch.tensor(1.1))


def test_tis_weights_truncate():
    old, server = torch.log(torch.tensor([[0.5, 0.2]])), torch.log(torch.tensor([[0.25, 0.4]]))
    assert torch.allclose(g.tis_weights(old, server, 1.5), torch.tensor([[1.5, 0.5]]))


def test_grpo_token_loss_with_kl_and_tis_hand_values():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    old = torch.log(torch.tensor([[0.4, 0.25]]))  # ratios 1.25 (clipped at 1.2 for A > 0) and 1
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    tis = torch.tensor([[2.0, 0.5]])
    one = torch.ones(1, 2)
    loss, clipped, kl = token_loss(logp, old, torch.tensor([1.0]), one, 0.2, 0.2, "token", tis, ref, beta=0.1)
    # KL(pi || ref) per token, k3 with d = ref - logp: d = log(0.5), log(2) -> e^d - d - 1
    k3 = [0.5 - math.log(0.5) - 1, 2 - math.log(2) - 1]
    assert torch.allclose(kl, torch.tensor([k3]), atol=1e-6)
    assert torch.allclose(loss, torch.tensor([[-1.2 * 2.0 + 0.1 * k3[0], -1.0 * 0.5 + 0.1 * k3[1]]]), atol=1e-6)
    assert clipped.tolist() == [[True, False]]
    loss, _, kl = token_loss(logp, old, torch.tensor([1.0]), one, 0.2, 0.2)  # no TIS, no reference
    assert kl is None and torch.allclose(loss, torch.tensor([[-1.2, -1.0]]))


def test_aggregate_modes_mask_and_weights():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0], [7.0, 7.0, 7.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])  # masked values must not count
    w = torch.tensor([1.0, 1.0, 0.0])  # the third sequence is filtered out: it must not count either
    agg = lambda mode, rows=slice(None): g.aggregate(x[rows], m[rows], w[rows], mode, g.loss_norm(mode, 2, 4, 3)).item()
    assert agg("seq") == pytest.approx((2.0 + 4.0) / 2)
    assert agg("token") == pytest.approx(10.0 / 4)
    assert agg("constant") == pytest.approx(10.0 / 6)
    # micro-batches with whole-batch normalisers add up to the whole-batch value
    for mode in ("seq", "token", "constant"):
        assert agg(mode, slice(0, 1)) + agg(mode, slice(1, 3)) == pytest.approx(agg(mode))
    half = torch.tensor([0.5, 1.0, 0.0])  # a weight scales the sequence's share, in the sum and in the normaliser
    assert g.aggregate(x, m, half, "token", 3 * 0.5 + 1).item() == pytest.approx((6 * 0.5 + 4) / 2.5)
    with pytest.raises(KeyError):
        g.loss_norm("tokens", 2, 4, 3)


def test_policy_loss_reads_the_flags_into_the_loss():
    """The call site that wires flags into the math: unequal clips each on their side, TIS with the trainer's
    logprobs over the server's (not the reverse), the ratio level, the reference at --beta."""
    logp = torch.log(torch.tensor([[0.6, 0.3], [0.2, 0.5]]))
    old = torch.log(torch.tensor([[0.4, 0.3], [0.4, 0.5]]))  # ratios 1.5 and 1 (A > 0); 0.5 and 1 (A < 0)
    b = {"adv": torch.tensor([1.0, -1.0]), "mask": torch.ones(2, 2), "server_lp": old - math.log(2)}  # π_old / π_server = 2
    cfg = g.Config(clip_low=0.1, clip_high=0.3, tis_cap=1.5)
    loss, clipped, kl = g.policy_loss(cfg, b, logp, old, None)
    # TIS min(2, 1.5) = 1.5; row 0: min(1.5, 1.3) = 1.3; row 1: -min(-0.5, -0.9) = 0.9; the ratio-1 tokens: -/+1
    assert torch.allclose(loss, 1.5 * torch.tensor([[-1.3, -1.0], [0.9, 1.0]]), atol=1e-6) and kl is None
    b["ref_lp"] = logp.detach() - 0.5
    loss_kl, _, kl = g.policy_loss(dataclasses.replace(cfg, beta=0.1, tis_cap=0.0), b, logp, old, None)
    assert torch.allclose(loss_kl, torch.tensor([[-1.3, -1.0], [0.9, 1.0]]) + 0.1 * kl) and kl.gt(0).all()
    seq, _, _ = g.policy_loss(dataclasses.replace(cfg, ratio_level="sequence"), b, logp, old, None)
    assert not torch.allclose(seq, loss)  # --ratio_level reaches the loss


def test_head_logprobs_hand_values_and_gradients_against_autograd_in_float64():
    """The LM head's log-probs and entropies, chunk by chunk, and its own backward, against log_softmax and autograd
    in float64 on fresh random inputs: temperatures, chunks that do not divide the rows, Gemma's soft-capping, the
    log-probs alone (no entropy gradient) and both; each --head_matmul ('bf16': the log-probs of x and W rounded to
    bf16, exactly; the gradients within bf16 rounding of the unrounded ones)."""
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])  # hand values: x = the logits, W = I
    lp, ent = g.HeadLogprobs.apply(logits, torch.eye(3), torch.tensor([2, 1]), 1.0, None, "fp32", 1)
    assert torch.allclose(lp, torch.tensor([3 - math.log(math.e + math.e ** 2 + math.e ** 3), -math.log(3)]))
    assert torch.allclose(ent[1], torch.tensor(math.log(3)))
    lp2, _ = g.HeadLogprobs.apply(logits, torch.eye(3), torch.tensor([2, 1]), 2.0, None, "fp32", 5)
    assert torch.allclose(lp2[0], torch.tensor(1.5 - math.log(math.e ** 0.5 + math.e + math.e ** 1.5)))
    torch.manual_seed(0)
    cases = ((None, 1.0, 3, True), (None, 0.7, 5, False), (None, 1.0, 4, False), (30.0, 0.8, 4, True), (2.0, 1.0, 99, True),
             (2.0, 0.9, 4, False))  # both False: the log-probs' gradient alone (with no cap: the backward's short way)
    for cap, T, chunk, both in cases:
        x, w = torch.randn(11, 6, dtype=torch.float64, requires_grad=True), torch.randn(13, 6, dtype=torch.float64,
                                                                                      requires_grad=True)
        t, gl, ge = torch.randint(0, 13, (11,)), torch.randn(11, dtype=torch.float64), torch.randn(11, dtype=torch.float64)
        def lp_ent(x, w):
            logp = torch.log_softmax((cap * torch.tanh(x @ w.T / cap) if cap else x @ w.T) / T, -1)
            return logp.gather(1, t[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)
        lp_ref, ent_ref = lp_ent(x, w)
        want = torch.autograd.grad((lp_ref * gl).sum() + (both * ent_ref * ge).sum(), (x, w))
        rounded = lp_ent(x.detach().bfloat16().double(), w.detach().bfloat16().double())  # what 'bf16' computes
        for mm, tol in (("fp32", 1e-5), ("bf16", 1e-2)):  # bf16: the gradient's matmuls in bf16
            x32, w32 = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
            lp, ent = g.HeadLogprobs.apply(x32, w32, t, T, cap, mm, chunk)
            got = torch.autograd.grad((lp * gl.float()).sum() + ((ent * ge.float()).sum() if both else 0), (x32, w32))
            rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
            lp_want, ent_want = rounded if mm == "bf16" else (lp_ref, ent_ref)
            assert rel(lp, lp_want) < 1e-6 and rel(ent, ent_want) < 1e-5, (cap, T, chunk, mm)
            assert got[0].dtype == got[1].dtype == torch.float32, mm
            assert rel(got[0], want[0]) < tol and rel(got[1], want[1]) < tol, (cap, T, chunk, mm)
        assert rel(rounded[0].float(), lp_ref) > 1e-4  # (the rounding shows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the head's bf16 matmuls as a GPU runs them")
@pytest.mark.parametrize("mm", ["fp32", "bf16"])
def test_head_logprobs_on_cuda_against_float64_autograd(mm):
    """HeadLogprobs on CUDA, where its fast paths' dtypes matter (bf16 x bf16 -> fp32 logits; bf16
    gradient matmuls written into fp32 slices of dW): log-probs, entropies ('bf16': those of x and W rounded to bf16)
    and both gradients against float64 autograd on the CPU, at a size with several row chunks and vocabulary slices
    that do not divide (the CPU test's sizes are tiny)."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(301, 96, generator=gen, dtype=torch.float64), torch.randn(3001, 96, generator=gen,
                                                                                dtype=torch.float64) / 4
    t, gl = torch.randint(0, 3001, (301,), generator=gen), torch.randn(301, generator=gen, dtype=torch.float64)
    for T, ge in ((0.7, None), (1.0, torch.randn(301, generator=gen, dtype=torch.float64))):  # short way; both
        x64, w64 = x.clone().requires_grad_(), w.clone().requires_grad_()
        logp = torch.log_softmax(x64 @ w64.T / T, -1)
        lp_ref, ent_ref = logp.gather(1, t[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)
        want = torch.autograd.grad((lp_ref * gl).sum() + ((ent_ref * ge).sum() if ge is not None else 0), (x64, w64))
        if mm == "bf16":  # the log-probs of the rounded values
            logp = torch.log_softmax(x.bfloat16().double() @ w.bfloat16().double().T / T, -1)
            lp_ref, ent_ref = logp.gather(1, t[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)
        xc, wc = (a.detach().float().cuda().requires_grad_() for a in (x, w))
        lp, ent = g.HeadLogprobs.apply(xc, wc, t.cuda(), T, None, mm, 64)
        got = torch.autograd.grad((lp * gl.float().cuda()).sum() + ((ent * ge.float().cuda()).sum() if ge is not None
                                                                   else 0), (xc, wc))
        rel = lambda a, b: ((a.double().cpu() - b).norm() / b.norm()).item()
        tol = {"bf16": (1e-5, 1e-2), "fp32": (1e-5, 1e-5)}[mm]
        assert rel(lp, lp_ref) < tol[0] and rel(ent, ent_ref) < tol[0], (T, rel(lp, lp_ref), rel(ent, ent_ref))
        assert got[1].dtype == torch.float32 and rel(got[0], want[0]) < tol[1] and rel(got[1], want[1]) < tol[1], \
            (T, rel(got[0], want[0]), rel(got[1], want[1]))


def test_mismatch_stats_hand_values():
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    server = torch.log(torch.tensor([[0.25, 0.2, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding: it must not count
    m = g.Metrics()
    g.mismatch_stats(trainer, server, mask, 1.5, m)
    dist_init()
    try:
        got = m.reduce("cpu")
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()
    assert got["mismatch_max"] == pytest.approx(math.log(2)) and got["mismatch_mean"] == pytest.approx(math.log(2) / 2)
    assert got["is_ratio_mean"] == pytest.approx((2 + 1) / 2) and got["is_ratio_max"] == pytest.approx(2)
    assert got["is_truncated_frac"] == 0.5  # ratio 2 > cap 1.5
    # k3 estimate of KL(server || trainer) on tokens the server sampled: d = trainer - server
    assert got["mismatch_kl"] == pytest.approx((2 - math.log(2) - 1) / 2)
    # the importance weights' effective sample size over their count: (Σw)² / (n Σw²) = (2 + 1)² / (2 x 5)
    assert got["is_ess"] == pytest.approx(9 / 10)


def test_metrics_are_logged_by_what_they_are_and_ranks_may_differ_in_names():
    """A new metric is one call (a sum, a mean with its count, a maximum); the names are agreed over ranks first,
    so a metric only one rank has cannot hang or misalign the others; a mean over nothing is None."""
    m = g.Metrics()
    m.mean("entropy", torch.tensor(3.0), 2), m.mean("entropy", 1.0, 2), m.sum("loss", 0.5), m.sum("loss", 0.25)
    m.max("worst", 2.0), m.max("worst", torch.tensor(5.0)), m.mean("nothing", 0.0, 0)
    dist_init()
    try:
        got = m.reduce("cpu")
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()
    assert got == {"entropy": 1.0, "loss": 0.75, "worst": 5.0, "nothing": None}


# ---------------------------------------------------------------------------------------------
# 2. rewards: parsing answers, the registry, scoring, a user's own reward

def test_extract_number_formats():
    assert extract_number("The total is 1,234 apples") == "1234"
    assert extract_number("It costs 1,234,567 dollars") == "1234567"
    assert extract_number("She pays $5 in total") == "5"
    assert extract_number("She pays $1,000.50") == "1000.5"
    assert extract_number("So the answer is 42.") == "42"
    assert extract_number("The temperature is -3 degrees") == "-3"
    assert extract_number("It costs 3.50") == "3.5"
    assert extract_number("72.00") == "72"
    assert extract_number("What is 10-3") == "3"  # "-" after a digit is subtraction, not a sign


def test_extract_number_precedence():
    # "####" wins over later numbers (documented choice: it is the format we ask for)
    assert extract_number("#### 42\nI used 3 steps.") == "42"
    assert extract_number("#### 1\nwrong\n#### 18") == "18"  # the LAST ####
    assert extract_number("x = 5 so #### 7") == "7"
    # boxed: last box wins, commas and \$ inside work
    assert extract_number(r"First \boxed{3} then \boxed{4}, checked 9 times") == "4"
    assert extract_number(r"\boxed{1,000}") == "1000"
    assert extract_number(r"\boxed{\$5}") == "5"
    # "#### <no number>" falls back to the last number
    assert extract_number("so 12 eggs\n#### ") == "12"
    # otherwise, the last number in the text
    assert extract_number("3 + 4 = 7, then 7 * 2 = 14") == "14"


def test_extract_number_none():
    assert extract_number("") is None
    assert extract_number("no digits here") is None


def test_gsm8k_reward():
    gold = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"
    assert gsm8k_reward("She sold 48 + 24 = 72 clips.\n#### 72", gold) == 1.0
    assert gsm8k_reward("The answer is 72.00", gold) == 1.0  # numeric, not string, compare
    assert gsm8k_reward(r"\boxed{72}", "72") == 1.0  # plain answer accepted
    assert gsm8k_reward("#### 1,234", "#### 1234") == 1.0
    assert gsm8k_reward("#### 71", gold) == 0.0
    assert gsm8k_reward("#### 72\nThat used 5 steps.", gold) == 1.0  # #### wins
    assert gsm8k_reward("I don't know", gold) == 0.0
    assert gsm8k_reward("", gold) == 0.0
    assert gsm8k_reward("", "") == 0.0  # None == None must not count as correct


def test_format_reward():
    assert format_reward("reasoning...\n#### 42") == 1.0
    assert format_reward("reasoning\n#### -3.5.\n") == 1.0
    assert format_reward(r"so \boxed{1,000}") == 1.0
    assert format_reward(r"so \boxed{\$5}") == 1.0
    assert format_reward("the answer is 42") == 0.0
    assert format_reward("#### forty-two") == 0.0
    assert format_reward("I think #### 42 maybe") == 0.0  # must be its own line
    assert format_reward("#### 42 apples") == 0.0  # ...holding just the number
    assert format_reward("") == 0.0


def test_arithmetic_reward():
    assert arithmetic_reward("7 + 12 = 19", "19") == 1.0
    assert arithmetic_reward("19", "19") == 1.0
    assert arithmetic_reward("The answer is 19.", "19") == 1.0
    assert arithmetic_reward("12", "19") == 0.0
    assert arithmetic_reward("19 is not right, it is 20", "19") == 0.0  # last number only
    assert arithmetic_reward("no idea", "19") == 0.0
    assert arithmetic_reward("", "19") == 0.0


@pytest.mark.parametrize("ret, reason", [
    (float("nan"), "returned NaN"), (None, "returned None"), (float("inf"), "returned inf"),
    (-math.inf, "returned inf"), ("1.0", "returned non-number str"),
])
def test_safe_reward_bad_returns(ret, reason):
    def bad_reward(c, a):
        return ret
    w = collections.Counter()
    assert safe_reward(bad_reward, "c", "a", w) == 0.0
    assert w == {f"bad_reward: {reason}": 1}


def test_safe_reward_raising_fn_and_plain_dict():
    def broken_reward(c, a):
        raise ZeroDivisionError
    w = {}  # a plain dict works too
    assert safe_reward(broken_reward, "c", "a", w) == 0.0
    assert safe_reward(broken_reward, "c", "a", w) == 0.0
    assert w == {"broken_reward: raised ZeroDivisionError": 2}


def test_safe_reward_good_values():
    w = collections.Counter()
    assert safe_reward(lambda c, a: True, "c", "a", w) == 1.0
    assert safe_reward(lambda c, a: 0.25, "c", "a", w) == 0.25
    assert safe_reward(gsm8k_reward, "#### 3", "3", w) == 1.0
    assert not w


def test_a_rewards_signature_is_checked_at_start_and_its_warnings_name_the_term_as_written(monkeypatch):
    """A reward that cannot be called as one (f(completion)) is one error naming the --reward term, before any step;
    a warning names the term the user wrote, not the Python function (a lambda); a dict with no entries is no part,
    no warning (the README says a dict's parts are summed: none, 0)."""
    monkeypatch.setitem(reward_fns.REWARD_FNS, "short", lambda completion: 1.0)
    monkeypatch.setitem(reward_fns.REWARD_FNS, "bonus", lambda c, a: {} if c else {"bonus": 1.0})
    monkeypatch.setitem(reward_fns.REWARD_FNS, "boom", lambda c, a, sample: 1 / 0)
    with pytest.raises(ValueError, match=r"'short': <lambda>\(completion\) cannot be called as a reward .* it must "
                                         r"take \(completion, answer\), or \(completion, answer, sample\)"):
        reward_fns.combine("gsm8k:1,short:0.5", "gsm8k")
    w = {}
    f = reward_fns.combine("gsm8k:1,bonus:0.5,boom:1", "gsm8k")
    assert f({"text": "#### 3", "answer": "3"}, w) == (1.0, {"gsm8k": 1.0, "boom": 0.0})
    assert f({"text": "", "answer": "3"}, w) == (0.5, {"gsm8k": 0.0, "bonus": 1.0, "boom": 0.0})
    assert w == {"boom (--task gsm8k): raised ZeroDivisionError": 2}


def test_registry():
    """(adding a reward, one that takes the sample too, needs no edit here; accuracy is counted by the check)"""
    check_registry(reward_fns)
    assert reward_fns.gsm8k_format_reward("#### 4", "3") == pytest.approx(0.1)  # shaped: not correct, yet rewarded


def test_unknown_reward_name_is_a_clear_error(tiny_model, server, tmp_path):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--reward", "gsm9k"), timeout=120)
    assert code == 1 and "--reward: unknown reward function 'gsm9k'" in out and "Traceback" not in out


@pytest.mark.parametrize("spec, says", [
    ("arithmetic:0", "'arithmetic:0': every weight is 0, so every reward would be 0"),
    ("arithmetic:0,format:0.0", "'arithmetic:0,format:0.0': every weight is 0"),
    ("arithmetic:nan", "'arithmetic:nan': the weight must be a finite number"),
    ("format:0.1,arithmetic:inf", "'arithmetic:inf': the weight must be a finite number")])
def test_reward_weights_must_be_finite_and_not_all_0(tiny_model, spec, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        reward_fns.combine(spec, "arithmetic")
    with pytest.raises(g.UserError, match=re.escape("--reward: " + says)):  # the trainer's message
        g.load_data(g.Config(model=tiny_model, dataset="builtin", reward=spec))
    reward = reward_fns.combine("arithmetic:1,format:0", "arithmetic")  # a 0 beside a weight is fine
    assert reward({"text": "3", "answer": "3"}, {}) == (1.0, {"arithmetic": 1.0, "format": 0.0})


def test_score_counts_correctness_not_reward_and_the_table_keeps_each_sequence_in_its_row():
    """Accuracy comes from the task's check whatever the reward (a shaped reward cannot inflate it); row k of the
    table is completion k of the rollout, of prompt k // G; a weighted mix of rewards logs each part; a reward that
    asks for the sample sees its length and finish reason."""
    texts = ["#### 3", "3", "#### 7", "nothing", "#### 5", "#### 5", "5", "8"]  # two prompts, G = 4

    class Tok:
        def decode(self, ids, skip_special_tokens):
            return texts[ids[0]]
    seqs = table([{"ids": [1], "answer": "3"}, {"ids": [2, 2], "answer": "5"}],
                 [([k] + [9] * (k % 3), [-0.5] * (1 + k % 3), "length" if k == 7 else "stop") for k in range(8)], Tok(), 4)
    assert seqs["prompt"] == [[1]] * 4 + [[2, 2]] * 4 and seqs["group"].tolist() == [0] * 4 + [1] * 4
    assert seqs["length"].tolist() == [1, 2, 3, 1, 2, 3, 1, 2] and seqs["mask"].sum().item() == 15
    m = g.Metrics()
    warn = g.score(seqs, task_of(reward_fns.combine("format", "gsm8k"), reward_fns.gsm8k_correct), 4, m)
    assert seqs["correct"].tolist() == [1, 1, 0, 0, 1, 1, 1, 0] and not warn
    assert seqs["reward"].tolist() == [1, 0, 1, 0, 1, 1, 0, 0]  # format only
    reward_fns.REWARD_FNS["long"] = lambda c, a, sample: float(sample["length"] > 1 and sample["finish"] == "stop")
    try:
        g.score(seqs, task_of(reward_fns.combine("gsm8k:1,long:0.5", "gsm8k"), reward_fns.gsm8k_correct), 4, m)
    finally:
        del reward_fns.REWARD_FNS["long"]
    long = [0, 1, 1, 0, 1, 1, 0, 0]  # length > 1 and stopped (row 7 was cut by max_new_tokens)
    assert seqs["reward"].tolist() == [c + 0.5 * l for c, l in zip([1, 1, 0, 0, 1, 1, 1, 0], long)]
    dist_init()
    try:
        got = m.reduce("cpu")
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()
    assert got["reward_gsm8k"] == 5 / 8 and got["reward_long"] == 4 / 8 and got["accuracy"] == 5 / 8
    assert got["truncated_frac"] == 1 / 8 and got["completion_len_mean"] == 15 / 8


def test_a_reward_part_is_its_mean_over_the_rows_that_have_it_however_the_rows_fall_on_ranks():
    """A part some rows report and others not (a dict reward with a key only sometimes): its logged mean is over the
    rows that report it, the same whether they share a rank or not. Metrics.reduce sums each name's total and count
    over ranks (0 where a rank lacks it), so scoring each rank's rows into one Metrics is what the ranks log."""
    class Tok:
        def decode(self, ids, skip_special_tokens):
            return "abcd"[ids[0]]
    parts = {"a": {"bonus": 2.0, "base": 1.0}, "b": {"base": 0.0}, "c": {"base": 1.0}, "d": {"base": 1.0}}
    reward = lambda s, warn: (sum(parts[s["text"]].values()), parts[s["text"]])
    tab = lambda ks: table([{"ids": [9], "answer": "1"}], [([k], [-0.5], "stop") for k in ks], Tok(), len(ks))
    dist_init()
    try:
        logged = []
        for ranks in ([[0, 1, 2, 3]], [[0, 1], [2, 3]], [[2, 3], [0, 1]]):  # one rank, or two (rank 0 with "a")
            m = g.Metrics()
            for ks in ranks:
                g.score(tab(ks), task_of(reward), len(ks), m)
            got = m.reduce("cpu")
            logged.append((got["reward_bonus"], got["reward_base"]))
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()
    assert logged == [(2.0, 3 / 4)] * 3  # "bonus": row a's 2 over the one row that has it; "base": all four rows


def test_a_new_reward_needs_no_test_edit_and_cannot_change_the_accuracy(tiny_model, server, tmp_path):
    """A user's reward registered the way reward_fns.py says (here a constant 1): the run trains on it, while
    `accuracy` and `eval_accuracy` still count the task's correctness check."""
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--reward", "always_1", rewards=True))
    assert code == 0, out
    steps, evals = [r for r in read_metrics(tmp_path) if "reward_mean" in r], [r for r in read_metrics(tmp_path) if "eval_reward" in r]
    assert all(r["reward_mean"] == 1 and r["accuracy"] < 1 for r in steps) and len(steps) == 2
    assert all(r["eval_reward"] == 1 and r["eval_accuracy"] < 1 for r in evals) and len(evals) == 2


def test_the_calculator_answers_error_to_any_expression_it_cannot_evaluate_however_deep_or_long(monkeypatch):
    """A reply of 6,000 unary minus signs made ast.parse raise MemoryError, which ended the run: now any expression
    longer than CALC_MAX_CHARS (200) is 'error' unread, and one that exhausts the parser's memory or recursion anyway
    is 'error' too (the bound lifted here to reach them)."""
    rf = reward_fns
    call = lambda expr: rf.calculator_env([{"role": "assistant", "content": "calc: " + expr}], "0")
    assert call("-" * 6000 + "1") == "error" and rf.calculate("-" * 6000 + "1") == "error"
    assert rf.calculate("1+" * 99 + "1") == "100" and rf.calculate("1+" * 100 + "1") == "error"  # 199 / 201 chars
    assert rf.calculate("-" * 151 + "1") == "-1" and rf.calculate("(" * 99 + "7" + ")" * 99) == "7"
    monkeypatch.setattr(rf, "CALC_MAX_CHARS", 10 ** 6)
    for expr in ("-" * 6000 + "1", "(" * 300 + "1" + ")" * 300, "1+" * 5000 + "1", "9" * 400):
        assert rf.calculate(expr) == "error", expr[:10]  # MemoryError, SyntaxError, RecursionError, OverflowError


def one_arg_env(messages):  # (top level, as a user's: a nested function's TypeError names its test too)
    return "again"


def test_safe_env_passes_a_message_and_ends_the_episode_on_anything_else_with_a_short_counted_warning():
    """An environment's str is the next message and None ends the episode, silently; one that raises (int() of a word,
    the wrong arguments) or returns a non-str (an int, a dict) ends the episode with one counted warning naming it and
    what went wrong, the error's message cut to 80 characters: never a traceback, never a repr sent as a message."""
    rf = reward_fns
    said = lambda text: [{"role": "user", "content": "?"}, {"role": "assistant", "content": text}]

    def my_env(messages, answer):
        return "higher" if int(messages[-1]["content"]) < int(answer) else None

    def dict_env(messages, answer):
        return {"role": "user", "content": "again"}

    def long_env(messages, answer):
        raise RuntimeError("x" * 100 + "\nsecond line")
    w = {}
    assert rf.safe_env(my_env, said("3"), "5", w) == "higher" and rf.safe_env(my_env, said("5"), "5", w) is None
    assert w == {}  # a message and an end are no warnings
    assert rf.safe_env(my_env, said("five"), "5", w) is None and rf.safe_env(my_env, said("five"), "5", w) is None
    assert rf.safe_env(dict_env, said("3"), "5", w) is None
    assert rf.safe_env(lambda m, a: 7, said("3"), "5", w, name="count_env") is None
    assert rf.safe_env(one_arg_env, said("3"), "5", w) is None
    assert rf.safe_env(long_env, said("3"), "5", w) is None
    assert w == {"my_env: raised ValueError: invalid literal for int() with base 10: 'five'": 2,
                 "dict_env: returned dict (a message must be a str, or None to end the episode)": 1,
                 "count_env: returned int (a message must be a str, or None to end the episode)": 1,
                 "one_arg_env: raised TypeError: " + "one_arg_env() takes 1 positional argument but 2 were given": 1,
                 "long_env: raised RuntimeError: " + "x" * 77 + "...": 1}
    c = collections.Counter()  # the trainer's counter works as well
    rf.safe_env(lambda m, a: 1 / 0, said("3"), "5", c)
    assert c == {"<lambda>: raised ZeroDivisionError: division by zero": 1}

    def stop(messages, answer):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C still stops training
        rf.safe_env(stop, said("3"), "5", w)
    # guess on a secret that is no whole number (answer_problem keeps such rows out): a clear error, counted
    with pytest.raises(ValueError, match=re.escape("the answer '7.5' is not a whole number from 1 to 16, so no guess "
                                                   "can find it")):
        rf.guess_env(said("5"), "7.5")
    w = {}
    assert rf.safe_env(rf.guess_env, said("5"), "7.5", w) is None and rf.safe_env(rf.guess_env, said("5"), "7", w)
    assert w == {"guess_env: raised ValueError: the answer '7.5' is not a whole number from 1 to 16, so no guess can "
                 "find it": 1}
    assert safe_reward(rf.guess_correct, "7", "7.5", w) == 0.0 and w["guess_correct: raised ValueError"] == 1


def test_answer_problem_says_why_no_completion_could_match_a_rows_answer_under_the_tasks_check(monkeypatch):
    """Each task's answers that its check can never match (a numeric task's without a number, exact's empty once
    normalized, choice's without a letter, guess's secret out of 1..16 or not whole, arithmetic's that is no number
    itself) -> the reason the trainer counts the skipped row under; None for answers a completion can match. A user's
    Task brings its own rule as check_answer (one that raises or returns no str is said as the reason). Every row of
    the built-in tasks passes."""
    rf = reward_fns
    T = rf.TASKS
    not_number = "answer that is not a number"
    empty = "answer empty once normalized (case, punctuation and a/an/the dropped)"
    for task, answer, why in [
            ("gsm8k", "none", "answer without a number"), ("gsm8k", "#### 72", None), ("gsm8k", "It is 1,234.", None),
            ("arithmetic", "19", None), ("arithmetic", "$1,234", None), ("arithmetic", "#### 19", not_number),
            ("arithmetic", "NaN", not_number), ("arithmetic", "Infinity", not_number), ("calculator", "5535", None),
            ("calculator", "x", not_number),
            ("exact", "Paris", None), ("exact", "", empty), ("exact", "the", empty), ("exact", "!!!", empty),
            ("exact", "[citation needed]", None), ("exact", "[1, 2]", None),  # plain answers that start with "["
            ("exact", '["Paris", "City of Light"]', None), ("exact", "[]", "answer an empty list of aliases"),
            ("exact", '["the", "!!"]', "answer a list of aliases, each empty once normalized"),
            ("choice", "B", None), ("choice", "(c)", None), ("choice", "2", "answer that is not a letter A-J"),
            ("choice", "K", "answer that is not a letter A-J"), ("choice", '["1", "D"]', None),
            ("choice", '["1", "2"]', "answer a list of aliases, none a letter A-J"),
            ("choice", "[]", "answer an empty list of aliases"),
            ("guess", "7", None), ("guess", "16", None), ("guess", " 1 ", None)] + [
            ("guess", a, "answer that is not a whole number from 1 to 16") for a in ("7.5", "0", "17", "five", "")]:
        assert rf.answer_problem(T[task], answer) == why, (task, answer)
        if why is None and task in ("exact", "choice", "arithmetic", "calculator", "guess"):  # a completion matches
            names = rf.aliases(answer) or [answer]
            assert T[task].correct(names[-1].upper() if task == "choice" else names[-1], answer), (task, answer)
    assert not rf.arithmetic_correct("5", "Infinity")  # (it raised OverflowError)
    my = rf.Task("exact", rf.exact_correct, numeric=False)  # a user's task without a rule: any answer goes
    assert rf.answer_problem(my, "") is None and rf.answer_problem(rf.Task("gsm8k", rf.gsm8k_correct), "x") == \
        "answer without a number"

    def city_rule(answer):
        return None if answer.istitle() else "answer that is not a city's name"

    def broken_rule(answer):
        return int(answer) and None
    assert rf.answer_problem(dataclasses.replace(my, check_answer=city_rule), "paris") == "answer that is not a city's name"
    assert rf.answer_problem(dataclasses.replace(my, check_answer=city_rule), "Paris") is None
    assert rf.answer_problem(dataclasses.replace(my, check_answer=broken_rule), "Paris") == \
        "broken_rule raised ValueError: invalid literal for int() with base 10: 'Paris'"
    assert rf.answer_problem(dataclasses.replace(my, check_answer=str.istitle), "Paris") == \
        "istitle returned bool (why, a str, or None)"
    for task, rows in (("arithmetic", rf.arithmetic_rows()), ("guess", rf.guess_rows()),
                       ("calculator", rf.calculator_rows())):
        assert [r["answer"] for r in rows if rf.answer_problem(T[task], r["answer"])] == [], task


def test_exact_and_choice_take_a_list_of_aliases_and_exact_compares_unicode_after_nfkc():
    """A row's answer that is a JSON list of strings is matched by any alias (exact, choice); an empty list by none; any
    other answer, even one that starts with '[', is plain as before. An accented answer in decomposed Unicode (NFD)
    matches the composed (NFC) text a model writes, and the other way round."""
    rf = reward_fns
    cities = json.dumps(["Paris", "City of Light"])
    assert rf.exact_correct("The answer is Paris.", cities) and rf.exact_correct("the city of light", cities)
    assert not rf.exact_correct("Lyon", cities) and not rf.exact_correct("", "[]") and not rf.exact_correct("[]", "[]")
    assert rf.exact_correct("[citation needed]", "[citation needed]") and rf.exact_correct("1 2", "[1, 2]")
    assert rf.exact_correct("[Paris", "[Paris") and rf.aliases("[Paris") is None and rf.aliases('["a", 1]') is None
    assert rf.choice_correct("(D)", '["B", "D"]') and rf.choice_correct("B", '["B", "D"]')
    assert not rf.choice_correct("C", '["B", "D"]') and not rf.choice_correct("A", "[]")
    nfd, nfc = "Cafe\u0301 de Flore", "Caf\u00e9 de Flore"
    assert len(nfd) == len(nfc) + 1 and rf.normalize_text(nfd) == rf.normalize_text(nfc) == "café de flore"
    assert rf.exact_correct(nfc, nfd) and rf.exact_correct(nfd, nfc) and not rf.exact_correct("Cafe de Flore", nfc)
    assert rf.exact_correct("\uff30\uff41\uff52\uff49\uff53", "Paris")  # full-width letters (NFKC)


@pytest.mark.parametrize("change, says", [
    (lambda t: dataclasses.replace(t["exact"], reward=reward_fns.exact_reward),
     "its reward must be the name of a reward in REWARD_FNS (or a mix of them, e.g. 'gsm8k:1,format:0.1'), not the "
     "function exact_reward: register the function, REWARD_FNS['exact_reward'] = exact_reward, and give the task its "
     "name, Task('exact_reward', ...)"),
    (lambda t: dataclasses.replace(t["exact"], reward=lambda c, a: 1.0),
     "its reward must be the name of a reward in REWARD_FNS (or a mix of them, e.g. 'gsm8k:1,format:0.1'), not the "
     "function <lambda>: register the function, REWARD_FNS['my_reward'] = my_reward, and give the task its name, "
     "Task('my_reward', ...)"),
    (lambda t: dataclasses.replace(t["exact"], reward="exakt"),
     "its reward 'exakt' must name rewards of REWARD_FNS (a name, or a mix such as 'gsm8k:1,format:0.1'): unknown "
     f"reward function 'exakt'; valid names: {REWARD_NAMES}"),
    (lambda t: dataclasses.replace(t["exact"], reward="exact:1,format:x"),
     "its reward 'exact:1,format:x' must name rewards of REWARD_FNS (a name, or a mix such as 'gsm8k:1,format:0.1'): "
     "'format:x': the weight must be a finite number (e.g. gsm8k:1,format:0.1)"),
    (lambda t: dataclasses.replace(t["exact"], correct=lambda completion: True),
     "its correct, <lambda>(completion) cannot be called as a check (too many positional arguments): it must take "
     "(completion, answer) and return whether the completion is right (True or False)"),
    (lambda t: dataclasses.replace(t["exact"], correct=None),
     "its correct, None (a NoneType) cannot be called as a check: it must take (completion, answer) and return whether "
     "the completion is right (True or False)"),
    (lambda t: dataclasses.replace(t["guess"], env=lambda messages: None),
     "its env, <lambda>(messages) cannot be called as an environment (too many positional arguments): it must take "
     "(messages, answer) (and warnings, a Counter of its own warnings, if it wants them) and return the next user "
     "message (a str), or None to end the episode"),
    (lambda t: dataclasses.replace(t["guess"], env=lambda messages, answer, warnings, more: None),
     "its env, <lambda>(messages, answer, warnings, more) cannot be called as an environment (missing a required "
     "argument: 'more'): it must take (messages, answer) (and warnings, a Counter of its own warnings, if it wants "
     "them) and return the next user message (a str), or None to end the episode"),
    (lambda t: dataclasses.replace(t["guess"], max_turns=1),
     "it has an environment (guess_env) but max_turns 1, so every episode ends at the first reply and the "
     "environment's messages would be thrown away: set max_turns to the most replies an episode may take, e.g. "
     "Task(..., env=guess_env, max_turns=3)"),
    (lambda t: dataclasses.replace(t["guess"], max_turns=0),
     "its max_turns is 0: it must be a whole number of replies, at least 1 (1 for a task without an environment)"),
    (lambda t: dataclasses.replace(t["arithmetic"], max_turns=3),
     "its max_turns is 3 but it has no environment to answer a reply, so every episode is one turn: give it an env "
     "(messages, answer) -> the next user message, or drop max_turns"),
    (lambda t: dataclasses.replace(t["exact"], check_answer=lambda: None),
     "its check_answer, <lambda>() cannot be called as an answer check (too many positional arguments): it must take "
     "(answer) and return why no completion can match it (a str), or None"),
])
def test_check_task_refuses_a_task_that_breaks_the_contract_naming_the_task_and_the_fix(change, says):
    """Each mistake of a user's task is one ValueError at start that names the task (--task NAME, and where it lives)
    and says the fix: a reward given as a function or misspelt (not blamed on --reward, a flag never given), a check
    or an environment that cannot be called with their arguments, an environment that max_turns 1 would silence."""
    with pytest.raises(ValueError) as e:
        reward_fns.check_task("mine", change(reward_fns.TASKS))
    assert str(e.value) == "--task mine (TASKS['mine'] in reward_fns.py): " + says


def test_check_task_takes_every_built_in_task_and_a_mix_as_a_tasks_reward(monkeypatch):
    """The built-in tasks pass check_task; a task's reward may be a mix (Task's comment says so), and --reward auto
    trains on it term by term, auto's weight scaling each; a task whose reward is one name keeps the part 'auto'."""
    rf = reward_fns
    for name, task in rf.TASKS.items():
        rf.check_task(name, task)
    monkeypatch.setitem(rf.TASKS, "mixed", dataclasses.replace(rf.TASKS["guess"], reward="guess:1,format:0.5"))
    rf.check_task("mixed", rf.TASKS["mixed"])
    won = {"text": "#### 7", "answer": "7", "messages": [{"role": "assistant", "content": "#### 7"}]}
    assert rf.combine("auto", "mixed")(won, {}) == (1.5, {"guess": 1.0, "format": 1.0})  # 1 x 1 + 0.5 x 1
    assert rf.combine("auto:2", "mixed")(won, {}) == (3.0, {"guess": 1.0, "format": 1.0})  # 2 x 1 + 1 x 1
    assert rf.combine("auto:1,format:0.1", "arithmetic")({"text": "#### 3", "answer": "3"}, {}) == (
        pytest.approx(1.1), {"auto": 1.0, "format": 1.0})


# ---------------------------------------------------------------------------------------------
# 3. data: the prompts of each step, prompt formats, data files, splits and held-out rows

def test_epochs_are_shuffled_differently():
    n = 50
    epoch0 = g.prompts_for_step(n, 0, n, seed=0)
    epoch1 = g.prompts_for_step(n, 1, n, seed=0)
    assert sorted(epoch0) == sorted(epoch1) == list(range(n)) and epoch0 != epoch1


def test_prompts_for_step_is_a_pure_function_of_step():
    a = [g.prompts_for_step(10, s, 4, seed=0) for s in range(5)]
    assert sorted(a[0] + a[1] + a[2][:2]) == list(range(10))  # one epoch covers every row once
    assert a[3] == g.prompts_for_step(10, 3, 4, seed=0)      # resume at step 3 -> same prompts
    assert a != [g.prompts_for_step(10, s, 4, seed=1) for s in range(5)]


def test_base_model_without_chat_template_gets_plain_prompts(tmp_path):
    from transformers import AutoTokenizer
    base = build_tiny(str(tmp_path / "base"), chat_template=False)
    tok = AutoTokenizer.from_pretrained(base)
    rows = [{"question": "What is 1 + 2?", "answer": "3"}]
    plain = g.tokenize_rows(rows, tok, g.Config(), "Answer with the number only.", "plain", collections.Counter(),
                            reward_fns.TASKS["gsm8k"])
    assert tok.decode(plain[0]["ids"]) == "What is 1 + 2 ? Answer with the number only ."
    chat_tok = AutoTokenizer.from_pretrained(build_tiny(str(tmp_path / "chat")))
    chat = g.tokenize_rows(rows, chat_tok, g.Config(), "", "chat", collections.Counter(), reward_fns.TASKS["gsm8k"])
    assert chat_tok.decode(chat[0]["ids"]).startswith("<|im_start|> user What is 1 + 2 ?")
    s = StandIn(base)
    try:
        code, out = run(train_cmd(base, s.url, tmp_path / "a", "--steps", "1"))
        assert code == 0 and "prompt format: plain" in out, out
        code, out = run(train_cmd(base, s.url, tmp_path / "b", "--prompt_format", "chat"), timeout=120)
        assert code == 1 and "has no chat template" in out and "--prompt_format plain" in out and "Traceback" not in out
    finally:
        s.close()
    code, out = run(train_cmd(chat_tok.name_or_path, "http://127.0.0.1:1", tmp_path / "c", "--prompt_format", "chatml"), timeout=120)
    assert code == 1 and "--prompt_format 'chatml' is out of range: it must be auto or chat or plain" in out


def test_unusable_rows_are_counted_and_skipped(tiny_model, tmp_path):
    from transformers import AutoTokenizer
    path = tmp_path / "data.jsonl"
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "", "answer": "3"},
            {"question": "What is 2 + 0?", "answer": "none"}, {"question": "What is " + "1 + " * 200 + "1?", "answer": "201"},
            {"question": "What is 0 + 1?", "answer": "#### 1"}, {"answer": "4"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = g.Config(dataset=str(path), eval_size=0, max_prompt_tokens=64)
    train, evals, held_out = g.load_splits(cfg)
    assert len(train) == 6 and evals == [] and "the file has no splits" in held_out
    skipped = collections.Counter()
    kept = g.tokenize_rows(train, AutoTokenizer.from_pretrained(tiny_model), cfg, "", "chat", skipped,
                           reward_fns.TASKS["gsm8k"])
    assert sorted(r["answer"] for r in kept) == ["#### 1", "2"]
    assert skipped == {"empty or missing prompt (--prompt_field 'question')": 2,
                       "answer without a number (--answer_field 'answer')": 1, "prompt longer than max_prompt_tokens=64": 1}
    with pytest.raises(g.UserError, match="no such file"):
        g.load_splits(g.Config(dataset=str(tmp_path / "missing.jsonl")))


def test_answers_that_are_not_numbers_train_with_the_check_that_fits_them(tiny_model, tmp_path):
    """--task auto by the answers: numbers -> gsm8k, letters -> choice, words -> exact (said at start); word answers
    are kept (not 'answer without a number'); exact and choice read the completion's final line. A task that needs
    numbers, given word answers, says which task takes them (not to rename the fields, which were right)."""
    rf = reward_fns
    assert rf.exact_correct("The answer is Paris.", "paris") and rf.exact_correct("#### the Eiffel Tower", "Eiffel tower")
    assert not rf.exact_correct("Paris, or Lyon", "Paris") and not rf.exact_correct("Lyon", "Paris")
    assert rf.choice_correct("I think it is (B)", "B") and rf.choice_correct("C.", "(c)")
    assert not rf.choice_correct("A or B", "A") and not rf.choice_correct("no idea", "A")
    for answers, task in ((["12", "#### 7"], "gsm8k"), (["A", "(b)", "C."], "choice"), (["Paris", "12"], "exact")):
        path = tmp_path / f"{task}.jsonl"
        path.write_text("".join(json.dumps({"question": f"Q{k}?", "answer": answers[k % len(answers)]}) + "\n"
                                for k in range(20)))
        _, train, evals, t = one_task(g.load_data(g.Config(model=tiny_model, dataset=str(path))))
        assert t.name == task and len(train) + len(evals) == 20, (task, len(train), len(evals))
        assert t.correct is rf.TASKS[task].correct
    (tmp_path / "words.jsonl").write_text("".join(json.dumps({"question": f"Q{k}?", "answer": "Paris"}) + "\n"
                                                  for k in range(20)))
    with pytest.raises(g.UserError, match="--task gsm8k needs answers that hold a number: --task exact or choice") as e:
        g.load_data(g.Config(model=tiny_model, dataset=str(tmp_path / "words.jsonl"), task="gsm8k"))
    assert "--prompt_field" not in str(e.value)  # the fields were right


def test_prompts_that_are_all_too_long_say_so_not_the_fields(tiny_model, tmp_path):
    cfg = g.Config(model=tiny_model, dataset="builtin", builtin_max_operand=2, max_prompt_tokens=3, out_dir=str(tmp_path))
    with pytest.raises(g.UserError) as e:
        g.load_data(cfg)
    assert "prompt longer than max_prompt_tokens=3" in str(e.value) and "raise --max_prompt_tokens" in str(e.value)
    assert "--prompt_field" not in str(e.value)


@pytest.mark.parametrize("name, content, says", [
    ("bad.jsonl", '{"question": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n{"question": "c" "answer": "3"}\n',
     "bad.jsonl line 3 is not valid JSON"),
    ("empty.jsonl", "", "empty.jsonl: the file holds no rows; each row must be an object like {"),
    ("list.jsonl", '{"question": "a", "answer": "1"}\n["b", "2"]\n', "list.jsonl: row 2 is not a JSON object"),
    ("data.csv", "question,answer\na,1\n", "a local file must be .jsonl (one JSON object per line"),
    ("array.json", '[{"question": "a", "answer": "1"}, ', "array.json is not valid JSON (line 1")])
def test_bad_data_files_are_one_clear_error(tmp_path, name, content, says):
    (tmp_path / name).write_text(content)
    with pytest.raises(g.UserError, match=re.escape(says)):
        g.load_splits(g.Config(dataset=str(tmp_path / name)))


def test_a_data_file_that_is_one_json_document_is_read_and_said_or_its_shape_explained(tmp_path, capsys):
    """A .json shaped {"data": [...]} and a .jsonl holding one pretty-printed list (or such an object) were blamed as
    invalid JSON on line 1. They are read, and what was read is said at start; an object with several lists of rows,
    or a pretty-printed document that is broken, says what is expected."""
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "What is 2 + 2?", "answer": "4"}]
    for name, doc, how in (("data.json", {"data": rows}, "the list under its key 'data'"),
                           ("meta.json", {"version": 1, "tags": ["a"], "examples": rows},
                            "the list under its key 'examples'"),
                           ("pretty.jsonl", rows, "one JSON list"), ("pretty_object.jsonl", {"data": rows},
                                                                      "the list under its key 'data'")):
        (tmp_path / name).write_text(json.dumps(doc, indent=2))
        assert g.read_rows(str(tmp_path / name)) == rows, name
        assert capsys.readouterr().out == (f"data: {tmp_path / name} holds one JSON document spanning lines: read "
                                           f"{how} (2 rows)\n"), name
    for name, text, says in (
            ("splits.json", json.dumps({"train": rows, "test": rows}), "splits.json is one JSON object with several "
             "lists of rows ('train', 'test'): keep the one to train on (or give a folder of train.jsonl and test.jsonl)"),
            ("cut.jsonl", json.dumps(rows, indent=2)[:-9], "cut.jsonl line 1 is not valid JSON (Expecting value): '['; "
             "nor is the file one JSON document spanning lines (line 8: Expecting value)")):
        (tmp_path / name).write_text(text)
        with pytest.raises(g.UserError, match=re.escape(says)):
            g.read_rows(str(tmp_path / name))
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # JSON Lines named .json: as before
    assert g.read_rows(str(tmp_path / "lines.json")) == rows and capsys.readouterr().out == ""


def test_a_broken_file_in_a_data_folder_is_named(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "What is 1 + 1?", "answer": "2"}\n')
    (tmp_path / "test.jsonl").write_text('{"question": "What is 1 + 2?", "answer": "3"}\n{"question": "x" "answer": 1}\n')
    with pytest.raises(g.UserError, match=re.escape("test.jsonl line 2 is not valid JSON")):
        g.load_splits(g.Config(dataset=str(tmp_path)))


def test_splits_of_a_local_dataset_folder_a_typo_is_an_error_and_the_held_out_share_is_said(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(40)]
    for split, part in (("train", rows[:30]), ("test", rows[30:])):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    train, evals, held_out = g.load_splits(g.Config(dataset=str(tmp_path), eval_size=5))  # a folder: no config name
    assert train == rows[:30] and evals == rows[30:35] and held_out == "its 'test' split"  # the split it names
    with pytest.raises(g.UserError, match=re.escape("--eval_split: dataset " + repr(str(tmp_path)) + " has no split 'tset'")):
        g.load_splits(g.Config(dataset=str(tmp_path), eval_split="tset"))
    train, evals, held_out = g.load_splits(g.Config(dataset=str(tmp_path), eval_split="", eval_size=200))
    assert len(train) == 27 and len(evals) == 3 and "at most 10%" in held_out  # min(--eval_size, 10% of 30)
    assert "at most 10% of the train rows" in g.Config.__dataclass_fields__["eval_size"].metadata["help"]
    (tmp_path / "empty").mkdir()  # a folder without data files: one clear error that says what --dataset takes
    with pytest.raises(g.UserError, match="doesn't contain any data files.*--dataset takes a dataset on the HF hub, a local folder"):
        g.load_splits(g.Config(dataset=str(tmp_path / "empty")))


def test_a_question_held_out_for_evaluation_never_trains_even_as_a_duplicate_row(tiny_model, tmp_path, capsys):
    """Held out means never trained on: a train row whose question is an eval row's (a dataset with duplicates, or
    an eval split that repeats train rows) leaves the training rows and is counted with its reason."""
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    (tmp_path / "dups.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + rows))  # each row twice
    cfg = g.Config(model=tiny_model, dataset=str(tmp_path / "dups.jsonl"), eval_size=200)
    raw_train, raw_eval, _ = g.load_splits(cfg)  # 4 rows (10%) held out; their twins are among the 36 others
    twins = sum(r["question"] in {e["question"] for e in raw_eval} for r in raw_train)
    assert len(raw_eval) == 4 and twins >= 1
    _, train, evals, _ = g.load_data(cfg)
    assert len(evals) == 4 and len(train) == 36 - twins
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    assert (f"skipped {twins} rows ({{'question also held out for evaluation (a duplicate)': {twins}}})"
            in capsys.readouterr().out)
    folder = tmp_path / "splits"  # an eval split with 5 of the train split's questions
    folder.mkdir()
    for split, part in (("train", rows[:15]), ("test", rows[10:])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    _, train, evals, _ = g.load_data(g.Config(model=tiny_model, dataset=str(folder), eval_size=200))
    assert [r["question"] for r in train] == [r["question"] for r in rows[:10]] and len(evals) == 10
    assert "skipped 5 rows ({'question also held out for evaluation (a duplicate)': 5})" in capsys.readouterr().out


def test_a_dataset_too_small_to_hold_any_rows_out_says_so_and_what_to_do(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(10)]
    for n in (1, 9):
        (tmp_path / "small.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
        with pytest.raises(g.UserError, match=re.escape(
                f"--dataset {tmp_path / 'small.jsonl'} has {n} row(s): too few to hold any out for evaluation (the "
                f"file has no splits; 10% are held out, so it needs at least 10). Add rows, or give it an eval split: "
                f"a folder of train.jsonl and test.jsonl")):
            g.load_splits(g.Config(dataset=str(tmp_path / "small.jsonl")))
    (tmp_path / "small.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, evals, _ = g.load_splits(g.Config(dataset=str(tmp_path / "small.jsonl")))
    assert len(train) == 9 and len(evals) == 1
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "train.jsonl").write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(g.UserError, match=re.escape("has 1 row(s): too few to hold any out for evaluation (--eval_split"
                                                    " ''; 10% are held out, so it needs at least 10). Add rows, or give"
                                                    " it an eval split: --eval_split NAME")):
        g.load_splits(g.Config(dataset=str(tmp_path / "folder"), eval_split=""))


# ---------------------------------------------------------------------------------------------
# 4. the weight payload, read back with SGLang's own classes

def test_payload_roundtrip_with_sglang_deserializer():
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
    named = [("a.weight", torch.randn(3, 5)), ("b.bias", torch.randn(7)), ("c", torch.randn(2, 2, 2).double())]
    flat, meta = g.pack(named, torch.device("cpu"))
    payload = g.serialize_bucket(flat, meta)
    assert isinstance(payload, str) and flat.dtype == torch.uint8 and flat.numel() == (15 + 7 + 8) * 2
    obj = MultiprocessingSerializer.deserialize(payload)
    got = FlattenedTensorBucket(flattened_tensor=obj["flattened_tensor"], metadata=obj["metadata"]).reconstruct_tensors()
    assert [n for n, _ in got] == ["a.weight", "b.bias", "c"]
    for (_, want), (_, t) in zip(named, got):
        assert t.dtype == torch.bfloat16 and t.shape == want.shape
        assert torch.equal(t, want.to(torch.bfloat16))


def test_weights_split_into_several_buckets_arrive_whole(tiny_model, server, tmp_path):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--steps", "1", "--sync_bucket_mb", "0.02"))
    assert code == 0, out
    per_sync = server.calls["/update_weights_from_tensor"] // 2  # the initial push and one per step
    assert per_sync > 1 and len(server.pushes) == 2 * per_sync
    for k in range(2):  # exactly the last bucket of each sync flushes the prefix cache and sets the version
        flags = server.push_log[k * per_sync: (k + 1) * per_sync]
        assert [f["flush_cache"] for f in flags] == [False] * (per_sync - 1) + [True]
        assert [f["weight_version"] for f in flags] == [None] * (per_sync - 1) + [str(k)]
        assert {f["load_format"] for f in flags} == {"flattened_bucket"}
    last = {}
    for bucket in server.pushes[per_sync:]:
        assert not set(bucket) & set(last)  # every parameter in exactly one bucket
        last.update(bucket)
    assert_server_has(last, ckpt_weights(tmp_path))


def test_no_pickle_is_ever_read_from_the_network():
    """We only serialize for the server; nothing the network sends us is unpickled."""
    src = open(os.path.join(HERE, "grpo_sglang.py")).read()
    import re
    for forbidden in ("pickle.load", "deserialize(", "weights_only=False", "unpickle"):
        assert forbidden not in src, forbidden
    assert not re.search(r"(?<![\w.])(eval|exec)\(", src)


# ---------------------------------------------------------------------------------------------
# 5. GPU layouts, servers and flags: what is accepted, and what is refused before anything loads

def test_gpu_layout_dedicated_and_colocated():
    one = lambda gpu: [("http://127.0.0.1:30000", [gpu])]
    assert g.gpu_layout(one(3), False, 0, 3, None, 4) == (0, [3])
    assert g.gpu_layout(one(3), False, 2, 3, "0,1,2,3", 4) == (2, [3])
    assert g.gpu_layout(one(3), False, 0, 1, "0,3", 2) == (0, [1])   # CUDA_VISIBLE_DEVICES renumbers GPUs
    assert g.gpu_layout(one(3), True, 0, 1, None, 1) == (0, [0])     # colocated: stage on rank 0's GPU
    two = [("http://127.0.0.1:30000", [0]), ("http://127.0.0.1:30001", [1])]  # one server colocated, one on GPU 1
    assert g.gpu_layout(two, True, 0, 1, None, 2) == (0, [0, 1])
    tp = [("http://127.0.0.1:30000", [2, 3])]  # a TP-2 server: we stage on its first GPU
    assert g.gpu_layout(tp, False, 1, 2, None, 4) == (1, [2])


def test_gpu_layout_refuses_overlap_and_picks_the_sync_path():
    one = lambda gpu, url="http://127.0.0.1:30000": [(url, [gpu])]
    with pytest.raises(g.UserError, match="which the SGLang server at http://127.0.0.1:30000 uses"):
        g.gpu_layout(one(3), False, 0, 4, None, 4)
    with pytest.raises(g.UserError, match="training rank 0 would run on GPU 3"):
        g.gpu_layout(one(3), False, 0, 1, "3,0", 2)
    with pytest.raises(g.UserError, match="only 1 visible"):
        g.gpu_layout(one(3), False, 0, 2, None, 1)
    with pytest.raises(g.UserError, match="training rank 1 would run on GPU 1, which the SGLang server at http://127.0.0.1:2"):
        g.gpu_layout([("http://127.0.0.1:1", [3]), ("http://127.0.0.1:2", [1, 2])], False, 0, 2, None, 4)  # a TP's 2nd GPU
    assert g.gpu_layout(one(3), False, 0, 3, "0,1,2", 3) == (0, [None])  # the server's GPU is hidden from us
    # a server on another machine: --server_gpu names its GPUs, not ours (4 ranks here with the default 3)
    assert g.gpu_layout(one(3, "http://gpu-box-b.invalid:30000"), False, 0, 4, None, 4) == (0, [None])
    # tensor when rank 0 sees every server's GPU on this host; else NCCL, or a clear refusal of --sync tensor
    assert g.pick_sync(g.Config(), one(3), [3], None)[0] == "tensor"
    kind, why = g.pick_sync(g.Config(), one(3), [None], "0")
    assert kind == "nccl" and "GPU 3 (--server_gpu) is not visible to the trainer (CUDA_VISIBLE_DEVICES=0)" in why
    with pytest.raises(g.UserError, match=r"--sync tensor needs rank 0 to see the server's GPU.*not visible.*"
                                          r"CUDA_VISIBLE_DEVICES=0,1,2.*Use --sync nccl"):
        g.pick_sync(g.Config(sync="tensor"), one(3), [None], "0,1,2")
    kind, why = g.pick_sync(g.Config(), one(3, "http://gpu-box-b.invalid:30000"), [3], None)
    assert kind == "nccl" and "on another host" in why
    assert g.pick_sync(g.Config(sync="nccl"), one(3), [3], None)[0] == "nccl"
    two = [("http://127.0.0.1:30000", [1]), ("http://127.0.0.1:30001", [2])]
    assert g.pick_sync(g.Config(), two, [1, None], "0,1")[0] == "nccl"  # one server's GPU hidden: NCCL for all


@pytest.mark.parametrize("urls, gpus, says", [
    ("http://a:1,http://b:1", "1,2,3", "--server_gpu '1,2,3' must name the GPU of each --server_url (2)"),
    ("http://a:1,http://a:1/", "1", "--server_url lists http://a:1 twice: name each server once"),
    ("http://a:1", "two", "--server_gpu 'two' must name the GPU"),
    ("http://a:1,b:2", "1", "--server_url 'b:2' is not a server address")])
def test_several_servers_flags_are_checked(urls, gpus, says, tmp_path):
    with pytest.raises(g.UserError, match=re.escape(says)):
        g.check_config(g.Config(server_url=urls, server_gpu=gpus, out_dir=str(tmp_path)), 1)
    assert g.parse_servers(g.Config(server_url="http://a:1, http://b:2/", server_gpu="0+1,3")) == [
        ("http://a:1", [0, 1]), ("http://b:2", [3])]


def test_a_server_url_with_a_path_or_https_for_an_http_server_says_what_to_give(tmp_path):
    """The URL with /generate (or another path) pasted got a 404, and https:// for serve.sh's http server "Is it
    running?": now the first names the path and the address to give, before anything loads; the second, at the first
    request and without retries, that the TLS handshake failed and the http:// URL to use."""
    for url, path in (("http://127.0.0.1:30000/generate", "/generate"), ("http://h:1/v1/models?x=1", "/v1/models?x=1"),
                      ("http://h:1,http://h:2/#frag", "/#frag")):
        with pytest.raises(g.UserError, match=re.escape(f"has a path ({path}): give only the server's address, "
                                                        f"scheme://host:port (")):
            g.check_config(g.Config(server_url=url, out_dir=str(tmp_path)), 1)
    assert g.parse_servers(g.Config(server_url="http://h:1/, http://h:2", server_gpu="1")) == [("http://h:1", [1]),
                                                                                             ("http://h:2", [1])]
    import time
    http = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (BaseHTTPRequestHandler,), {
        "do_GET": lambda self: (self.send_response(200), self.end_headers()), "log_message": lambda self, *a: None}))
    threading.Thread(target=http.serve_forever, daemon=True).start()
    port, t0 = http.server_address[1], time.time()
    try:
        with pytest.raises(g.UserError) as e:
            g.call(g.Config(request_retries=3), f"https://127.0.0.1:{port}", "/health")
    finally:
        http.shutdown()
        http.server_close()
    assert time.time() - t0 < 5  # no retries (3 with backoff: 7 s of waiting)
    assert str(e.value) == (f"the TLS handshake with the server at https://127.0.0.1:{port} failed ([SSL: "
                            f"WRONG_VERSION_NUMBER] wrong version number): it speaks plain http, not https (as serve.sh "
                            f"starts it): use --server_url http://127.0.0.1:{port}"), str(e.value)


@pytest.mark.parametrize("urls, says", [
    ("http://127.0.0.1:{p},http://127.0.0.1:{p}", "--server_url lists http://127.0.0.1:{p} twice"),
    ("http://127.0.0.1:{p},http://localhost:{p}/", "--server_url names one server twice, as http://127.0.0.1:{p} and "
                                                   "http://localhost:{p}")])
def test_one_server_under_two_names_is_refused(tiny_model, server, tmp_path, urls, says):
    port = server.http.server_address[1]
    code, out = run(train_cmd(tiny_model, urls.format(p=port), tmp_path), timeout=120)
    assert code == 1 and out.count(says.format(p=port)) == 1 and "Traceback" not in out, out
    assert "--server_gpu" not in out and not server.pushes


def test_a_tensor_parallel_server_must_have_all_its_gpus_named(tiny_model, tmp_path):
    code, out, _, s = run_against(tiny_model, tmp_path, {"tp": 2}, "--server_gpu", "3")
    assert code == 1 and "--server_gpu gives the server at" in out and "1 GPU(s) (3), but it is tensor-parallel over 2" in out
    assert "Traceback" not in out and not s.pushes, out


def test_world_size_must_divide_the_batch(tiny_model, server, tmp_path):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--prompts_per_step", "3", nproc=2), timeout=120)
    assert code != 0 and "--prompts_per_step 3 must divide by the world size 2" in out


def test_help_lists_every_flag_with_its_help_and_default():
    code, out = run([sys.executable, os.path.join(HERE, "grpo_sglang.py"), "--help"], timeout=120)
    assert code == 0 and "GRPO in one file" in out, out  # (a '%' in a help string once crashed argparse here)
    squeezed = "".join(out.split())  # argparse wraps the help lines anywhere, hyphens included
    for f in dataclasses.fields(g.Config):
        assert "--" + f.name.rstrip("_") in out, f.name
        assert "".join(f"{f.metadata['help']} (default: {f.default})".split()) in squeezed, f.name


def test_a_bad_flag_is_one_clear_line_not_a_traceback(tiny_model, tmp_path):
    code, out = run(train_cmd(tiny_model, f"http://127.0.0.1:{free_port()}", tmp_path, "--temperature", "0"), timeout=120)
    assert code == 1 and "--temperature 0.0 is out of range" in out
    assert "Traceback" not in out and "no answer from the SGLang server" not in out  # before even the server


@pytest.mark.parametrize("flags, says", [
    ((), "no answer from the SGLang server"),                          # rank 0 alone finds it
    (("--temperature", "0"), "--temperature 0.0 is out of range")])     # every rank finds it
def test_one_error_said_once_under_torchrun_and_last(tiny_model, tmp_path, flags, says):
    code, out = run(train_cmd(tiny_model, f"http://127.0.0.1:{free_port()}", tmp_path, *flags, nproc=2), timeout=180)
    assert code == 1
    assert out.count(says) == 1, out
    tail = "\n".join(l for l in out.strip().splitlines()[-6:])
    assert says in tail, out


@pytest.mark.parametrize("flag, value, says", [
    ("--temperature", "0", "--temperature 0.0 is out of range: it must be temperature > 0"),
    ("--temperature", "-1", "--temperature -1.0 is out of range"),
    ("--prompts_per_step", "0", "--prompts_per_step 0 is out of range: it must be prompts_per_step >= 1"),
    ("--lr", "-1", "--lr -1.0 is out of range: it must be lr >= 0"),
    ("--top_p", "0", "--top_p 0.0 is out of range: it must be 0 < top_p <= 1"),
    ("--top_k", "0", "--top_k 0 is out of range: it must be top_k == -1 or top_k >= 1"),
    ("--clip_low", "1.5", "--clip_low 1.5 is out of range: it must be 0 <= clip_low < 1"),
    ("--tis_cap", "-1", "--tis_cap -1.0 is out of range: it must be tis_cap == 0 or tis_cap >= 1"),
    ("--out_dir", "/proc/no/such/dir", "--out_dir '/proc/no/such/dir' cannot be created"),
    ("--group_size", "1", "--group_size 1 is out of range: it must be group_size >= 2"),
    ("--sync", "ib", "--sync 'ib' is out of range: it must be auto or tensor or nccl"),
    ("--nccl_port", "70000", "--nccl_port 70000 is out of range: it must be 0 <= nccl_port <= 65535"),
    ("--check_seqs", "-1", "--check_seqs -1 is out of range: it must be check_seqs >= 0"),
    ("--server_url", "localhost:30000", "--server_url 'localhost:30000' is not a server address: it must look like http://"),
    ("--server_url", "http://", "--server_url 'http://' is not a server address"),
    ("--server_url", "http://127.0.0.1:99999", "--server_url 'http://127.0.0.1:99999' is not a server address")])
def test_flags_out_of_range_are_refused_before_anything_heavy(flag, value, says, tmp_path):
    cfg = g.parse_config(([] if flag == "--out_dir" else ["--out_dir", str(tmp_path)]) + [flag, value])
    with pytest.raises(g.UserError, match=re.escape(says)):
        g.check_config(cfg, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU")
def test_device_cuda_without_a_gpu_is_refused(tmp_path):
    with pytest.raises(g.UserError, match="--device cuda, but torch sees no GPU"):
        g.check_config(g.Config(device="cuda", out_dir=str(tmp_path)), 1)


def test_bf16_head_on_a_gpu_with_a_torch_before_2_8_is_refused(tmp_path, monkeypatch):
    """--head_matmul bf16 (the default) needs torch.mm(..., out_dtype=float32) on CUDA, torch >= 2.8: older is one
    clear error before anything heavy (it would be a TypeError in the head's first forward); fp32 and the CPU run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for version, head, device, refused in (("2.7.1+cu126", "bf16", "auto", True), ("2.7.1", "fp32", "auto", False),
                                           ("2.7.1", "bf16", "cpu", False), ("2.8.0", "bf16", "auto", False),
                                           ("2.11.0+cu130", "bf16", "cuda", False)):
        monkeypatch.setattr(torch, "__version__", version)
        cfg = g.Config(head_matmul=head, device=device, out_dir=str(tmp_path))
        if refused:
            with pytest.raises(g.UserError, match=r"--head_matmul bf16 needs torch >= 2.8 .* this is torch 2\.7\.1"):
                g.check_config(cfg, 1)
        else:
            g.check_config(cfg, 1)


@pytest.mark.parametrize("new_tokens, says", [
    ("200", "--max_new_tokens 200 leaves no room for a prompt: the server's context is 128 tokens"),
    ("125", 'no usable rows left for training (skipped: {"prompt longer than 2 tokens (the server\'s context)"')])
def test_max_new_tokens_beyond_the_servers_context_is_said_before_the_model_loads(tiny_model, server, tmp_path, new_tokens,
                                                                                    says):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--max_new_tokens", new_tokens), timeout=120)
    assert code == 1 and says in out and "Traceback" not in out and not server.pushes, out


# ---------------------------------------------------------------------------------------------
# 6. one step and FSDP in-process: log-probs, norms, micro-batches, sharding, the train step

@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "gemma2"])  # (gemma2: a soft-capped head)
def test_packed_batch_logprobs_entropy_and_grads_equal_each_sequence_alone_in_plain_transformers(arch, tmp_path):
    """pack_batch puts sequences of very different lengths end to end in rows (position_ids restart at 0 for each):
    every completion token's log-prob, entropy and gradient must be what plain transformers gives each sequence
    alone (its own forward, log_softmax of logits / T), for Llama, Qwen3 and Gemma 3 (a sliding window of 16,
    shorter than some of these sequences), through transformers' masked SDPA, which reads the packing from the
    position ids."""
    from transformers import AutoModelForCausalLM
    d, T = build_tiny(str(tmp_path), arch), 0.7
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    plain = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    scoring(model)  # what shard() gives it: token_logprobs, the log-probs of chosen tokens from its last states
    gen = torch.Generator().manual_seed(0)
    tokens = lambda n: torch.randint(4, model.config.vocab_size, (n,), generator=gen).tolist()
    samples = [{"prompt": tokens(p), "completion": tokens(c)} for p, c in
               ((7, 3), (2, 5), (4, 1), (20, 18), (1, 2), (9, 30), (3, 3), (12, 6), (5, 9))]
    lens = [len(s["prompt"]) + len(s["completion"]) for s in samples]
    b = g.pack_batch(samples, 0, "cpu")
    lp, ent = g.completion_logprobs(model, b, T)
    assert b["ids"].shape == (4, 39) and (b["ids"] == 0).any()  # rows as long as the longest, 39
    assert b["tokens"] == sum(lens)
    full = g.pack_batch([{"prompt": [4, 5], "completion": [6, 7, 8]}] * 2, 0, "cpu")  # full rows: no pad, no mask
    assert full["ids"].shape == (2, 5) and full["src"].tolist() == [1, 2, 3, 6, 7, 8]
    w = torch.randn(lp.shape, generator=gen) * b["mask"]  # a loss that weighs every token differently
    ((lp * w).sum() + (ent * w).sum()).backward()
    total = 0
    for i, s in enumerate(samples):
        p, c = s["prompt"], s["completion"]
        z = plain(torch.tensor([p + c])).logits[0, len(p) - 1: -1] / T  # (len(c), V): the positions before each token
        ref_lp = torch.log_softmax(z, -1).gather(1, torch.tensor(c)[:, None]).squeeze(1)
        ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
        # (fp32 both: one forward's rounding, ~1e-7 relative, apart; 1e-5 leaves room for the summation order)
        assert torch.allclose(lp[i, : len(c)], ref_lp, atol=1e-5), (i, lp[i, : len(c)], ref_lp)
        assert torch.allclose(ent[i, : len(c)], ref_ent, atol=1e-5), i
        assert b["mask"][i].sum() == len(c) and (lp[i, len(c):] == 0).all()
        total = total + (ref_lp * w[i, : len(c)]).sum() + (ref_ent * w[i, : len(c)]).sum()
    total.backward()
    got, want = dict(model.named_parameters()), dict(plain.named_parameters())
    assert all(torch.allclose(got[n].grad, want[n].grad, atol=1e-5, rtol=1e-4) for n in want), \
        [n for n in want if not torch.allclose(got[n].grad, want[n].grad, atol=1e-5, rtol=1e-4)]


@pytest.mark.parametrize("arch, n_fused", [("llama", 5), ("qwen3", 9), ("gemma3", 0)])
def test_fused_rms_norms_compute_transformers_norms_and_leave_gemmas_alone(arch, n_fused, tmp_path):
    """fuse_rms_norms gives Llama's and Qwen's RMSNorms (Qwen3's per-head q and k norms too) torch's fused norm and
    leaves Gemma's (x * (1 + weight)) as it is: in fp32 the whole model computes what transformers' does; in bf16 one
    norm's output is rounded once (within half a bf16 step of the exact value) and its gradients are bf16-close."""
    from transformers import AutoModelForCausalLM
    d, gen = build_tiny(str(tmp_path), arch), torch.Generator().manual_seed(0)
    model, plain = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32) for _ in range(2))
    norms = [(m, p) for m, p in zip(model.modules(), plain.modules()) if type(m).__name__.endswith("RMSNorm")]
    for m, p in norms:  # weights that matter (transformers starts them at 1, or Gemma's at 0)
        m.weight.data = p.weight.data = torch.rand(m.weight.shape, generator=gen) + 0.5
    g.fuse_rms_norms(model)
    fused = [m for m, _ in norms if "forward" in m.__dict__]
    assert len(norms) >= 5 and len(fused) == n_fused
    ids = torch.randint(4, model.config.vocab_size, (2, 12), generator=gen)
    assert torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-5)
    if fused:
        check_fused_norm_in_bf16(fused[0], "cpu")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:  # what the trainer's models get: shard() fuses them
        sharded = g.shard(g.load_policy(d, torch.device("cpu"), False), init_device_mesh("cpu", (1,)), torch.bfloat16)
    finally:
        dist.destroy_process_group()
    assert sum("forward" in m.__dict__ for m in sharded.modules() if type(m).__name__.endswith("RMSNorm")) == n_fused


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's fused RMSNorm kernel runs on CUDA")
def test_fused_rms_norm_on_cuda_runs_torchs_kernel_within_bf16_rounding(tmp_path):
    """On CUDA fuse_rms_norms' norms run torch's fused kernel (its own backward), in bf16 within rounding."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(build_tiny(str(tmp_path), "qwen2"), dtype=torch.float32)
    g.fuse_rms_norms(model)
    y = check_fused_norm_in_bf16(model.model.norm, "cuda")
    print("grad_fn:", y.grad_fn.name())
    assert "Fused" in y.grad_fn.name(), y.grad_fn.name()


def test_micro_batches_hold_as_many_tokens_as_micro_batch_of_the_longest_sequences():
    """Short sequences share micro-batches (a few of them alone would leave the GPU idle): each micro-batch holds at most
    micro_batch x the longest sequence's tokens, consecutive in length, a longer sequence alone; all rows exactly once."""
    parts = g.split_by_tokens([5, 5, 5, 5, 20, 20, 40, 40, 70], 40, "cpu")
    assert [(p.start, p.stop) for p in parts] == [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9)]  # 70: alone
    comp = [[7] * n for n in [3, 60, 2, 5, 58, 4, 60, 1, 6, 2, 3, 59]]  # eight short, four near 60
    seqs = {"prompt": [[4, 5]] * len(comp), "completion": comp, "mask": torch.ones(len(comp), 60)}
    mbs = g.micro_batches(seqs, 2, 0)  # budget: 2 x 62 tokens
    assert sorted(i for b in mbs for i in b["rows"].tolist()) == list(range(len(comp)))
    tokens = [sum(len(comp[i]) + 2 for i in b["rows"].tolist()) for b in mbs]
    assert len(mbs) == 3 and max(tokens) <= 124 and len(mbs[0]["rows"]) == 9, tokens  # the short ones and a long one
    assert [len(b["rows"]) for b in g.micro_batches({**seqs, "completion": [[7] * 60] * 12}, 2, 0)] == [2] * 6


TOKEN_PARTS_ON_TWO_RANKS = """import json, sys
sys.path.insert(0, {here!r})
import torch, torch.distributed as dist
import grpo_sglang as g
dist.init_process_group("gloo")
lengths = [[3] * 12, [3] * 6 + [30] * 6][dist.get_rank()]  # rank 0: one part would do; rank 1 needs four
parts = g.split_by_tokens(lengths, 60, torch.device("cpu"))
json.dump([[p.start, p.stop] for p in parts], open({out!r} + str(dist.get_rank()), "w"))  # a file each: no interleaving
dist.destroy_process_group()
"""


def test_every_rank_cuts_its_rows_into_as_many_micro_batches(tmp_path):
    """FSDP runs its collectives once per micro-batch: a rank whose rows fit in fewer micro-batches than another's
    splits its largest ones (each still within the budget), so that no rank waits for a collective the others skip."""
    script = tmp_path / "parts.py"
    script.write_text(TOKEN_PARTS_ON_TWO_RANKS.format(here=HERE, out=str(tmp_path / "parts")))
    code, out = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                     f"--master_port={free_port()}", str(script)], timeout=120)
    assert code == 0, out
    got = {r: json.load(open(tmp_path / f"parts{r}")) for r in (0, 1)}
    assert got[1] == [[0, 7], [7, 9], [9, 11], [11, 12]]
    assert got[0] == [[0, 3], [3, 6], [6, 9], [9, 12]]  # 36 tokens in four, not one


def test_training_mode_checkpoints_layers_and_turns_dropout_off(tmp_path):
    d = build_tiny(str(tmp_path), "llama", attention_dropout=0.5)  # a config that asks for dropout
    for ckpt, runs_per_layer in ((False, 1), (True, 2)):
        model = g.load_policy(d, torch.device("cpu"), ckpt)
        assert model.training and model.config.attention_dropout == 0.0
        calls = []
        # a pre-hook: the recompute stops as soon as it has what backward needs, before mlp returns
        model.model.layers[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
        ids = torch.tensor([[4, 5, 6, 7, 8]])
        out1 = model(ids).logits
        assert torch.equal(out1, model(ids).logits)  # training mode, yet deterministic: no dropout
        calls.clear()
        model(ids).logits.sum().backward()
        assert len(calls) == runs_per_layer  # checkpointing recomputes the layer in backward


def test_checkpointed_blocks_recompute_in_bf16_under_fsdp(tmp_path, monkeypatch):
    """torch 2.11's FSDP (what SGLang 0.5.16 pins) does not cast a block's inputs to bf16 when transformers
    5.12's checkpointing re-runs the block in backward (torch 2.12+ does); the root's fp32 rotary cos/sin
    then met bf16 values and an H200 run crashed in SDPA. With torch 2.11's behaviour put back, every call
    of the first block's attention, forward and recompute, must still see bf16 only."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState, TrainingState
    newer = FSDPState._pre_forward

    def torch_2_11(self, module, args, kwargs):  # unshard as now, but hand the inputs on uncast, as 2.11 did
        cast = newer(self, module, args, kwargs)
        return (args, kwargs) if self._training_state == TrainingState.PRE_BACKWARD else cast
    monkeypatch.setattr(FSDPState, "_pre_forward", torch_2_11)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        d = build_tiny(str(tmp_path), "qwen2")
        model = g.shard(g.load_policy(d, torch.device("cpu"), True), init_device_mesh("cpu", (1,)), torch.bfloat16)
        seen = []
        model.model.layers[0].self_attn.register_forward_pre_hook(
            lambda m, args, kwargs: seen.append({kwargs["hidden_states"].dtype, *(t.dtype for t in kwargs["position_embeddings"])}),
            with_kwargs=True)
        b = g.pack_batch([{"prompt": [4, 5, 6], "completion": [7, 8]}, {"prompt": [4], "completion": [9]}], 0, "cpu")
        g.completion_logprobs(model, b, 1.0)[0].sum().backward()
    finally:
        dist.destroy_process_group()
    assert len(seen) == 2 and all(dtypes == {torch.bfloat16} for dtypes in seen), seen  # forward + recompute


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fsdp_units_of_several_blocks_compute_what_one_block_per_unit_does(checkpointing, tmp_path):
    """shard() puts consecutive blocks in one FSDP unit up to unit_params (fewer hooks: CPU time on small models).
    The log-probs and every gradient must be those of one block per unit, bit for bit, with and without
    checkpointing; and the units must be what the rule says."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    d, results = build_tiny(str(tmp_path), "qwen2"), []
    batch = g.pack_batch([{"prompt": [4, 5, 6], "completion": [7, 8, 9]}, {"prompt": [5], "completion": [10, 11]}], 0,
                        "cpu")
    try:
        for units_of in ({"unit_params": 1}, {}):  # one block per unit; the default: the tiny model's blocks in one
            model = g.shard(g.load_policy(d, torch.device("cpu"), checkpointing), init_device_mesh("cpu", (1,)),
                            torch.bfloat16, **units_of)
            units = {id(fully_shard.state(b)) for b in model.model.layers}
            lp = g.completion_logprobs(model, batch, 0.7)[0]
            (lp * torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 0.0]])).sum().backward()
            results.append((len(units), lp.detach(), {n: p.grad.full_tensor() for n, p in model.named_parameters()}))
    finally:
        dist.destroy_process_group()
    (n0, lp0, g0), (n1, lp1, g1) = results
    assert (n0, n1) == (len(model.model.layers), 1) and n0 > 1
    assert torch.equal(lp0, lp1) and g0.keys() == g1.keys() and all(torch.equal(g0[n], g1[n]) for n in g0)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fsdp_keeping_small_models_gathered_from_forward_to_backward_changes_no_number(checkpointing, tmp_path):
    """shard() keeps a small model's gathered weights from forward to backward (no second gather). Every log-prob
    of three steps, no-grad forwards included, and the weights after them must be those of gathering again, bit for
    bit: a forward after an optimizer step must see the new weights, never the ones kept."""
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    d = build_tiny(str(tmp_path), "qwen2")
    try:
        (lp0, w0, kept0, _), (lp1, w1, kept1, _) = (fsdp_steps(d, checkpointing, keep_params=0),
                                                    fsdp_steps(d, checkpointing))
    finally:
        dist.destroy_process_group()
    assert (kept0, kept1) == (False, True)  # the rule: the tiny model is kept gathered, keep_params=0 is not
    assert all(torch.equal(a, b) for a, b in zip(lp0, lp1)) and not torch.equal(lp1[0], lp1[-1])  # the weights moved
    assert w0.keys() == w1.keys() and all(torch.equal(w0[n], w1[n]) for n in w0)


def test_a_frozen_model_kept_gathered_from_step_to_step_scores_as_one_gathered_each_time(tmp_path):
    """The reference model (shard(frozen=True)) keeps its gathered weights between its no-grad forwards: the same
    log-probs, bit for bit, as a model that gathers them for every forward."""
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    d = build_tiny(str(tmp_path), "qwen2")
    try:
        runs = [fsdp_steps(d, False, steps=1, keep_params=0), fsdp_steps(d, False, steps=1, frozen=True)]
    finally:
        dist.destroy_process_group()
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0]))


def test_the_default_process_group_is_not_bound_to_a_device():
    """A default group bound to a device (init_process_group(device_id=...)) makes torch build every later
    NCCL group by splitting it, so the trainer never met the server in the weight-update group: the server
    waited for the trainer's NCCL id until the request timed out (seen on two H200s). Gloo on CPU cannot
    show it, hence this guard on the call itself."""
    import ast
    calls = [n for n in ast.walk(ast.parse(open(os.path.join(HERE, "grpo_sglang.py")).read()))
             if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "init_process_group"]
    assert len(calls) == 1 and not any(k.arg == "device_id" for k in calls[0].keywords)


def test_the_old_policy_and_reference_logprobs_are_at_the_sampling_temperature(tiny_model):
    """--mu 2 and --beta 0.1, a batch sampled at temperature 0.7: the no-grad forwards before the first update (and
    at mu 1 train's first forward, lp0) score each completion token as the server sampled it, log softmax(z / 0.7), z
    from plain transformers (fp32). The batch's temperature counts, not the flag's (here 1: a schedule would change
    it while a batch sampled before waits, with --async)."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    dist_init()
    try:
        model, ref = sharded(tiny_model), sharded(tiny_model, frozen=True)
        cfg = g.Config(mu=2, beta=0.1, group_size=4)
        seqs = g.sequences(known_batch(0.7), 4, "cpu")
        g.old_and_ref_logprobs(cfg, model, ref, seqs, g.micro_batches(seqs, 3, 0))
        seqs.update(adv=torch.zeros(12), weight=torch.ones(12), reward=torch.zeros(12))
        g.train(dataclasses.replace(cfg, mu=1, beta=0.0), model, torch.optim.SGD(model.parameters(), lr=0.0), seqs,
                g.micro_batches(seqs, 3, 0), 1, lambda s, m: None, g.Metrics())
    finally:
        dist.destroy_process_group()
    gap = 0.0
    for k, c in enumerate(COMPLETIONS):
        p = PROMPTS[k // 4]
        with torch.no_grad():
            z = plain(torch.tensor([p + c])).logits[0, len(p) - 1: -1]
        want = [torch.log_softmax(z / t, -1).gather(-1, torch.tensor(c)[:, None])[:, 0] for t in (0.7, 1.0)]
        for name in ("old_lp", "ref_lp", "lp0"):  # one bf16 forward against fp32: ~2e-3 apart at most here (0.01: 5x that)
            assert seqs[name][k, : len(c)].tolist() == pytest.approx(want[0].tolist(), abs=0.01), (name, k)
        gap = max(gap, (want[0] - want[1]).abs().max().item())
    assert gap > 0.1  # (at temperature 1 they would be this far off)


def test_train_step_is_the_grpo_objective_of_each_sequence_with_its_own_advantage_and_weight(tiny_model, monkeypatch):
    """One step in-process, on a batch whose rewards are known: the loss is the GRPO objective computed here sequence
    by sequence with each one's own group advantage, its TIS weights (trainer over server, capped), its weight (a
    filtered sequence counts nowhere) and the temperature; the entropy is that of the sampling distribution; a
    gradient step raises the rewarded completions against the others; with mu = 2 the logged grad_norm is the mean
    over both updates. The trainer's log-probs and entropies here are those of the step's own packed forwards
    (as_trained): bit for bit what train() computes, so only the sums' order differs (fp32)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    dist_init()
    try:
        torch.manual_seed(0)
        model = g.shard(g.load_policy(tiny_model, torch.device("cpu"), False), init_device_mesh("cpu", (1,)),
                        torch.bfloat16)
        G, T, cap = 4, 0.8, 1.5
        prompts = [[4, 5, 6, 8], [6, 7], [9, 4, 10]]
        completions = [[11 + (k * 5 + j) % 13 for j in range(1 + k % 4)] + [3] for k in range(12)]  # lengths 2..5, EOS last
        good = [0, 3, 5, 6, 9]  # rewarded; group 2 (8-11) has one rewarded, group 0 two, group 1 two
        texts = {tuple(c): ("good" if k in good else "bad") for k, c in enumerate(completions)}

        class Tok:
            def decode(self, ids, skip_special_tokens):
                return texts[tuple(ids)]
        table = g.sequences(known_batch(T), G, "cpu")  # (its lengths make the micro-batches, as in the step)
        rows = lambda x: [x[k, : len(c)] for k, c in enumerate(completions)]
        # the trainer's logprobs and entropies before the step; the server's differ by known amounts
        before, ents = map(rows, as_trained(model, table, 3, T))
        server = [(lp + (0.7 if k % 3 == 0 else -0.1)).tolist() for k, lp in enumerate(before)]  # TIS: capped, or 1.105
        batch = {"rows": [{"ids": p, "answer": "1"} for p in prompts], "version": 0, "srv": [0] * 12,
                 "outs": [(c, lps, "stop") for c, lps in zip(completions, server)]}
        reward = lambda c, a: float(c == "good")
        cfg = g.Config(temperature=T, tis_cap=cap, loss_agg="token", max_grad_norm=1e9, micro_batch=3, group_size=G)
        weight = torch.tensor([1.0] * 8 + [0.0] * 4)  # group 2 filtered out
        seqs, got = one_step(cfg, model, batch, Tok(), reward, weight)  # micro-batches of 3 across groups, by length
        adv = g.group_advantages(torch.tensor([float(k in good) for k in range(12)]), G)
        w = [torch.clamp(torch.exp(lp - torch.tensor(sv)), max=cap) for lp, sv in zip(before, server)]
        n_tokens = sum(len(c) for c in completions[:8])
        # (the same forwards: only fp32 sums in another order, ~1e-7 relative)
        assert got["loss"] == pytest.approx(-sum(a * wk.sum() for a, wk in zip(adv[:8], w[:8])).item() / n_tokens, rel=1e-5)
        assert got["entropy"] == pytest.approx(sum(e.sum() for e in ents).item() / sum(map(len, completions)), rel=1e-5)
        after = rows(as_trained(model, table, 3, T)[0])
        gain = [(a - b).sum().item() for a, b in zip(after, before)]
        for grp in range(2):  # in every group the rewarded completions rose against the others
            ks = range(grp * G, (grp + 1) * G)
            up = sum(gain[k] for k in ks if k in good) / sum(k in good for k in ks)
            down = sum(gain[k] for k in ks if k not in good) / sum(k not in good for k in ks)
            assert up > down, (grp, gain)
        assert all(torch.equal(seqs["lp0"][k, : len(c)], before[k])
                   for k, c in enumerate(completions))  # row k of lp0 is completion k, whatever the micro-batches
        norms, clip = [], g.clip_grads
        monkeypatch.setattr(g, "clip_grads", lambda *a, **k: norms.append(clip(*a, **k)) or norms[-1])
        _, got2 = one_step(dataclasses.replace(cfg, mu=2), model, batch, Tok(), reward)
        assert len(norms) == 2 and norms[0].item() != norms[1].item()  # .item(): torch 2.11 has no DTensor `!=`
        assert got2["grad_norm"] == pytest.approx((norms[0].item() + norms[1].item()) / 2, rel=1e-6)
    finally:
        dist.destroy_process_group()


def test_the_kl_metric_counts_only_the_sequences_with_a_weight(tiny_model):
    """--beta 0.1 against a reference that differs from the policy, group 1 filtered out (weight 0): the logged kl
    is the mean of k3(π, π_ref) over the tokens of the sequences with a weight, written out here from both models'
    log-probs of the step's own packed forwards (as_trained: the same numbers as the step's)."""
    import torch.distributed as dist
    dist_init()
    try:
        model, ref = sharded(tiny_model), sharded(tiny_model, frozen=True, noise=0.05)
        T = 0.8
        table = g.sequences(known_batch(T), 4, "cpu")
        d = as_trained(ref, table, 3, T)[0] - as_trained(model, table, 3, T)[0]
        k3 = [(torch.exp(d) - d - 1)[k, : len(c)] for k, c in enumerate(COMPLETIONS)]
        cfg = g.Config(beta=0.1, temperature=T, group_size=4, micro_batch=3, max_grad_norm=1e9)
        weight = torch.tensor([1.0] * 4 + [0.0] * 4 + [1.0] * 4)
        _, got = one_step(cfg, model, known_batch(T), KnownTok(), lambda c, a: float(c == "good"), weight, ref=ref)
    finally:
        dist.destroy_process_group()
    kept = [k for k in range(12) if weight[k]]
    want = sum(k3[k].sum().item() for k in kept) / sum(len(COMPLETIONS[k]) for k in kept)
    every = sum(x.sum().item() for x in k3) / sum(map(len, COMPLETIONS))
    assert got["kl"] == pytest.approx(want, rel=1e-5) and abs(every - want) > 0.1 * want  # (fp32 sums' order only)


def test_entropy_with_mu_2_is_logged_from_the_first_pass_per_token(tiny_model):
    """--mu 2: the logged entropy is that of the policy that sampled, before either update, per completion token
    (the step's own packed forwards scored here: as_trained), neither summed over the two passes nor mixed with the
    second's."""
    import torch.distributed as dist
    dist_init()
    try:
        model, T = sharded(tiny_model), 0.8
        table = g.sequences(known_batch(T), 4, "cpu")
        ents = as_trained(model, table, 3, T)[1]
        cfg = g.Config(mu=2, temperature=T, group_size=4, micro_batch=3, max_grad_norm=1e9)
        _, got = one_step(cfg, model, known_batch(T), KnownTok(), lambda c, a: float(c == "good"))
        after = as_trained(model, table, 3, T)[1]
    finally:
        dist.destroy_process_group()
    n = sum(map(len, COMPLETIONS))
    want, moved = ((e * table["mask"]).sum().item() / n for e in (ents, after))
    # the same forwards: only fp32 sums in another order (~1e-7); the updates moved it far more than that
    assert got["entropy"] == pytest.approx(want, rel=1e-5) and abs(moved - want) > 5e-4 * want


def test_a_step_whose_weights_are_all_0_skips_its_update(tiny_model, monkeypatch):
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed as dist
    dist_init()
    try:
        model = g.shard(g.load_policy(tiny_model, torch.device("cpu"), False), init_device_mesh("cpu", (1,)), torch.bfloat16)
        batch = {"rows": [{"ids": [4, 5], "answer": "1"}], "version": 0, "srv": [0] * 4,
                 "outs": [([11 + k, 3], [-1.0, -1.0], "stop") for k in range(4)]}

        class Tok:
            def decode(self, ids, skip_special_tokens):
                return str(ids[0])
        steps = []
        monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a: steps.append(1))
        cfg = g.Config(group_size=4, micro_batch=2, mu=2)
        _, got = one_step(cfg, model, batch, Tok(), lambda c, a: float(c == "11"), torch.zeros(4))
        assert got["empty_batch_skips"] == 2 and not steps and got["loss"] == 0  # both updates skipped, nothing trained
        _, got = one_step(cfg, model, batch, Tok(), lambda c, a: float(c == "11"))
        assert got["empty_batch_skips"] == 0 and len(steps) == 2
    finally:
        dist.destroy_process_group()


def test_clip_grads_is_torchs_clip_grad_norm_on_sharded_gradients():
    """clip_grads (the trainer's clipping, on FSDP's local shards) against torch.nn.utils.clip_grad_norm_ on the same
    DTensor gradients: the same total norm, the same clipped gradients; no clipping under the norm or at inf."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh, torch_gen = init_device_mesh("cpu", (1,)), torch.Generator().manual_seed(0)
        shapes = [(4, 3), (7,), (2, 2, 5)]
        grads = [torch.randn(s, generator=torch_gen) for s in shapes]
        for max_norm in (0.5, 1e3, float("inf")):
            runs = []
            for fn in (torch.nn.utils.clip_grad_norm_, g.clip_grads):
                ps = [torch.nn.Parameter(distribute_tensor(torch.zeros(s), mesh, [Shard(0)])) for s in shapes]
                for p, gr in zip(ps, grads):
                    p.grad = distribute_tensor(gr.clone(), mesh, [Shard(0)])
                norm = fn(ps, max_norm)
                runs.append((float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm),
                             [p.grad.full_tensor() for p in ps]))
            (n0, g0), (n1, g1) = runs
            assert n1 == pytest.approx(n0, rel=1e-6) and n0 == pytest.approx(torch.cat([x.flatten() for x in grads]).norm().item())
            assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(g0, g1)), max_norm
            assert (max_norm < n0) == (not torch.allclose(g1[0], grads[0]))  # clipped only above the norm
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# 7. the script end to end against the stand-in server (1 process, then torchrun with 2)

@pytest.mark.parametrize("nproc", [1, 2])
def test_script_trains_and_server_gets_the_weights(tiny_model, server, tmp_path, nproc):
    from transformers import AutoTokenizer
    # step 1, then resume to step 2: after EACH step the server holds exactly the trainer's weights
    mb = ["--micro_batch", "2"] if nproc == 2 else []  # 2 ranks x 2 micro-batches: grads reduced once
    mb += ["--reward", "has_number"]  # a signal in every step, so that the weights move
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--steps", "1", *mb, nproc=nproc, rewards=True))
    assert code == 0, out
    assert len(server.pushes) == 2  # the initial push, then one per step
    assert_server_has(server.pushes[-1], ckpt_weights(tmp_path))
    assert not torch.equal(server.pushes[0]["model.layers.0.mlp.up_proj.weight"],
                           server.pushes[1]["model.layers.0.mlp.up_proj.weight"])  # training moved the weights
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--steps", "2", "--resume", *mb, nproc=nproc, rewards=True))
    assert code == 0, out
    assert "resumed from" in out and "at step 1" in out
    assert len(server.pushes) == 4
    assert_server_has(server.pushes[2], {n: t for n, t in server.pushes[1].items()})  # resume pushes step-1 weights
    assert_server_has(server.pushes[-1], ckpt_weights(tmp_path))
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert [r["step"] for r in m] == [1, 2]
    for key in ("reward_mean", "kl", "mismatch_mean", "mismatch_max", "mismatch_kl", "is_ratio_mean", "time_rollout",
                "time_train", "time_sync", "rollout_tokens_per_s"):
        assert all(isinstance(r[key], float) and math.isfinite(r[key]) for r in m), key
    assert all(r["mismatch_mean"] < 0.05 for r in m)
    assert "batch: 2 prompts x 4 completions = 8 sequences per step" in out
    assert "weight sync: tensor (on the CPU: tensors shared through files)" in out
    im_start = AutoTokenizer.from_pretrained(tiny_model).convert_tokens_to_ids("<|im_start|>")
    assert "prompt format: chat" in out and all(p[0] == im_start for r in server.rollouts for p in r)  # auto: its template
    assert server.calls["/flush_cache"] == 0  # the cache is flushed by the last bucket's flush_cache flag


@pytest.mark.parametrize("arch", ["llama_untied", "qwen2", "qwen3", "gemma3"])
def test_architectures_train_and_push(arch, tmp_path):
    """Beyond Llama (the fixture): forward/backward through shard(), every weight pushed and loaded by
    name, two steps against the stand-in. Gemma's final norm returns bf16 into the fp32 LM head (with
    --head_matmul fp32, whose logits take the head's input as it comes: it must be cast first)."""
    model_dir = build_tiny(str(tmp_path / "model"), arch)
    s = StandIn(model_dir)
    try:
        head = ["--head_matmul", "fp32"] if arch == "gemma3" else []
        code, out = run(train_cmd(model_dir, s.url, tmp_path / "run", "--steps", "2", *head))
        assert code == 0, out
        assert_server_has(s.pushes[-1], ckpt_weights(tmp_path / "run"))
        m = [r for r in read_metrics(tmp_path / "run") if "reward_mean" in r]
        assert len(m) == 2 and all(math.isfinite(r["mismatch_mean"]) and math.isfinite(r["loss"]) for r in m)
    finally:
        s.close()


def test_a_step_on_a_known_reward_raises_the_rewarded_completions(tiny_model, server, tmp_path):
    """End to end, one step with a reward the test knows (1 if the completion holds the word 'number'): the
    trained weights give the rewarded completions more probability against the others of their own group."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    flags = ("--reward", "has_number", "--steps", "1", "--prompts_per_step", "4", "--group_size", "8", "--max_new_tokens", "6",
             "--lr", "1e-3", "--micro_batch", "5")
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, *flags, rewards=True))
    assert code == 0, out
    tok = AutoTokenizer.from_pretrained(tiny_model)
    gens = server.generations  # step 1's rollout: 4 prompts x 8, in order
    rewards = torch.tensor([float("number" in tok.decode(c, skip_special_tokens=True).split()) for _, c, _ in gens])
    assert 0 < rewards.sum() < len(rewards) - 8, rewards  # signal in some groups
    models = [AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), None]
    models[1] = AutoModelForCausalLM.from_pretrained(g.latest_checkpoint(str(tmp_path)), dtype=torch.float32)
    [scoring(m) for m in models]
    with torch.no_grad():
        total = [torch.stack([g.completion_logprobs(m, g.pack_batch([{"prompt": p, "completion": c}], 0, "cpu"), 1.0)[0].sum()
                              for p, c, _ in gens]) for m in models]
    gain, adv = (total[1] - total[0]).view(4, 8), g.group_advantages(rewards, 8).view(4, 8)
    for grp in range(4):
        r = rewards.view(4, 8)[grp]
        if 0 < r.sum() < 8:
            assert gain[grp][r == 1].mean() > gain[grp][r == 0].mean(), (grp, gain[grp], r)
    assert (adv * gain).sum() > 0


def test_one_rank_and_two_ranks_take_the_same_step(tiny_model, tmp_path):
    """The same rollouts on one rank or split over two give the same step and the same metrics: each rank
    takes its own prompts (no overlap, none left out), the loss normalisers count the whole batch, FSDP's
    gradient average is undone by the world size, sums are summed and maxima maxed over ranks."""
    got = {}
    for key, nproc in (("1", 1), ("2", 2)):
        s = StandIn(tiny_model)  # fresh weights: all runs sample the same completions
        try:  # 2 prompts x 4 per rank in micro-batches of 3: groups straddle micro-batches
            code, out = run(train_cmd(tiny_model, s.url, tmp_path / key, "--steps", "1", "--prompts_per_step", "4",
                                      "--micro_batch", "3", "--loss_agg", "seq", "--beta", "0.1", "--reward", "has_number",
                                      nproc=nproc, rewards=True))
            assert code == 0, out
            got[key] = ([r for r in read_metrics(tmp_path / key) if "loss" in r][0], s.generations, s.rollouts)
        finally:
            s.close()
    (m1, gen1, asked1), (m2, gen2, asked2) = got["1"], got["2"]
    assert len(asked1) == 1 and len(asked2) == 2  # one request per rank
    prompts = [set(r) for r in asked2]
    assert not prompts[0] & prompts[1] and prompts[0] | prompts[1] == set(asked1[0]) and len(asked1[0]) == 16
    assert sorted(map(str, gen1)) == sorted(map(str, gen2))  # identical rollouts, split differently
    # (kl: 0, the policy is still the reference at step 1; test_kl_is_logged_once_with_mu_2 logs one that is not)
    assert m1["kl"] == 0 and m1["mismatch_max"] > 0 and m1["loss"] != 0
    # Nothing here depends on the trainer's rounding but its log-probs (one bf16 forward) and its gradient (one
    # backward); the two layouts pack the rows otherwise, and a CPU's kernels may round each packing otherwise.
    for k in ("reward_mean", "accuracy", "kl", "clip_frac", "completion_len_mean", "zero_std_groups_frac"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-6, abs=1e-9), k  # (kl 0, clip 0: at step 1 the ratio is exactly 1)
    # Both runs' log-probs are within mismatch_max of the same server's (its fp32 ones of the same sequences), so
    # within d of each other, token by token: what each metric may differ by follows from d.
    d, top = m1["mismatch_max"] + m2["mismatch_max"], max(m1["mismatch_max"], m2["mismatch_max"])
    ratio = max(m1["is_ratio_max"], m2["is_ratio_max"])
    assert d < 0.02 and top < math.log(2.0), (d, top)  # (bf16 against fp32: ~2e-3; no token over the TIS cap of 2)
    bound = {"mismatch_mean": d, "mismatch_max": d, "check_mismatch_mean": d, "check_mismatch_max": d,  # |a| - |b|
             "mismatch_kl": d * math.expm1(top),  # k3's slope e^x - 1 over |x| <= top
             "is_ratio_mean": math.expm1(d) * ratio, "is_ratio_max": math.expm1(d) * ratio,
             "is_truncated_frac": 0.0,
             # seq loss: -A x (the TIS weight, min(ratio, cap)) averaged; |A| <= 1.5 in a group of 4, each weight
             # moves by at most its ratio x (e^d - 1)
             "loss": 1.5 * ratio * math.expm1(d),
             # entropy: near uniform, as here (3.2 of log 26 nats), it moves less than a log-prob under the same
             # logits' rounding (bf16 against fp32 per token: 6e-5 against 1.7e-3)
             "entropy": d}
    for k, b in bound.items():
        assert abs(m2[k] - m1[k]) <= b + 1e-7, (k, m1[k], m2[k], b)
    # one backward each: a bf16 gradient is within ~0.5% of the fp32 one (|Δg| / |g| 5.2-5.5e-3 on the tiny model), so
    # two of them within ~1.1% of each other, and so are their norms
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=2e-2)


def test_kl_is_logged_once_with_mu_2(tiny_model, tmp_path):
    """With lr 0 the mu=2 passes see the same policy, so the logged KL must equal mu=1's on the same rollouts. For
    that to say anything the policy must differ from the reference: both runs resume, at lr 0, from one step taken at
    lr 3e-2 (at step 1 the policy is the reference, and the KL is 0)."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "base", "--steps", "1", "--beta", "0.1", "--reward",
                                  "has_number", rewards=True))
        assert code == 0, out
    finally:
        s.close()
    kl = {}
    for mu in (1, 2):
        d = tmp_path / str(mu)
        shutil.copytree(tmp_path / "base", d)
        saved = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(dict(saved, mu=mu, lr=0.0)))  # what this run trains with
        s = StandIn(tiny_model)
        try:
            code, out = run(train_cmd(tiny_model, s.url, d, "--steps", "2", "--mu", str(mu), "--beta", "0.1",
                                      "--lr", "0", "--reward", "has_number", "--resume", rewards=True))
            assert code == 0 and "at step 1" in out, out
            kl[mu] = [r for r in read_metrics(d) if "kl" in r and r["step"] == 2][0]["kl"]
        finally:
            s.close()
    assert kl[1] > 1e-4 and kl[2] == pytest.approx(kl[1], rel=1e-6), kl


def test_max_grad_norm_0_trains_without_clipping(tiny_model, server, tmp_path):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--steps", "1", "--max_grad_norm", "0", "--reward",
                              "has_number", rewards=True))
    assert code == 0, out
    w = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(server.pushes[0][w], server.pushes[1][w])  # 0 is "no clipping", not a zero gradient
    assert [r["grad_norm"] for r in read_metrics(tmp_path) if "grad_norm" in r][0] > 0
    with pytest.raises(g.UserError, match=re.escape("--max_grad_norm -1.0 is out of range: it must be max_grad_norm >= 0")):
        g.check_config(g.Config(max_grad_norm=-1.0, out_dir=str(tmp_path / "x")), 1)


ONE_RANKS_METRIC = """import os, sys
sys.path.insert(0, {here!r})
import grpo_sglang as g
score = g.score  # a metric only rank 1 logs (a reward part only its samples have, say)
def score_and_more(seqs, task, group_size, m):
    if os.environ["RANK"] == "1":
        m.mean("only_on_rank_1", 3.0, 2), m.max("max_on_rank_1", 5.0)
    return score(seqs, task, group_size, m)
g.score = score_and_more
try:
    g.main(g.parse_config())
except g.UserError as e:
    g.exit_now(1, f"error: {{e}}")
g.exit_now(0)
"""


def test_a_metric_only_one_rank_logs_neither_hangs_nor_shifts_the_others(tiny_model, server, tmp_path):
    script = tmp_path / "one_rank.py"
    script.write_text(ONE_RANKS_METRIC.format(here=HERE))
    cmd = train_cmd(tiny_model, server.url, tmp_path / "run", "--steps", "1", nproc=2)
    code, out = run([c if not c.endswith("grpo_sglang.py") else str(script) for c in cmd], timeout=180)
    assert code == 0, out
    m = [r for r in read_metrics(tmp_path / "run") if "reward_mean" in r][0]
    assert m["only_on_rank_1"] == 1.5 and m["max_on_rank_1"] == 5.0 and 0 <= m["accuracy"] <= 1


@pytest.mark.parametrize("nproc", [1, 2])
def test_nccl_path_protocol_against_the_stand_in(tiny_model, tmp_path, nproc):
    """--sync nccl on CPU: the same protocol over a gloo group (the stand-in joins it with SGLang's helper
    and reads each bucket with SGLang's bucket class): init once, buckets of bf16 with names, dtypes and
    shapes, the flush and the version tag on the last bucket only, the group destroyed at the end."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "2", "--sync", "nccl", "--sync_bucket_mb", "0.02",
                                  nproc=nproc))
        assert code == 0, out
        assert "weight sync: nccl (--sync nccl, NCCL group at " in out
        assert s.calls["/init_weights_update_group"] == 1 and s.calls["/destroy_weights_update_group"] == 1
        assert s.calls["/update_weights_from_tensor"] == 0
        per_sync = s.calls["/update_weights_from_distributed"] // 3  # the initial push, then one per step
        assert per_sync > 1 and len(s.push_log) == 3 * per_sync
        for k in range(3):
            flags = s.push_log[k * per_sync: (k + 1) * per_sync]
            assert [f["flush_cache"] for f in flags] == [False] * (per_sync - 1) + [True]
            assert [f["weight_version"] for f in flags] == [None] * (per_sync - 1) + [str(k)]
        last = {}
        for bucket in s.pushes[-per_sync:]:
            assert not set(bucket) & set(last)
            last.update(bucket)
        assert_server_has(last, ckpt_weights(tmp_path))
    finally:
        s.close()


@pytest.mark.parametrize("sync", ["tensor", "nccl"])
def test_several_servers_and_a_tensor_parallel_one(tiny_model, tmp_path, sync):
    """Two servers, the second tensor-parallel (2 ranks): each step's prompts are split between them by group (every
    prompt of the step to exactly one server, all its completions there), every version reaches every rank of every server
    (tensor: one payload per TP rank; nccl: one group of 1 + 1 + 2 ranks, one broadcast per bucket), every rollout
    and re-score comes from its version on each server, and after the run every rank holds the trainer's weights.
    (Two runs on 2 ranks, against the two servers and then one: ~7 s a case.)"""
    a, b = StandIn(tiny_model), StandIn(tiny_model, tp=2)
    try:
        port = ["--nccl_port", str(free_port(2)), "--request_timeout", "60"] if sync == "nccl" else []
        code, out = run(train_cmd(tiny_model, f"{a.url},{b.url}", tmp_path, "--steps", "3", "--prompts_per_step", "4",
                                  "--async", "--sync", sync, "--server_gpu", "0,1+2", *port, nproc=2), timeout=240)
        assert code == 0, out
        if port:  # --nccl_port P: the groups meet on P and P + 1, one port each
            assert [r["master_port"] for r in a.inits + b.inits] == [int(port[1]), int(port[1]) + 1]
        assert f"servers at {a.url}, {b.url} (tensor parallel: [1, 2]); weight sync: {sync}" in out
        m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
        assert [r["sampled_from_version"] for r in m] == [0, 0, 1] and all(r["check_mismatch_mean"] < 0.01 for r in m)
        assert f"20 of 20 tensors of the server at {a.url} compared after every rollout" in out  # each its own hashes
        assert f"10 of 40 tensors of the server at {b.url} compared after every rollout" in out  # its norms: not sharded
        assert all(r["weights_checked"] == 30 for r in m)
        assert len(a.rollouts) == len(b.rollouts) == 2 * 3  # each rank asks each server once a step
        one = StandIn(tiny_model)  # the same run against one server: the same prompts, split by prompt index
        try:
            code, out = run(train_cmd(tiny_model, one.url, tmp_path / "one", "--steps", "1", "--prompts_per_step", "4",
                                      "--async", "--sync", sync, nproc=2), timeout=240)
            assert code == 0, out
        finally:
            one.close()
        step1 = lambda srv: {p for req in srv.rollouts[:2] for p in req}  # the prompts of step 1 (a request per rank)
        assert len(step1(a)) == len(step1(b)) == 2 and not step1(a) & step1(b) and step1(a) | step1(b) == step1(one)
        trainer = ckpt_weights(tmp_path)
        for srv in (a, b):
            assert [p["weight_version"] for p in srv.push_log if p["weight_version"]][:4] == ["0", "1", "2", "3"]
            assert_every_rank_has(srv, trainer)
            assert srv.rescores  # both servers re-scored the rows they had sampled
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------------------------------------
# 8. the sync check and the weight check: a server that holds other weights stops the run

def test_the_sync_check_at_a_temperature_counts_the_tokens_of_the_rescored_rows(tiny_model, server):
    """--async, a batch sampled at temperature 0.7: the batch is one step old, so the server re-scores some of its rows with the
    weights the trainer has (at temperature 1, as SGLang's prefill does) and the trainer scores them at temperature 1
    too. check_mismatch_mean is the mean |Δ| over the tokens the server re-scored (as the stand-in counts them: rows
    of 2 to 5 tokens, which the trainer's (B, C) scores pad to 5), and small: the same weights."""
    import torch.distributed as dist
    from types import SimpleNamespace
    dist_init()
    try:
        model = sharded(tiny_model)
        srv = g.Server.__new__(g.Server)  # the server's client, without its start-up checks
        srv.cfg = g.Config(check_seqs=4, group_size=4, server_url=server.url)  # (the batch's 0.7 counts, not 1)
        srv.rt, srv.urls, srv.link = SimpleNamespace(rank=0, world=1, device=torch.device("cpu")), [server.url], None
        server.version = "1"  # the weights after step 1; the batch was sampled from version 0
        check, m = srv.check(known_batch(0.7), 1, model, 0), g.Metrics()
        check(g.sequences(known_batch(0.7), 4, "cpu"), m)
        got = m.reduce("cpu")
    finally:
        dist.destroy_process_group()
    (asked,) = server.rescores  # one request: prompt + completion of each re-scored row
    rows = [k for k, c in enumerate(COMPLETIONS) if tuple(PROMPTS[k // 4] + c) in asked]
    tokens = sum(len(COMPLETIONS[k]) for k in rows)
    assert len(rows) == 4 and len({len(COMPLETIONS[k]) for k in rows}) == 4, rows  # (of 2, 3, 4 and 5 tokens)
    assert m.sums["check_mismatch_mean#n"] == tokens and 0 < got["check_mismatch_mean"] < 0.01, (m.sums, tokens)
    # the server's sampling log-probs are at 0.7 and its re-score at 1: their gap is no staleness, and is not logged
    assert got["staleness_mean"] is None and "staleness_max" not in got, got


@pytest.mark.parametrize("how, says", [("short", "5 logprobs, the first off at token 0"), ("none", "5 logprobs, the first off at token 4"),
                                       ("other_token", "5 logprobs, the first off at token 4"), ("id_0", None)])
def test_a_rescored_sequence_out_of_line_stops_the_run_naming_the_server_but_an_id_reported_as_0_does_not(
        tiny_model, tmp_path, how, says):
    """SGLang reports the input token ids >= vocab_size - 1 as 0: that is no misalignment (a random-weight 1.5B-shaped
    model sampled its last id, and the run stopped on it, at 9fe208f)."""
    code, out, _, s = run_against(tiny_model, tmp_path, {"garble_rescores": how}, "--steps", "3", "--async")
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert "Traceback" not in out, out
    if says is None:
        assert code == 0 and len(m) == 3 and len(s.rescores) == 2, out
    else:
        assert code == 1 and out.count("error:") == 1 and len(m) == 1, out
        assert f"error: the server at {s.url} re-scored a sequence of the sync check (/generate, max_new_tokens 0, " \
               f"logprob_start_len) out of line with its 5 completion tokens ({says})" in out and "--check_seqs 0" in out, out


def test_a_skipped_push_stops_the_run_at_the_very_next_step(tiny_model, tmp_path):
    code, out, _, s = run_against(tiny_model, tmp_path, {"miss_pushes": {"2"}}, "--steps", "5")  # the push after step 2
    assert code == 1, out
    assert f"the server at {s.url} sampled with weights of version '1', but this rollout must come from version '2'" in out
    assert [r["step"] for r in read_metrics(tmp_path) if "reward_mean" in r] == [1, 2]  # stopped before step 3 trained


def test_weights_dropped_under_a_correct_tag_are_caught_by_the_mismatch(tiny_model, tmp_path):
    """A server that keeps the version tag but not the weights (the vLLM sleep-mode bug in TRL #5312), and has no
    /weights_checker (an older SGLang): only the trainer-vs-server mismatch on the sampled tokens can see it, once the
    weights have moved far enough (at --lr 3e-2 on the tiny model: at once)."""
    code, out, _, s = run_against(tiny_model, tmp_path, {"drop_weights": {"2", "3", "4", "5", "6"}, "checker": False},
                                  "--steps", "6")
    assert code == 1 and "weight sync check failed at step 3" in out and "had the right version tag" in out, out
    assert f"weight check: 0 of 0 tensors of the server at {s.url} compared (/weights_checker: " \
           f"HTTP 404): only the log-prob check remains" in out
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert [r["step"] for r in m] == [1, 2] and all(r["mismatch_mean"] < 0.1 and r["weights_checked"] == 0 for r in m)


@pytest.mark.parametrize("mode", ["--no-async", "--async"])
def test_a_server_that_computes_otherwise_with_the_weights_in_place_is_told_apart_from_one_without_them(tiny_model,
                                                                                                   tmp_path, mode):
    """A stand-in whose every log-prob is 0.2 nats off its model's (a server that computes another function: another
    dtype, no fp32 head), its weights as pushed: the check stops the run at step 1 and says the weights hash as pushed
    (20 of its 20 tensors), so the gap is arithmetic, not a lost push. Without /weights_checker it cannot know: the
    error is the one of a server that lost its weights."""
    for checker in (True, False):
        code, out, _, s = run_against(tiny_model, tmp_path / str(checker), {"lp_shift": 0.2, "checker": checker},
                                      "--steps", "3", mode, "--eval_every", "0")
        assert code == 1 and out.count(f"weight sync check failed at step 1: the server at {s.url} ") == 1, out
        assert ("holds the weights after step" in out and "(20 of its 20 tensors hash as pushed), yet on" in out
                and re.search(r"by 0\.(19\d|20\d) nats on average", out) is not None  # (0.2 + one forward's
                and "the two sides' arithmetic" in out) == checker, out                  # rounding on each side)
        assert ("had the right version tag" in out and "it does not generate with the weights" in out) != checker, out


@pytest.mark.parametrize("after, text", [(0, '{"success": true, "message": "", "ranks": [{"checksums": {"model.'),
                                         (0, "<html><body><h1>502 Bad Gateway</h1></body></html>"),
                                         (2, "<html><body><h1>502 Bad Gateway</h1></body></html>")])
def test_a_weights_checker_answering_no_checksums_is_no_checker_at_start_and_one_error_mid_run(tiny_model, tmp_path,
                                                                                              after, text):
    """/weights_checker answering HTTP 200 with JSON cut short or an HTML page (a proxy) was a traceback, at start or
    mid-run. At start the server is one without a usable checker (its one line says what it answered; the log-prob
    check remains, the run goes on); from its answer after the push of version 1 on, one error naming the server and
    what it answered."""
    code, out, _, s = run_against(tiny_model, tmp_path, {"checker": (after, text)}, "--steps", "3")
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert "Traceback" not in out, out
    if after == 0:
        assert code == 0 and len(m) == 3 and all(r["weights_checked"] == 0 for r in m), out
        assert out.count(f"weight check: 0 of 0 tensors of the server at {s.url} compared "
                         f"(/weights_checker: HTTP 200, but no checksums: {text!r}): only the log-prob check "
                         f"remains\n") == 1, out
    else:
        assert code == 1 and out.count("error:") == 1 and len(m) == 1, out
        assert f"error: the server at {s.url} answered /weights_checker, after a rollout sampled from version 1, with no " \
               f"checksums: {text!r}. The weight check cannot go on" in out, out


def test_recipes_name_the_trainer_tensors_that_make_each_server_tensor():
    """By name; else (SGLang's fused tensors) those of the same leaf under the same module that the server does not
    name, in the trainer's order; nothing for what the trainer has no part of (a buffer, a name of one dot)."""
    a = "m.0.attn."
    trainer = ["m.embed.weight", a + "q.weight", a + "k.weight", a + "v.weight", a + "q.bias", a + "k.bias",
               a + "v.bias", a + "o.weight", "lm_head.weight"]
    server = [(0, "m.embed.weight"), (0, a + "qkv.bias"), (0, a + "qkv.weight"), (0, a + "o.weight"),
              (1, a + "o.weight"), (0, a + "rotary.cache"), (0, "head.weight")]
    assert g.recipes(server, trainer) == {
        (0, "m.embed.weight"): ("m.embed.weight",), (0, a + "qkv.bias"): (a + "q.bias", a + "k.bias", a + "v.bias"),
        (0, a + "qkv.weight"): (a + "q.weight", a + "k.weight", a + "v.weight"), (0, a + "o.weight"): (a + "o.weight",),
        (1, a + "o.weight"): (a + "o.weight",)}


@pytest.mark.parametrize("fault, flags", [
    ({"drop_weights": {"2", "3", "4", "5", "6"}}, ("--lr", "1e-7")),  # bf16 weights barely move (next test)
    ({"drop_weights": {"2", "3", "4", "5", "6"}}, ("--lr", "1e-7", "--async", "--sync", "nccl", "--check_seqs", "0")),
    ({"drop_half": {"2"}}, ("--sync", "nccl")),
    ({"drop_half": {"2"}}, ("--async", "--lr", "1e-3"))])  # (every weight moves; the re-scored check sees little)
def test_weights_dropped_in_whole_or_in_part_stop_the_run_at_the_next_step(tiny_model, tmp_path, fault, flags):
    """A push whose tag the server takes but whose weights (all, or every other tensor) it does not load: its hash
    of each tensor it holds, asked after the push, differs from the trainer's of what it sent, which stops the run at
    the next step before it trains; also at a learning rate so small that the log-prob check cannot see it (the next
    test), with either sync path, sync or --async (--check_seqs 0 too)."""
    code, out, _, s = run_against(tiny_model, tmp_path, fault, "--steps", "6", *flags)
    # the server's tensors vs the trainer's after step 2; half: those it left out that step 2 changed (async: it loaded
    # push 3 whole since)
    moved = lambda n: not torch.equal(*(ckpt_weights(tmp_path, k)[n].to(torch.bfloat16) for k in (1, 2)))
    k = sum(map(moved, s.dropped)) if s.half else held_differ(s, tmp_path, step=2)[0]
    assert code == 1 and out.count("error:") == 1 and "Traceback" not in out and 0 < k, out
    assert f"weight check: 20 of 20 tensors of the server at {s.url} compared after every rollout\n" in out
    at = 4 if "--async" in flags else 3  # the step that trains on the first batch sampled after the dropped push
    assert f"error: weight sync check failed at step {at}: after the rollout sampled from version 2 (the weights after " \
           f"step 2), the server at {s.url} holds other weights than the trainer pushed: {k} of 20 tensors differ " \
           f"(model." in out and "not load" in out, out
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert [r["step"] for r in m] == list(range(1, at)) and all(r["weights_checked"] == 20 for r in m)  # nor step {at}


def test_a_resumed_run_checks_the_tensors_its_fresh_start_did_and_a_dropped_first_push_stops_it(tiny_model, tmp_path):
    """A resume's first push is the checkpoint's weights, which a server that drops pushes never holds: the weight
    check, keeping the tensors that push bore out, left most out ("5 of 20 compared" at --lr 1e-4) and the run trained
    to its end on a stale server. Now a resume compares the tensors its run's fresh first push found the server holds
    as sent (out_dir/weight_check.json): the fault that stops a fresh run at step 3 (the test above) stops the resumed
    one at step 3 too, before it trains. Without that record it learns from its own first push, as before, and says
    so."""
    flags = ("--lr", "1e-4", "--eval_every", "0")
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "run", "--steps", "2", *flags))
    finally:
        s.close()
    assert code == 0 and "compared after every rollout\n" in out, out
    record = json.load(open(tmp_path / "run" / "weight_check.json"))
    assert [(r["tp"], len(r["names"]), len(r["compared"])) for r in record] == [(1, 20, 20)]
    again = shutil.copytree(tmp_path / "run", tmp_path / "again")
    (again / "weight_check.json").unlink()
    code, out, _, s = run_against(tiny_model, tmp_path / "run", {"drop_weights": {"2", "3", "4", "5", "6"}},
                                  "--steps", "6", "--resume", *flags)
    k, n = held_differ(s, tmp_path / "run")  # the server's tensors (the base's) vs the checkpoint's
    assert code == 1 and out.count("error:") == 1 and "Traceback" not in out and 10 <= k <= 20, (k, out)
    assert f"weight check: 20 of 20 tensors of the server at {s.url} compared after every rollout (those the run's " \
           f"first push found it holds as sent)\n" in out, out
    assert f"error: weight sync check failed at step 3: after the rollout sampled from version 2 (the weights after " \
           f"step 2), the server at {s.url} holds other weights than the trainer pushed: {k} of 20 tensors differ " \
           f"(model." in out, out
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "reward_mean" in r] == [1, 2]  # step 3 never trained
    code, out, _, s = run_against(tiny_model, again, {"drop_weights": {"2", "3"}}, "--steps", "3", "--resume", *flags)
    assert f"weight check: {20 - k} of 20 tensors of the server at {s.url} compared after every rollout (those this " \
           f"resume's first push bore out: weight_check.json there has no record of this server's layout)\n" in out, out


def test_at_a_tiny_lr_the_log_prob_check_alone_does_not_see_dropped_weights(tiny_model, tmp_path):
    """Why the weight check: at --lr 1e-7 a push changes few bf16 values, and a server that drops them samples within
    kernel noise of the trainer's policy: without /weights_checker the run goes on to the end, its server stale."""
    code, out, _, s = run_against(tiny_model, tmp_path, {"drop_weights": {"2", "3", "4", "5", "6"}, "checker": False},
                                  "--steps", "6", "--lr", "1e-7")
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert code == 0 and len(m) == 6 and all(r["check_mismatch_mean"] < 0.01 for r in m), out
    assert held_differ(s, tmp_path)[0] > 0  # it never held the weights of steps 2-6


@pytest.mark.parametrize("fault, flags", [
    ({}, ()),
    ({}, ("--async", "--sync", "nccl")),
    ({}, ("--lr", "0")),
    ({"drop_weights": {"2", "3"}}, ("--lr", "0", "--async")),  # a push that changes no bf16 value is not a dropped one
    ({"tp": 2}, ("--sync", "nccl", "--server_gpu", "0+1")),  # each rank's norms (its matrices: shards of ours)
    ({"checker": False}, ())])  # an older SGLang: the run goes on, with the log-prob check
def test_a_correct_run_passes_the_weight_check_at_every_step(tiny_model, tmp_path, fault, flags):
    code, out, _, s = run_against(tiny_model, tmp_path, fault, "--steps", "4", *flags)
    n, k = (20 * s.tp, 20 if s.tp == 1 else 10) if s.checker else (0, 0)  # TP: 5 norms on each rank
    assert code == 0 and held_differ(s, tmp_path)[0] == 0, out  # and the server holds the trainer's last weights
    assert f"weight check: {k} of {n} tensors of the server at {s.url} compared" + (
        " after every rollout\n" if n else " (/weights_checker: HTTP 404): only the log-prob check remains") in out, out
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert len(m) == 4 and all(r["weights_checked"] == k and 0 <= r["time_weight_check"] < 5 for r in m)


@pytest.mark.parametrize("buckets", [(), ("--sync_bucket_mb", "1e-4")])  # one bucket, or one for each tensor
def test_a_server_that_fuses_tensors_is_compared_by_recipes(tmp_path, buckets):
    """SGLang holds q/k/v (weights and Qwen2's biases) as one qkv_proj and gate/up as one gate_up_proj: the trainer
    finds which of its tensors make each one (their parts in other buckets too), checks that on the first push and
    compares them all after every push: a dropped push is caught at the next step (the stand-in drops its last
    bucket, the one that carries the tag)."""
    model = build_tiny(str(tmp_path / "qwen2"), arch="qwen2")
    code, out, _, s = run_against(model, tmp_path / "run", {"fuse": True, "drop_weights": {"2"}}, "--steps", "4",
                                  *buckets)
    k, n = held_differ(s, tmp_path / "run")
    assert n == 16 and {"model.layers.0.self_attn.qkv_proj.bias", "model.layers.1.mlp.gate_up_proj.weight"} <= set(
        s.checksums(0)) and f"weight check: 16 of 16 tensors of the server at {s.url} compared after every rollout" in out
    assert code == 1 and k > 0 and f"holds other weights than the trainer pushed: {k} of 16 tensors differ" in out, out


def test_a_dropped_last_push_is_reported_at_the_end(tiny_model, tmp_path):
    """The last push has no next step, but the final evaluation samples with it: it is checked as the run ends."""
    code, out, _, s = run_against(tiny_model, tmp_path, {"drop_weights": {"3"}}, "--steps", "3")
    assert code == 1 and "failed at the end of the run: after the rollout sampled from version 3" in out, out
    assert "holds other weights than the trainer pushed: 20 of 20 tensors differ" in out, out
    assert [r["step"] for r in read_metrics(tmp_path) if "reward_mean" in r] == [1, 2, 3]


@pytest.mark.parametrize("fault, says", [
    ({"miss_pushes": {"2"}}, "sampled with weights of version '1', but this rollout must come from version '2'"),
    ({"drop_weights": {"2", "3", "4", "5"}}, "version 2 (the weights after step 2), the server at {url} holds other "
                                             "weights than the trainer pushed")])
def test_one_server_of_two_missing_a_push_stops_the_run_and_is_named(tiny_model, tmp_path, fault, says):
    a, b = StandIn(tiny_model), StandIn(tiny_model, **fault)
    try:
        code, out = run(train_cmd(tiny_model, f"{a.url},{b.url}", tmp_path, "--steps", "6", "--prompts_per_step", "4",
                                  "--eval_every", "0", "--reward", "has_number", rewards=True), timeout=200)
    finally:
        a.close()
        b.close()
    assert code == 1 and says.format(url=b.url) in out and f"at {b.url}" in out and "Traceback" not in out, out
    assert len([r for r in read_metrics(tmp_path) if "reward_mean" in r]) == 2  # stopped before step 3 trained


# ---------------------------------------------------------------------------------------------
# 9. async: rollouts one step off, the re-scored check, a resume, a server failing mid-generation

def test_async_trains_one_step_off_and_never_updates_mid_generation(tiny_model, tmp_path):
    s = StandIn(tiny_model, slow_generate=1.0)
    try:  # at this toy lr one step moves the policy by ~0.3 nats: the mismatch check must allow that here
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "3", "--async"))
        assert code == 0, out
        assert "rollouts: async, one step off-policy" in out
        m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
        assert [r["sampled_from_version"] for r in m] == [0, 0, 1]  # step 1 on-policy, then one step behind
        assert [r["stale_token_frac"] for r in m] == [0, 1, 1]  # the share of tokens an older version sampled
        assert [p["weight_version"] for p in s.push_log] == ["0", "1", "2", "3"]
        assert_server_has(s.pushes[-1], ckpt_weights(tmp_path))
        assert all(math.isfinite(r["is_ratio_mean"]) and r["mismatch_mean"] > 0 for r in m)
        for prev, nxt in zip(m, m[1:]):  # step s+1's batch was sampled while step s trained, and before its push
            assert nxt["span_rollout"][0] < prev["span_train"][1] and nxt["span_rollout"][1] > prev["span_train"][0], (prev, nxt)
            assert nxt["span_rollout"][1] <= prev["span_sync"][0] + 0.05

        # the trainer trained first and only then waited for the rest of the 1-second generation: where the generation
        # outlasted the training (at least once: a step trains in ~0.1-0.3 s here), the wait began after the training
        # and covered the rest of the generation (its span ends where the sync's begins)
        outlasted = [(prev, nxt) for prev, nxt in zip(m, m[1:]) if nxt["span_rollout"][1] > prev["span_train"][1]]
        assert outlasted and all(prev["time_next_rollout_wait"] >= nxt["span_rollout"][1] - prev["span_train"][1] - 0.01
                                 for prev, nxt in outlasted), m
        assert len(s.pushed_during_generation) == 4 and not any(s.pushed_during_generation)
    finally:
        s.close()


def test_async_check_off_rescores_nothing(tiny_model, server, tmp_path):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--steps", "3", "--async", "--check_seqs", "0"))
    assert code == 0 and "check - mismatch" in out, out
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert not server.rescores and [r["check_mismatch_mean"] is None for r in m] == [False, True, True]


@pytest.mark.parametrize("temperature", ["1.0", "0.7"])
def test_async_check_compares_the_same_weights_so_a_large_lr_does_not_stop_it(tiny_model, tmp_path, temperature):
    """At this toy lr one step moves the policy by ~0.3-0.8 nats: the batch mismatch (server θ_{s-1} vs trainer θ_s)
    is far over --mismatch_max, yet the run goes on, because the check compares the rows the server re-scored
    with θ_s (a prefill at temperature 1, as SGLang's input logprobs are) with the trainer's under θ_s."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "4", "--async", "--temperature", temperature,
                                  "--check_seqs", "6", "--reward", "has_number", rewards=True))
        assert code == 0, out
        m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
        assert max(r["mismatch_mean"] for r in m) > 0.2  # the old rule would have stopped this run
        assert all(r["check_mismatch_mean"] < 0.01 for r in m), m
        assert m[0]["staleness_mean"] is None and m[0]["check_mismatch_mean"] == m[0]["mismatch_mean"]  # step 1 on-policy
        if temperature == "1.0":  # (at 0.7 the server's sampling log-probs are at 0.7, its re-score at 1: not logged)
            assert all(r["staleness_mean"] > 0.1 and r["staleness_max"] >= r["staleness_mean"] for r in m[1:])
        else:
            assert all(r["staleness_mean"] is None for r in m)
        # steps 2-4: 6 of each batch's 8 sequences (prompt + completion), re-scored once, spread over its groups
        batches = [s.generations[k * 8:(k + 1) * 8] for k in range(1, 4)]
        assert s.rescores == [[tuple(p + c) for p, c, _ in (b[i] for i in (0, 1, 2, 4, 5, 6))] for b in batches]
    finally:
        s.close()


def test_async_check_on_other_shapes_compares_each_sequence_with_itself(tiny_model, tmp_path):
    """Two ranks, prompts of different lengths in one re-score request, micro-batches of 3 across groups of 4, and 7
    re-scored rows a step over 2 ranks (4 each, rounded up): every re-scored row is compared with the trainer's logprobs
    of that same sequence (kernel noise only, ~0 here)."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "3", "--async", "--prompts_per_step", "4",
                                  "--micro_batch", "3", "--check_seqs", "7", "--dataset",
                                  mixed_lengths_data(tmp_path / "q.jsonl"), "--reward", "has_number", nproc=2, rewards=True),
                        timeout=240)
        assert code == 0, out
        m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
        assert all(r["check_mismatch_mean"] < 0.01 for r in m) and all(r["staleness_mean"] > 0 for r in m[1:]), m
        assert len(s.rescores) == 4 and [len(r) for r in s.rescores] == [4] * 4  # steps 2, 3: a request per rank
        assert any(len({len(p) for p in req}) > 1 for req in s.rollouts)  # prompts of different lengths together
    finally:
        s.close()


def test_async_a_skipped_push_stops_the_run_at_the_next_step_before_it_trains(tiny_model, tmp_path):
    code, out, _, s = run_against(tiny_model, tmp_path, {"miss_pushes": {"2"}}, "--steps", "5", "--async",
                                  "--eval_every", "0")  # no evaluation at step 2, which would see it first
    assert code == 1 and f"the server at {s.url} re-scored the batch with weights of version '1', but this check must " \
                          "come from version '2'" in out, out
    assert [r["step"] for r in read_metrics(tmp_path) if "reward_mean" in r] == [1, 2]  # stopped before step 3 trained


def test_async_weights_dropped_under_a_correct_tag_are_caught_by_the_check(tiny_model, tmp_path):
    """The log-prob check alone (a server without /weights_checker): the re-scored rows see the dropped weights."""
    code, out, _, _ = run_against(tiny_model, tmp_path, {"drop_weights": {"2", "3", "4", "5", "6"}, "checker": False},
                                  "--steps", "6", "--async")
    assert code == 1 and "weight sync check failed at step 3" in out and "had the right version tag" in out, out
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert [r["step"] for r in m] == [1, 2] and all(r["check_mismatch_mean"] < 0.01 for r in m)


def test_async_a_server_that_drops_weights_is_named_when_some_rows_are_rescored(tiny_model, tmp_path):
    a, b = StandIn(tiny_model), StandIn(tiny_model, drop_weights={"2", "3", "4", "5"}, checker=False)  # log-prob check
    try:
        code, out = run(train_cmd(tiny_model, f"{a.url},{b.url}", tmp_path, "--steps", "5", "--async", "--prompts_per_step",
                                  "4", "--check_seqs", "2", "--server_gpu", "0,1", "--eval_every", "0", "--reward",
                                  "has_number", nproc=2, rewards=True), timeout=240)
    finally:
        a.close()
        b.close()
    says = f"weight sync check failed at step 3: the server at {b.url} had the right version tag"
    assert code == 1 and out.count(says) == 1, out


def test_async_resume_regenerates_the_pending_batch_from_the_checkpoint(tiny_model, tmp_path):
    flags = ("--async", "--save_every", "1")
    ref = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, ref.url, tmp_path / "ref", "--steps", "4", *flags))
        assert code == 0, out
    finally:
        ref.close()
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "k", "--steps", "2", *flags))
        assert code == 0, out
        n_before = len(s.rollouts)
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "k", "--steps", "4", "--resume", *flags))
        assert code == 0 and "at step 2" in out, out
    finally:
        s.close()
    m = [r for r in read_metrics(tmp_path / "k") if "reward_mean" in r]
    # the batch pending at the checkpoint is regenerated from the checkpoint's weights (version 2), then one behind
    assert [r["sampled_from_version"] for r in m] == [0, 0, 2, 2]
    assert s.rollouts[n_before:] == ref.rollouts[2:]  # and it asks for the prompts the uninterrupted run did


@pytest.mark.parametrize("fault", ["dies", "stalls"])
def test_async_server_failing_during_a_background_generation_stops_cleanly(tiny_model, tmp_path, fault):
    """--async: the initial eval and step 1's rollout work; step 2's rollout, running in the background, fails (the
    server dies, or stalls): one error, no traceback, no weights pushed meanwhile. ('stalls' waits out
    --request_timeout 3 twice, a try and its retry, ~6 s: a shorter timeout could end a correct generation on 2 busy
    cores.)"""
    code, out, took, s = run_against(tiny_model, tmp_path, {"fail_generate_after" if fault == "dies" else "stall_generate_after": 2},
                                     "--steps", "4", "--async", "--request_timeout", "3")
    assert code == 1 and ("stand-in: scheduler died" if fault == "dies" else "ReadTimeout") in out, out
    assert "Traceback" not in out and out.count("error:") == 1 and took < 30  # (~3-8 s after the fault: 2 tries)
    assert len(s.push_log) == 1  # no weights pushed while that generation was pending


def test_ctrl_c_exits_at_once_even_with_a_generation_in_flight(tiny_model, tmp_path):
    import signal
    import time
    s = StandIn(tiny_model, stall_generate_after=2)  # step 2's background rollout hangs for 20 s
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1")
    try:
        with open(tmp_path / "log", "w") as f:
            # as from a terminal: a worker of the test runner may ignore SIGINT, which its children inherit (Python
            # then installs no KeyboardInterrupt handler: seen under pytest-xdist, the signal had no effect)
            p = subprocess.Popen(train_cmd(tiny_model, s.url, tmp_path / "run", "--steps", "3", "--async"),
                                 stdout=f, stderr=subprocess.STDOUT, env=env, cwd=HERE,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            deadline = time.time() + 120
            while s.calls["/generate"] < 3 and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            t0 = time.time()
            p.send_signal(signal.SIGINT)
            try:
                code = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                code = "still running 30 s after SIGINT"
            took = time.time() - t0
    finally:
        s.close()
    out = (tmp_path / "log").read_text()
    assert code == 130 and "interrupted" in out and "--resume" in out and took < 10, (code, s.calls, out)
    assert "Traceback" not in out


# ---------------------------------------------------------------------------------------------
# 10. faults: a server, a step or a process that fails stops with one clear message (or recovers)

def test_server_not_running_is_reported_before_loading_anything(tiny_model, tmp_path):
    code, out = run(train_cmd(tiny_model, f"http://127.0.0.1:{free_port()}", tmp_path), timeout=120)
    assert code == 1
    assert "no answer from the SGLang server" in out and "bash serve.sh" in out
    assert "data:" not in out and "Traceback" not in out  # before the data or model; no raw traceback


def test_wrong_model_on_server(tiny_model, tmp_path):
    s = StandIn(tiny_model, served_path="Qwen/Qwen2.5-0.5B-Instruct")
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path), timeout=120)
    finally:
        s.close()
    assert code == 1 and "serves 'Qwen/Qwen2.5-0.5B-Instruct' but the trainer trains" in out
    assert "MODEL=" in out and "bash serve.sh" in out and "Traceback" not in out


def test_api_key_is_sent_and_a_missing_key_is_explained(tiny_model, tmp_path):
    s = StandIn(tiny_model, api_key="sekret")
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "a"), timeout=120)
        assert code == 1 and "wrong or missing --api_key" in out
        # the other loss paths ride along: mu=2 (old logprobs, ratio != 1), KL to a reference, TIS, seq mean
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "b", "--steps", "1", "--api_key", "sekret",
                                  "--mu", "2", "--beta", "0.1", "--tis_cap", "2", "--loss_agg", "seq", "--reward",
                                  "has_number", rewards=True))  # (rewards that differ: the first update moves)
        assert code == 0, out
        m = [r for r in read_metrics(tmp_path / "b") if "kl" in r][0]
        assert m["kl"] > 1e-4 and math.isfinite(m["loss"])  # the second update sees a policy that moved
    finally:
        s.close()


def test_a_server_slower_than_request_timeout_is_called_busy_not_down(tiny_model):
    """A server that takes the request but answers nothing within --request_timeout may be alive but busy: the
    message says so and how to wait longer; one that refuses the connection is asked whether it is running."""
    s = StandIn(tiny_model, stall_generate_after=0)  # every /generate sleeps 20 s before answering
    cfg = g.Config(request_timeout=0.5, request_retries=0)
    try:
        with pytest.raises(g.UserError) as busy:
            g.call(cfg, s.url, "/generate", {"input_ids": [[1, 2]]})
    finally:
        s.close()
    assert f"no answer from the SGLang server at {s.url}/generate after 1 tries (ReadTimeout" in str(busy.value)
    assert ("It answered nothing within 0.5 s: it may be alive but busy (see serve.log); raise --request_timeout"
            in str(busy.value)) and "Is it running" not in str(busy.value)
    with pytest.raises(g.UserError) as down:
        g.call(cfg, f"http://127.0.0.1:{free_port()}", "/generate", {"input_ids": [[1, 2]]})
    assert "(ConnectionError" in str(down.value) and "Is it running? Start it with: bash serve.sh" in str(down.value)
    assert "busy" not in str(down.value)


def test_stalled_server_times_out_instead_of_hanging(tiny_model, tmp_path):
    code, out, took, _ = run_against(tiny_model, tmp_path, {"stall_generate_after": 2}, "--steps", "3", "--request_timeout", "2")
    assert code == 1 and "no answer from the SGLang server" in out and "ReadTimeout" in out, out
    assert took < 18  # from the stall: 2 tries x 2 s + backoff (~5 s with a busy core); not the stand-in's 20 s a try


def test_server_dies_mid_run_bounded_retries_and_checkpoint_survives(tiny_model, tmp_path):
    s = StandIn(tiny_model, fail_generate_after=2)  # eval + step 1 work, step 2's rollout fails
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "3"), timeout=120)
    finally:
        s.close()
    assert code == 1 and "HTTP 503" in out and "stand-in: scheduler died" in out, out
    assert s.calls["/generate"] <= 2 + 2  # bounded: --request_retries 1, then a clean stop
    st = torch.load(os.path.join(g.latest_checkpoint(str(tmp_path)), "trainer_state.pt"), weights_only=True)
    assert st["step"] == 1 and ckpt_weights(tmp_path)  # the last checkpoint loads


def test_rejected_weight_update_stops_training(tiny_model, tmp_path):
    s = StandIn(tiny_model, reject_updates=True)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path), timeout=120)
    finally:
        s.close()
    assert code == 1 and "HTTP 400" in out and "Failed to update weights: test" in out
    assert "step    1" not in out  # no rollout against stale weights


@pytest.mark.parametrize("fault, says", [
    ("die_at_init", "did not join the NCCL group"),
    ("die_in_broadcast", "no answer from the SGLang server"),
    ("reject_updates", "Failed to update weights: test")])
def test_nccl_path_failures_end_with_a_clear_error_in_time(tiny_model, tmp_path, fault, says):
    code, out, took, s = run_against(tiny_model, tmp_path, {fault: True}, "--sync", "nccl", "--request_timeout", "5")
    assert code == 1 and says in out and "Traceback" not in out and out.count("error:") == 1, out
    assert took < 30 and not s.pushes  # within the timeout of 5 s of the fault (not gloo's minutes), nothing trained on


def test_an_nccl_port_in_use_on_the_trainers_host_is_said_at_once(tiny_model, tmp_path):
    """--nccl_port P, with P taken on the trainer's host (any listener): the trainer cannot host the group's
    rendezvous, and says so at once, not after --request_timeout with the server's join blamed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, took, s = run_against(tiny_model, tmp_path, {}, "--sync", "nccl", "--nccl_port", str(port),
                                         "--request_timeout", "60")
    assert code == 1 and f"the NCCL group's port 127.0.0.1:{port} is in use on this host" in out, out
    assert "Traceback" not in out and out.count("error:") == 1 and not s.pushes
    assert took < 55  # from the run's start: sooner than the 60 s the server's join would have taken


def test_nonfinite_gradients_skip_the_step_then_stop(tiny_model, tmp_path):
    s = StandIn(tiny_model, nan_logprobs=True)  # a broken server: NaN logprobs -> NaN TIS weights -> NaN loss
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "4", "--tis_cap", "2",
                                  "--max_nonfinite_steps", "2"), timeout=120)
    finally:
        s.close()
    assert code == 1 and "NaN/Inf gradients in 2 steps in a row" in out, out
    assert out.count("update(s) skipped") == 2
    for p in s.pushes[1:]:  # the weights never moved: every push equals the initial one
        assert all(torch.equal(p[n], s.pushes[0][n]) for n in p)


def test_one_nan_step_is_skipped_and_the_next_one_trains(tiny_model, tmp_path):
    """The first step's rollout has NaN logprobs (its gradient is NaN and skipped); the gradient must not carry over."""
    s = StandIn(tiny_model, nan_logprobs={1})
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "3", "--tis_cap", "2", "--max_nonfinite_steps",
                                  "2", "--reward", "has_number", rewards=True))
    finally:
        s.close()
    assert code == 0, out
    m = [r for r in read_metrics(tmp_path) if "nonfinite_skips" in r]
    assert [r["nonfinite_skips"] for r in m] == [1, 0, 0] and all(math.isfinite(r["grad_norm"]) for r in m[1:])
    assert not torch.equal(s.pushes[1]["model.layers.0.mlp.up_proj.weight"], s.pushes[3]["model.layers.0.mlp.up_proj.weight"])


DROPS_ON_RANK_1 = """import os, sys
sys.path.insert(0, {here!r})
import grpo_sglang as g
mbs = g.micro_batches  # the obvious filter, done wrong: rank 1 drops a micro-batch's rows
g.micro_batches = lambda seqs, size, pad, **kw: mbs(seqs, size, pad, **kw)[: -1 if os.environ["RANK"] == "1" else None]
try:
    g.main(g.parse_config())
except g.UserError as e:
    g.exit_now(1, f"error: {{e}}")
g.exit_now(0)
"""


def test_ranks_that_would_run_different_numbers_of_micro_batches_stop_with_one_error_not_a_hang(tiny_model, server,
                                                                                               tmp_path):
    script = tmp_path / "drops.py"
    script.write_text(DROPS_ON_RANK_1.format(here=HERE))
    cmd = train_cmd(tiny_model, server.url, tmp_path / "run", "--micro_batch", "2", nproc=2)
    code, out = run([c if not c.endswith("grpo_sglang.py") else str(script) for c in cmd], timeout=180)
    says = "the ranks would run different numbers of micro-batches ([2, 1]), and FSDP would hang"
    assert code == 1 and out.count(says) == 1 and "seqs['weight'] to 0" in out, out


@pytest.mark.parametrize("forked", [False, True])
def test_run_ends_every_process_of_a_run_that_times_out(tmp_path, monkeypatch, forked):
    """torchrun starts each worker in a session of its own: a timed-out run must not leave them running, whether
    run() started torchrun afresh or forked it (Forked). The run times out once both workers run (its wait ends
    then, as a timeout's would), not after a fixed time that a slow machine might spend starting them."""
    import psutil
    import time
    (tmp_path / "pids").mkdir()
    script = tmp_path / "hang.py"
    script.write_text("import os, time\nopen(os.path.join(os.environ['PIDS'], str(os.getpid())), 'w').close()\n"
                      "time.sleep(600)\n")
    monkeypatch.setenv("PIDS", str(tmp_path / "pids"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={free_port()}", str(script)]
    way = Forked if forked else subprocess.Popen
    if not forked:
        monkeypatch.setattr(Forked, "start", lambda *a: None)
    wait, timed_out = way.wait, []

    def times_out_once_both_run(self, timeout=None):
        deadline = time.time() + 240
        while len(os.listdir(tmp_path / "pids")) < 2 and time.time() < deadline and psutil.pid_exists(self.pid):
            time.sleep(0.05)
        monkeypatch.setattr(way, "wait", wait)  # (kill_tree's own waits are real ones)
        timed_out.append(time.time())
        return wait(self, 0.001)  # -> TimeoutExpired
    monkeypatch.setattr(way, "wait", times_out_once_both_run)
    with pytest.raises(subprocess.TimeoutExpired):
        run(cmd)
    pids = [int(p) for p in os.listdir(tmp_path / "pids")]
    assert len(pids) == 2 and time.time() - timed_out[0] < 20, pids  # both workers had started; all ended at once
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


# ---------------------------------------------------------------------------------------------
# 11. resume, checkpoints and the out_dir: a resumed run is the run it resumes, nothing is overwritten

def test_kill_9_then_resume_continues_exactly(tiny_model, tmp_path):
    import signal
    import time
    # uninterrupted reference run
    ref = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, ref.url, tmp_path / "ref", "--steps", "4", "--seed", "3"))
        assert code == 0, out
    finally:
        ref.close()
    # the same run, killed with SIGKILL once its step-2 checkpoint exists, then resumed (without --seed: its own);
    # the stand-in holds every /generate after step 2's rollout (the eval of step 2, after its checkpoint: the 4th),
    # so that however slowly this test looks, the run is still at step 2 when the kill comes
    s = StandIn(tiny_model, hold_generate_after=3)
    try:
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
        cmd = train_cmd(tiny_model, s.url, tmp_path / "k", "--steps", "4", "--seed", "3")
        with open(tmp_path / "killed.log", "w") as f:  # (forked as run()'s runs are, where the zygote is free)
            p = Forked.start(cmd, env, f.name) or subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                                                   cwd=HERE)
            deadline = time.time() + 240
            try:
                while time.time() < deadline and _alive(p.pid):
                    ck = g.latest_checkpoint(str(tmp_path / "k"))
                    if ck and ck.endswith("step_2"):
                        break
                    time.sleep(0.05)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait()
        s.release.set()
        ck = g.latest_checkpoint(str(tmp_path / "k"))
        step = torch.load(os.path.join(ck, "trainer_state.pt"), weights_only=True)["step"]
        assert step == 2, "the kill landed outside the run"
        while s.in_flight["/generate"] and time.time() < deadline:  # a request of the killed run still being answered
            time.sleep(0.05)
        n_before, served_before = len(s.rollouts), len(s.generations)
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "k", "--steps", "4", "--resume"))
        assert code == 0, out
        assert f"at step {step}" in out
    finally:
        s.close()
    # same next prompts, and completions (the stand-in samples deterministically from the weights): 2 x 4 a step
    assert s.rollouts[n_before:] == ref.rollouts[step:] and s.generations[served_before:] == ref.generations[8 * step:]
    # same final weights and optimizer state as the uninterrupted run
    a, b = ckpt_weights(tmp_path / "ref"), ckpt_weights(tmp_path / "k")
    assert all(torch.equal(a[n], b[n]) for n in a)
    sa = torch.load(os.path.join(g.latest_checkpoint(str(tmp_path / "ref")), "trainer_state.pt"), weights_only=True)
    sb = torch.load(os.path.join(g.latest_checkpoint(str(tmp_path / "k")), "trainer_state.pt"), weights_only=True)
    assert sa["step"] == sb["step"] == 4
    for k, v in sa["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(v[name], sb["optimizer"]["state"][k][name]), (k, name)


def test_a_resumed_run_samples_and_trains_exactly_as_one_that_never_stopped(resumed_runs):
    """The run stopped dead after its step-2 checkpoint and resumed without --seed (its --seed 7 comes back from its
    config.json) is asked for the same prompts and served the same completions as the run that never stopped, and
    ends with the same weights and optimizer state."""
    ref, resumed = resumed_runs
    assert resumed.served_first == 16 and len(ref.stand_in.generations) == 40  # 2 prompts x 4 a step
    assert resumed.stand_in.generations == ref.stand_in.generations
    assert [r["loss"] for r in resumed.metrics] == [r["loss"] for r in ref.metrics]
    a, b = ckpt_weights(ref.dir), ckpt_weights(resumed.dir)
    assert all(torch.equal(a[n], b[n]) for n in a)
    sa, sb = (torch.load(os.path.join(g.latest_checkpoint(str(r.dir)), "trainer_state.pt"), weights_only=True)
              for r in resumed_runs)
    assert all(torch.equal(v[k], sb["optimizer"]["state"][i][k]) for i, v in sa["optimizer"]["state"].items()
               for k in ("exp_avg", "exp_avg_sq", "step"))


def test_a_soft_capped_models_checkpoint_keeps_its_cap_and_resumes_exactly(tmp_path):
    """Gemma 2 caps its logits (final_logit_softcapping), which the trainer's head applies in the model's stead: the
    checkpoint's config.json still says so (else a resumed run, or a server of the checkpoint, drops the cap), and a
    run resumed from it trains as the one that never stopped."""
    d, got = build_tiny(str(tmp_path / "model"), "gemma2"), {}
    for key in ("ref", "resumed"):
        s = StandIn(d)
        try:
            flags = ("--steps", "3", "--save_every", "1", "--eval_every", "0", "--reward", "has_number")
            run_here(d, s.url, tmp_path / key, *flags, kill_after=1 if key == "resumed" else None)
            if key == "resumed":
                run_here(d, s.url, tmp_path / key, *flags, "--resume")
        finally:
            s.close()
        got[key] = [(r["step"], r["loss"], r["entropy"]) for r in read_metrics(tmp_path / key) if "loss" in r]
    ckpt = g.latest_checkpoint(str(tmp_path / "ref"))
    assert json.load(open(os.path.join(ckpt, "config.json")))["final_logit_softcapping"] == 2.0
    assert got["ref"] == got["resumed"] and len(got["ref"]) == 3


def test_a_resumed_run_continues_the_lr_schedule_at_its_global_step(resumed_runs):
    """Warmup over 1 step, then a cosine from --lr to 0.5 x --lr over steps 2-5: the run resumed at step 2 goes on
    where the schedule was, not from its start."""
    want = [3e-2 * f for f in (1.0, 1.0, 0.5 + 0.25 * (1 + math.cos(math.pi / 3)),
                               0.5 + 0.25 * (1 + math.cos(2 * math.pi / 3)), 0.5)]
    for run in resumed_runs:
        assert [r["step"] for r in run.metrics] == [1, 2, 3, 4, 5]
        assert [r["lr"] for r in run.metrics] == pytest.approx(want)


def test_a_run_ends_with_a_checkpoint_of_its_last_step(resumed_runs):
    """--steps 5, --save_every 2: the last checkpoint is that of step 5 (not 4), with the weights the last push sent."""
    for run in resumed_runs:
        ck = g.latest_checkpoint(str(run.dir))
        assert os.path.basename(ck) == "step_5", ck
        assert torch.load(os.path.join(ck, "trainer_state.pt"), weights_only=True)["step"] == 5
        assert_server_has(run.stand_in.pushes[-1], ckpt_weights(run.dir))


def test_a_run_keeps_its_newest_checkpoints_and_latest_names_the_last(resumed_runs):
    """--keep_checkpoints 2: each save, once `latest` names it, drops the run's checkpoints older than the newest 2,
    also those a resumed run's first process wrote (step_2)."""
    for run in resumed_runs:
        assert sorted(f for f in os.listdir(run.dir) if f.startswith("step_")) == ["step_4", "step_5"]
        assert (run.dir / "latest").read_text() == "step_5"


def test_keep_checkpoints_never_deletes_a_folder_the_run_did_not_write_and_is_said_at_start(tmp_path, capsys):
    """The checkpoints a save drops are the run's own before it (step_N whose trainer_state.pt says step N), past the
    newest --keep_checkpoints (0: none): never a user's copy under a checkpoint's name, a name it does not write, or
    a later one (left by a rollback: `echo step_1 > latest`). The rule is one line at start."""
    from types import SimpleNamespace
    for name, step in (("step_1", 1), ("step_2", 2), ("step_3", 5), ("step_4", 4), ("step_04", 4), ("step_9", 9),
                       ("best", 4)):
        (tmp_path / name).mkdir()
        torch.save({"step": step}, tmp_path / name / "trainer_state.pt")
    (tmp_path / "step_x").mkdir()
    old = lambda keep: sorted(os.path.basename(d) for d in g.old_checkpoints(str(tmp_path), 5, keep))
    assert old(2) == ["step_1", "step_2"] and old(1) == ["step_1", "step_2", "step_4"] and old(4) == old(0) == []
    for keep, says in ((3, "the newest 3 kept, this run's older ones deleted (--keep_checkpoints)"),
                       (0, "all kept (--keep_checkpoints 0)")):
        cfg = g.Config(out_dir="runs/x", save_every=50, keep_checkpoints=keep)
        g.MetricsLog(cfg, SimpleNamespace(master=False, world=1), 0, 100)
        assert f"\ncheckpoints: runs/x/step_N every 50 steps and at the last step; {says}\n" in capsys.readouterr().out


def test_a_resumed_run_restores_its_flags_and_refuses_those_that_would_change_it(tiny_model, tmp_path):
    """--resume takes the saved config.json for every flag not given again (here --beta and --group_size); a flag given
    again that changes what the run trains is one error listing each one with its saved and its given value, before
    any server is asked; flags of how and where it runs (--steps, --micro_batch, --head_matmul) may change."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "1", "--beta", "0.1", "--group_size", "2",
                                  "--entropy_coef", "0.01"))  # (an entropy bonus: step 1 moves, whatever the rewards)
        assert code == 0, out
        before = s.calls["/generate"]
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "2", "--resume", "--group_size", "4", "--lr",
                                  "1e-3"), timeout=120)
        assert code == 1 and out.count("error: --resume: these flags differ from the run in") == 1, out
        assert "--group_size was 2, now 4; --lr was 0.03, now 0.001" in out and "Traceback" not in out, out
        assert s.calls["/generate"] == before  # refused before any rollout
        flags = train_cmd(tiny_model, s.url, tmp_path, "--steps", "2", "--resume", "--micro_batch", "3", "--head_matmul",
                          "fp32")
        k = flags.index("--group_size")  # the resume command leaves --group_size out: 2 is restored
        code, out = run(flags[:k] + flags[k + 2:])
        assert code == 0 and "at step 1" in out, out
        assert "batch: 2 prompts x 2 completions = 4 sequences per step" in out, out
        m = [r for r in read_metrics(tmp_path) if "kl" in r]
        assert [r["step"] for r in m] == [1, 2] and m[1]["kl"] > 1e-4  # --beta 0.1 restored, not the default 0
        saved = json.load(open(tmp_path / "config.json"))
        assert saved["beta"] == 0.1 and saved["group_size"] == 2 and saved["steps"] == 2 and saved["micro_batch"] == 3
        assert saved["head_matmul"] == "fp32"
    finally:
        s.close()


def test_resuming_a_checkpoint_of_another_architecture_is_one_error(tiny_model, tmp_path):
    other = build_tiny(str(tmp_path / "three"), num_hidden_layers=3)
    with pytest.raises(g.UserError, match=re.escape("is not a checkpoint of --model") + ".*num_hidden_layers 2 there, 3 "):
        g.check_architecture(tiny_model, other)
    g.check_architecture(tiny_model, tiny_model)


def test_the_api_key_is_never_saved(tiny_model, server, tmp_path):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--steps", "1", "--api_key", "sekret"))
    assert code == 0, out
    st = torch.load(os.path.join(g.latest_checkpoint(str(tmp_path)), "trainer_state.pt"), weights_only=True)
    assert "sekret" not in open(tmp_path / "config.json").read() and st["config"]["api_key"] == ""


def test_resume_from_a_checkpoint_that_is_gone_or_half_copied_names_the_complete_ones(tiny_model, tmp_path):
    (tmp_path / "latest").write_text("step_3")
    code, out = run(train_cmd(tiny_model, f"http://127.0.0.1:{free_port()}", tmp_path, "--resume"), timeout=120)
    assert code == 1 and out.count(f"--resume: {tmp_path / 'latest'} names step_3, but that folder is gone. There is no "
                                   f"other complete checkpoint here") == 1 and "Traceback" not in out, out  # no server
    (tmp_path / "step_3").mkdir()
    for d in ("step_1", "step_2"):
        (tmp_path / d).mkdir()
        for f in ("config.json", "trainer_state.pt"):
            (tmp_path / d / f).write_text("")
    with pytest.raises(g.UserError, match=re.escape(f"names step_3, but it is incomplete (no config.json or trainer_state.pt). "
                                                    f"Complete checkpoints here: step_1, step_2; to resume from the last one: "
                                                    f"echo step_2 > {tmp_path / 'latest'}")):
        g.checkpoint_to_resume(str(tmp_path))
    (tmp_path / "latest").write_text("step_2")  # complete, but its empty trainer_state.pt is no checkpoint
    state = tmp_path / "step_2" / "trainer_state.pt"
    with pytest.raises(g.UserError, match=re.escape(f"names step_2, but {state} cannot be read (RuntimeError") + ".*"
                       + re.escape("here: step_1;")):
        g.checkpoint_to_resume(str(tmp_path))


BREAKS = {"latest deleted": lambda d: (d / "latest").unlink(),
          "trainer_state.pt cut in half": lambda d: cut_in_half(d / "step_2" / "trainer_state.pt"),
          "trainer_state.pt without its optimizer": lambda d: edit_state(d / "step_2/trainer_state.pt", optimizer=None),
          "model.safetensors cut in half": lambda d: cut_in_half(d / "step_2" / "model.safetensors"),
          "lr edited to a string": lambda d: edit_config(d, lr="1e-5", max_grad_norm=1),  # (an int for a float: fine)
          "resumed on 2 ranks": lambda d: None}
NAMES = "--resume: {d}/latest names step_2, but {d}/step_2/"
KEPT = ". Complete checkpoints here: step_1; to resume from the last one: echo step_1 > {d}/latest"


@pytest.mark.parametrize("case, says, fix", [
    ("latest deleted", "--resume: {d} holds a run (config.json, metrics.jsonl, step_1, step_2) but no {d}/latest, "
                       "and a resume never starts over. Complete checkpoints here: step_1, step_2; to resume from "
                       "the last one: echo step_2 > {d}/latest", "step_2"),
    ("trainer_state.pt cut in half", NAMES + "trainer_state.pt cannot be read (RuntimeError: PytorchStreamReader "
                                             "failed reading zip archive: failed finding central directory)" + KEPT,
     "step_1"),
    ("trainer_state.pt without its optimizer", NAMES + "trainer_state.pt has no 'optimizer'" + KEPT, "step_1"),
    ("model.safetensors cut in half", NAMES + "model.safetensors cannot be read (SafetensorError: Error while "
                                              "deserializing header: incomplete metadata, file not fully covered)"
                                              + KEPT, "step_1"),
    ("lr edited to a string", "--resume: {d}/config.json holds values of the wrong type: 'lr': '1e-5' (--lr takes a "
                              "float). Fix them there", None),
    ("resumed on 2 ranks", "--resume: {d}/step_2 was written by 1 rank(s) and this run has 2: resume with 1", None)],
    ids=lambda x: x if x in BREAKS else "")
def test_a_resume_that_would_start_over_or_read_a_broken_checkpoint_is_one_error_before_anything_loads(
        two_step_run, tiny_model, tmp_path, case, says, fix):
    """Each was a raw traceback, or (latest deleted) a run that started over from step 0 and replaced the old rows of
    metrics.jsonl. Now one message, before the server is asked (there is none here), that names the file and the
    complete checkpoints still there (step_1: an older one the user kept), and whose one-line fix works."""
    d = tmp_path / "run"
    shutil.copytree(two_step_run, d)
    shutil.copytree(d / "step_2", d / "step_1")
    BREAKS[case](d)
    before = files_of(d)
    nproc, says = 2 if "2 ranks" in case else 1, says.format(d=d)
    code, out = run(train_cmd(tiny_model, f"http://127.0.0.1:{free_port()}", d, "--resume", "--steps", "3",
                              nproc=nproc), timeout=180)
    assert code == 1 and out.count(says) == 1, out
    assert ("Traceback" not in out) if nproc == 1 else (says in "\n".join(out.strip().splitlines()[-6:])), out
    assert files_of(d) == before  # nothing written, nothing lost
    if fix:
        (d / "latest").write_text(fix)
        assert g.checkpoint_to_resume(str(d)) == str(d / fix)


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_checkpoint_that_cannot_be_written_is_one_clear_error_and_keeps_the_last_one(tiny_model, tmp_path, nproc):
    """A full disk (seen on the GPU with a 7B model) raised deep inside safetensors / torch.save. Here the
    write fails because a file sits where step 2's folder goes: the run stops, said once, and the
    previous checkpoint stays the one to resume from."""
    (tmp_path / "step_2").write_text("in the way")
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "2", nproc=nproc), timeout=200)
    finally:
        s.close()
    says = "could not write the checkpoint"
    assert code == 1 and out.count(says) == 1 and "Is the disk full?" in out, out
    assert ("Traceback" not in out) if nproc == 1 else (says in "\n".join(out.strip().splitlines()[-6:])), out
    assert g.latest_checkpoint(str(tmp_path)) == str(tmp_path / "step_1") and (tmp_path / "step_1" / "trainer_state.pt").exists()


def test_a_fresh_run_never_writes_into_another_runs_folder_and_a_resumed_one_logs_each_step_once(tiny_model, tmp_path):
    kinds = lambda: [(r["step"], "eval_accuracy" in r) for r in read_metrics(tmp_path)]
    flags = ("--steps", "4", "--save_every", "2")
    s = StandIn(tiny_model, fail_generate_after=5)  # eval 0, steps 1-2, eval 2, step 3; then step 4's rollout fails
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, *flags), timeout=120)
        assert code == 1 and kinds() == [(0, True), (1, False), (2, False), (2, True), (3, False)], out
    finally:
        s.close()
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, *flags), timeout=120)  # a fresh run there: refused
        assert code == 1 and f"--out_dir {tmp_path} already holds a run (config.json, latest, metrics.jsonl, " \
            f"step_2): continue it with --resume" in out and "Traceback" not in out and not s.calls["/generate"], out
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, *flags, "--resume"), timeout=120)
        assert code == 0 and "at step 2" in out, out
    finally:
        s.close()
    # the steps after the checkpoint and its evaluation, redone after the resume, are in the file once
    assert kinds() == [(0, True), (1, False), (2, False), (2, True), (3, False), (4, False), (4, True)]


def test_a_run_stopped_before_its_first_checkpoint_is_started_again_by_resume(tiny_model, tmp_path):
    """Run again, a run killed before its first checkpoint said "continue it with --resume", and --resume said "a
    resume never starts over": no way on in that folder. Now the first says what --resume does there, and --resume
    starts it again from --model with its flags (--steps 3 restored) and logs each step once. A folder whose
    metrics.jsonl shows a step a checkpoint was due at (its checkpoints deleted) is still refused."""
    kinds = lambda: [(r["step"], "eval_accuracy" in r) for r in read_metrics(tmp_path)]
    s = StandIn(tiny_model, fail_generate_after=2)  # eval 0 and step 1; step 2's rollout fails: no checkpoint yet
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "3", "--save_every", "2"), timeout=120)
        assert code == 1 and kinds() == [(0, True), (1, False)] and not (tmp_path / "latest").exists(), out
    finally:
        s.close()
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--save_every", "2"), timeout=120)
        assert code == 1 and out.count(f"error: --out_dir {tmp_path} already holds a run (config.json, metrics.jsonl): "
                                       f"it stopped before its first checkpoint: --resume starts it again from --model "
                                       f"with its flags, or start this one in another --out_dir") == 1, out
        assert "Traceback" not in out and not s.calls["/generate"], out
        cmd = train_cmd(tiny_model, s.url, tmp_path, "--resume", "--save_every", "2")
        code, out = run(cmd[: cmd.index("--steps")] + cmd[cmd.index("--steps") + 2:])  # its --steps 3 comes back
        assert code == 0 and f"--resume: no checkpoint in {tmp_path} yet, starting from {tiny_model} (the run there " \
                              f"stopped before its first: it starts again, with its flags)" in out, out
    finally:
        s.close()
    assert kinds() == [(0, True), (1, False), (2, False), (2, True), (3, False), (3, True)]
    gone = tmp_path / "gone"  # its checkpoints deleted (one was due at step 2: --save_every 2): no start over
    gone.mkdir()
    shutil.copy(tmp_path / "config.json", gone / "config.json")
    shutil.copy(tmp_path / "metrics.jsonl", gone / "metrics.jsonl")
    with pytest.raises(g.UserError, match=re.escape(f"holds a run (config.json, metrics.jsonl) but no {gone}/latest, "
                                                    f"and a resume never starts over")):
        g.checkpoint_to_resume(str(gone))
    edit_config(gone, save_every=4, steps=10)
    assert g.checkpoint_to_resume(str(gone)) is None  # none was due yet


def test_a_path_a_shell_would_have_expanded_is_read_as_one_and_a_checkpoint_as_out_dir_names_the_runs_folder(
        two_step_run, tiny_model, tmp_path, monkeypatch, capsys):
    """--out_dir '~/runs/x' (quoted, or after '=': no shell expands it) made a folder named '~' where the run started;
    '$HOME/x' one named '$HOME'. Now such a path is read as a shell reads it, and said; an unset variable is one error.
    --out_dir at a checkpoint inside a run (with or without --resume) was refused as 'a model's folder?' without a
    word of the run's folder: now the error names it, and how to resume from that checkpoint."""
    home = tmp_path / "home"
    run = home / "run"
    shutil.copytree(two_step_run, run)
    shutil.copytree(run / "step_2", run / "step_1")
    before = files_of(run)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RUNS", str(home))
    monkeypatch.delenv("NOPE", raising=False)
    monkeypatch.chdir(tmp_path)  # a path taken literally ('~', '$RUNS') would be made here
    at = f"--out_dir {run}/step_2 is a checkpoint of the run in {run}, not a run's folder: "
    for out_dir, resume, says in [
            ("~/run/step_2", True, at + f"--resume continues a run from its folder, at the checkpoint its latest "
                                        f"names: --out_dir {run} --resume"),
            ("$RUNS/run/step_1", True, at.replace("step_2", "step_1") + f"--resume continues a run from its folder, at "
                                       f"the checkpoint its latest names: --out_dir {run} --resume (from this "
                                       f"checkpoint: first echo step_1 > {run}/latest)"),
            ("${RUNS}/run/step_2", False, at + f"to train on from these weights in a new run, --model {run}/step_2 "
                                               f"--out_dir <another folder>; to continue that run, --out_dir {run} "
                                               f"--resume"),
            ("$NOPE/run", False, "--out_dir '$NOPE/run': $NOPE is not set (a shell reads it as a variable): set it, "
                                 "or give the path in full")]:
        with pytest.raises(g.UserError) as e:
            g.setup(g.Config(model=tiny_model, out_dir=out_dir, resume=resume, device="cpu"))
        assert str(e.value) == says
        read_as = f"--out_dir {out_dir!r} is read as {run}/step_{out_dir[-1]}, as a shell reads a path"
        assert capsys.readouterr().out.count(read_as) == ("NOPE" not in out_dir), out_dir
    assert files_of(run) == before and os.listdir(tmp_path) == ["home"]  # nothing written, no folder '~' or '$RUNS'


@pytest.mark.parametrize("whose, resume", [("--model's", False), ("--model's", True), ("another model's", False),
                                           ("another model's", True)])
def test_a_run_never_writes_over_a_models_folder(tiny_model, tmp_path, whose, resume):
    """--out_dir set to --model's folder overwrote its config.json with the run's (the model no longer loaded)."""
    model = shutil.copytree(tiny_model, tmp_path / "model")
    d = model if whose == "--model's" else shutil.copytree(tiny_model, tmp_path / "other")
    before = files_of(d)
    code, out = run(train_cmd(str(model), f"http://127.0.0.1:{free_port()}", d, *(["--resume"] if resume else [])),
                    timeout=120)
    says = (f"--out_dir {d} is --model's folder" if d == model else
            f"--out_dir {d} holds a config.json that no run of this trainer wrote (a model's folder?)")
    assert code == 1 and out.count(says + ": the run would write over its config.json. Use another --out_dir") == 1, out
    assert "Traceback" not in out and files_of(d) == before and not (d / ".lock").exists()


def test_a_second_trainer_in_the_out_dir_of_a_running_one_is_refused_naming_its_pid(tiny_model, tmp_path):
    """Two runs started a second apart in one --out_dir both exited 0, and only the second's files remained. Now the
    first holds a lock on it while it runs: a second one there, fresh or --resume, is refused; the first goes on."""
    import time
    s = StandIn(tiny_model, hold_generate_after=0)  # the first run waits at its first /generate until released
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1")
    d = tmp_path / "run"
    try:
        with open(tmp_path / "first.log", "w") as f:
            p = subprocess.Popen(train_cmd(tiny_model, s.url, d, "--steps", "1"), stdout=f, stderr=subprocess.STDOUT,
                                 env=env, cwd=HERE)
            deadline = time.time() + 120
            while time.time() < deadline and p.poll() is None and not (
                    (d / ".lock").exists() and (d / ".lock").read_text().strip() == str(p.pid)):
                time.sleep(0.05)
            for again in ((), ("--resume",)):
                code, out = run(train_cmd(tiny_model, f"http://127.0.0.1:{free_port()}", d, "--steps", "1", *again),
                                timeout=120)
                assert code == 1 and out.count(f"--out_dir {d} is in use by another run (pid {p.pid}): wait for it to "
                                               f"end (or stop it), or use another --out_dir") == 1, out
                assert "Traceback" not in out
            assert p.poll() is None  # the first run ran all along
            s.release.set()
            code = p.wait(120)
    finally:
        s.close()
    assert code == 0, (tmp_path / "first.log").read_text()
    assert [(r["step"], "eval_accuracy" in r) for r in read_metrics(d)] == [(0, True), (1, False), (1, True)]
    g.lock_out_dir(str(d)).close()  # the OS let go of the first run's lock when it ended


def test_an_out_dir_that_cannot_be_written_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(g.UserError, match=re.escape("--out_dir '/proc' cannot be created or written")):
        g.check_config(g.Config(out_dir="/proc"), 1)  # exists, and no one may write there (root included)
    if os.geteuid():  # root writes into a read-only folder anyway
        (tmp_path / "ro").mkdir(mode=0o555)
        with pytest.raises(g.UserError, match="cannot be created or written: Permission denied"):
            g.check_config(g.Config(out_dir=str(tmp_path / "ro")), 1)


DISK_FULL = """import builtins, os, runpy, sys
sys.path.insert(0, {here!r})
real = builtins.open  # config.json and metrics.jsonl in --out_dir, opened in a mode of {modes!r}: opened (for 'w',
def full(f, mode="r", *a, **k):  # emptied), as on a full disk, then every write fails: 'No space left on device'
    if isinstance(f, str) and os.path.basename(f).split(".tmp")[0] in ("config.json", "metrics.jsonl") and (
            os.path.dirname(os.path.abspath(f)) == {out_dir!r} and any(c in mode for c in {modes!r})):
        real(f, mode).close()
        f = "/dev/full"
    return real(f, mode, *a, **k)
builtins.open = full
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full: a file whose every write finds the disk full")
def test_a_full_disk_under_metrics_jsonl_is_one_clear_error_and_the_resume_after_it_logs_each_step_once(
        two_step_run, tiny_model, tmp_path):
    """A full disk while metrics.jsonl grew was a raw OSError; one at the start of a resume emptied config.json (the
    run's flags). Now one message (what, where, and to --resume), config.json, the rows and the checkpoint stay, and
    after a row that the full disk cut short the resume logs each step once."""
    d, wrapper = tmp_path / "run", tmp_path / "disk_full.py"
    shutil.copytree(two_step_run, d)
    before, rows = files_of(d), read_metrics(d)
    s = StandIn(tiny_model)
    try:
        cmd = train_cmd(tiny_model, s.url, d, "--resume", "--steps", "3")
        for modes, what in (("wa", "config.json and metrics.jsonl"), ("a", f"step 2's row of {d / 'metrics.jsonl'}")):
            wrapper.write_text(DISK_FULL.format(here=HERE, modes=modes, out_dir=str(d),
                                                script=os.path.join(HERE, "grpo_sglang.py")))
            code, out = run([cmd[0], str(wrapper), *cmd[2:]])
            says = (f"could not write {what} (No space left on device): is the disk of {d} full? Free space, then "
                    f"--resume from the last checkpoint there")
            assert code == 1 and out.count(says) == 1 and "Traceback" not in out, out
            if modes == "wa":  # full from the start: nothing changed
                assert {p: b for p, b in files_of(d).items() if p.suffix != ".tmp"} == before
        assert read_metrics(d) == [r for r in rows if r["step"] < 2 or "eval_accuracy" not in r]  # (an eval redone)
        assert g.latest_checkpoint(str(d)) == str(d / "step_2")
        with open(d / "metrics.jsonl", "a") as f:
            f.write('{"step": 3, "reward_mean": 0.')  # the part of a row that reached a full disk
        code, out = run(cmd)
        assert code == 0 and "at step 2" in out, out
    finally:
        s.close()
    kinds = [(r["step"], "eval_accuracy" in r) for r in read_metrics(d)]
    assert kinds == [(0, True), (1, False), (2, False), (2, True), (3, False), (3, True)]


# ---------------------------------------------------------------------------------------------
# 12. the GRPO variants of TRL, verl and slime, each a flag: hand values against the formula written here

def test_lr_schedule_hand_values():
    f = lambda step, schedule, warmup=2, min_ratio=0.1: g.lr_factor(step, 12, warmup, schedule, min_ratio)
    assert [f(s, "constant") for s in (0, 1, 2, 11)] == [0.5, 1.0, 1.0, 1.0]  # linear warmup over 2 steps, then flat
    assert f(2, "cosine") == pytest.approx(1.0) and f(11, "cosine") == pytest.approx(0.1)  # decay to min_lr_ratio
    assert f(6, "cosine") == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 9)))
    assert f(6, "linear") == pytest.approx(0.1 + 0.9 * (1 - 4 / 9)) and f(0, "linear", 0) == pytest.approx(1.0)
    opt, m = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), g.Metrics()
    g.set_lr(opt, 0.25, m)
    assert opt.param_groups[0]["lr"] == 0.25 and m.maxes["lr"] == 0.25


def test_overlong_penalty_hand_values():
    got = g.overlong_penalty(torch.tensor([50.0, 80, 90, 95, 100, 130]), 100, 20)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.5, -0.75, -1.0, -1.0]))  # DAPO eq. 13, L_max 100, L_cache 20


def test_the_overlong_penalty_reaches_the_advantages_a_run_trains_on(resumed_runs):
    """--overlong_buffer 4 of --max_new_tokens 6, --overlong_penalty 0.5: a sequence's reward is the task's (here:
    'number' in the completion) plus 0.5 x DAPO's penalty (0 up to 2 tokens, then -1/4 a token more), and the
    advantages train() gets are GRPO's of that reward, written out here."""
    ref, _ = resumed_runs
    varied = 0
    for t in ref.tables:
        penalty = [-0.5 * min(max((n - 2) / 4, 0.0), 1.0) for n in t["length"].tolist()]
        reward = [float("number" in text.split()) + p for text, p in zip(t["text"], penalty)]
        assert t["adv"].tolist() == pytest.approx(grpo_advantages(reward, 4), rel=1e-5, abs=1e-6), (t, penalty)
        varied += any(len(set(penalty[k: k + 4])) > 1 for k in range(0, len(penalty), 4))
    assert len(ref.tables) == 5 and varied  # (groups whose penalties differ: there it moves the advantages)


def test_rloo_and_batch_std_advantages_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 1.0, 1.0])
    rloo = g.group_advantages(r, 4, scale=False, rloo=True)  # r_i - the mean of the other three
    assert torch.allclose(rloo, torch.tensor([1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3, 3 - 1, 1 - 5 / 3, 1 - 5 / 3, 1 - 5 / 3]))
    batch = g.group_advantages(r, 4, std=torch.tensor(2.0), eps=0.0)  # TRL's scale_rewards='batch': one std for all
    assert torch.allclose(batch, torch.tensor([0.25, -0.25, -0.25, 0.25, 0.75, -0.25, -0.25, -0.25]))


def test_batch_std_is_exact_for_rewards_far_from_0():
    """--scale_rewards batch: float32 sums of squares lose the std's digits when the rewards are far from 0 (3.5e-4
    relative at 100 + N(0, 1), 4.7e-2 at 1000 + {0, 1}); it must be torch's std, in float64."""
    gen = torch.Generator().manual_seed(0)
    dist_init()
    try:
        for r in (100 + torch.randn(64, generator=gen), 1000 + torch.randint(0, 2, (64,), generator=gen).float()):
            want = r.double().std().item()  # unbiased, of the float32 values the trainer has
            assert g.batch_std(r).item() == pytest.approx(want, rel=1e-6)
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()


ADVANTAGES_ON_TWO_RANKS = """import json, sys
sys.path.insert(0, {here!r})
import torch, torch.distributed as dist
import grpo_sglang as g
dist.init_process_group("gloo")
r = torch.tensor({rewards!r}[dist.get_rank()])
got = {{m: g.advantages(g.Config(group_size=4, scale_rewards=m), r).tolist() for m in ("group", "batch", "none")}}
json.dump(got, open({out!r} + str(dist.get_rank()), "w"))
dist.destroy_process_group()
"""


def test_scale_rewards_batch_divides_by_the_std_of_the_whole_batch_over_all_ranks(tmp_path):
    """Two ranks with rewards of different spread: --scale_rewards batch divides every advantage by the std of all
    16 rewards (not of a rank's 8, nor of the group), group by the group's, none by nothing; written out here."""
    rewards = [[1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5], [3.0, 0.0, 1.0, 2.0, 0.0, 4.0, 4.0, 4.0]]
    script = tmp_path / "adv.py"
    script.write_text(ADVANTAGES_ON_TWO_RANKS.format(here=HERE, rewards=rewards, out=str(tmp_path / "adv")))
    code, out = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                     f"--master_port={free_port()}", str(script)], timeout=120)
    assert code == 0, out
    import statistics
    std = statistics.stdev(rewards[0] + rewards[1])
    for rank in (0, 1):
        got = json.load(open(tmp_path / f"adv{rank}"))
        r = rewards[rank]
        assert got["batch"] == pytest.approx(grpo_advantages(r, 4, std=std), rel=1e-5), (rank, got)
        assert got["group"] == pytest.approx(grpo_advantages(r, 4), rel=1e-5)
        assert got["none"] == pytest.approx(grpo_advantages(r, 4, std=1.0, eps=0.0), rel=1e-5)
    assert std == pytest.approx(1.522, abs=1e-3)  # (each rank's own: 0.378 and 1.753)


def test_gspo_sequence_ratio_hand_values():
    """GSPO: one ratio per completion, exp(mean over its tokens of log π/π_old), masked tokens left out; each of its
    tokens carries it (TRL's importance_sampling_level='sequence')."""
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]]))
    old = torch.log(torch.tensor([[0.25, 0.2, 0.1], [0.3, 0.6, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # row 0's third token is padding
    # row 0: (log 2 + log 1) / 2 -> ratio sqrt(2); row 1: (0 + log 0.5 + 0) / 3 -> ratio 0.5^(1/3)
    want = torch.tensor([[2 ** 0.5] * 3, [0.5 ** (1 / 3)] * 3])
    assert torch.allclose(torch.exp(g.log_ratio(logp, old, mask, "sequence")), want, atol=1e-6)
    assert torch.allclose(g.log_ratio(logp, old, mask, "token"), logp - old)
    adv = torch.tensor([1.0, -1.0])
    loss, clipped, _ = token_loss(logp, old, adv, mask, 0.2, 0.3, "sequence")
    # row 0: A > 0, sqrt(2) = 1.414 clipped to 1.3; row 1: A < 0, 0.794 clipped to 0.8: -min(-0.794, -0.8) = 0.8
    assert torch.allclose(loss, torch.tensor([[-1.3] * 3, [0.8] * 3]), atol=1e-6)
    assert clipped.all()
    # the gradient of a token's loss reaches every token of its sequence (1/|y| each), none where clipped
    lp = logp.clone().requires_grad_(True)
    l, _, _ = token_loss(lp, old, torch.tensor([1.0, 1.0]), mask, 0.5, 0.3, "sequence")  # row 0 clipped
    (l * mask).sum().backward()
    r1 = 0.5 ** (1 / 3)  # row 1, unclipped: d/dlogp_t of -3 * exp(mean) = -exp(mean) (3 tokens, 1/3 each)
    assert torch.allclose(lp.grad[1], torch.full((3,), -r1), atol=1e-6) and (lp.grad[0] == 0).all()


def test_gspo_with_one_token_completions_is_grpo():
    logp, old, adv, mask = torch.randn(5, 1), torch.randn(5, 1), torch.randn(5), torch.ones(5, 1)
    tis, ref = torch.rand(5, 1) + 0.5, torch.randn(5, 1)
    tok = token_loss(logp, old, adv, mask, 0.2, 0.28, "token", tis, ref, 0.1)
    seq = token_loss(logp, old, adv, mask, 0.2, 0.28, "sequence", tis, ref, 0.1)
    assert all(torch.equal(a, b) for a, b in zip(tok, seq))


def test_ratio_level_takes_the_documented_names_from_the_command_line(tmp_path):
    cfg = g.parse_config(["--ratio_level", "sequence", "--clip_low", "3e-4", "--clip_high", "4e-4", "--out_dir", str(tmp_path)])
    g.check_config(cfg, 1)
    logp, old, mask = torch.tensor([[0.0, -2.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2)
    b = {"adv": torch.tensor([1.0]), "mask": mask, "server": old}
    assert torch.equal(g.policy_loss(dataclasses.replace(cfg, tis_cap=0), b, logp, old, None)[0],  # one ratio, exp(0) = 1
                       torch.tensor([[-1.0, -1.0]]))
    with pytest.raises(g.UserError, match=re.escape("--ratio_level 'seq' is out of range: it must be token or sequence")):
        g.check_config(g.parse_config(["--ratio_level", "seq", "--out_dir", str(tmp_path)]), 1)


def test_gspo_with_grpos_clips_is_warned_once(tmp_path, capsys):
    g.check_config(g.parse_config(["--ratio_level", "sequence", "--out_dir", str(tmp_path)]), 1)
    assert capsys.readouterr().out.count("warning: GSPO (--ratio_level sequence) with --clip_low 0.2") == 1
    g.check_config(g.parse_config(["--ratio_level", "sequence", "--clip_low", "3e-4", "--clip_high", "4e-4", "--out_dir",
                                   str(tmp_path)]), 1)
    assert "warning" not in capsys.readouterr().out


def test_importance_sampling_modes_hand_values():
    old = torch.log(torch.tensor([[0.8, 0.3, 0.5], [0.2, 0.2, 0.9]]))
    server = torch.log(torch.tensor([[0.2, 0.6, 0.5], [0.4, 0.2, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # token ratios [4, 0.5, (pad)], [0.5, 1, 9]
    w = lambda mode: g.tis_weights(old, server, 2.0, mask, mode)
    assert torch.allclose(w("token_truncate")[:, :2], torch.tensor([[2.0, 0.5], [0.5, 1.0]]))
    assert torch.allclose(w("token_mask"), torch.tensor([[0.0, 0.5, 1.0], [0.5, 1.0, 0.0]]))
    # one ratio per sequence, the product of its tokens': 4 * 0.5 = 2 (the pad left out), 0.5 * 1 * 9 = 4.5
    assert torch.allclose(w("sequence_truncate"), torch.tensor([[2.0] * 3, [2.0] * 3]))
    assert torch.allclose(w("sequence_mask"), torch.tensor([[2.0] * 3, [0.0] * 3]))
    assert torch.allclose(g.tis_weights(old, server, 2.0), w("token_truncate"))  # the default is TIS as before


def test_importance_weights_are_computed_in_log_space_a_huge_sequence_ratio_weighs_0_not_nan():
    """A sequence's summed log ratio past ~88.7 nats is exp = inf in float32, and inf * 0 = NaN would skip the whole
    update: in log space it weighs 0 (mask) or the cap (truncate), in all four modes."""
    huge = g.tis_weights(torch.zeros(2, 400), torch.full((2, 400), -0.25), 2.0, torch.ones(2, 400), "sequence_mask")
    assert torch.equal(huge, torch.zeros(2, 400))  # 400 x 0.25 = 100 nats: over log 2
    old = torch.zeros(2, 3)  # log ratios: [100, 0.25, 0] (sum 100.25) and [log 1.5, (pad), (pad)]
    server = torch.tensor([[-100.0, -0.25, 0.0], [-math.log(1.5), -5.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    w = lambda mode: g.tis_weights(old, server, 2.0, mask, mode)
    e = math.exp(0.25)
    assert torch.allclose(w("token_truncate"), torch.tensor([[2.0, e, 1.0], [1.5, 1.0, 1.0]]))
    assert torch.allclose(w("token_mask"), torch.tensor([[0.0, e, 1.0], [1.5, 1.0, 1.0]]))
    assert torch.allclose(w("sequence_truncate"), torch.tensor([[2.0] * 3, [1.5] * 3]))
    assert torch.allclose(w("sequence_mask"), torch.tensor([[0.0] * 3, [1.5] * 3]))


def test_policy_loss_weighs_each_token_by_the_tis_mode_it_is_given():
    """--tis_mode reaches the loss: π_old / π_server of [4, 1] and [0.5, 1] at --tis_cap 2, the policy not yet moved
    (ratio 1, no clipping), so each token's loss is -A x its IS weight: truncated or masked, per token or per sequence
    (the product over its tokens: 4 and 0.5)."""
    old = torch.log(torch.tensor([[0.8, 0.5], [0.2, 0.4]]))
    x = {"adv": torch.tensor([1.0, -2.0]), "mask": torch.ones(2, 2),
         "server_lp": torch.log(torch.tensor([[0.2, 0.5], [0.4, 0.4]]))}
    want = {"token_truncate": [[2.0, 1.0], [0.5, 1.0]], "token_mask": [[0.0, 1.0], [0.5, 1.0]],
            "sequence_truncate": [[2.0, 2.0], [0.5, 0.5]], "sequence_mask": [[0.0, 0.0], [0.5, 0.5]]}
    for mode, w in want.items():
        loss, _, _ = g.policy_loss(g.Config(tis_cap=2.0, tis_mode=mode), x, old.clone(), old, None)
        assert torch.allclose(loss, -x["adv"][:, None] * torch.tensor(w), atol=1e-6), (mode, loss)


def test_is_truncated_frac_counts_the_tokens_the_tis_mode_cuts_and_empty_micro_batches_log_null():
    """The share of tokens whose TIS weight the cap cut, under --tis_mode: a sequence mode cuts every token of a
    sequence whose product of ratios passes the cap, whatever its tokens' own ratios. A micro-batch of empty
    completions (no columns, or a mask of 0s) logs its means as null, and does not crash on an empty maximum."""
    trainer = torch.zeros(2, 3)  # ratios: 1.5 x 3 (product 3.375 > 2, no token > 2), and 4, 0.25 (product 1), pad
    server = torch.tensor([[-math.log(1.5)] * 3, [-math.log(4), math.log(4), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    got = {}
    dist_init()
    try:
        for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
            m = g.Metrics()
            g.mismatch_stats(trainer, server, mask, 2.0, m, mode)
            got[mode] = m.reduce("cpu")["is_truncated_frac"]
        m = g.Metrics()
        g.mismatch_stats(trainer, server, mask, 0, m, "sequence_mask")  # --tis_cap 0: no TIS, nothing cut
        off = m.reduce("cpu")["is_truncated_frac"]
        m = g.Metrics()
        g.mismatch_stats(torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0), 2.0, m, "sequence_mask")
        g.mismatch_stats(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3), 2.0, m)
        empty = m.reduce("cpu")
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()
    assert got == {"token_truncate": 1 / 5, "token_mask": 1 / 5, "sequence_truncate": 3 / 5, "sequence_mask": 3 / 5}
    assert off == 0
    assert all(empty[k] is None for k in ("mismatch_mean", "mismatch_kl", "is_ratio_mean", "is_truncated_frac"))


def test_cispo_hand_values_and_its_gradient_flows_through_clipped_tokens():
    logp = torch.log(torch.tensor([[0.6, 0.3]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.3, 0.3]]))  # ratios 2 (over 1 + 0.28) and 1
    adv = torch.tensor([2.0])
    loss, clipped, _ = token_loss(logp, old, adv, torch.ones(1, 2), 0.2, 0.28, loss_type="cispo")
    want = -torch.tensor([1.28, 1.0]) * 2 * torch.log(torch.tensor([0.6, 0.3]))  # -sg(min(ρ, 1.28)) A log π
    assert torch.allclose(loss.detach(), want.unsqueeze(0)) and clipped.tolist() == [[True, False]]
    loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.28 * 2, -1.0 * 2]]))  # not 0 where clipped (PPO's would be)


def test_entropy_bonus_enters_the_loss_per_token():
    logp, old = torch.log(torch.tensor([[0.5, 0.25]])), torch.log(torch.tensor([[0.5, 0.25]]))
    ent = torch.tensor([[1.0, 2.0]], requires_grad=True)
    x = {"adv": torch.tensor([1.0]), "mask": torch.ones(1, 2), "server_lp": old}
    cfg = g.Config(entropy_coef=0.1, tis_cap=0)
    loss, _, _ = g.policy_loss(cfg, x, logp, old, ent)
    assert torch.allclose(loss, torch.tensor([[-1.0 - 0.1, -1.0 - 0.2]]))
    loss.sum().backward()
    assert torch.allclose(ent.grad, torch.tensor([[-0.1, -0.1]]))
    assert torch.equal(g.policy_loss(dataclasses.replace(cfg, entropy_coef=0.0), x, logp, old, ent)[0],
                       torch.tensor([[-1.0, -1.0]]))


def test_filters_set_weights_and_shaping_adds_the_overlong_penalty():
    seqs = {"reward": torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]),
            "truncated": torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
            "length": torch.tensor([3.0, 10, 9, 1, 2, 2, 10, 8])}
    cfg = g.Config(group_size=4, max_new_tokens=10, overlong_buffer=4, overlong_penalty=0.5)
    assert g.weights(cfg, seqs).tolist() == [1.0] * 8
    assert g.weights(dataclasses.replace(cfg, mask_truncated=True), seqs).tolist() == [1, 0, 1, 1, 1, 1, 0, 1]
    assert g.weights(dataclasses.replace(cfg, filter_flat_groups=True), seqs).tolist() == [1] * 4 + [0] * 4
    m = g.Metrics()
    g.shape_rewards(cfg, seqs, m)  # lengths 9, 10 over max - buffer = 6: -0.5 x 3/4, -0.5 x 1; 8: -0.5 x 2/4
    assert torch.allclose(seqs["reward"], torch.tensor([1.0, -0.5, 1 - 0.375, 1.0, 0.5, 0.5, 0.0, 0.25]))


def test_advantages_may_be_per_token_and_any_other_shape_is_one_clear_error():
    """(B,) advantages, or (B, T) ones (process rewards, a per-token penalty): one equal along each row is exactly
    the per-sequence loss and gradient, a varying one is the formula token by token; another shape (it would
    broadcast to (B, B, T) and train on nonsense) is one clear error that names the shapes."""
    logp0 = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]]))
    old = torch.log(torch.tensor([[0.25, 0.2, 0.9], [0.3, 0.3, 0.2]]))  # ratios [2, 1, 1], [1, 2, 0.5]
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])

    def loss_and_grad(adv, loss_type="grpo"):
        lp = logp0.clone().requires_grad_(True)
        loss, clipped, _ = token_loss(lp, old, adv, mask, 0.2, 0.28, loss_type=loss_type)
        total = g.aggregate(loss, mask, torch.ones(2), "token", 5)
        total.backward()
        return loss.detach(), clipped, total.detach(), lp.grad
    adv = torch.tensor([1.0, -2.0])
    for loss_type in ("grpo", "cispo"):
        per_seq, per_tok = loss_and_grad(adv, loss_type), loss_and_grad(adv[:, None].expand(2, 3), loss_type)
        assert all(torch.equal(a, b) for a, b in zip(per_seq, per_tok)), loss_type
    a = torch.tensor([[1.0, -1.0, 3.0], [0.5, 2.0, -1.0]])  # -min(ρA, clip(ρ, 0.8, 1.28) A), token by token
    loss, clipped, total, grad = loss_and_grad(a)
    assert torch.allclose(loss, torch.tensor([[-1.28, 1.0, -3.0], [-0.5, -2.56, 0.8]]))
    assert total.item() == pytest.approx((-1.28 + 1.0 - 0.5 - 2.56 + 0.8) / 5)  # the pad's -3 left out
    assert torch.allclose(grad, torch.tensor([[0.0, 1.0, 0.0], [-0.5, 0.0, 0.0]]) / 5)  # -Aρ where not clipped
    loss, _, _, _ = loss_and_grad(a, "cispo")  # -sg(min(ρ, 1.28)) A log π
    assert torch.allclose(loss, -torch.tensor([[1.28, 1.0, 1.0], [1.0, 1.28, 0.5]]) * a * logp0)
    for bad in (torch.ones(2, 2), torch.ones(3), torch.ones(2, 3, 1)):
        for loss_type in ("grpo", "cispo"):
            with pytest.raises(g.UserError, match=re.escape(f"advantages of shape {tuple(bad.shape)} for 2 sequences "
                                                            f"of 3 tokens: they must be (2,), one per sequence, or "
                                                            f"(2, 3), per token")):
                loss_and_grad(bad, loss_type)


def test_per_token_advantages_of_the_table_train_as_per_sequence_ones(tiny_model, monkeypatch):
    """The step's table may hold (N, C) advantages, right-padded as its mask: the micro-batches slice them (rows_of)
    and the step takes exactly the gradient of the (N,) ones equal along each row; a table of another width is one
    clear error before any forward. The step logs the share of tokens that its --tis_mode cut."""
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed as dist
    dist_init()
    try:
        model = g.shard(g.load_policy(tiny_model, torch.device("cpu"), False), init_device_mesh("cpu", (1,)),
                        torch.bfloat16)
        batch = {"rows": [{"ids": [4, 5], "answer": "1"}], "version": 0, "srv": [0] * 4,
                 "outs": [([11 + k, 3, 7][: 1 + k % 3], [-1.0] * (1 + k % 3), "stop") for k in range(4)]}

        class Tok:
            def decode(self, ids, skip_special_tokens):
                return str(ids[0])
        grads = []
        monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a: grads.append(
            [p.grad.to_local().clone() for p in self.param_groups[0]["params"] if p.grad is not None]))

        def step(seqs):
            m = g.Metrics()
            g.train(cfg, model, torch.optim.SGD(model.parameters(), lr=0.05), seqs, mbs, 1, lambda s, m: None, m)
            return m.reduce("cpu")
        cfg = g.Config(group_size=4, micro_batch=1, tis_mode="sequence_mask")  # one sequence a micro-batch
        seqs = table(batch["rows"], batch["outs"], Tok(), 4)  # completions of 1, 2, 3 and 1 tokens
        mbs = g.micro_batches(seqs, cfg.micro_batch, 0)
        assert len({b["C"] for b in mbs}) > 1  # micro-batches of several widths C_b
        seqs.update(adv=torch.zeros(4), weight=torch.ones(4), reward=torch.zeros(4))
        step(seqs)  # -> the trainer's log-probs, lp0
        seqs["server_lp"] = seqs["lp0"] - 0.5 * seqs["mask"]  # e^0.5 < 2 a token: sequences of 2 or 3 over the cap
        grads.clear()
        adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
        for a in (adv, adv[:, None].expand_as(seqs["mask"]).clone()):
            seqs["adv"] = a
            assert step(seqs)["is_truncated_frac"] == 5 / 7  # sequence_mask: their 2 + 3 of the 7 tokens
        assert len(grads) == 2 and all(torch.equal(x, y) for x, y in zip(*grads))
        assert any(x.abs().sum() > 0 for x in grads[0])
        seqs["adv"] = torch.ones(4, seqs["mask"].shape[1] + 1)
        with pytest.raises(g.UserError, match=re.escape("advantages of shape (4, 4) for 4 sequences of 3 tokens")):
            step(seqs)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("flags, says", [
    (["--lr_warmup_steps", "10", "--steps", "2"],  # the run would end in its warmup (0.2 x --lr at most)
     "--lr_warmup_steps 10 is out of range: it must be 0 <= lr_warmup_steps < steps (--steps is 2)"),
    (["--lr_warmup_steps", "2", "--steps", "2"], "--lr_warmup_steps 2 is out of range"),
    (["--overlong_buffer", "9", "--max_new_tokens", "8"],  # every completion, even an empty one, would be penalised
     "--overlong_buffer 9 is out of range: it must be 0 <= overlong_buffer <= max_new_tokens (--max_new_tokens is 8)"),
    (["--lr_warmup_steps", "1", "--steps", "2", "--overlong_buffer", "8", "--max_new_tokens", "8"], None)])
def test_a_warmup_as_long_as_the_run_and_an_overlong_buffer_past_the_limit_are_refused(tmp_path, flags, says):
    """A rule may name another flag, whose value the message gives. A buffer as long as --max_new_tokens is allowed:
    DAPO's ramp over every length, 0 for an empty completion (a length penalty)."""
    cfg = g.parse_config(["--out_dir", str(tmp_path)] + flags)
    with pytest.raises(g.UserError, match=re.escape(says)) if says else contextlib.nullcontext():
        g.check_config(cfg, 1)


def test_every_variant_at_once_trains_on_two_ranks_and_logs_what_it_did(tiny_model, tmp_path):
    """All the variants together (two ranks, async, sequence-level ratio): the run goes on, the learning rate follows
    its schedule, the overlong penalty is a logged part of the reward, and the sync check still passes."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "3", "--async", "--prompts_per_step", "4",
                                  "--lr_warmup_steps", "1", "--lr_schedule", "cosine", "--min_lr_ratio", "0.5",
                                  "--entropy_coef", "0.01", "--mask_truncated", "--overlong_buffer", "2",
                                  "--filter_flat_groups", "--tis_mode", "sequence_mask", "--adv_estimator", "rloo",
                                  "--scale_rewards", "batch", "--loss_type", "cispo", "--ratio_level", "sequence",
                                  "--clip_low", "3e-4", "--clip_high", "4e-4", "--reward", "has_number:1,always_1:0.1",
                                  nproc=2, rewards=True), timeout=240)
        assert code == 0, out
        m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
        assert [r["lr"] for r in m] == pytest.approx([3e-2, 3e-2, 1.5e-2])  # warmup 1 step, then cosine to 0.5
        assert all(r["reward_overlong"] <= 0 and r["reward_always_1"] == 1 for r in m)
        assert all(r["check_mismatch_mean"] < 0.01 for r in m) and all(math.isfinite(r["loss"]) for r in m)
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# 13. docs and tools: the README's recipes, the docs' flags, the plot tool and the metrics, this index

def test_the_readmes_recipes_run_as_written(tiny_model, server, tmp_path):
    """Every recipe of the README's Hacking guide, applied to a copy as written and run: the reward that sees the
    sample (and the reward registry still passes), the filter (a step with no right answer skips its update), the
    rank advantages (a choice of --adv_estimator, scaled as the others) and the extra loss term (hand values through
    the edited copy's own functions, each behind its flag); then the dataset recipe's file and command."""
    import importlib.util
    recipes = readme_recipes()
    assert list(recipes) == ["concise", "filter", "ranks", "loss", "sft", "state", "curriculum", "dataset",
                             "environment", "selfcheck", "turns", "asks"], list(recipes)
    root = tmp_path / "copy"
    root.mkdir()
    for f in ("grpo_sglang.py", "reward_fns.py"):
        shutil.copy(os.path.join(HERE, f), root / f)
    for name in ("concise", "filter", "ranks", "loss", "environment", "selfcheck"):
        apply_recipe(recipes[name], root)
    load = lambda name, path: (lambda spec: (spec, importlib.util.module_from_spec(spec)))(
        importlib.util.spec_from_file_location(name, path))
    spec, rf = load("reward_fns_recipes", root / "reward_fns.py")
    spec.loader.exec_module(rf)
    check_registry(rf)
    ask = lambda task, *turns: rf.TASKS[task].env([{"role": "user", "content": "What is 2 + 3?"}] + [
        {"role": ("assistant", "user")[k % 2], "content": c} for k, c in enumerate(turns)], "5")
    assert ask("arithmetic_check", "6") == "Check your answer, then give it again." and ask("arithmetic_check", "6", "?", "5") is None
    assert ask("arithmetic_retry", "6") == "That is not right. Try again." and ask("arithmetic_retry", "5") is None
    spec, copy = load("grpo_sglang_recipes", root / "grpo_sglang.py")
    spec.loader.exec_module(copy)
    rewards, beats = torch.tensor([0.0, 1.0, 1.0, 3.0, 2.0, 2.0, 2.0, 2.0]), torch.tensor([0.0, 1, 1, 3])
    adv = copy.advantages(copy.Config(adv_estimator="rank", group_size=4, scale_rewards="none"), rewards)
    assert torch.allclose(adv, torch.tensor([-1.25, -0.25, -0.25, 1.75, 0, 0, 0, 0]))  # beats 0, 1, 1, 3; a flat group
    adv = copy.advantages(copy.Config(adv_estimator="rank", group_size=4), rewards)  # --scale_rewards group applies
    assert torch.allclose(adv[:4], (beats - 1.25) / (beats.std() + 1e-4)) and not adv[4:].any()
    lp, slp = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])  # advantage 0: only the new term is left
    x = {"adv": torch.zeros(1), "mask": torch.ones(1, 2), "server_lp": slp}
    loss = copy.policy_loss(copy.Config(tis_cap=0, sampler_kl=0.05), x, lp, lp, torch.zeros(1, 2))[0]
    assert torch.allclose(loss, 0.05 * (torch.exp(slp - lp) - (slp - lp) - 1))
    cmd = train_cmd(tiny_model, server.url, tmp_path / "run", "--steps", "2", "--reward", "arithmetic:1,concise:0.5",
                    "--max_new_tokens", "30", "--solved_only", "--sampler_kl", "0.05", "--adv_estimator", "rank")
    code, out = run([cmd[0], str(root / "grpo_sglang.py"), *cmd[2:]])
    assert code == 0, out
    m = [r for r in read_metrics(tmp_path / "run") if "reward_mean" in r]
    # the filter: a step with no right answer skips its update, one with a right answer trains on its group (hand
    # values: the second group has one right answer); in the run, a step skips exactly when nothing was right
    seqs = {"reward": torch.zeros(8), "correct": torch.tensor([0.0, 0, 0, 0, 0, 1, 0, 0])}
    assert copy.weights(copy.Config(group_size=4, solved_only=True), seqs).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert copy.weights(copy.Config(group_size=4), seqs).tolist() == [1] * 8  # off: as before
    assert len(m) == 2 and [r["empty_batch_skips"] for r in m] == [int(r["accuracy"] == 0) for r in m], m
    assert any(r["reward_concise"] != 0 for r in m) and not any(r["reward_warnings"] for r in m), m  # saw the sample
    mix = [r["reward_arithmetic"] + 0.5 * r["reward_concise"] for r in m]  # each part logged, unweighted
    assert [r["reward_mean"] for r in m] == pytest.approx(mix), m  # the reward that trained: the weighted mix
    cmd = train_cmd(tiny_model, server.url, tmp_path / "retry", "--steps", "1", "--task", "arithmetic_retry",
                    "--max_new_tokens", "40", "--adv_estimator", "rank")  # (the new choice is a flag the run takes)
    code, out = run([cmd[0], str(root / "grpo_sglang.py"), *cmd[2:]])
    assert code == 0 and "task: arithmetic_retry, episodes of up to 3 replies (its environment: retry_env)" in out, out
    (file, _, _, _, rows), (_, _, _, _, command) = recipes["dataset"]
    assert open(os.path.join(HERE, file)).read().startswith(rows)  # the file's first rows, as the README shows them
    flags = command.replace("\\\n", " ").split("grpo_sglang.py", 1)[1].split()
    flags = [f for f in flags if f not in ("--colocate",)]
    k = flags.index("--model")
    code, out = run(train_cmd(tiny_model, server.url, tmp_path / "data_run", "--steps", "1", *flags[:k], *flags[k + 2:]))
    assert code == 0 and "eval prompts from data/capitals.jsonl" in out, out
    assert "task: exact (--task auto: 40 of 40 answers are no number; --task gsm8k, exact, choice or yours" in out, out


def test_the_reward_per_turn_and_the_environment_that_asks_the_model_recipes_run_as_written(tiny_model, tmp_path,
                                                                                          monkeypatch):
    """A reward per turn, applied to a copy as written: hand values (reply k's tokens get the group advantage of its
    return; the environment's tokens 0), and with every bonus 0 ('talk' never calls the calculator) a run trains
    exactly as the one advantage per episode does, to the bit. The environment that asks the model: a run of its task
    plays episodes of two replies around the question the model asked (a text prompt to /generate)."""
    import importlib.util
    recipes, root = readme_recipes(), tmp_path / "copy"
    root.mkdir()
    for f in ("grpo_sglang.py", "reward_fns.py"):
        shutil.copy(os.path.join(HERE, f), root / f)
    for name in ("turns", "asks"):
        apply_recipe(recipes[name], root)
    spec = importlib.util.spec_from_file_location("grpo_sglang_turns", root / "grpo_sglang.py")
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    seqs = {"mask": torch.tensor([[1.0, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]]), "reward": torch.tensor([1.0, 0.0])}
    adv = copy.turn_advantages(copy.Config(group_size=2, scale_rewards="none"), seqs, torch.tensor([[0.1, 0.2],
                                                                                                  [0.0, 0.0]]))
    # returns: episode 0 1.3 from reply 0 (1 + 0.1 + 0.2), 1.2 from reply 1; episode 1 0: advantages +-0.65, +-0.6
    assert torch.allclose(adv, torch.tensor([[0.65, 0.65, 0, 0, 0.6, 0.6, 0], [-0.65, -0.65, -0.65, 0, 0, 0, 0]]))
    got = {}
    for key, script in (("per_episode", os.path.join(HERE, "grpo_sglang.py")), ("per_turn", str(root / "grpo_sglang.py"))):
        s = StandIn(tiny_model)
        try:
            bonus = ("--calc_bonus", "0.1") if key == "per_turn" else ()  # on: every reply's bonus 0 all the same
            cmd = train_cmd(tiny_model, s.url, tmp_path / key, *TALK, "--max_reply_tokens", "4", *bonus, rewards=True)
            (root / "with_test_rewards.py").write_text(open(WITH_REWARDS).read().replace(
                os.path.join(HERE, "grpo_sglang.py"), script))  # the test tasks, registered before this copy runs
            code, out = run([cmd[0], str(root / "with_test_rewards.py"), *cmd[2:]])
            assert code == 0, out
        finally:
            s.close()
        got[key] = ckpt_weights(tmp_path / key), [r for r in read_metrics(tmp_path / key) if "loss" in r]
    (w, m), (w1, m1) = got["per_episode"], got["per_turn"]
    assert max(r["turns_mean"] for r in m) > 1 and [r["loss"] for r in m] == [r["loss"] for r in m1]
    assert all(torch.equal(w[k], w1[k]) for k in w)
    s = StandIn(tiny_model)
    try:
        monkeypatch.setenv("ASK_URL", s.url)
        cmd = train_cmd(tiny_model, s.url, tmp_path / "asks", "--task", "arithmetic_student", "--max_new_tokens", "24",
                        "--max_reply_tokens", "6", "--steps", "1", "--eval_every", "0")
        code, out = run([cmd[0], str(root / "grpo_sglang.py"), *cmd[2:]])
    finally:
        s.close()
    m = [r for r in read_metrics(tmp_path / "asks") if "loss" in r]
    assert code == 0 and m[0]["turns_mean"] == 2 and m[0]["env_warnings"] == 0, out
    assert s.asked_text and all(t.startswith("A teacher answered: ") for t in s.asked_text)


def test_the_readmes_sft_term_and_replay_queue_recipes_run_as_written(tiny_model, tmp_path):
    """The recipes of a term with its own normaliser and of state kept across steps, applied to a copy as written: the
    SFT term is -0.1 x the mean log-prob of the right answers' tokens, whatever the batch's token count (a step at
    advantage 0, where only that term is left, against the trainer's own log-probs); the replay queue brings back
    prompts nobody got right; the curriculum draws rows with Python's random from a table of their scores; and a run
    with both, stopped after step 2 and resumed, is the run that never stopped (the queue, the table and random's
    state went into the checkpoint; random is seeded from --seed: the two runs drew the same rows from step 1)."""
    import importlib.util
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    recipes = readme_recipes()
    root = tmp_path / "copy"
    root.mkdir()
    for f in ("grpo_sglang.py", "reward_fns.py"):
        shutil.copy(os.path.join(HERE, f), root / f)
    apply_recipe(recipes["sft"] + recipes["state"] + recipes["curriculum"], root)
    spec = importlib.util.spec_from_file_location("grpo_sglang_state", root / "grpo_sglang.py")
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    dist_init()
    try:
        model = copy.shard(copy.load_policy(tiny_model, torch.device("cpu"), False), init_device_mesh("cpu", (1,)),
                           torch.bfloat16)
        seqs = copy.sequences(known_batch(), 4, "cpu")
        right = torch.tensor([float(k in GOOD) for k in range(12)])  # 5 of 12 right: 17 of the 42 tokens
        seqs.update(adv=torch.zeros(12), weight=torch.ones(12), reward=right, correct=right)
        m = copy.Metrics()
        copy.train(copy.Config(group_size=4, micro_batch=3, sft_coef=0.1), model, torch.optim.SGD(model.parameters(), lr=0.0), seqs,
                   copy.micro_batches(seqs, 3, 0), 1, lambda s, m: None, m)
        got = m.reduce("cpu")["loss"]
    finally:
        dist.destroy_process_group()
    tokens = seqs["mask"] * right.unsqueeze(1)
    want = -0.1 * (seqs["lp0"] * tokens).sum() / tokens.sum()  # (divided by all 42 tokens: 2.5x smaller)
    assert tokens.sum() == 17 and seqs["mask"].sum() == 42 and got == pytest.approx(want.item(), rel=1e-5)
    (rows, w, s), (rows1, w1, s1) = stopped_and_resumed(  # 23 rows: 16 drawn, one a step replayed
        tiny_model, tmp_path, "--eval_every", "0", "--prompts_per_step", "4", "--builtin_max_operand", "4",
        "--replay_frac", "0.25", "--curriculum", "0.5", script=str(root / "grpo_sglang.py")).values()
    asked = s.rollouts
    assert len(rows) == 4 and rows == rows1 and asked == s1.rollouts and all(torch.equal(w[k], w1[k]) for k in w)
    rng = torch.load(tmp_path / "resumed" / "step_2" / "trainer_state.pt", weights_only=True)["rng"][0]
    prompts = [tuple(p) for req in asked for p in req[::4]]  # each request: its prompts, 4 copies each
    assert len(asked) == 4 and len(rng["state"]["replay"]) >= 1 and len(set(prompts)) < 16  # a missed prompt came back
    assert len(rng["state"]["wrong"]) >= 4  # the curriculum's table: every row scored so far
    assert rng["python"] != random.Random(g.Config().seed).getstate()  # it drew with random (seeded: --seed + rank)


def recipes_copy(root, names):
    """The trainer and reward_fns.py copied to root with the guide's recipes `names` applied as written, and
    root/with_test_rewards.py, which registers the test rewards and tasks in that copy's reward_fns and runs that
    copy's trainer. -> that script's path."""
    root.mkdir()
    for f in ("grpo_sglang.py", "reward_fns.py"):
        shutil.copy(os.path.join(HERE, f), root / f)
    recipes = readme_recipes()
    for name in names:
        apply_recipe(recipes[name], root)
    train_cmd(HERE, "", root, rewards=True)  # (writes WITH_REWARDS)
    text = open(WITH_REWARDS).read().replace(os.path.join(HERE, "grpo_sglang.py"), str(root / "grpo_sglang.py"))
    (root / "with_test_rewards.py").write_text(text.replace(repr(HERE), repr(str(root))))
    return str(root / "with_test_rewards.py")


def run_copy(script, cmd, timeout):
    """train_cmd's command with `script` in the trainer's place (1 process or torchrun's) -> (exit code, output)."""
    return run([script if c in (WITH_REWARDS, os.path.join(HERE, "grpo_sglang.py")) else c for c in cmd], timeout)


# every recipe's flag on at once, in episodes of up to 3 replies of 4 tokens
EVERY_RECIPE = ("--reward", "has_number:1,concise:0.5", "--solved_only", "--adv_estimator", "rank", "--sampler_kl",
                "0.05", "--sft_coef", "0.1", "--replay_frac", "0.5", "--curriculum", "0.5", "--calc_bonus", "0.1",
                "--max_new_tokens", "24", "--max_reply_tokens", "4", "--prompts_per_step", "4", "--eval_every", "0")


@pytest.mark.parametrize("scale, mode, tasks", [
    ("batch", "--async", "rank_turns"),
    ("group", "--no-async", "rank_turns,arithmetic_retry,arithmetic_check,arithmetic_student"),
    ("none", "--no-async", "rank_turns,arithmetic_retry,arithmetic_check,arithmetic_student")],
    ids=["batch-async", "group-mixed", "none-mixed"])
def test_every_recipe_at_once_runs_on_two_ranks_whose_episodes_take_different_numbers_of_replies(
        tiny_model, tmp_path, monkeypatch, scale, mode, tasks):
    """Every recipe of docs/hacking.md applied as written, all their flags on, on 2 ranks whose episodes take
    different numbers of replies (rank_turns: rank 1's up to 3, rank 0's one; beside it, the guide's own tasks of
    episodes): one run per --scale_rewards, the one with the batch's std (an all-reduce in each call of advantages())
    --async. The reward per turn, with its K per rank, hung such a run forever; now each trains its 2 steps (a hang
    would end after --collective_timeout, with a message), and the curriculum's table is one table on both ranks,
    with every rank's rows."""
    script = recipes_copy(tmp_path / "copy", readme_recipes())
    s = StandIn(tiny_model)
    try:
        monkeypatch.setenv("ASK_URL", s.url)  # the environment that asks the model asks this one
        code, out = run_copy(script, train_cmd(tiny_model, s.url, tmp_path / "run", *EVERY_RECIPE, "--task", tasks,
                                               "--scale_rewards", scale, mode, "--collective_timeout", "60", nproc=2,
                                               rewards=True), timeout=300)
    finally:
        s.close()
    assert code == 0, out
    m = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(m) == 2 and all(math.isfinite(r["loss"]) for r in m) and max(r["turns_mean"] for r in m) > 1, m
    ranks = torch.load(tmp_path / "run" / "step_2" / "trainer_state.pt", weights_only=True)["rng"]
    tables = [r["state"]["wrong"] for r in ranks]
    assert tables[0] == tables[1] and len(tables[0]) >= 4, tables  # 2 rows a rank at step 1: both ranks' rows


def test_ranks_that_call_a_collective_a_different_number_of_times_stop_with_one_message(tiny_model, tmp_path):
    """The reward per turn as the guide had it (K, the most replies of the rank's episodes, per rank), on 2 ranks
    whose episodes differ, --scale_rewards batch: rank 1 called advantages(), and so its all-reduces, more often than
    rank 0, and the run hung until it was killed. Now the wait ends after --collective_timeout (15 s here) with one
    message that names the step and the likely cause. (The test is that wait, ~17 s: the timeout bounds every
    collective of the run, and a rank of a correct step on 2 busy cores may wait seconds for the other.)"""
    import time
    script = recipes_copy(tmp_path / "copy", ["turns"])
    src = (tmp_path / "copy" / "grpo_sglang.py").read_text()
    per_rank = re.sub(r"K = int\(all_reduce_named\(.*?\)\[\"K\"\]\)", "K = max(map(len, calls))", src, flags=re.S)
    assert per_rank != src
    (tmp_path / "copy" / "grpo_sglang.py").write_text(per_rank)
    s, t0 = StandIn(tiny_model), time.time()
    try:
        code, out = run_copy(script, train_cmd(tiny_model, s.url, tmp_path / "run", *TALK, "--task", "rank_turns",
                                               "--max_reply_tokens", "4", "--calc_bonus", "0.1", "--scale_rewards",
                                               "batch", "--collective_timeout", "15", nproc=2, rewards=True),
                             timeout=240)
    finally:
        s.close()
    says = re.findall(r"error: step 1: rank [01] waited 15 s \(--collective_timeout\) in a collective \(.*?\) that "
                      r"another rank never reached\. Likely cause: a hack that calls a collective .* a different "
                      r"number of times on each rank, e\.g\. once per reply", out)
    assert code == 1 and len(says) == 1 and out.count("never reached") == 1, out
    assert says[0] in "\n".join(out.strip().splitlines()[-6:]) and not [r for r in read_metrics(tmp_path / "run") if "loss" in r], out
    print(f"ended in {time.time() - t0:.0f} s")


def test_the_docs_commands_use_only_flags_the_script_has():
    """Every flag after grpo_sglang.py in a command of the README or docs/ is one the script has (a renamed or removed
    flag must not live on in the docs); and docs/reference.md lists every flag."""
    docs = [os.path.join(HERE, "README.md")] + sorted(glob.glob(os.path.join(HERE, "docs", "*.md")))
    flags, seen = config_flags(), 0
    for path in docs:
        fences = re.findall(r"^```(\w*)\n(.*?)^```", open(path).read(), re.S | re.M)  # (language, text), in order
        for block in (text for lang, text in fences if lang in ("", "bash", "sh")):
            for cmd in block.replace("\\\n", " ").splitlines():
                if "grpo_sglang.py" not in cmd:
                    continue
                after = cmd.split("grpo_sglang.py", 1)[1].split("#")[0]
                used = {t.split("=")[0] for t in after.split() if t.startswith("--")}
                seen += 1
                assert used <= flags | {"--help"}, (f"{os.path.relpath(path, HERE)}: this command uses flags the "
                                                    f"script lacks, {sorted(used - flags)}: rename or drop them there "
                                                    f"(the flags are Config's fields): {cmd.strip()}")
    assert seen >= 6, seen
    reference = open(os.path.join(HERE, "docs", "reference.md")).read()
    missing = [f for f in sorted(flags) if not f.startswith("--no-") and f"`{f}`" not in reference]
    assert not missing, f"docs/reference.md lacks the flags {missing}: run python3 tools/flags_md.py --write"
    sys.path.insert(0, os.path.join(HERE, "tools"))
    import flags_md  # the flag tables are Config's, as tools/flags_md.py writes them: a new help line shows there
    table = reference.split("<!-- flags: begin", 1)[1].split("-->", 1)[1].split("<!-- flags: end -->")[0]
    assert table.strip() == flags_md.tables().strip(), ("docs/reference.md's flag tables are not Config's (a flag or "
                                                        "its help changed): run python3 tools/flags_md.py --write")


def test_a_task_or_a_reward_registered_as_the_docs_say_changes_no_flag_table_and_no_help():
    """A student's task and reward, registered in reward_fns.py as docs/hacking.md says (before the trainer imports
    it), changed --task's and --reward's help (they listed the registries), so the flag tables' test turned red on a
    correct hack. The help names the registries, not their contents: the tables are the same after a registration."""
    show = ("import sys; sys.path[:0] = [{here!r}, {tools!r}]; import reward_fns; {register}"
            "import flags_md; print(flags_md.tables())")
    tables = [subprocess.run([sys.executable, "-c", show.format(here=HERE, tools=os.path.join(HERE, "tools"), register=r)],
                             capture_output=True, text=True, check=True).stdout for r in (
        "", "reward_fns.REWARD_FNS['mine'] = lambda c, a: 1.0; reward_fns.TASKS['mine'] = reward_fns.Task('mine', "
            "lambda c, a: True); ")]
    assert tables[0] and tables[0] == tables[1]


def test_the_plot_tool_draws_a_runs_metrics_and_every_metric_is_in_the_glossary(tiny_model, server, tmp_path):
    """tools/plot_metrics.py draws the learning curve of a run's metrics.jsonl (a stand-in run with most features on);
    and every metric that run logs is explained in docs/metrics.md."""
    cmd = train_cmd(tiny_model, server.url, tmp_path / "run", "--steps", "2", "--beta", "0.1", "--mu", "2", "--async",
                    "--reward", "arithmetic:1,format:0.1", "--overlong_buffer", "2", "--eval_every", "1")
    code, out = run(cmd)
    assert code == 0, out
    metrics = tmp_path / "run" / "metrics.jsonl"
    code, out = run([sys.executable, os.path.join(HERE, "tools", "plot_metrics.py"), str(metrics), str(tmp_path / "c.png")])
    assert code == 0 and (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out
    glossary = open(os.path.join(HERE, "docs", "metrics.md")).read()
    names = {k for r in read_metrics(tmp_path / "run") for k in r}
    names = {"reward_<part>" if k.startswith("reward_") and k != "reward_mean" else k for k in names}
    missing = sorted(k for k in names if f"`{k}`" not in glossary)
    sections = re.findall(r"^## (.+)$", glossary, re.M)
    assert not missing, (f"docs/metrics.md does not explain the metrics {missing}: for each, add a bullet under the "
                         f"section it belongs to ({', '.join(sections)}): - `NAME`: what it is, its unit, how it is "
                         f"aggregated (m.mean, m.sum or m.max), healthy values, what to do when it looks wrong")


def test_the_index_names_every_section_and_only_functions_and_tests_that_exist():
    """The docstring's index is the `# N. title` headers (numbered once, in order, every test under one); its map
    names only functions the script has, and -k words of real tests. (That it maps every function above the fence is
    the maintainers' check, in dev/test_dev.py: a student's new function needs no line here.)"""
    found = sections()
    assert [n for n, _, _ in found] == list(range(1, len(found) + 1)), (
        f"the section headers `# N. title` must number 1, 2, ... in order; they are {[n for n, _, _ in found]}")
    index = re.findall(r"^ ?(\d+)\. (.+)$", __doc__, re.M)
    assert index == [(str(n), t) for n, t, _ in found], (
        "test_smoke.py's docstring must list each section as its header says, one line `N. title` each, in order: "
        + "; ".join(f"{n}. {t}" for n, t, _ in found if (str(n), t) not in index))
    tests = [t for t in globals() if t.startswith("test_")]
    placed = [t for _, _, ts in found for t in ts]
    assert sorted(placed) == sorted(tests), (  # no test outside a section, none twice
        f"every test goes under one section header; outside one or twice: "
        f"{sorted(set(t for t in tests if placed.count(t) != 1))}")
    mapped = {f: words.split(" or ") for fs, words in re.findall(r"^  ([\w, ]+) -> (.+)$", __doc__, re.M)
              for f in fs.split(", ")}
    gone = [f for f in mapped if not hasattr(g, f)]
    assert not gone, f"test_smoke.py's docstring map names what grpo_sglang.py does not have: {gone}: drop or rename"
    idle = [w for ws in mapped.values() for w in ws if not any(w in t for t in tests)]
    assert not idle, f"test_smoke.py's docstring map has -k words that select no test: {idle}: fix them"


# ---------------------------------------------------------------------------------------------
# 14. serve.sh: its settings, layouts and ports, and its start and stop

def test_serve_sh_binds_loopback_passes_api_key_waits_and_stops(tmp_path):
    """serve.sh against a fake `python` that records its arguments and answers like a server."""
    fake = tmp_path / "fakepython"
    port = free_port()
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-m" ]; then
  echo "$@" > {tmp_path}/argv
  exec {sys.executable} -c 'import http.server as h, time
time.sleep(1)
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
h.HTTPServer(("127.0.0.1", {port}), H).serve_forever()'
fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    env = dict(os.environ, PYTHON=str(fake), PORT=str(port), GPU="0", SGLANG_API_KEY="sekret",
               LOG=str(tmp_path / "serve.log"), PIDFILE=str(tmp_path / "serve.pid"), TIMEOUT="30")
    p = subprocess.run(["bash", os.path.join(HERE, "serve.sh")], env=env, capture_output=True, text=True, timeout=60)
    try:
        assert p.returncode == 0 and "healthy after" in p.stdout, p.stdout + p.stderr
        argv = (tmp_path / "argv").read_text()
        assert "--host 127.0.0.1" in argv and "--api-key sekret" in argv and "--enable-fp32-lm-head" in argv
        assert "sekret" not in p.stdout  # the key is not echoed
    finally:
        q = subprocess.run(["bash", os.path.join(HERE, "serve.sh"), "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert "stopped server" in q.stdout and not (tmp_path / "serve.pid").exists()


@pytest.mark.parametrize("tp", [2, 1])
def test_serve_sh_starts_several_and_tensor_parallel_servers_and_stops_them_all(tmp_path, tp):
    """GPU=1,2 SERVERS=2: with TP=2 two TP-2 servers on consecutive ports that share GPUs 1 and 2 (the GPU list wraps
    around), so the second starts once the first is healthy (each sizes its KV cache from the memory it finds free);
    with TP=1 one server per GPU, started at once. The trainer flags are printed; 'stop' stops both."""
    p, env = _serve_sh(tmp_path, GPU="1,2", TP=str(tp), SERVERS="2")
    port = int(env["PORT"])
    try:
        assert p.returncode == 0 and p.stdout.count("healthy after") == 2, p.stdout + p.stderr
        argv = sorted((tmp_path / "argv").read_text().splitlines(), key=lambda a: int(re.search(r"--port (\d+)", a).group(1)))
        gpus = ["1,2", "1,2"] if tp == 2 else ["1", "2"]
        assert [a.split()[0] for a in argv] == [f"CUDA_VISIBLE_DEVICES={g}" for g in gpus] and all(
            ("--tp-size 2" in a) == (tp == 2) for a in argv)
        assert f"--port {port} " in argv[0] and f"--port {port + 1} " in argv[1]
        started = [float(a.rsplit(" at ", 1)[1]) for a in argv]
        assert (started[1] - started[0] > 1.0) == (tp == 2)  # shared GPUs: one after the other
        assert (f"trainer flags: --server_url http://127.0.0.1:{port},http://127.0.0.1:{port + 1} --server_gpu "
                f"{','.join(g.replace(',', '+') for g in gpus)}" in p.stdout)
        assert (tmp_path / "serve_1.log").exists() and len((tmp_path / "serve.pid").read_text().split()) == 2
    finally:
        q = subprocess.run(["bash", os.path.join(HERE, "serve.sh"), "stop"], env=env, capture_output=True, text=True, timeout=90)
    assert q.stdout.count("stopped server") == 2 and not (tmp_path / "serve.pid").exists(), q.stdout


def test_serve_sh_reports_a_server_that_dies_at_start(tmp_path):
    fake = tmp_path / "fakepython"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-m" ] && {{ echo "CUDA error: no GPU"; exit 1; }}\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    env = dict(os.environ, PYTHON=str(fake), PORT=str(free_port()), LOG=str(tmp_path / "serve.log"),
               PIDFILE=str(tmp_path / "serve.pid"), TIMEOUT="30")
    p = subprocess.run(["bash", os.path.join(HERE, "serve.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "exited during start-up" in p.stderr and "CUDA error: no GPU" in p.stderr


@pytest.mark.parametrize("settings, says", [
    ({"PORT": "abc"}, "PORT=abc is not a port: write a whole number from 1 to 65535 (e.g. PORT=30000)"),
    ({"PORT": "99999"}, "PORT=99999 is not a port: write a whole number from 1 to 65535 (e.g. PORT=30000)"),
    ({"PORT": "65535", "GPU": "0,1", "SERVERS": "2"},
     "PORT=65535 SERVERS=2 needs ports up to 65536, past 65535: write PORT=65534 or lower"),
    ({"TIMEOUT": "15m"}, "TIMEOUT=15m is not a whole number of seconds (1 or more): write e.g. TIMEOUT=900"),
    ({"TIMEOUT": "2h"}, "TIMEOUT=2h is not a whole number of seconds (1 or more): write e.g. TIMEOUT=7200"),
    ({"TIMEOUT": "0"}, "TIMEOUT=0 is not a whole number of seconds (1 or more): write e.g. TIMEOUT=900"),
    ({"TIMEOUT": "1.5h"}, "TIMEOUT=1.5h is not a whole number of seconds (1 or more): write e.g. TIMEOUT=5400"),
    ({"FP32_LM_HEAD": "true"}, "FP32_LM_HEAD=true is not 0 or 1: write FP32_LM_HEAD=1 (fp32 logits) or 0"),
    ({"PYTHON": "no-such-python"}, "PYTHON=no-such-python is not a command: set PYTHON to the Python that has SGLang"),
])
def test_serve_sh_refuses_a_bad_port_timeout_or_switch_before_starting_anything(tmp_path, settings, says):
    """A PORT that is no port (or whose SERVERS run past 65535; PORT=abc was an 'unbound variable'), a TIMEOUT that is
    not whole seconds (15m: 'integer expression expected' every 3 s, never giving up), an FP32_LM_HEAD other than 0/1
    (true was silently off), a PYTHON that is no command: one line saying what to write, and nothing started."""
    _fake_sglang(tmp_path, ANSWERS)
    p, env = _run_serve_sh(tmp_path, **{"PORT": str(_two_free_ports()), **settings})
    try:
        assert p.returncode == 1 and (p.stdout + p.stderr).count(says) == 1, p.stdout + p.stderr
        assert (p.stdout + p.stderr).count("[serve.sh]") == 1, p.stdout + p.stderr
        assert _starts(tmp_path) == [] and not (tmp_path / "serve.pid").exists()
    finally:
        _run_serve_sh(tmp_path, "stop")


@pytest.mark.parametrize("servers", [1, 2])
def test_serve_sh_refuses_a_port_another_server_answers(tmp_path, servers):
    """Another server answers on PORT (or on PORT+1, the second server's): before, serve.sh called it healthy while its
    own server died there. Now: one line naming the port and a free PORT, and nothing started."""
    _fake_sglang(tmp_path, ANSWERS)
    port = _two_free_ports()
    other = ThreadingHTTPServer(("127.0.0.1", port + servers - 1), type("H", (BaseHTTPRequestHandler,), {
        "do_GET": lambda self: (self.send_response(200), self.end_headers())}))
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        p, env = _run_serve_sh(tmp_path, PORT=str(port), GPU="0,1", SERVERS=str(servers))
        out = p.stdout + p.stderr
        said = re.search(rf"\[serve.sh\] port {port + servers - 1} on 127.0.0.1 is in use \(another server\?\): stop "
                         r"what holds it, or choose free ports, e.g. PORT=(\d+)\n", out)
        assert p.returncode == 1 and said and out.count("[serve.sh]") == 1, out
        assert int(said[1]) > port + servers - 1  # past the one taken
        assert _starts(tmp_path) == [] and not (tmp_path / "serve.pid").exists()
    finally:
        other.shutdown()
        other.server_close()
        _run_serve_sh(tmp_path, "stop")


def test_serve_sh_never_takes_another_servers_answer_for_its_own(tmp_path):
    """Its server loads for 2 s and dies (as SGLang does on a port taken after serve.sh checked it), and then another
    server starts answering on that port (once the first is gone, not at a fixed time a busy machine might reorder):
    serve.sh must say its server exited, never 'healthy'."""
    gone = "import os, time\nparent = os.getppid()\nwhile os.path.exists(f'/proc/{parent}'): time.sleep(0.05)\n"
    _fake_sglang(tmp_path, f"""import subprocess, sys, time
other = subprocess.Popen([sys.executable, "-c", {gone!r} + {ANSWERS!r}] + sys.argv[1:])
open({str(tmp_path / "other.pid")!r}, "w").write(str(other.pid))
time.sleep(2)
sys.exit("address already in use")
""")
    p, env = _run_serve_sh(tmp_path, PORT=str(free_port()))
    try:
        out = p.stdout + p.stderr
        assert p.returncode == 1 and "[serve.sh] the server on GPU 3 exited during start-up" in p.stderr, out
        assert "healthy" not in out and "address already in use" in p.stderr, out
    finally:
        if (tmp_path / "other.pid").exists() and _alive(other := int((tmp_path / "other.pid").read_text())):
            os.kill(other, 9)


def test_serve_sh_refuses_a_second_start_while_its_servers_load_and_keeps_their_pids(tmp_path):
    """While its server still loads, a second `bash serve.sh` (before: it emptied the pid file, started again, and
    'stop' then left the first running) is refused, naming the pid file and `bash serve.sh stop`; the pid file keeps
    the first's pid. Once that one answers, a start again says 'already running' and returns at once; 'stop' ends it,
    and a start right after on its port is not refused as taken."""
    import time
    ready = tmp_path / "ready"
    _fake_sglang(tmp_path, f"import os, time\nfor _ in range(900):  # 90 s at most: none left behind by a failed test\n"
                           f"    if os.path.exists({str(ready)!r}): break\n    time.sleep(0.1)\nelse: exit()\n" + ANSWERS)
    port = free_port()
    first, env = _run_serve_sh(tmp_path, popen=True, PORT=str(port))
    pidfile = tmp_path / "serve.pid"
    try:
        # until it has started its server: its pid written (by serve.sh) and its start recorded (by the server: it
        # may come later on a busy machine)
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() and len(_starts(tmp_path)) == 1,
                   "serve.sh's pid file and its server's start")
        pid = pidfile.read_text()
        again, _ = _run_serve_sh(tmp_path, PORT=str(port), TIMEOUT="5")
        said = again.stdout + again.stderr
        assert again.returncode == 1 and said.count("[serve.sh]") == 1, said
        assert (f"[serve.sh] the servers of {pidfile} (pid {pid.strip()}) are running but do not all answer at "
                f"http://127.0.0.1:{port}: still loading (see {tmp_path / 'serve.log'})? Wait for them, or 'bash "
                f"serve.sh stop' first\n") in again.stderr, again.stderr
        assert pidfile.read_text() == pid and len(_starts(tmp_path)) == 1
        ready.touch()
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0 and "healthy after" in out, out + err
        again, _ = _run_serve_sh(tmp_path, PORT=str(port))
        assert again.returncode == 0 and again.stdout == (f"[serve.sh] already running (pid {pid.strip()}) at "
                                                          f"http://127.0.0.1:{port}; 'bash serve.sh stop' first to "
                                                          "change it\n"), again.stdout + again.stderr
        assert pidfile.read_text() == pid and len(_starts(tmp_path)) == 1
    finally:
        if first.poll() is None:
            first.kill()
        q, _ = _run_serve_sh(tmp_path, "stop")
    assert q.stdout == f"[serve.sh] stopped server (pid {pid.strip()})\n" and not _alive(int(pid)), q.stdout
    assert not pidfile.exists()
    try:  # at once again on the port it freed, where its health checks' connections still wait (TIME_WAIT)
        again, _ = _run_serve_sh(tmp_path, PORT=str(port))
        assert again.returncode == 0 and "healthy after" in again.stdout, again.stdout + again.stderr
    finally:
        _run_serve_sh(tmp_path, "stop")


def test_serve_sh_restart_brings_back_the_server_it_started_and_says_its_settings(tmp_path):
    """The restart advice `bash serve.sh stop && bash serve.sh` started the default model on GPU 3, not the one-GPU
    quick start's server. `bash serve.sh restart` starts the last start's settings again (its MEM_FRACTION, its model
    with a space, its arguments after --), prints them, and a setting given now wins (the trainer's wrong-model
    advice: MODEL=... bash serve.sh restart), as do SGLang's arguments after --. With nothing started yet it says so."""
    _fake_sglang(tmp_path, ANSWERS)
    p, _ = _run_serve_sh(tmp_path, "restart")
    assert p.returncode == 1 and p.stderr == (f"[serve.sh] nothing to restart: no {tmp_path}/serve.pid.settings (a start "
                                              f"writes it): start with bash serve.sh\n") and not _starts(tmp_path), p.stderr
    port = free_port()
    settings = dict(GPU="0", MEM_FRACTION="0.3", MODEL="/models/my model", PORT=str(port))
    try:
        p, _ = _run_serve_sh(tmp_path, "--", "--context-length", "64", **settings)
        assert p.returncode == 0 and "healthy after" in p.stdout, p.stdout + p.stderr
        again, _ = _run_serve_sh(tmp_path, "restart")  # none of them given again
        assert again.returncode == 0 and "stopped server" in again.stdout and "healthy after" in again.stdout, again
        assert (f"[serve.sh] restart with the settings of the last start ({tmp_path}/serve.pid.settings): "
                f"MODEL=/models/my\\ model GPU=0 TP=1 SERVERS=1 HOST=127.0.0.1 PORT={port} MEM_FRACTION=0.3 "
                f"DTYPE=bfloat16 SEED=0 FP32_LM_HEAD=1 TIMEOUT=30 LOG={tmp_path}/serve.log PYTHON={tmp_path}/fakepython "
                f"-- --context-length 64\n") in again.stdout, again.stdout
        other, _ = _run_serve_sh(tmp_path, "restart", "--", "--context-length", "32", MODEL="other")
        assert other.returncode == 0 and "serve.pid.settings; set now: MODEL the arguments after --): MODEL=other " \
            "GPU=0 " in other.stdout and other.stdout.count(" -- --context-length 32\n") == 1, other.stdout
        first, second, third = _starts(tmp_path)
        assert first == second and third == [x.replace("/models/my model", "other") for x in first[:-1]] + ["32"]
        assert first[0] == "0" and "0.3" in first and first[-2:] == ["--context-length", "64"], first
    finally:
        _run_serve_sh(tmp_path, "stop")


def test_serve_sh_gives_up_after_timeout_and_stops_its_server(tmp_path):
    """A server that never answers: after TIMEOUT seconds one line (and its log), and the server is stopped, so that
    a start with a longer TIMEOUT is not refused (before: it was left running, its pid file kept)."""
    _fake_sglang(tmp_path, f"import os, time\nopen({str(tmp_path / 'server.pid')!r}, 'w').write(str(os.getpid()))\n"
                           "print('loading...', flush=True)\ntime.sleep(600)\n")
    p, env = _run_serve_sh(tmp_path, PORT=str(free_port()), TIMEOUT="2")
    pid = int((tmp_path / "server.pid").read_text())
    if left := _alive(pid):
        os.kill(pid, 9)  # not left behind when the test fails
    assert p.returncode == 1 and p.stderr.startswith(
        "[serve.sh] the server on GPU 3 was not healthy after 2s: stopped (still loading? raise TIMEOUT, e.g. "
        f"TIMEOUT=4). Last lines of {tmp_path / 'serve.log'}:\nloading...\n"), p.stdout + p.stderr
    assert p.stderr.count("[serve.sh]") == 1 and not left and not (tmp_path / "serve.pid").exists()


@pytest.mark.parametrize("settings, args, cuda, sglang", SERVE_SH_ARGS)
def test_serve_sh_passes_each_setting_to_sglang_exactly(tmp_path, settings, args, cuda, sglang):
    """The exact arguments (and GPUs) SGLang starts with, for the defaults and for each setting on its own: a
    setting lost, a flag misspelt or a value split (a model path with a space) would show here."""
    import shlex
    _fake_sglang(tmp_path)  # its server dies at start: what it got is all this test needs
    port = None if settings == {} else free_port()
    if port is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", 30000)) == 0:
                pytest.skip("port 30000, serve.sh's default, is in use here")
    p, env = _run_serve_sh(tmp_path, *args, **settings, **({"PORT": str(port)} if port else {}))
    want = shlex.split(sglang if port is None else sglang.replace("--port 30000", f"--port {port}"))
    assert p.returncode == 1 and "exited during start-up" in p.stderr, p.stdout + p.stderr
    assert _starts(tmp_path) == [[cuda] + want]


def test_serve_sh_flags_are_sglangs_own():
    """Every flag of SERVE_SH_ARGS (so every flag serve.sh passes, the test above shows) is one of SGLang's
    (0.5.16's ServerArgs), a value after each that takes one and none after a switch."""
    import shlex
    flags = _sglang_flags()
    assert flags["--model-path"] and flags["--model"] and not flags["--enable-fp32-lm-head"], "read the source wrong"
    for *_, sglang in SERVE_SH_ARGS:
        argv = shlex.split(sglang)[2:]  # after -m sglang.launch_server
        while argv:
            flag = argv.pop(0)
            assert flag in flags, f"{flag} is not an SGLang flag ({sglang})"
            if flags[flag]:
                assert argv and not argv.pop(0).startswith("--"), f"{flag} wants a value ({sglang})"


@pytest.mark.parametrize("settings, says", [
    ({"GPU": "2, 3"}, "GPU='2, 3' has spaces: write GPU numbers separated by single commas, e.g. GPU=2,3"),
    ({"GPU": "2,,3"}, "GPU='2,,3' has an empty entry: write GPU numbers separated by single commas, e.g. GPU=2,3"),
    ({"GPU": "2,3,"}, "GPU='2,3,' has an empty entry: write GPU numbers separated by single commas, e.g. GPU=2,3"),
    ({"GPU": "2,x"}, "GPU='2,x' has something other than GPU numbers and commas: write GPU numbers separated"),
    ({"GPU": "2,2"}, "GPU=2,2 lists GPU 2 twice: list each GPU once (GPU=2); for several servers on one GPU set "
                     "SERVERS (e.g. GPU=2 SERVERS=2)"),
    ({"GPU": "0,1,2", "TP": "2", "SERVERS": "2"},
     "GPU=0,1,2 TP=2 SERVERS=2 would not share GPUs evenly: servers 0,1 on GPU 0, server 1 across the end of the list "
     "(GPUs 2,0); server k takes TP GPUs from position k*TP of GPU, wrapping. Give each server its own GPUs "
     "(SERVERS=1, or 4 GPUs in GPU), or wrap evenly: GPU=0,1 puts 2 servers on each GPU"),
    ({"GPU": "0,1,2", "TP": "2", "SERVERS": "3"}, "GPU=0,1,2 TP=2 SERVERS=3 would not share GPUs evenly: servers 0,1 "
     "on GPU 0, servers 0,2 on GPU 1, servers 1,2 on GPU 2, server 1 across the end of the list (GPUs 2,0);"),
    ({"GPU": "0,1,2", "SERVERS": "4"}, "GPU=0,1,2 TP=1 SERVERS=4 would not share GPUs evenly: servers 0,3 on GPU 0;"),
    ({"GPU": "1", "SERVERS": "2", "MEM_FRACTION": "0.85"}, "2 servers share each GPU at MEM_FRACTION=0.85, 2 x 0.85 of "
     "its memory: more than 0.9. Set MEM_FRACTION=0.45 or lower"),
    ({"GPU": "1", "SERVERS": "100", "MEM_FRACTION": "0.5"}, "100 servers share each GPU at MEM_FRACTION=0.5, 100 x 0.5 "
     "of its memory: more than 0.9. Set MEM_FRACTION=0.009 or lower"),  # (0.00 was no fraction at all)
    ({"MEM_FRACTION": "0,4"}, "MEM_FRACTION=0,4 is not a number between 0 and 1"),
    ({"MEM_FRACTION": "1"}, "MEM_FRACTION=1 is not a number between 0 and 1"),
])
def test_serve_sh_refuses_a_layout_it_would_misread_before_starting_anything(tmp_path, settings, says):
    """A GPU list with spaces, empty entries or a GPU twice, servers that would share GPUs unevenly (or a TP server
    across the wrap), servers sharing a GPU at more than 0.9 of it, a MEM_FRACTION outside (0, 1): one message, and
    nothing started."""
    p, env = _serve_sh(tmp_path, **settings)
    try:
        assert p.returncode == 1 and (p.stdout + p.stderr).count(says) == 1, p.stdout + p.stderr
        assert (p.stdout + p.stderr).count("[serve.sh]") == 1, p.stdout + p.stderr
        assert not (tmp_path / "argv").exists() and not (tmp_path / "serve.pid").exists()
    finally:
        _serve_sh_stop(env)


@pytest.mark.parametrize("settings, fix", [
    ({"GPU": "2 3"}, {"GPU": "2,3"}),  # (it said GPU=23)
    ({"GPU": "2, 2"}, {"GPU": "2"}),  # (it said GPU=2,2, then refused as GPU 2 twice)
    ({"GPU": "0,1,2", "SERVERS": "4", "MEM_FRACTION": "0.5"}, {"GPU": "0,1", "MEM_FRACTION": "0.45"}),  # (2 x 0.5)
    ({"GPU": "1", "SERVERS": "2", "MEM_FRACTION": "0.85"}, {"MEM_FRACTION": "0.45"}),
    ({"TIMEOUT": "1.5h"}, {"TIMEOUT": "5400"})])  # (it said 900)
def test_serve_sh_suggests_a_fix_that_itself_starts_the_servers(tmp_path, settings, fix):
    """A fix serve.sh suggests must itself be right: its refusal names these settings, and serve.sh given them starts
    the servers (here against the fake python), with no second refusal."""
    p, env = _serve_sh(tmp_path, **settings)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and all(re.search(rf"\b{k}={re.escape(v)}(?![\w.,])", out) for k, v in fix.items()), out
    p, env = _serve_sh(tmp_path, **{**settings, **fix})
    try:
        assert p.returncode == 0 and "healthy after" in p.stdout, p.stdout + p.stderr
    finally:
        _serve_sh_stop(env)


@pytest.mark.parametrize("settings, gpus, mem", [
    ({"GPU": "1", "SERVERS": "2"}, ["1", "1"], "0.425"),                      # the default 0.85, split in two
    ({"GPU": "2,3", "TP": "2", "SERVERS": "2"}, ["2,3", "2,3"], "0.425"),      # an even wrap
    ({"GPU": "1", "SERVERS": "2", "MEM_FRACTION": "0.45"}, ["1", "1"], "0.45")])  # one that fits is kept
def test_serve_sh_shares_gpus_evenly_and_splits_the_default_memory(tmp_path, settings, gpus, mem):
    p, env = _serve_sh(tmp_path, **settings)
    try:
        assert p.returncode == 0 and p.stdout.count("healthy after") == 2, p.stdout + p.stderr
        argv = sorted((tmp_path / "argv").read_text().splitlines(), key=lambda a: int(re.search(r"--port (\d+)", a)[1]))
        assert [a.split()[0] for a in argv] == [f"CUDA_VISIBLE_DEVICES={g}" for g in gpus], argv
        assert all(f"--mem-fraction-static {mem} " in a for a in argv), argv
        split = "[serve.sh] 2 servers share each GPU: MEM_FRACTION 0.425 each (0.85 split; set MEM_FRACTION to choose)"
        assert p.stdout.count(split) == ("MEM_FRACTION" not in settings), p.stdout
    finally:
        _serve_sh_stop(env)
    assert not (tmp_path / "serve.pid").exists()


# ---------------------------------------------------------------------------------------------
# 15. LoRA: adapters that start at 0, their gradients, the merged push, the base as reference, checkpoints and resume

LORA = ("--lora_rank", "4", "--lora_alpha", "8")  # scale alpha / rank = 2
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_policy(path, world=1, b_std=0.0, dtype=torch.bfloat16):
    """The trainer's LoRA policy (add_lora, then shard) on CPU ranks; b_std: B drawn at random (not 0, its start);
    dtype: the base's, and the blocks' compute (bf16 as the trainer's, or fp32 to compare with autograd's numbers)."""
    from torch.distributed.device_mesh import init_device_mesh
    model = g.add_lora(g.load_policy(path, torch.device("cpu"), False, dtype), 4, 8.0, TARGETS, seed=3)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for m in [m for m in model.modules() if hasattr(m, "lora_B")] if b_std else []:
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * b_std)
    return g.shard(model, init_device_mesh("cpu", (world,)), dtype)


def adapters_of(ckpt):
    """A LoRA checkpoint's adapters -> {module name: (A, B)} (peft's names read back by hand)."""
    from safetensors.torch import load_file
    got = load_file(os.path.join(ckpt, "adapter_model.safetensors"))
    pre, mods = "base_model.model.", {k[len("base_model.model."):].rsplit(".lora_", 1)[0] for k in got}
    return {m: (got[f"{pre}{m}.lora_A.weight"], got[f"{pre}{m}.lora_B.weight"]) for m in mods}


def merged_by_hand(base, adapters, scale):
    """{HF name: bf16 tensor} the server should hold: W + scale * B @ A for each adapted Linear, else W, summed in
    float64 from W, A and B in bf16 (the base the trainer holds, the adapters as its forward gets them), rounded."""
    out, bf = {n: t.to(torch.bfloat16) for n, t in base.items()}, lambda t: t.to(torch.bfloat16).double()
    for m, (a, b) in adapters.items():
        out[m + ".weight"] = (bf(out[m + ".weight"]) + scale * bf(b) @ bf(a)).to(torch.bfloat16)
    return out


def within_a_bf16_step(got, want):
    """bf16 tensors equal, or (a sum rounded in fp32 first) one step of bf16 apart where they differ."""
    return bool(((got.double() - want.double()).abs() <= want.double().abs() * 2**-7).all())


def test_lora_at_init_leaves_the_logprobs_unchanged(tiny_model):
    """B starts at 0: the adapted model's log-probs (and entropies) are the base model's, bit for bit; only the
    adapters train: every other parameter is frozen, A is not 0."""
    dist_init()
    try:
        batch = g.pack_batch([{"prompt": p, "completion": c} for p, c in zip(PROMPTS, COMPLETIONS)], 0, "cpu")
        from torch.distributed.device_mesh import init_device_mesh
        base = g.shard(g.load_policy(tiny_model, torch.device("cpu"), False, torch.bfloat16),
                       init_device_mesh("cpu", (1,)), torch.bfloat16)
        lora = lora_policy(tiny_model)
        with torch.no_grad():
            want, got = g.completion_logprobs(base, batch, 0.7), g.completion_logprobs(lora, batch, 0.7)
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
        trains = sorted(n for n, p in lora.named_parameters() if p.requires_grad)
        parts = [("self_attn", t) for t in TARGETS[:4]] + [("mlp", t) for t in TARGETS[4:]]
        assert trains == sorted(f"model.layers.{i}.{part}.{t}.lora_{x}" for i in range(2) for x in "AB"
                                for part, t in parts)
        assert all(p.dtype == torch.float32 for n, p in lora.named_parameters() if p.requires_grad)
        assert all(p.dtype == torch.bfloat16 for n, p in lora.named_parameters() if not p.requires_grad)
        assert all(p.full_tensor().abs().sum() > 0 for n, p in lora.named_parameters() if n.endswith("lora_A"))
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()


def test_lora_logprobs_are_those_of_the_merged_weights_the_server_is_sent(tiny_model):
    """The adapted model's forward (training and no-grad) computes, bit for bit, what a plain model holding the pushed
    tensors (W + s B A, rounded as sent) computes: the log-prob check compares the same weights, as in a full
    fine-tune."""
    from torch.distributed.device_mesh import init_device_mesh
    dist_init()
    try:
        lora = lora_policy(tiny_model, b_std=0.3)
        pushed = {n: t.clone() for bucket, _ in g.weight_buckets(lora, 2**30, keep=True) for n, t in bucket}
        plain = g.load_policy(tiny_model, torch.device("cpu"), False, torch.bfloat16)
        plain.load_state_dict(pushed, strict=False)
        assert all(torch.equal(p, pushed[n]) for n, p in plain.named_parameters())
        plain = g.shard(plain, init_device_mesh("cpu", (1,)), torch.bfloat16)
        batch = g.pack_batch([{"prompt": p, "completion": c} for p, c in zip(PROMPTS, COMPLETIONS)], 0, "cpu")
        want = g.completion_logprobs(plain, batch, 0.7)[0].detach()
        got = g.completion_logprobs(lora, batch, 0.7)[0]
        got.sum().backward()  # (the training forward: the adapters get gradients)
        with torch.no_grad():
            assert torch.equal(g.completion_logprobs(lora, batch, 0.7)[0], want)
        assert torch.equal(got.detach(), want) and all(p.grad is not None for n, p in lora.named_parameters()
                                                       if p.requires_grad)
        assert not torch.equal(pushed["model.layers.0.mlp.up_proj.weight"],
                               g.load_policy(tiny_model, torch.device("cpu"), False, torch.bfloat16)
                               .model.layers[0].mlp.up_proj.weight)  # B != 0: the pushed weights are not the base's
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()


GRADS_SCRIPT = r'''
import os, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import grpo_sglang as g, test_smoke as t
dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
model = t.lora_policy(sys.argv[2], world=w, b_std=0.3, dtype=torch.float32)  # fp32: autograd's numbers to compare
rows = [{"prompt": p, "completion": c} for p, c in zip(t.PROMPTS * 4, t.COMPLETIONS)]
coef = torch.randn(len(rows), 5, generator=torch.Generator().manual_seed(1))  # a loss: any weights of the log-probs
mine = list(range(r, len(rows), w))
b = g.pack_batch([rows[i] for i in mine], 0, "cpu")
lp = g.completion_logprobs(model, b, 0.7)[0]
((coef[mine, : lp.shape[1]] * lp * b["mask"]).sum() * w).backward()  # as train(): FSDP averages over ranks
grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.requires_grad}
if r == 0:
    torch.save({"grads": grads, "coef": coef}, sys.argv[3])
dist.destroy_process_group()
'''


@pytest.mark.parametrize("nproc", [1, 2])
def test_lora_gradients_equal_autograd_through_the_merged_weights(tiny_model, tmp_path, nproc):
    """The adapters' gradients, from the trainer's forward and backward (sharded on 1 or 2 ranks, each its half of the
    rows), equal autograd's through the merged weights W + s B A of a plain model scoring all rows at once."""
    from torch.func import functional_call
    from transformers import AutoModelForCausalLM
    script = tmp_path / "grads.py"
    script.write_text(GRADS_SCRIPT)
    code, out = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                     f"--master_port={free_port()}", str(script), HERE, tiny_model, str(tmp_path / "g.pt")])
    assert code == 0, out
    got = torch.load(tmp_path / "g.pt")
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)
    adapted = g.add_lora(g.load_policy(tiny_model, torch.device("cpu"), False), 4, 8.0, TARGETS, seed=3)
    gen, leaves = torch.Generator().manual_seed(5), {}
    for n, m in adapted.named_modules():  # the same A (seed 3) and B (drawn as lora_policy draws it)
        if hasattr(m, "lora_B"):
            leaves[n] = (m.lora_A.detach().double().requires_grad_(),
                         (torch.randn(m.lora_B.shape, generator=gen) * 0.3).double().requires_grad_())
    held = dict(plain.named_parameters())
    weights = {n + ".weight": held[n + ".weight"] + 2.0 * b @ a for n, (a, b) in leaves.items()}
    loss = 0
    for i, (p, c) in enumerate(zip(PROMPTS * 4, COMPLETIONS)):
        logits = functional_call(plain, weights, (torch.tensor([p + c]),)).logits[0, len(p) - 1: -1] / 0.7
        lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None])[:, 0]
        loss = loss + (got["coef"][i, : len(c)].double() * lp).sum()
    loss.backward()
    for n, (a, b) in leaves.items():
        for x, leaf in (("A", a), ("B", b)):
            mine = got["grads"][f"{n}.lora_{x}"].double()
            assert (mine - leaf.grad).norm() <= 1e-4 * leaf.grad.norm(), (n, x)


def test_lora_reference_is_the_base_with_its_adapters_off(tiny_model):
    """--lora_rank with --beta: ref_lp is the base model's log-probs (no second model), old_lp the adapted one's."""
    from types import SimpleNamespace
    dist_init()
    try:
        lora = lora_policy(tiny_model, b_std=0.3)
        from torch.distributed.device_mesh import init_device_mesh
        base = g.shard(g.load_policy(tiny_model, torch.device("cpu"), False, torch.bfloat16),
                       init_device_mesh("cpu", (1,)), torch.bfloat16)
        seqs = g.sequences(known_batch(0.7), 4, "cpu")
        mbs = g.micro_batches(seqs, 4, 0)
        g.old_and_ref_logprobs(SimpleNamespace(mu=2), lora, lora, seqs, mbs)
        want = {}
        for name, net in (("ref_lp", base), ("old_lp", lora)):
            want[name] = torch.zeros_like(seqs["mask"])
            for b in mbs:
                with torch.no_grad():
                    want[name][b["rows"], : b["C"]] = g.completion_logprobs(net, b, 0.7)[0]
        assert torch.equal(seqs["ref_lp"], want["ref_lp"]) and torch.equal(seqs["old_lp"], want["old_lp"])
        assert not torch.allclose(seqs["ref_lp"], seqs["old_lp"])  # B != 0: the adapters change the policy
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()


@pytest.mark.parametrize("nproc, flags", [(1, ()), (2, ()), (1, ("--sync", "nccl", "--async"))])
def test_lora_run_pushes_the_merged_weights_and_checkpoints_only_the_adapters(tiny_model, server, tmp_path, nproc,
                                                                              flags):
    """After each step the server holds W + (alpha / r) B A for every adapted Linear (B, A: the checkpoint's) and the
    base's other tensors; the checkpoint holds the adapters (peft's layout), not the model; AdamW has state for the
    adapters only; --beta needs no second model."""
    from transformers import AutoModelForCausalLM
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, *LORA, "--beta", "0.1", "--reward", "has_number",
                              *flags, nproc=nproc, rewards=True))
    assert code == 0, out
    base = {n: p.detach() for n, p in AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters()}
    ckpt = g.latest_checkpoint(str(tmp_path))
    want = merged_by_hand(base, adapters_of(ckpt), 2.0)
    assert set(server.pushes[-1]) == set(want) and len(server.pushes) == 3
    assert all(within_a_bf16_step(server.pushes[-1][n], t) for n, t in want.items())
    moved = [n for n in want if not torch.equal(want[n], base[n].to(torch.bfloat16))]
    assert len(moved) == 14 and all(any(t in n for t in TARGETS) for n in moved)  # the adapters trained
    assert sorted(os.listdir(ckpt)) == ["adapter_config.json", "adapter_model.safetensors", "chat_template.jinja",
                                        "config.json", "tokenizer.json", "tokenizer_config.json", "trainer_state.pt"]
    c = json.load(open(os.path.join(ckpt, "adapter_config.json")))
    assert (c["r"], c["lora_alpha"], c["target_modules"], c["peft_type"]) == (4, 8.0, TARGETS, "LORA")
    state = torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=True)["optimizer"]["state"]
    assert sorted(state) == sorted(f"{m}.lora_{x}" for m in adapters_of(ckpt) for x in "AB")
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert len(m) == 2 and m[-1]["kl"] > 0 and all(r["weights_checked"] == 20 for r in m)


def test_lora_resumed_run_is_the_run_it_resumes(tiny_model, tmp_path):
    """A LoRA run stopped dead after its step-2 checkpoint and resumed ends with the adapters, the pushes and the
    metrics of the run that never stopped."""
    got = {}
    for key in ("ref", "resumed"):
        s = StandIn(tiny_model)
        try:
            flags = (*LORA, "--steps", "4", "--save_every", "2", "--reward", "has_number", "--eval_every", "0")
            run_here(tiny_model, s.url, tmp_path / key, *flags, kill_after=2 if key == "resumed" else None)
            if key == "resumed":
                run_here(tiny_model, s.url, tmp_path / key, *flags, "--resume")
        finally:
            s.close()
        got[key] = (adapters_of(g.latest_checkpoint(str(tmp_path / key))), s.pushes[-1],
                    [r for r in read_metrics(tmp_path / key) if "loss" in r])
    (a_ref, push_ref, m_ref), (a_res, push_res, m_res) = got["ref"], got["resumed"]
    assert a_ref.keys() == a_res.keys() and all(torch.equal(a_ref[k][i], a_res[k][i]) for k in a_ref for i in (0, 1))
    assert all(torch.equal(push_ref[n], push_res[n]) for n in push_ref)
    keys = ("step", "loss", "reward_mean", "grad_norm", "kl", "entropy")
    assert [[r[k] for k in keys] for r in m_ref] == [[r[k] for k in keys] for r in m_res] and len(m_ref) == 4


def test_lora_export_writes_a_plain_model_of_the_merged_weights(tiny_model, tmp_path):
    """export_merged: a LoRA checkpoint -> an HF model folder (no adapters) whose weights are W + s B A in bf16, which
    loads as a plain model; it never writes into a folder that holds files."""
    from transformers import AutoModelForCausalLM
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "run", *LORA, "--reward", "has_number", rewards=True))
    finally:
        s.close()
    assert code == 0, out
    ckpt = g.latest_checkpoint(str(tmp_path / "run"))
    g.export_merged(ckpt, str(tmp_path / "merged"))
    m = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    base = {n: p.detach() for n, p in AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters()}
    want = merged_by_hand(base, adapters_of(ckpt), 2.0)
    got = {n: p.detach() for n, p in m.named_parameters()}
    assert set(got) == set(want) and m.dtype == torch.bfloat16
    assert all(within_a_bf16_step(got[n], want[n]) for n in want)
    assert torch.equal(s.pushes[-1]["model.layers.1.mlp.up_proj.weight"], got["model.layers.1.mlp.up_proj.weight"])
    with pytest.raises(g.UserError, match="not empty"):
        g.export_merged(ckpt, str(tmp_path / "run"))


def lora_checkpoint(base, d, step=1):
    """A LoRA checkpoint of --model `base` (rank 4, alpha 8, TARGETS) written by hand as save_checkpoint writes one,
    at `step` (of a run on one rank), in folder d; B is 0, as at the start. -> d"""
    from transformers import AutoConfig, AutoTokenizer
    model = g.add_lora(g.load_policy(str(base), torch.device("cpu"), False, torch.bfloat16), 4, 8.0, TARGETS, seed=3)
    g.save_adapters(str(d), {n: p.detach() for n, p in model.named_parameters() if ".lora_" in n},
                    g.Config(model=str(base), lora_rank=4, lora_alpha=8.0, lora_targets=",".join(TARGETS)))
    AutoConfig.from_pretrained(base).save_pretrained(d)
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(d)
    torch.save({"optimizer": {}, "step": step, "rng": [None], "config": {}}, os.path.join(d, "trainer_state.pt"))
    return d


def test_lora_export_mistakes_are_one_clear_line_each(tiny_model, tmp_path):
    """export_merged raised raw tracebacks for the common mistakes: a run's folder for its step_N, a full fine-tune's
    checkpoint (or any model folder), an adapter file cut in half, the base model's folder moved since training. Each
    is one error saying what to give instead (the moved base: base=, which then exports), and from `python -c` it is
    one line, no traceback."""
    from transformers import AutoModelForCausalLM
    base, run_dir = shutil.copytree(tiny_model, tmp_path / "base"), tmp_path / "run"
    ckpt, out = lora_checkpoint(base, run_dir / "step_2", 2), str(tmp_path / "out")
    shutil.copytree(ckpt, run_dir / "step_1")
    (run_dir / "latest").write_text("step_2")
    cut = shutil.copytree(ckpt, tmp_path / "cut")
    cut_in_half(cut / "adapter_model.safetensors")
    full = shutil.copytree(tiny_model, tmp_path / "full")  # a full fine-tune's checkpoint: a model, its trainer state
    torch.save({"step": 1}, full / "trainer_state.pt")
    for given, says in (
            (run_dir, f"export_merged: {run_dir} is a run's folder, not a checkpoint: give one of its checkpoints, "
                      f"{run_dir}/step_1, {run_dir}/step_2 (the last: {run_dir}/step_2)"),
            (tiny_model, f"export_merged: {tiny_model} is a model's folder, not a checkpoint of a training run (no "
                         f"adapter_config.json, no trainer_state.pt): give a checkpoint of a LoRA run "
                         f"(runs/grpo/step_100)"),
            (full, f"export_merged: {full} is a full fine-tune's checkpoint (no adapter_config.json): it holds the "
                   f"whole trained model, nothing to merge: serve it as it is (MODEL={full} bash serve.sh)"),
            (cut, f"{cut}/adapter_model.safetensors cannot be read (SafetensorError: Error while deserializing header: "
                  f"incomplete metadata, file not fully covered): the file is damaged (a copy cut short?); use another "
                  f"checkpoint")):
        with pytest.raises(g.UserError) as e:
            g.export_merged(str(given), out)
        assert str(e.value) == says and not os.path.exists(out)
    code, said = run([sys.executable, "-c", f"import grpo_sglang as g; g.export_merged({str(run_dir)!r}, {out!r})"])
    assert code == 1 and said == f"error: export_merged: {run_dir} is a " \
        f"run's folder, not a checkpoint: give one of its checkpoints, {run_dir}/step_1, {run_dir}/step_2 (the last: " \
        f"{run_dir}/step_2)\n", said
    os.rename(base, tmp_path / "moved")
    with pytest.raises(g.UserError, match=re.escape(
            f"export_merged: the base model of {ckpt}, {str(base)!r}, cannot be loaded (no folder {base}). If it moved "
            f"since training, say where it is now: export_merged({str(ckpt)!r}, {out!r}, base='/path/to/it')")):
        g.export_merged(str(ckpt), out)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(g.UserError, match=re.escape(f"export_merged: {tmp_path / 'a_file'} is a file: export into a "
                                                    f"new folder")):
        g.export_merged(str(ckpt), str(tmp_path / "a_file"))
    g.export_merged(str(ckpt), out, base=str(tmp_path / "moved"))
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16


def test_a_lora_run_whose_config_json_is_lost_resumed_without_lora_flags_names_them(tiny_model, tmp_path):
    """A LoRA run's config.json (its flags) lost, resumed without --lora_rank: transformers said "no file named
    model.safetensors". Now one line, before any server is asked, that it is a LoRA checkpoint and the flags it was
    trained with; and the other way round (a full checkpoint resumed with --lora_rank)."""
    lora_checkpoint(tiny_model, tmp_path / "step_1")
    (tmp_path / "latest").write_text("step_1")
    code, out = run(train_cmd(tiny_model, f"http://127.0.0.1:{free_port()}", tmp_path, "--resume"), timeout=120)
    says = (f"error: --resume: {tmp_path}/step_1 is a LoRA checkpoint (it holds adapter_config.json), but this run has "
            f"no --lora_rank ({tmp_path}/config.json, which held the run's flags, is gone). Resume with --lora_rank 4 "
            f"--lora_alpha 8 --lora_targets {','.join(TARGETS)}, and the run's other flags")
    assert code == 1 and out.count(says) == 1 and out.count("error:") == 1 and "Traceback" not in out, out
    full = shutil.copytree(tiny_model, tmp_path / "full" / "step_1")
    with pytest.raises(g.UserError, match=re.escape(
            f"--resume: {full} is a full fine-tune's checkpoint (no adapter_config.json), but this run has --lora_rank 4 "
            f"({tmp_path}/full/config.json, which held the run's flags, is gone). Resume without the LoRA flags")):
        g.check_lora_resume(g.Config(lora_rank=4, out_dir=str(tmp_path / "full")), str(full))


@pytest.mark.parametrize("targets, says", [
    ("qkv,dense", "--lora_targets qkv,dense: LlamaForCausalLM has no Linear of these names; its Linears are named "
                  "down_proj,gate_proj,k_proj,lm_head,o_proj,q_proj,up_proj,v_proj"),
    ("q_proj,lm_head", "--lora_targets lm_head: the LM head takes no adapter here")])
def test_lora_targets_that_name_no_linear_or_the_head_are_one_clear_error(tiny_model, server, tmp_path, targets, says):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--lora_rank", "4", "--lora_targets", targets))
    assert code == 1 and "Traceback" not in out and out.count("error:") == 1, out
    assert f"error: {says}" in out


def test_lora_targets_are_trimmed_and_a_typo_or_an_empty_entry_is_one_clear_error(tiny_model, tmp_path):
    """`--lora_targets q_proj,v_prj` (a typo) and `"q_proj, v_proj"` (a space) both trained q_proj alone, silently:
    names are trimmed, each must name a Linear of the model (the error lists its names), and an empty entry is an
    error before anything loads."""
    cfg = g.Config(lora_targets=" q_proj, v_proj ", out_dir=str(tmp_path))
    g.check_config(cfg, 1)
    assert cfg.lora_targets == "q_proj,v_proj"  # (so config.json and adapter_config.json hold it)
    adapt = lambda targets: g.add_lora(g.load_policy(tiny_model, torch.device("cpu"), False, torch.bfloat16), 4, 8.0,
                                       targets)
    assert sorted({n.rsplit(".", 1)[-1] for n, m in adapt(cfg.lora_targets.split(",")).named_modules()
                   if hasattr(m, "lora_A")}) == ["q_proj", "v_proj"]
    with pytest.raises(g.UserError, match=re.escape(
            "--lora_targets v_prj: LlamaForCausalLM has no Linear of this name; its Linears are named down_proj,"
            "gate_proj,k_proj,lm_head,o_proj,q_proj,up_proj,v_proj")):
        adapt(["q_proj", "v_prj"])
    for bad in ("q_proj,,v_proj", "q_proj,", " "):
        with pytest.raises(g.UserError, match=re.escape(f"--lora_targets {bad!r} has an empty entry: name the Linears")):
            g.check_config(g.Config(lora_targets=bad, out_dir=str(tmp_path)), 1)



# ---------------------------------------------------------------------------------------------
# 16. episodes: multi-turn rollouts, the environment's tokens (mask 0), the check, ranks, resume; dynamic sampling

class Scripted:
    """A server that replies from a script, one list of (ids, finish) per call, log-prob -0.5 a token; it records each
    call's prompts and token budgets. (One server: every episode on it.)"""
    def __init__(self, calls, servers=1):
        self.calls, self.asked, self.servers, self.srv = list(calls), [], servers, []

    def place(self, n_rows, n):
        return [k % self.servers for k in range(n_rows * n)]

    def sample(self, prompts, budgets, stops, sampling, version, srv):
        self.asked.append(([list(p) for p in prompts], list(budgets)))
        self.stops = getattr(self, "stops", []) + [list(stops)]
        self.srv.append(list(srv))
        return [(ids, [-0.5] * len(ids), fin) for ids, fin in self.calls.pop(0)]


def tiny_task(tiny_model, env, max_turns=3):
    """The tasks load_data builds, {"t": the task} (rows of task "t"), on the tiny model's tokenizer (ChatML-like; its
    word-level tokenizer drops newlines: a reply is closed by <|im_end|> alone)."""
    from types import SimpleNamespace
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model)
    return tok, {"t": SimpleNamespace(env=env, max_turns=max_turns, stop=[],
                                      env_ids=g.remembered(g.env_ids(tok, "chat", "talk")),
                                      decode=lambda ids: tok.decode(ids, skip_special_tokens=True))}


def test_an_episode_appends_each_reply_sampled_and_each_environment_message_with_mask_0(tiny_model):
    """rollout() by hand: two episodes of one prompt, on two servers. Episode 0 replies 'number': the environment says
    done (finish 'stop'). Episode 1 replies 'is' (ended by <|im_end|>), the environment answers 'the number ?' (its
    ids: the template's user turn and the opening of the next reply, mask 0, log-prob 0), then its second reply, asked
    of its own server, is cut by the token budget (what is left of --max_new_tokens: 4): 'length'. A reply that ended without
    <|im_end|> gets it from the environment's tokens; out of turns the environment's last message is not appended
    (finish 'turns'); a message that would leave no room for a reply ends the episode ('length')."""
    tok, task = tiny_task(tiny_model, lambda m, a: None if "number" in m[-1]["content"] else "the number ?")
    v = tok.convert_tokens_to_ids
    IS, NUMBER, WHAT, THE, Q, END, START, USER, ASSISTANT = (v(w) for w in (
        "is", "number", "What", "the", "?", "<|im_end|>", "<|im_start|>", "user", "assistant"))
    says = [START, USER, THE, NUMBER, Q, END, START, ASSISTANT]  # the environment's turn, then the model's opened
    cfg = g.Config(group_size=2, max_new_tokens=14, temperature=0.7)
    rows = [{"ids": [START, USER, WHAT, END, START, ASSISTANT], "answer": "1", "text": "What", "task": "t"}]
    server = Scripted([[([NUMBER, END], "stop"), ([IS, END], "stop")], [([WHAT, IS, THE, NUMBER], "length")]], servers=2)
    batch = g.rollout(cfg, server, task, rows, 3)
    e1, e0 = batch["episodes"]  # (e0: the episode of two turns, on server 1)
    assert e0["completion"] == [IS, END] + says + [WHAT, IS, THE, NUMBER]
    assert e0["mask"] == [1, 1] + [0] * 8 + [1] * 4 and e0["server_lp"] == [-0.5] * 2 + [0.0] * 8 + [-0.5] * 4
    assert (e0["turns"], e0["finish"], e1["turns"], e1["finish"]) == (2, "length", 1, "stop")
    assert [m["content"] for m in e0["messages"]] == ["What", "is", "the number ?", "What is the number"]
    assert e1["completion"] == [NUMBER, END] and e1["mask"] == [1, 1]
    assert server.asked[0][1] == [14, 14] and server.asked[1] == ([rows[0]["ids"] + [IS, END] + says], [4])
    assert batch["sampling"]["temperature"] == 0.7 and batch["version"] == 3 and batch["srv"] == [0, 1]
    assert server.srv == [[0, 1], [1]]  # its second turn on its own server (its prefix is cached there)
    seqs = g.sequences(batch, 2, "cpu")  # the table: the mask is the one truth of which tokens count
    assert seqs["mask"].sum(1).tolist() == [2, 6] and seqs["length"].tolist() == [2, 14]
    assert seqs["text"] == ["number", "What is the number"] and seqs["truncated"].tolist() == [0, 1]
    # a reply stopped without <|im_end|>: the environment's tokens close it; out of turns: finish 'turns'
    tok, task = tiny_task(tiny_model, lambda m, a: "the number ?", max_turns=2)
    server = Scripted([[([IS], "stop")], [([IS, END], "stop")]])
    (e,) = g.rollout(dataclasses.replace(cfg, group_size=1), server, task, rows, 0)["episodes"]
    assert e["completion"] == [IS, END] + says + [IS, END] and e["finish"] == "turns" and e["turns"] == 2
    assert e["mask"] == [1] + [0] * 9 + [1, 1] and len(e["messages"]) == 4
    # the same message after a reply that closed itself (remembered by message and reply end): closed once
    server = Scripted([[([IS, END], "stop")], [([IS, END], "stop")]])
    (e,) = g.rollout(dataclasses.replace(cfg, group_size=1), server, task, rows, 0)["episodes"]
    assert e["completion"] == [IS, END] + says + [IS, END] and e["mask"] == [1, 1] + [0] * 8 + [1, 1]
    # the environment's message would fill the budget: the episode ends there, without it
    server = Scripted([[([IS, IS, IS, END], "stop")]])
    (e,) = g.rollout(dataclasses.replace(cfg, group_size=1, max_new_tokens=12), server, task, rows, 0)["episodes"]
    assert e["completion"] == [IS, IS, IS, END] and e["finish"] == "length" and len(e["messages"]) == 2
    # --max_reply_tokens 3: a reply cut there is closed and answered; the episode goes on while tokens are left
    server = Scripted([[([IS, IS, IS], "length")], [([NUMBER, END], "stop")]])
    (e,) = g.rollout(dataclasses.replace(cfg, group_size=1, max_new_tokens=30, max_reply_tokens=3), server, task,
                     rows, 0)["episodes"]
    assert e["completion"] == [IS, IS, IS, END] + says + [NUMBER, END] and e["finish"] == "turns"
    assert [b for _, b in server.asked] == [[3], [3]]


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_task(tiny_model, tmp_path):
    """The environment's tokens are the template's rendering of its message after a fixed conversation minus that
    conversation: a template that renders earlier turns otherwise once a turn is added (here: only the last two
    messages kept) cannot extend an episode by token ids. One clear error before the model loads, naming the task."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = ("{% for m in messages[-2:] %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(g.UserError, match="--task guess: the chat template of this tokenizer does not render"):
        g.env_ids(tok, "chat", "guess")
    d = str(tmp_path / "model")
    shutil.copytree(tiny_model, d)
    tok.save_pretrained(d)
    s = StandIn(d)
    try:
        code, out = run(train_cmd(d, s.url, tmp_path / "run", "--task", "talk", rewards=True), timeout=120)
    finally:
        s.close()
    assert code == 1 and out.count("error:") == 1 and "Traceback" not in out, out
    assert "error: --task talk: the chat template of this tokenizer does not render a conversation" in out
    assert "--prompt_format plain" in out and "initial sync" not in out  # before the model loaded


def test_the_environments_tokens_have_no_loss_and_no_gradient_and_the_normaliser_counts_sampled_tokens(tiny_model):
    """One step in-process on two-turn episodes (reply, the environment's message, reply): at mu = 1 the ratio is 1,
    so each sampled token's loss is -A and its gradient d loss / d log π = -A / (sampled tokens of the batch),
    exactly; each environment token's is 0; the logged loss is -Σ A_i n_i / Σ n_i over sampled tokens only."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    dist_init()
    try:
        model = g.shard(g.load_policy(tiny_model, torch.device("cpu"), False), init_device_mesh("cpu", (1,)),
                        torch.bfloat16)
        env = [2, 4, 12, 13, 9, 3, 2, 5]  # <|im_start|> user the number ? <|im_end|> <|im_start|> assistant
        replies = [([11 + k, 3], [16 + k % 3] * (1 + k % 2) + [3]) for k in range(4)]  # 2 tokens, then 2 or 3
        eps = [{"prompt": [2, 4, 6, 7, 3, 2, 5], "completion": a + env + b, "mask": [1] * len(a) + [0] * 8 + [1] * len(b),
                "server_lp": [-1.0] * len(a) + [0.0] * 8 + [-1.0] * len(b), "answer": "1", "turns": 2, "finish": "stop",
                "messages": [{"role": "assistant", "content": str(k)}], "task": "t"} for k, (a, b) in enumerate(replies)]
        batch = {"rows": [{"ids": eps[0]["prompt"], "answer": "1"}], "version": 0, "srv": [0] * 4, "episodes": eps,
                 "sampling": {"temperature": 1.0}, "span": (0.0, 0.0)}
        cfg = g.Config(group_size=4, micro_batch=4, tis_cap=0, max_grad_norm=0)
        seqs = g.sequences(batch, 4, "cpu")
        mbs = g.micro_batches(seqs, cfg.micro_batch, 0)
        m = g.Metrics()
        g.score(seqs, task_of(lambda s, w: (float(s["text"] in "02"), {})), 4, m)  # episodes 0 and 2 rewarded
        seqs["adv"], seqs["weight"] = g.advantages(cfg, seqs["reward"]), torch.ones(4)
        grads, logp_of = [], g.completion_logprobs

        def kept(model, b, temperature):  # the log-probs train() computes, their gradient kept
            lp, ent = logp_of(model, b, temperature)
            lp.retain_grad()
            grads.append((b, lp))
            return lp, ent
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(g, "completion_logprobs", kept)
            g.train(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), seqs, mbs, 1, lambda s, m: None, m)
        got = m.reduce("cpu")
    finally:
        dist.destroy_process_group()
    n = seqs["mask"].sum()  # 2 + 2, 2 + 3, 2 + 2, 2 + 3 = 18 sampled tokens (the environment's 32 not among them)
    assert n == 18 and seqs["length"].sum() == 50 and got["completion_len_mean"] == 18 / 4 and got["turns_mean"] == 2
    adv = seqs["adv"]
    assert got["loss"] == pytest.approx((-(adv * seqs["mask"].sum(1)).sum() / n).item(), rel=1e-6, abs=1e-7)
    for b, lp in grads:
        want = -adv[b["rows"]].unsqueeze(1) * seqs["mask"][b["rows"], : b["C"]] / n  # 0 on every environment token
        assert torch.allclose(lp.grad, want, rtol=1e-6, atol=1e-9), (lp.grad, want)
        assert (lp.grad[seqs["mask"][b["rows"], : b["C"]] == 0] == 0).all()


def test_the_rescored_check_compares_only_the_tokens_the_model_sampled():
    """--async's check: the server re-scores whole episodes (its own tokens too), but the trainer-vs-server gap and
    the staleness count only tokens of mask 1 (the sampler's log-probs of the environment's tokens are 0 by design)."""
    trainer = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0])
    now = [-1.01, -2.0, -9.0, -9.0, -5.02]  # tokens 2 and 3 are the environment's: any value there
    then = [-1.0, -2.0, 0.0, 0.0, -5.0]
    d, count, top, stale, stale_top = g.rescored_stats(trainer, now, then, [1, 1, 0, 0, 1])
    assert (count, d, top) == (3, pytest.approx(0.03), pytest.approx(0.02))
    assert (stale, stale_top) == (pytest.approx(0.03), pytest.approx(0.02))


def test_every_metric_of_the_step_counts_the_sampled_tokens_of_an_episode_only(tiny_model):
    """train() on episodes (reply, the environment's message, reply) whose log-probs are set by hand (the forwards'
    values replaced, their gradients kept): on the model's tokens the no-grad forward says -1.1 (the server -1.0), the
    training forward -0.6 (ratio e^0.5: clipped where A > 0), the reference -0.8, the entropy 1; on the environment's
    tokens -7, -7, 0 and an entropy of 50. Each metric is its value on the sampled tokens alone, computed here from
    the formulas (the weighted ones without the weight-0 sequence): a metric that counted the environment's tokens,
    or the packed batch's, would be off by far."""
    import torch.distributed as dist
    dist_init()
    try:
        model, ref = sharded(tiny_model), sharded(tiny_model, frozen=True)
        env = [2, 4, 12, 13, 9, 3, 2, 5]  # <|im_start|> user the number ? <|im_end|> <|im_start|> assistant
        replies = [([11 + k, 3], [16 + k % 3] * (1 + k % 2) + [3]) for k in range(4)]  # 2 tokens, then 2 or 3
        eps = [{"prompt": [2, 4, 6, 7, 3, 2, 5], "completion": a + env + b, "mask": [1] * len(a) + [0] * 8 + [1] * len(b),
                "server_lp": [-1.0] * len(a) + [0.0] * 8 + [-1.0] * len(b), "answer": "1", "turns": 2, "finish": "stop",
                "messages": [{"role": "assistant", "content": str(k)}], "task": "t"} for k, (a, b) in enumerate(replies)]
        batch = {"rows": [{"ids": eps[0]["prompt"], "answer": "1"}], "version": 0, "srv": [0] * 4, "episodes": eps,
                 "sampling": {"temperature": 1.0}, "span": (0.0, 0.0)}
        cfg = g.Config(group_size=4, micro_batch=4, mu=2, beta=0.1, max_grad_norm=0)
        seqs = g.sequences(batch, 4, "cpu")
        mask = seqs["mask"]
        env_tok = (torch.arange(mask.shape[1]) < seqs["length"].unsqueeze(1)) & (mask == 0)
        hand = lambda sampled, other: sampled * mask + other * env_tok  # (N, C); 0 on padding
        old, now, ref_lp, ent = hand(-1.1, -7.0), hand(-0.6, -7.0), hand(-0.8, 0.0), hand(1.0, 50.0)
        real, lp0 = g.completion_logprobs, {}

        def by_hand(net, b, temperature):
            lp, e = real(net, b, temperature)
            want = (ref_lp if net is ref else now if torch.is_grad_enabled() else old)[b["rows"], : b["C"]]
            return lp + (want - lp.detach()), e + (ent[b["rows"], : b["C"]] - e.detach())
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(g, "completion_logprobs", by_hand)
            mbs = g.micro_batches(seqs, cfg.micro_batch, 0)
            g.old_and_ref_logprobs(cfg, model, ref, seqs, mbs)
            m = g.Metrics()
            g.score(seqs, task_of(lambda s, w: (float(s["text"] in "02"), {})), 4, m)  # episodes 0 and 2 rewarded
            seqs["adv"], seqs["weight"] = g.advantages(cfg, seqs["reward"]), torch.tensor([1.0, 1.0, 1.0, 0.0])
            g.train(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), seqs, mbs, 1,
                    lambda s, m: lp0.update(lp0=s["lp0"].clone()), m)
        got = m.reduce("cpu")
    finally:
        dist.destroy_process_group()
    n = mask.sum(1)  # 4, 5, 4, 5 sampled tokens (8 of the environment's in each episode)
    assert n.tolist() == [4, 5, 4, 5] and env_tok.sum() == 32
    assert torch.allclose(lp0["lp0"] * mask, old * mask, atol=1e-6)  # the check's log-probs: the weights the server holds
    k3 = lambda d: math.exp(d) - d - 1
    assert got["entropy"] == pytest.approx(1.0) and got["mismatch_mean"] == pytest.approx(0.1, rel=1e-5)
    assert got["mismatch_max"] == pytest.approx(0.1, rel=1e-5) and got["is_ratio_mean"] == pytest.approx(math.exp(-0.1))
    assert got["mismatch_kl"] == pytest.approx(k3(-0.1), rel=1e-4) and got["is_truncated_frac"] == 0
    assert got["kl"] == pytest.approx(k3(-0.2), rel=1e-4)  # k3(π, ref): ref - log π = -0.2 on the model's tokens
    assert seqs["adv"][0] > 0 > seqs["adv"][1] and seqs["adv"][2] > 0
    assert got["clip_frac"] == pytest.approx((4 + 4) / (4 + 5 + 4))  # ratio e^0.5 > 1.2 clips where A > 0


def test_the_sync_checks_mean_counts_the_sampled_tokens_of_episodes_only(tiny_model, tmp_path):
    """A stand-in that reports every log-prob 0.05 nats above its model's: the check's gap (on-policy: the batch; async:
    the re-scored episodes) and the batch's mismatch are 0.05 on the model's tokens, whatever the environment's
    tokens (here more than a third of every batch's) would have added had they been counted; async, the staleness on
    the re-scored episodes (the sampler's log-probs then against the server's now) is small on them too."""
    for mode in ("--no-async", "--async"):
        s = StandIn(tiny_model, lp_shift=0.05)
        try:
            code, out = run(train_cmd(tiny_model, s.url, tmp_path / mode, *TALK, "--max_reply_tokens", "4", mode,
                                      rewards=True))
        finally:
            s.close()
        assert code == 0, out
        m = [r for r in read_metrics(tmp_path / mode) if "loss" in r]
        # the environment's share of each batch's tokens: its message is 10 tokens (episodes_in's), one per extra turn
        env = [10 * (r["turns_mean"] - 1) for r in m]
        assert all(e / (e + r["completion_len_mean"]) > 0.35 for e, r in zip(env, m)) and episodes_in(s) > 0, m
        assert all(0.04 < r["check_mismatch_mean"] < 0.06 for r in m), (mode, m)
        assert mode == "--async" or all(0.04 < r["mismatch_mean"] < 0.06 for r in m), m
        assert [r["stale_token_frac"] for r in m] == ([0, 0] if mode == "--no-async" else [0, 1]), m
        stale = [r["staleness_mean"] for r in m if r.get("staleness_mean") is not None]  # re-scored episodes: the
        assert mode == "--no-async" or (stale and max(stale) < 0.5), m  # sampler's 0s on the environment's tokens


@pytest.mark.parametrize("mode", ["--no-async", "--async"])
def test_weights_reloaded_between_two_turns_of_an_episode_stop_the_run_at_that_step(tiny_model, tmp_path, mode):
    """Another client reloads the server's weights from disk (its tag kept) between the two turns of step 3's
    episodes, whose first turns came from the weights the trainer pushed. Each rollout ends with the server's hashes
    of what it holds, compared with the push it sampled from: the run stops at the step that trains on that batch
    (3; async: its batch trains a step later, 4), before it trains, naming the server and the versions, at a learning
    rate (1e-4) where the log-prob check alone would not see it. The same run without the reload ends well."""
    flags = (*TALK, "--max_reply_tokens", "4", "--lr", "1e-4", "--steps", "5", "--save_every", "1", mode)
    # the requests of the rollout sampled from version 2: 5 and 6 (a rollout of two turns a step, from versions 0, 1,
    # 2); async: 7 and 8 (step 1's batch is sampled first, then version 0's for step 2, version 1's for step 3, ...)
    s = StandIn(tiny_model, reload_after=5 if mode == "--no-async" else 7)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "reload", *flags, rewards=True))
    finally:
        s.close()
    at = 3 if mode == "--no-async" else 4
    base = {n: t.to(torch.bfloat16) for n, t in ckpt_weights(tiny_model, "base").items()}  # what the reload loads
    k = sum(not torch.equal(base[n], t.to(torch.bfloat16)) for n, t in ckpt_weights(tmp_path / "reload", 2).items())
    assert code == 1 and out.count("error:") == 1 and "Traceback" not in out and k > 0, out
    assert f"error: weight sync check failed at step {at}: after the rollout sampled from version 2 (the weights after " \
           f"step 2), the server at {s.url} holds other weights than the trainer pushed: {k} of 20" in out, out
    assert "changed during the rollout (another client updated or reloaded them)" in out
    assert [r["step"] for r in read_metrics(tmp_path / "reload") if "loss" in r] == list(range(1, at))
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "clean", *flags, rewards=True))
    finally:
        s.close()
    assert code == 0 and len([r for r in read_metrics(tmp_path / "clean") if "loss" in r]) == 5, out


def test_weights_reloaded_between_two_rounds_of_dynamic_sampling_stop_the_run_at_that_step(tiny_model, tmp_path):
    """--dynamic_sampling 2: a step draws round after round (a request each) until its groups' rewards differ. A run
    without a reload says how many rounds each step drew; the same run, with another client reloading the server's
    weights (its tag kept) after the first round of the first later step that drew more than one, stops at that step
    before it trains, naming the server and the version."""
    flags = ("--dynamic_sampling", "2", "--reward", "has_number", "--eval_every", "0", "--steps", "4", "--lr", "1e-3")
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "clean", *flags, rewards=True))
    finally:
        s.close()
    rounds = [int(r["sampling_rounds"]) for r in read_metrics(tmp_path / "clean") if "loss" in r]
    assert code == 0 and len(rounds) == 4 and len(s.rollouts) == sum(rounds), out
    at = next(k for k in range(2, 5) if rounds[k - 1] > 1)  # a step of several rounds (not the first: the weights
    s = StandIn(tiny_model, reload_after=sum(rounds[: at - 1]) + 1)  # must have moved from the base's)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "reload", *flags, rewards=True))
    finally:
        s.close()
    assert code == 1 and out.count("error:") == 1 and "Traceback" not in out, out
    assert f"error: weight sync check failed at step {at}: after the rollout sampled from version {at - 1}" in out, out
    assert f"the server at {s.url} holds other weights than the trainer pushed" in out, out
    assert [r["step"] for r in read_metrics(tmp_path / "reload") if "loss" in r] == list(range(1, at))
    assert len(s.rollouts) >= sum(rounds[: at - 1]) + 2  # the step drew a round after the reload (its first round:
    # before it, as in the run without, so it drew more)


def test_groups_of_identical_samples_a_server_could_not_have_drawn_are_warned_about(tiny_model, tmp_path):
    """A server that samples every copy of a prompt with the same seed (SGLang's deterministic inference without a
    seed per request) returns G identical completions: their advantages are 0. Each step logs the share of groups
    whose completions are all the same tokens and how many of them the server's own log-probs say it would draw
    less than once in 1,000 tries (p^(G-1), p the completion's probability); the first such step prints one warning
    that names the cause and the fix. An honest server's groups (the random tiny model) are never identical."""
    got = {}
    for det in (True, False):
        s = StandIn(tiny_model, deterministic=det)
        try:
            code, out = run(train_cmd(tiny_model, s.url, tmp_path / str(det), "--steps", "3", "--eval_every", "0"))
        finally:
            s.close()
        assert code == 0, out
        got[det] = ([r for r in read_metrics(tmp_path / str(det)) if "loss" in r], out)
    (m, out), (m0, out0) = got[True], got[False]
    assert all(r["identical_groups_frac"] == 1 and r["improbable_identical_groups"] == 2 for r in m), m
    assert out.count("warning: at step 1, 2 group(s) of 4 completions are the same tokens, which the server's own "
                     "log-probs say it would draw less than once in 1,000 tries") == 1, out
    assert "--enable-deterministic-inference" in out and "Restart the server without it" in out
    assert all(r["identical_groups_frac"] == 0 and r["improbable_identical_groups"] == 0 for r in m0), m0
    assert "are the same tokens" not in out0


def test_identical_groups_are_improbable_only_where_the_sampler_made_them_unlikely():
    """identical_groups by hand: groups of 4; a repeated completion of log-prob -0.1 per token over 3 tokens (p =
    e^-0.3: p^3 = 0.41, a sharp policy) is identical but probable; of -1 per token (p^3 = e^-9 < 1e-3) improbable; a
    group that differs is neither; greedy (temperature 0) is never improbable."""
    tok = type("T", (), {"decode": lambda self, ids, skip_special_tokens: "x"})()
    outs = [([5, 6, 3], [-0.1] * 3, "stop")] * 4 + [([5, 6, 3], [-1.0] * 3, "stop")] * 4 + [
        ([5, 6, 3], [-1.0] * 3, "stop")] * 3 + [([5, 7, 3], [-1.0] * 3, "stop")]
    rows = [{"ids": [4], "answer": "1"}] * 3
    same, improbable = g.identical_groups(table(rows, outs, tok, 4), 4)
    assert same.tolist() == [True, True, False] and improbable.tolist() == [False, True, False]
    assert g.identical_groups(table(rows, outs, tok, 4, temperature=0.0), 4)[1].tolist() == [False] * 3


def test_an_episode_out_of_turns_is_not_truncated_and_mask_truncated_drops_only_cut_ones():
    """finish: 'stop' (the environment said done), 'length' (the tokens ran out: cut), 'turns' (the replies ran out:
    whole replies, not cut). Only 'length' is truncated, so only it weighs 0 under --mask_truncated."""
    tok = type("T", (), {"decode": lambda self, ids, skip_special_tokens: "x"})()
    batch = single_turns([{"ids": [4, 5], "answer": "1"}], [([6, 3], [-1.0] * 2, f) for f in ("stop", "length", "turns")],
                         tok, 3)
    seqs = g.sequences(batch, 3, "cpu")
    assert seqs["truncated"].tolist() == [0, 1, 0] and seqs["finish"] == ["stop", "length", "turns"]
    seqs["reward"] = torch.tensor([1.0, 0.0, 1.0])
    assert g.weights(g.Config(group_size=3, mask_truncated=True), seqs).tolist() == [1, 0, 1]
    assert g.weights(g.Config(group_size=3), seqs).tolist() == [1, 1, 1]


def test_dynamic_sampling_draws_n_more_rounds_and_times_all_of_them(tiny_model, tmp_path):
    """--dynamic_sampling 2 where every group is flat (a reward of 1 for all): each step draws its first round and 2
    more (3 rounds of 2 prompts: 6 groups drawn, none kept), and its rollout time covers the 3 rounds (the stand-in
    takes 0.4 s a rollout request: at least 1.2 s, not one round's 0.4 s)."""
    s = StandIn(tiny_model, slow_generate=0.4)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--dynamic_sampling", "2", "--reward", "always_1",
                                  "--eval_every", "0", rewards=True))
    finally:
        s.close()
    assert code == 0, out
    m = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert len(m) == 2 and all(r["sampling_rounds"] == 3 and r["groups_drawn"] == 6 and r["groups_kept"] == 0 for r in m), m
    assert all(r["time_rollout"] >= 1.2 and r["span_rollout"][1] - r["span_rollout"][0] >= 1.2 for r in m), m
    assert len(s.rollouts) == 6  # (3 requests a step, 2 steps)


def byte_tokenizer(d):
    """A byte-level BPE tokenizer with no merges (any text round-trips, newlines included) and ChatML's specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(["<pad>", "<|im_start|>", "<|im_end|>"] + sorted(alphabet))}
    tk = Tokenizer(models.BPE(vocab, []))
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.save_pretrained(d)
    return tok


def test_an_environments_message_is_a_line_of_its_own_in_plain_prompts_and_replies_reach_it_without_specials(
        tiny_model, tmp_path):
    """Plain prompts (a base model): the environment's message goes on a line of its own after the reply, and the
    next reply starts on a new line: its tokens are '\\n' + message + '\\n'. The environment reads each reply as text
    without special tokens (the reply's closing <|im_end|> is no part of what the model said)."""
    tok = byte_tokenizer(str(tmp_path / "bytes"))
    ids = g.env_ids(tok, "plain", "talk")("My number is higher.", tok.eos_token_id)
    assert tok.decode(ids) == "\nMy number is higher.\n"
    from transformers import AutoTokenizer
    _, _, _, task = one_task(g.load_data(g.Config(model=tiny_model, dataset="builtin", task="guess")))
    word = AutoTokenizer.from_pretrained(tiny_model).convert_tokens_to_ids
    assert task.decode([word("number"), word("is"), word("<|im_end|>")]) == "number is"


def test_the_calculators_call_is_calc_then_an_expression_anywhere_in_the_reply():
    """calculator_env answers a reply that holds 'calc:' (any case, spaces or none) and an arithmetic expression
    (numbers, + - * / x ×, brackets, decimals) with its value; anything else is the answer (None)."""
    env = lambda reply: reward_fns.calculator_env([{"role": "assistant", "content": reply}], "0")
    assert env("calc: 12 * 34") == env("CALC:12*34") == env("Calc: 12 x 34") == env("calc: 12×34") == "408"
    assert env("Let me check. calc: (2 + 3) * 4 then answer") == "20" and env("calc: 7.5 / 2.5") == "3"
    assert env("calc: -3 * 4") == "-12" and env("calc: 10 - 2 - 3") == "5"
    assert env("calculate 12 * 34") is None and env("calc 12 * 34") is None and env("408") is None
    assert env("calc: twelve") == "error"  # a call with no expression: the calculator says so


# The flags a resumed run may change (docs/reference.md, Resume), written out here: the trainer's list must not grow
# or shrink by a slip. Every other flag changes what the run trains: a resume refuses it.
RESUMABLE_FLAGS = {"steps", "resume", "out_dir", "eval_every", "save_every", "sample_every", "wandb", "wandb_project",
                   "device", "micro_batch", "head_matmul", "grad_checkpointing", "max_nonfinite_steps", "server_url",
                   "api_key", "server_gpu", "colocate", "request_timeout", "request_retries", "sync", "sync_bucket_mb",
                   "nccl_master_addr", "nccl_port", "mismatch_max", "check_seqs", "keep_checkpoints", "collective_timeout"}


def test_a_resume_refuses_every_flag_that_changes_what_the_run_trains_and_takes_the_others(tmp_path):
    """Each flag in turn, given to a resume with another value than its run's config.json: refused (naming it) unless
    it only says how or where the run goes (RESUMABLE_FLAGS); --seed and --dynamic_sampling are refused."""
    (tmp_path / "config.json").write_text(json.dumps(g.saved_config(g.Config(out_dir=str(tmp_path)))))
    other = lambda v: (not v) if type(v) is bool else v + 1 if isinstance(v, (int, float)) else v + "x"
    checked = set()
    for f in dataclasses.fields(g.Config):
        if f.name in ("out_dir", "resume"):
            continue
        cfg = g.Config(out_dir=str(tmp_path), resume=True, **{f.name: other(f.default)})
        cfg.given = {f.name, "out_dir", "resume"}
        if f.name in RESUMABLE_FLAGS:
            g.restore_config(cfg)
            assert getattr(cfg, f.name) == other(f.default), f.name
        else:
            with pytest.raises(g.UserError, match=f"--{f.name.rstrip('_')} was "):
                g.restore_config(cfg)
        checked.add(f.name)
    assert {"seed", "dynamic_sampling"} <= checked - RESUMABLE_FLAGS


def test_a_run_begun_before_example_existed_resumes_with_the_prompts_it_trained_on(tmp_path, capsys):
    """A calculator run's config.json from before --example (no such key): its resume puts no worked example before
    its plain prompts, as the run trained, and says so; the run's own value where config.json has one; --example given
    to the resume wins."""
    calc = reward_fns.TASKS["calculator"]
    shown = lambda cfg: g.shown_example(cfg, "plain", calc, calc.instruction)
    for saved, given, want in ((None, None, None), ("auto", None, "auto"), (None, "on", "on")):
        flags = g.saved_config(g.Config(out_dir=str(tmp_path), task="calculator"))
        flags.pop("example") if saved is None else flags.update(example=saved)
        (tmp_path / "config.json").write_text(json.dumps(flags))
        cfg = g.Config(out_dir=str(tmp_path), resume=True, **({"example": given} if given else {}))
        cfg.given = {"out_dir", "resume"} | ({"example"} if given else set())
        g.restore_config(cfg)
        assert cfg.task == "calculator" and bool(shown(cfg)) == (want is not None), (saved, given)
        said = "began before --example existed: --example off, as it trained" in capsys.readouterr().out
        assert said == (saved is None and given is None)


def test_a_students_environment_that_raises_ends_its_episode_with_a_counted_warning_not_a_traceback(tiny_model,
                                                                                                    tmp_path):
    """An environment that reads a number the reply does not hold (int() on a word) raised out of rollout() at eval
    step 0. Now each call that raises ends its episode there, is counted (env_warnings) and said once a step with
    what it raised; the run trains to its end."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, *TALK, "--task", "raising", rewards=True))
    finally:
        s.close()
    assert code == 0 and "Traceback" not in out, out
    m = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert len(m) == 2 and all(r["env_warnings"] == 8 and r["turns_mean"] == 1 for r in m), m  # every episode
    assert re.search(r"warnings at step 1: \{\"raising_env: raised ValueError: invalid literal for int\(\) with base "
                     r"10: 'reply: [^\"]*\": 8\}", out), out
    evals = int(re.search(r"eval step 0: .* on (\d+) held-out prompts", out).group(1))  # evaluation says so too
    assert re.search(r"warnings at eval step 0: \{\"raising_env: raised ValueError: invalid literal for int\(\) with "
                     rf"base 10: 'reply: [^\"]*\": {evals}\}}", out), out


def test_a_reward_that_raises_is_named_with_its_task_in_training_and_in_evaluation(tiny_model, tmp_path):
    """A task whose reward raises (--reward auto): each step's warning names the reward and the task, where it said
    'auto: raised ...', and the evaluation prints its warnings as training does, where it said nothing; every
    sequence counts 0 and the run trains to its end."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--task", "boom", "--steps", "1", "--eval_every", "0",
                                  "--save_every", "0", rewards=True))
    finally:
        s.close()
    assert code == 0 and "Traceback" not in out, out
    n = int(re.search(r"= (\d+) sequences per step", out).group(1))
    evals = int(re.search(r"eval step 0: .* on (\d+) held-out prompts", out).group(1))
    said = lambda k: str({"boom (--task boom): raised ZeroDivisionError": k})  # as a dict prints
    assert f"warnings at step 1: {said(n)}" in out and f"warnings at eval step 0: {said(evals)}" in out, out


@pytest.mark.parametrize("flags, says", [
    (("--task", "reward_fn_given"), "--task reward_fn_given (TASKS['reward_fn_given'] in reward_fns.py): its reward must "
                                    "be the name of a reward in REWARD_FNS"),
    (("--task", "talk", "--max_new_tokens", "8", "--max_reply_tokens", "8"),
     "--max_reply_tokens 8 leaves no room in --max_new_tokens 8 (an episode's replies and messages together) for a "
     "second reply of --task talk's episodes of up to 3: lower --max_reply_tokens, or raise --max_new_tokens")])
def test_a_tasks_own_mistakes_are_named_as_the_tasks_before_anything_loads(tiny_model, server, tmp_path, flags, says):
    """A task whose reward is a function (not a registered name) was reported as a bad --reward, a flag never given;
    a reply budget as large as the episode's leaves no second turn and was taken silently. One error each, at start."""
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, *flags, rewards=True), timeout=120)
    assert code == 1 and out.count("error:") == 1 and "Traceback" not in out and f"error: {says}" in out, out
    assert "--reward:" not in out and not server.pushes


def test_episodes_out_of_room_for_another_turn_are_counted_and_said_once(tiny_model, tmp_path):
    """'talk' with --max_new_tokens 9: a reply, then the environment's message (10 tokens) never fits: every episode
    ends after one reply. The share is logged every step (out_of_room_frac), the first step says it with the flags to
    change, once."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, *TALK, "--max_new_tokens", "9", "--max_reply_tokens",
                                  "4", rewards=True))
    finally:
        s.close()
    m = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert code == 0 and all(r["out_of_room_frac"] > 0.5 and r["turns_mean"] == 1 for r in m), (m, out)
    assert out.count("of the episodes ended because the environment's next message and another reply did not fit in "
                     "--max_new_tokens 9") == 1 and "raise --max_new_tokens, or lower --max_reply_tokens" in out, out


def test_a_reply_ends_at_a_stop_string_and_its_tokens_are_what_the_trainer_scores(tiny_model, tmp_path):
    """--stop number: the server ends each reply at the first 'number' (its token kept, as SGLang keeps the tokens of
    a matched stop string): no reply holds a word after it, and the sync check passes on those tokens. The default
    (--stop auto) ends plain prompts' replies at a newline in episodes, at a blank line otherwise, and sends chat
    models' none: their template ends a turn."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, *TALK, "--stop", "number", rewards=True))
    finally:
        s.close()
    assert code == 0, out
    replies = [s.tok.decode(o, skip_special_tokens=True).split() for _, o, _ in s.generations]
    assert any("number" in r for r in replies) and all("number" not in r[:-1] for r in replies), replies
    assert all(r["check_mismatch_max"] < 0.01 for r in read_metrics(tmp_path) if "loss" in r)
    assert g.stop_strings("auto", "plain", 3) == ["\n"] and g.stop_strings("auto", "plain", 1) == ["\n\n"]
    assert g.stop_strings("auto", "chat", 3) == [] and g.stop_strings("none", "plain", 3) == []
    assert g.stop_strings("\\n,###", "chat", 1) == ["\n", "###"]
    with pytest.raises(g.UserError, match="--stop 'a,,b' has an empty string"):
        g.stop_strings("a,,b", "chat", 1)
    with pytest.raises(g.UserError, match="--stop ' Auto': write 'auto' or 'none' exactly"):
        g.stop_strings(" Auto", "chat", 1)


def test_a_built_in_task_with_repeated_questions_never_trains_on_a_held_out_one(tiny_model):
    """A student's task whose built-in rows repeat 8 questions 10 times: the held-out ones are dropped from training
    and counted, as a dataset's are (a game's question, asked with many answers, hides its answer: guess keeps all)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reward_fns, "TASKS", dict(reward_fns.TASKS))
        mp.setitem(reward_fns.REWARD_FNS, "has_number", lambda c, a: float("number" in c.split()))
        exec(TEST_TASKS, {"reward_fns": reward_fns, "dataclasses": dataclasses})
        _, train, evals, _ = g.load_data(g.Config(model=tiny_model, dataset="builtin", task="lookup", eval_size=4))
    held = {r["question"] for r in evals}  # questions 0-3 (the first 4 rows), each in 9 more rows: dropped
    assert len(held) == 4 and not held & {r["question"] for r in train} and len(train) == 40


@pytest.mark.parametrize("answer, says", [
    ([{"text": ""}], "an answer without output_ids"),
    ([{"output_ids": [5], "meta_info": {"weight_version": "0"}}], "an answer without meta_info's output_token_logprobs"),
    ([], "0 answers for 1 prompts"),
    ({"error": "busy"}, "a dict, not a list of answers")])
def test_a_server_answering_generate_in_another_shape_is_one_error_naming_it(answer, says):
    cfg = g.Config()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(g, "call", lambda *a, **k: answer)
        with pytest.raises(g.UserError, match=re.escape(f"the server at http://x:1 answered /generate with {says}")):
            g.generate(cfg, "http://x:1", [[4, 5]], "0", "sampled", "this rollout")


def test_a_resume_whose_config_json_is_gone_takes_the_flags_its_checkpoint_kept(tiny_model, tmp_path):
    """--resume after config.json was deleted took the default flags, then blamed the server (another model). The
    checkpoint keeps the run's flags too: the resume takes them from there, says so, and trains on."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--steps", "2", "--lr", "1e-3"))
        assert code == 0, out
        (tmp_path / "config.json").unlink()
        cmd = [c for c in train_cmd(tiny_model, s.url, tmp_path, "--steps", "3", "--resume")]
        cut = cmd.index("--lr")
        code, out = run(cmd[:cut] + cmd[cut + 2:])  # the run's --lr is not given again
    finally:
        s.close()
    assert code == 0 and f"--resume: {tmp_path}/config.json is gone; the run's flags come from its checkpoint" in out, out
    assert json.load(open(tmp_path / "config.json"))["lr"] == 1e-3


def test_guess_the_number_and_the_calculator_by_their_rules():
    """The built-in environments on hand-made episodes: guess answers each guess (the reply's first integer) higher or
    lower and ends at the secret; its reward is 1 for a win, else 0.1 x the share of guesses the answers so far
    allowed. The calculator answers a call with the value, ends at any other reply; its reward is 1 for the right
    product as the last reply, else 0.1 if it called and then answered."""
    rf = reward_fns
    turns = lambda *replies: [{"role": "user", "content": "?"}] + [
        {"role": r, "content": c} for k, c in enumerate(replies) for r in ["assistant" if k % 2 == 0 else "user"]]
    assert rf.guess_env(turns("8"), "11") == "My number is higher than 8. Guess again."
    assert rf.guess_env(turns("I say 12, no 13"), "11") == "My number is lower than 12. Guess again."
    assert rf.guess_env(turns("eleven"), "11").startswith("That is not a number.")
    assert rf.guess_env(turns(" 11."), "11") is None and rf.guess_correct(" 11.", "11")
    game = lambda *guesses: {"messages": turns(*[x for q in guesses for x in (q, "(answer)")][:-1])}
    assert rf.guess_reward("11", "11", game("8", "12", "11")) == 1.0
    # 8 (possible), 20 (out of range), 5 (below 8: the answer 'higher' ruled it out), 9 (possible): 2 of 4
    assert rf.guess_reward("9", "11", game("8", "20", "5", "9")) == pytest.approx(0.05)
    assert rf.guess_reward("no", "11", game("no")) == 0.0
    assert rf.calculate("123 * 45") == "5535" and rf.calculate("7 / 2") == "3.5" and rf.calculate("2 ** 99") == "error"
    assert rf.calculate("__import__('os')") == "error" and rf.calculate("1 / 0") == "error"
    assert rf.calculator_env(turns("calc: 123 * 45"), "5535") == rf.calculator_env(turns("calc: 123×45 ="), "") == "5535"
    assert rf.calculator_env(turns("The answer is 5535"), "5535") is None
    called = {"messages": turns("calc: 123*45", "5535", "5535")}
    assert rf.calculator_reward("5535", "5535", called) == 1.0 and rf.calculator_correct("It is 5535.", "5535")
    assert rf.calculator_reward("5536", "5535", called) == pytest.approx(0.1)
    assert rf.calculator_reward("5536", "5535", {"messages": turns("5536")}) == 0.0
    # calls alone earn nothing: on one H200 a reward that paid for them was hacked (a call in every turn, no answer)
    assert rf.calculator_reward("calc: 1 * 2", "5535", {"messages": turns("calc: 5 * 7", "35", "calc: 1 * 2")}) == 0.0
    assert not rf.calculator_correct("calc: 5535", "5535")  # a call is no answer
    rows = rf.guess_rows()
    assert {r["answer"] for r in rows} == {str(n) for n in range(1, rf.GUESS_MAX + 1)} and len({r["question"] for r in rows}) == 1


# -- the Python tool (--task python): the code a reply asks to run, the sandbox it runs in, the task's rows

def test_a_reply_runs_its_fenced_python_or_its_python_line_and_a_reply_without_code_is_the_answer():
    """python_code: a ```python block (several: joined in order; one cut short by the token budget: what there is),
    else a line 'python: <code>' (plain prompts end a reply at a newline), else None, the answer. python_correct: the
    answer's final number, never a reply that still asks to run code."""
    rf = reward_fns
    assert rf.python_code("First:\n```python\nx = 3\n```\nthen\n```py\nprint(x * 2)\n```\nok") == "x = 3\n\nprint(x * 2)\n"
    assert rf.python_code("Sure.\n```python\nprint(124 * 36") == "print(124 * 36"  # cut by the budget
    assert rf.python_code("python: print(124 * 36 - 250)") == "print(124 * 36 - 250)"
    assert rf.python_code("  Python:x=2; x") == "x=2; x"
    assert rf.python_code("The answer is 4214.") is None and rf.python_code("I used python: it said 4214") is None
    assert rf.python_correct("So the shop has 4214 pens left.\nAnswer: 4214", "4214")
    assert not rf.python_correct("```python\nprint(4214)\n```\nAnswer: 4214", "4214")  # still asks to run code
    assert not rf.python_correct("Answer: 4215", "4214") and rf.python_reward("#### 4,214", "4214") == 1.0
    turns = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "Answer: 4214"}]
    assert rf.python_env(turns, "4214") is None  # no code: the episode ends


def test_the_sandbox_answers_with_what_the_code_printed_its_last_value_or_one_line_of_error():
    """What the model reads back: printed lines, then the last expression's value as a REPL shows it (None: nothing),
    or the error's type and first line; '(no output)' when there is none. Allowed modules import; none of these is a
    warning."""
    run = reward_fns.run_python
    assert run("print(124 * 36 - 250)") == ("4214", None)
    assert run("x = 6\nprint('x is', x)\nx * 7") == ("x is 6\n42", None)
    assert run("from fractions import Fraction\nFraction(3, 9)") == ("Fraction(1, 3)", None)
    assert run("import math\nmath.ceil(1025 / 40)") == ("26", None)
    assert run("print(y)") == ("NameError: name 'y' is not defined", None)
    assert run("print('a')\n1 / 0") == ("a\nZeroDivisionError: division by zero", None)
    assert run("print(") [0].startswith("SyntaxError: ") and run("x = 1") == ("(no output)", None)
    assert run("None") == ("(no output)", None)
    # a name that is not ASCII and a \N{} escape: Python imports unicodedata itself to read them (the GPU run of
    # --task python saw it refused 16 times in 60 steps)
    assert run("总数 = 12 * 3\nprint(总数)") == ("36", None)
    assert run('print("\\N{DEGREE SIGN}")') == ("\u00b0", None)
    same = "import random\nprint(random.random(), list({'apple', 'pear', 'plum', 'fig'}))"
    assert run(same) == run(same)  # the same draws and set order in every run: a resumed run is the same run


def _tree(d):
    """{path: bytes} of every file under d (what a test checks is unchanged)."""
    return {os.path.join(r, f): open(os.path.join(r, f), "rb").read() for r, _, fs in os.walk(d) for f in fs}


# Each escape is harmless even where the sandbox failed: it writes or deletes only in the test's own folder, sends
# to the test's own socket, starts at most one process that exits at once, stops itself within 30 s, asks for 2 GiB
# at most (untouched pages) and prints 10 MB once.
ESCAPES = {
    "write a file": ("open({out!r} + '/new.txt', 'w').write('x')", "refused a write outside its folder"),
    "delete a file": ("import os\nos.remove({out!r} + '/keep.txt')", "refused os.remove outside its folder"),
    "rename a file": ("import os\nos.rename({out!r} + '/keep.txt', 'mine.txt')", "refused os.rename outside its folder"),
    "open a socket": ("import socket\nsocket.create_connection(('127.0.0.1', {port}), 1).sendall(b'hi')",
                      "refused import socket"),
    "a process": ("import os\nos.system('touch ' + {out!r} + '/ran')", "refused os.system"),
    "fork": ("import os\nif os.fork() == 0: os._exit(0)", "refused os.fork"),
    "subprocess": ("import subprocess\nsubprocess.run(['touch', {out!r} + '/ran'])", "refused import subprocess"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).system(b'touch ' + {out!r}.encode() + b'/ran')", "refused import ctypes"),
    "loop forever": ("import time\nt = time.time()\nwhile time.time() - t < 30: pass", "stopped at the CPU-time limit (1 s)"),
    "sleep": ("import time\ntime.sleep(30)", "stopped at the wall-time limit (3 s)"),
    "2 GiB": ("x = bytearray(2 * 2**30)", "over the memory limit (256 MB)"),
    "print 10 MB": ("print('x' * 10**7)", "output over 300 characters"),
    "write 10 MB past print": ("import os\nos.write(1, b'x' * 10**7)", "output over the file-size limit (1 MB)"),
    "swallow the refusal": ("try:\n    import socket\nexcept Exception:\n    print('got through')", "refused import socket"),
}


@pytest.mark.parametrize("escape", list(ESCAPES))
def test_the_sandbox_stops_or_refuses_each_escape_names_the_cause_and_the_episode_goes_on(tmp_path, escape):
    """A snippet that tries to write, delete or rename a file outside its folder, reach the network, start a process
    (os.system, fork, subprocess, ctypes), loop or sleep forever, take far more memory than allowed, or print
    megabytes is refused or stopped: the model reads one line saying so, the environment's warnings count the cause,
    the episode goes on (a message, not None), nothing in the test's folder changes, nobody connects to the test's
    socket, and the sandbox's own folder is gone."""
    import tempfile
    out, scratch = str(tmp_path / "outside"), str(tmp_path / "tmp")  # (scratch: the sandboxes' folders go there)
    os.makedirs(out)
    os.makedirs(scratch)
    open(os.path.join(out, "keep.txt"), "w").write("keep")
    before = _tree(out)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.1)
    code, cause = ESCAPES[escape]
    limits = dict(reward_fns.PY_LIMITS, cpu_s=1, wall_s=3 if escape == "sleep" else 60, memory_mb=256,
                  output_chars=300)
    w = collections.Counter()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(reward_fns, "PY_LIMITS", limits)
            mp.setattr(tempfile, "tempdir", scratch)
            said = reward_fns.python_env([{"role": "assistant", "content": "```python\n" + code.format(
                out=out, port=listener.getsockname()[1]) + "\n```"}], "1", w)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert dict(w) == {f"python_env: {cause}": 1}, (said, w)
    assert isinstance(said, str) and said.strip() and "got through" not in said, said
    assert len(said) < 400 and said.count("\n") <= 3, said  # a few lines, never the megabytes
    assert _tree(out) == before  # nothing outside its folder changed
    assert os.listdir(scratch) == []  # and its folder is gone


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="the root layer: run as root (CI is)")
def test_as_root_a_snippet_is_jailed_as_nobody_so_the_sandbox_holds_without_its_audit_hook(tmp_path, monkeypatch):
    """Root ignores RLIMIT_NPROC and may write anywhere, so a trainer run as root jails each snippet in its folder
    (chroot) as the user nobody. With the audit hook taken out (as if a snippet had got round it), a fork still fails
    and the test's folder cannot be written (its path, inside the jail, cannot even be made)."""
    out = str(tmp_path / "outside")
    os.makedirs(out)
    assert reward_fns.run_python("import os\nos.getuid(), os.getcwd()") == ("(65534, '/work')", None)
    no_hook = reward_fns._SANDBOX.replace("sys.addaudithook(", "(lambda hook: None)(")
    assert no_hook != reward_fns._SANDBOX
    monkeypatch.setattr(reward_fns, "_SANDBOX", no_hook)
    text, _ = reward_fns.run_python("import os\nif os.fork() == 0: os._exit(0)")
    assert text.startswith(("BlockingIOError", "PermissionError")), text  # EAGAIN: no process for nobody
    text, _ = reward_fns.run_python(f"import os\nos.makedirs({out!r})\nopen({out!r} + '/x', 'w').write('x')")
    assert text.startswith("PermissionError") and os.listdir(out) == []  # the jail's /: root's, closed to nobody


def test_a_turns_environments_answer_together_in_a_bounded_pool(monkeypatch):
    """env_answers runs every episode's environment at once, up to ENV_POOL's threads: 12 environments that each
    wait for all 12 to have started finish (one at a time, the first would wait forever: here, 10 s, then a broken
    barrier and a warning), and 40 never run more than the pool's 32 at once. Each call's warnings are counted, as
    one Counter would."""
    import threading, time
    barrier, running, most, lock = threading.Barrier(12, timeout=10), [0], [0], threading.Lock()

    def together(messages, answer):
        barrier.wait()
        return "all here"

    def counted(messages, answer, warnings):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)  # (long enough to overlap on a busy machine)
        with lock:
            running[0] -= 1
        warnings["counted: one"] = warnings.get("counted: one", 0) + 1
        return None
    from types import SimpleNamespace
    tasks = {"t": SimpleNamespace(env=together), "c": SimpleNamespace(env=counted), "none": SimpleNamespace(env=None)}
    ep = lambda task: {"task": task, "messages": [{"role": "assistant", "content": "hi"}], "answer": "1"}
    warn = collections.Counter()
    said, seconds = g.env_answers(tasks, [ep("t")] * 12 + [ep("none")], warn)
    assert said == ["all here"] * 12 + [None] and not warn and seconds >= 0
    said, _ = g.env_answers(tasks, [ep("c")] * 40, warn)
    assert said == [None] * 40 and warn == {"counted: one": 40} and 1 < most[0] <= 32, most


def test_a_python_episode_runs_the_replys_code_and_answers_with_its_output_then_the_reply_without_code_ends_it(
        tiny_model):
    """rollout() by hand with the real python environment: the first reply's code runs in the sandbox and its output
    is the next user message (mask 0); the second reply has no code, so the episode ends ('stop'); its task's check
    and reward call it right. A second episode's reply without code ends at once."""
    tok, task = tiny_task(tiny_model, reward_fns.python_env)
    v = tok.convert_tokens_to_ids
    IS, NUMBER, END = v("is"), v("number"), v("<|im_end|>")
    replies = {(IS, END): "```python\nprint(124 * 36 - 250)\n```", (NUMBER, END): "Answer: 4214"}
    task["t"].decode = lambda ids: replies[tuple(ids)]  # the tiny tokenizer has no words for code
    rows = [{"ids": [v("What"), END], "answer": "4214", "text": "What", "task": "t"}]
    server = Scripted([[([IS, END], "stop"), ([NUMBER, END], "stop")], [([NUMBER, END], "stop")]])
    batch = g.rollout(g.Config(group_size=2, max_new_tokens=40), server, task, rows, 0)
    code, plain = batch["episodes"]
    assert [m["content"] for m in code["messages"]] == ["What", replies[IS, END], "4214", "Answer: 4214"]
    assert code["turns"] == 2 and code["finish"] == "stop" and plain["turns"] == 1
    said = task["t"].env_ids("4214", END)
    assert code["completion"] == [IS, END] + said + [NUMBER, END] and code["mask"] == [1, 1] + [0] * len(said) + [1, 1]
    assert reward_fns.python_correct(code["messages"][-1]["content"], "4214") and batch["env_s"] > 0
    assert not batch["warnings"]


def test_a_run_whose_environment_runs_the_sandbox_trains_and_counts_each_refusal(tiny_model, tmp_path):
    """The trainer end to end, 2 ranks, with an environment that runs each first reply's code in the real sandbox
    (a refused import): every step trains, the environments' time is logged, and each refusal is one warning:
    2 prompts x 4 episodes a step, so 8 a step over the ranks, named by its cause in the step's line."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, "--task", "sandboxed", "--max_new_tokens", "24",
                                  "--eval_every", "0", "--save_every", "0", nproc=2, rewards=True))
    finally:
        s.close()
    assert code == 0, out
    m = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert len(m) == 2 and all(r["env_warnings"] == 8 and r["time_env"] > 0 for r in m), m
    assert "python_env: refused import socket" in out and "episodes of up to 3 replies" in out, out[-2000:]

def test_the_word_problems_are_fixed_by_their_seed_and_each_answer_follows_from_its_text(tiny_model):
    """word_problem_rows: 1,000 rows, the same on every call (a fixed seed), every template used, each answer a
    positive whole number that this test computes from the numbers in the question by its own formula. The task
    holds 200 of them out for evaluation, never trained on."""
    rows = reward_fns.word_problem_rows()
    assert rows == reward_fns.word_problem_rows() and len(rows) == 1000 and rows != reward_fns.word_problem_rows(seed=1)
    n = lambda q: [int(x) for x in re.findall(r"\d+", q)]
    by_template = {  # the first words of each template -> its answer from the question's numbers
        "A bakery": lambda a, b, c, d: a * b * c - d, "A school": lambda b, c, q, t: c * q * b,
        "Maria": lambda a, b, c, d: (a * b - c) * d, "A train": lambda a, b, c, d: a * b + c * d,
        "A farmer": lambda a, b, c, d: a * b * c // d, "A shop": lambda a, b, s, d: (a - d) * s - a * b,
        "A library": lambda a, b, c, d: a + b * c - d, "A tank": lambda v, i, o: v // (i - o),
        "A recipe": lambda f, b, c: f * c // b}
    seen = collections.Counter()
    for r in rows:
        q, a = r["question"], int(r["answer"])
        assert a > 0 and r["answer"] == str(a)
        if q[0].isdigit():  # the buses: students and teachers over a bus's seats, rounded up
            s, t, b = n(q)
            assert a == math.ceil((s + t) / b), q
            seen["buses"] += 1
            continue
        key = next(k for k in by_template if q.startswith(k))
        assert a == by_template[key](*n(q)), q
        seen[key] += 1
    assert len(seen) == 10 and min(seen.values()) > 50, seen
    _, train, evals, task = one_task(g.load_data(g.Config(model=tiny_model, dataset="builtin", task="python")))
    assert len(evals) == 200 and not {r["question"] for r in train} & {r["question"] for r in evals}
    assert task.env is reward_fns.python_env and task.max_turns == 3


def test_the_built_in_tasks_load_their_rows_and_a_game_trains_on_every_secret(tiny_model):
    """guess: one question for every secret (hidden in the answer), so its held-out games are no duplicates to drop
    from training (a dataset's repeated question is); calculator: 200 problems held out."""
    _, train, evals, task = one_task(g.load_data(g.Config(model=tiny_model, dataset="builtin", task="guess")))
    assert (len(train), len(evals), task.max_turns) == (240, 80, reward_fns.GUESS_TURNS)
    assert {r["answer"] for r in train} == {r["answer"] for r in evals} == {str(n) for n in range(1, 17)}
    _, train, evals, task = one_task(g.load_data(g.Config(model=tiny_model, dataset="builtin", task="calculator")))
    assert len(evals) == 200 and not {r["question"] for r in train} & {r["question"] for r in evals} and task.env


@pytest.mark.parametrize("flags, says", [
    (("--max_turns", "3"), "--max_turns 3: --task arithmetic has no environment to answer a reply"),
    (("--task", "guess"), "--builtin_max_operand sizes the built-in rows of --task arithmetic only"),
    (("--task", "gues"), f"--task 'gues' is not a task of reward_fns.py: it must be auto or one of {TASK_NAMES}")])
def test_episode_flags_that_cannot_apply_are_one_clear_error(tiny_model, server, tmp_path, flags, says):
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, *flags), timeout=120)
    assert code == 1 and out.count("error:") == 1 and "Traceback" not in out and f"error: {says}" in out, out


TALK = ("--task", "talk", "--max_new_tokens", "24", "--steps", "2", "--eval_every", "0", "--save_every", "0")


def episodes_in(s):
    """-> how many of the stand-in's training requests asked for a reply after the environment's message."""
    said = (2, 4, 6, 7, 12, 13, 9, 3, 2, 5)  # <|im_start|> user What is the number ? <|im_end|> <|im_start|> assistant
    return sum(any(tuple(p[i: i + len(said)]) == said for i in range(len(p))) for req in s.rollouts for p in req)


@pytest.mark.parametrize("mode", ["--no-async", "--async"])
def test_episodes_train_and_every_check_passes_on_the_sampled_tokens(tiny_model, tmp_path, mode):
    """The 'talk' task end to end, on-policy and async: episodes of two replies around the environment's message
    train, and the sync check passes at every step (its log-probs and, async, the staleness on the re-scored
    episodes count the model's tokens only: the environment's log-probs of 0 would be off by nats)."""
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path, *TALK, mode, rewards=True))
    finally:
        s.close()
    assert code == 0, out
    m = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert len(m) == 2 and max(r["turns_mean"] for r in m) > 1 and episodes_in(s) > 0, m
    assert "episodes of up to 3 replies" in out and all(r["check_mismatch_max"] < 0.01 for r in m), m
    stale = [r["staleness_max"] for r in m if r.get("staleness_max") is not None]  # re-scored at step 2
    assert mode == "--no-async" or (stale and max(stale) < 1.0), m


def test_episodes_train_with_every_mode_at_once_and_two_servers(tiny_model, tmp_path):
    """'talk' on two ranks and two servers with --mu 2, --beta 0.1, LoRA, --tis_mode sequence_mask, --filter_flat_groups
    and --dynamic_sampling 1, async: it trains, both servers play episodes of several turns, and the check passes."""
    a, b = StandIn(tiny_model), StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, f"{a.url},{b.url}", tmp_path, *TALK, "--async", "--prompts_per_step", "4",
                                  "--server_gpu", "0,1", "--mu", "2", "--beta", "0.1", "--lora_rank", "4",
                                  "--tis_mode", "sequence_mask", "--filter_flat_groups", "--dynamic_sampling", "1",
                                  nproc=2, rewards=True), timeout=300)
    finally:
        a.close(), b.close()
    assert code == 0, out
    m = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert len(m) == 2 and all(r["check_mismatch_mean"] < 0.01 and math.isfinite(r["loss"]) for r in m), m
    assert max(r["turns_mean"] for r in m) > 1 and episodes_in(a) > 0 and episodes_in(b) > 0, m


def test_an_episode_that_ends_after_one_turn_is_the_single_turn_run_bit_for_bit(tiny_model, tmp_path):
    """arithmetic, and the same task with an environment that ends every episode at once (--max_turns 3): the same
    requests to the server, the same metrics at every step and the same weights at the end, to the bit."""
    got = {}
    for task in ("arithmetic", "one_turn"):
        s = StandIn(tiny_model)
        try:
            code, out = run(train_cmd(tiny_model, s.url, tmp_path / task, "--task", task, "--steps", "3",
                                      rewards=True))
            assert code == 0, out
            got[task] = (s.rollouts, [{k: v for k, v in r.items() if not k.startswith(("time", "span", "rollout_"))}
                                      for r in read_metrics(tmp_path / task)], ckpt_weights(tmp_path / task))
        finally:
            s.close()
    (asked, rows, weights), (asked1, rows1, weights1) = got["arithmetic"], got["one_turn"]
    assert asked == asked1 and rows == rows1 and len(rows) == 6  # steps 1-3, evals at 0, 2 and 3
    assert weights.keys() == weights1.keys() and all(torch.equal(weights[k], weights1[k]) for k in weights)


def test_episodes_of_different_lengths_on_two_ranks_take_the_step_of_one_rank(tiny_model, tmp_path):
    """'talk' on one rank and on two: the same episodes (the stand-in samples by prompt and copy, whoever asks), of
    different lengths on each rank, and the same first step: every rank runs as many micro-batches, the normaliser
    counts the sampled tokens of the whole batch."""
    got = {}
    for key, nproc in (("1", 1), ("2", 2)):
        s = StandIn(tiny_model)
        try:
            code, out = run(train_cmd(tiny_model, s.url, tmp_path / key, *TALK, "--steps", "1", "--prompts_per_step",
                                      "4", "--micro_batch", "3", "--eval_every", "0", nproc=nproc, rewards=True))
            assert code == 0, out
            got[key] = ([r for r in read_metrics(tmp_path / key) if "loss" in r][0], sorted(map(str, s.generations)))
        finally:
            s.close()
    (m1, gen1), (m2, gen2) = got["1"], got["2"]
    assert gen1 == gen2 and m1["turns_mean"] == m2["turns_mean"] > 1
    for k in ("reward_mean", "completion_len_mean", "turns_mean", "accuracy"):
        assert m2[k] == m1[k], k
    for k in ("loss", "entropy", "check_mismatch_mean"):  # one forward and one loss, split over ranks otherwise
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k


def test_a_resumed_run_of_episodes_is_the_run_that_never_stopped(tiny_model, tmp_path):
    """'talk': 4 steps at once, and 2 steps then --resume to 4: the same episodes after the resume, the same metrics
    at every step and the same weights at the end, to the bit. (On-policy: an --async resume samples its first batch
    from the checkpoint's weights, not the step before's: docs/design.md, Exact resume.)"""
    (rows, w, s), (rows1, w1, s1) = stopped_and_resumed(tiny_model, tmp_path, *TALK).values()
    assert len(rows) == 4 and rows == rows1 and all(torch.equal(w[k], w1[k]) for k in w)
    assert s.generations == s1.generations  # every reply of every turn: steps 1-2 before the stop, 3-4 after


def test_dynamic_sampling_fills_the_batch_with_groups_whose_rewards_differ_in_the_order_drawn(tiny_model):
    """--dynamic_sampling 2, 2 prompts a round, groups of 2, a reward of 1 for the replies '1' and '3' (by hand):
    round 0 draws A (1, 1: flat) and B (1, 2); round 1 draws C (2, 2: flat) and D (3, 4): B and D fill the batch, in that
    order, after 2 rounds of 3. With every group flat the rounds run out (3), and the first two drawn fill it (they weigh
    0). The batch's advantages, by the std of the batch, are those of its own groups: the ones left out are nowhere."""
    from types import SimpleNamespace
    cfg = g.Config(group_size=2, dynamic_sampling=2, scale_rewards="batch")
    task = {"t": SimpleNamespace(env=None, max_turns=1, decode=lambda ids: str(ids[0]), correct=lambda c, a: False,
                                 stop=[], reward_fn=lambda row, warn: (float(row["text"] in ("1", "3")), {}))}
    rows = [{"ids": [4, k], "answer": "1", "text": name, "task": "t"} for k, name in enumerate("ABCDEF")]
    rounds = [rows[0:2], rows[2:4], rows[4:6]]
    reply = lambda *ids: [([i, 3], "stop") for i in ids]
    server = Scripted([reply(1, 1, 1, 2), reply(2, 2, 3, 4)])  # (a third round would find no script: an error)
    batch = g.sample_groups(cfg, server, task, rounds, 0)
    assert [r["text"] for r in batch["rows"]] == ["B", "D"] and len(server.asked) == 2
    assert [e["completion"][0] for e in batch["episodes"]] == [1, 2, 3, 4] and batch["srv"] == [0] * 4
    assert batch["groups"] == {"drawn": 4, "kept": 2, "rounds": 2}
    seqs = g.sequences(batch, 2, "cpu")
    g.score(seqs, task, 2, g.Metrics())
    dist_init()
    try:  # rewards 1, 0, 1, 0: (r - the group's mean 0.5) / the batch's std (4 x 0.25 / 3) ** 0.5 (A and C: nowhere)
        assert g.advantages(cfg, seqs["reward"]).tolist() == pytest.approx([0.5 / (1 / 3) ** 0.5 * x for x in (1, -1, 1, -1)],
                                                                          rel=1e-3)
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()
    assert g.weights(cfg, seqs).tolist() == [1, 1, 1, 1]
    server = Scripted([reply(2, 2, 1, 1), reply(2, 2, 3, 3), reply(4, 4, 1, 1)])  # every group flat
    batch = g.sample_groups(cfg, server, task, rounds, 0)
    assert [r["text"] for r in batch["rows"]] == ["A", "B"] and batch["groups"] == {"drawn": 6, "kept": 0, "rounds": 3}
    seqs = g.sequences(batch, 2, "cpu")
    g.score(seqs, task, 2, g.Metrics())
    assert g.weights(cfg, seqs).tolist() == [0, 0, 0, 0]  # flat: no signal, out of the loss
    # without the flag: round 0 as drawn, one rollout, nothing else
    server = Scripted([reply(1, 1, 1, 2)])
    batch = g.sample_groups(dataclasses.replace(cfg, dynamic_sampling=0), server, task, rounds[:1], 0)
    assert [r["text"] for r in batch["rows"]] == ["A", "B"] and "groups" not in batch


def test_a_steps_rounds_of_prompts_are_a_pure_function_of_the_step_slices_of_one_stream_per_rank():
    """rank_rounds: each rank's rounds are slices of the step's per_step x rounds rows of the shuffled stream, disjoint
    over ranks and rounds; round 0 with one round is the step's prompts as ever (prompts_for_step, rank slices)."""
    for world in (1, 2):
        got = [g.rank_rounds(50, 3, 4, 0, r, world, 3) for r in range(world)]
        flat = [i for rank in got for rnd in rank for i in rnd]
        assert flat == g.prompts_for_step(50, 3, 12, 0) and len(set(flat)) == 12
        assert all(len(rnd) == 4 // world for rank in got for rnd in rank)
        one = [g.rank_rounds(50, 3, 4, 0, r, world)[0] for r in range(world)]
        assert [i for x in one for i in x] == g.prompts_for_step(50, 3, 4, 0)


DYNAMIC = ("--dynamic_sampling", "2", "--reward", "has_number", "--eval_every", "0")


def test_dynamic_sampling_on_two_ranks_and_resumed_is_the_run_that_never_stopped(tiny_model, tmp_path):
    """--dynamic_sampling 2 end to end: on two ranks every rank ends its step with as many groups (no hang; the
    rounds each drew are logged), and a run stopped after step 2 and resumed draws and trains exactly as the run that
    never stopped (the rounds are a pure function of the step). (Four runs of the trainer, one of them on 2 ranks:
    ~9 s.)"""
    (rows, w, s), (rows1, w1, s1) = stopped_and_resumed(tiny_model, tmp_path, *DYNAMIC).values()
    assert len(rows) == 4 and rows == rows1 and s.generations == s1.generations and all(torch.equal(w[k], w1[k]) for k in w)
    s = StandIn(tiny_model)
    try:
        code, out = run(train_cmd(tiny_model, s.url, tmp_path / "ranks", *DYNAMIC, "--steps", "2", nproc=2, rewards=True))
        assert code == 0, out
    finally:
        s.close()
    ranks = [r for r in read_metrics(tmp_path / "ranks") if "loss" in r]
    assert all(1 <= r["sampling_rounds"] <= 3 and r["groups_drawn"] >= 2 for r in rows + ranks), rows + ranks
    assert all(r["groups_kept"] <= 2 and r["groups_drawn"] == 2 * r["sampling_rounds"] for r in rows), rows


CALC_INSTRUCTION = ("To use a calculator, reply with calc: followed by the expression (for example calc: 12 * 34) and "
                    "I will tell you the result.")
# The calculator's worked example as a plain prompt shows it: the episode as the rollout writes one (the question and
# its instruction, then each reply and each message of the environment on a line of its own), then a blank line
CALC_EXAMPLE = f"What is 347 * 29?\n{CALC_INSTRUCTION}\ncalc: 347 * 29\n10063\n347 * 29 = 10063\n\n"


def test_a_worked_example_comes_before_each_question_in_plain_prompts_and_in_chat_ones_only_if_asked(tmp_path,
                                                                                                  monkeypatch):
    """--task calculator on a base model (plain prompts): each prompt, trained on or held out, is the task's worked
    episode and then the question, and the start says so; --example off gives the prompt of before. A chat model's
    prompt is unchanged, and --example on puts the episode in as earlier turns; a task without an example refuses it.
    (The task's built-in rows are 40 of its own, not its 20,000: each load tokenized them all, 5 s a load.)"""
    monkeypatch.setitem(reward_fns.TASKS, "calculator", dataclasses.replace(
        reward_fns.TASKS["calculator"], rows=lambda: reward_fns.calculator_rows(40)))
    tok = byte_tokenizer(str(tmp_path / "base"))  # no chat template: plain prompts; text round-trips, newlines too
    load = lambda *a, **k: g.load_data(g.Config(dataset="builtin", task="calculator", max_prompt_tokens=1024, **k))
    with contextlib.redirect_stdout(io.StringIO()) as said:
        _, train, evals, _ = load(model=str(tmp_path / "base"))
    for r in (train[0], evals[0]):
        assert tok.decode(r["ids"]) == CALC_EXAMPLE + f"{r['question']}\n{CALC_INSTRUCTION}\n"
        assert r["text"] == f"{r['question']}\n{CALC_INSTRUCTION}"  # the episode's first message: no example in it
    assert ("prompt format: plain ('question\\ninstruction\\n'), each question after a worked episode of the task "
            "(--example); a reply ends at '\\n' (--stop)") in said.getvalue()
    _, off, _, _ = load(model=str(tmp_path / "base"), example="off")
    assert tok.decode(off[0]["ids"]) == f"{off[0]['question']}\n{CALC_INSTRUCTION}\n"
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok.save_pretrained(str(tmp_path / "chat"))
    turn = lambda role, text: f"<|im_start|>{role}\n{text}<|im_end|>\n"
    with contextlib.redirect_stdout(io.StringIO()) as said:
        _, chat, _, _ = load(model=str(tmp_path / "chat"))
    q = f"{chat[0]['question']}\n{CALC_INSTRUCTION}"
    assert tok.decode(chat[0]["ids"]) == turn("user", q) + "<|im_start|>assistant\n"
    assert "--example" not in said.getvalue()
    _, on, _, _ = load(model=str(tmp_path / "chat"), example="on")
    q = f"{on[0]['question']}\n{CALC_INSTRUCTION}"
    assert tok.decode(on[0]["ids"]) == (turn("user", f"What is 347 * 29?\n{CALC_INSTRUCTION}") +
                                        turn("assistant", "calc: 347 * 29") + turn("user", "10063") +
                                        turn("assistant", "347 * 29 = 10063") + turn("user", q) +
                                        "<|im_start|>assistant\n")
    with pytest.raises(g.UserError, match=re.escape("--example on: --task arithmetic has no worked example to show: "
                                                    "give its Task one (example=, reward_fns.py), or drop --example")):
        g.load_data(g.Config(model=str(tmp_path / "base"), dataset="builtin", task="arithmetic", example="on"))


@pytest.mark.parametrize("name, answer", [("calculator", "10063"), ("guess", "11")])
def test_the_built_in_worked_examples_replay_through_their_environments_and_win(name, answer):
    """Each built-in example is an episode its environment plays: after each reply the environment says the example's
    next message, and after the last reply it ends the episode (None); the last reply is right, and earns reward 1."""
    task, steps = reward_fns.TASKS[name], 0
    ex = task.example
    assert [m["role"] for m in ex] == ["user", "assistant"] * (len(ex) // 2) and len(ex) // 2 <= task.max_turns
    for k in range(1, len(ex), 2):  # each reply: what the environment answers to the episode up to it
        said = task.env(copy.deepcopy(ex[: k + 1]), answer)
        assert said == (ex[k + 1]["content"] if k + 1 < len(ex) else None), (k, said)
        steps += 1
    assert steps == {"calculator": 2, "guess": 4}[name] and task.correct(ex[-1]["content"], answer)
    assert reward_fns.REWARD_FNS[task.reward](ex[-1]["content"], answer, {"messages": ex}) == 1.0


@pytest.mark.parametrize("example, says", [
    ("What is 2 * 3?", "its example is 'What is 2 * 3?', no episode: write it as an episode's messages"),
    ([], "its example is [], no episode: write it as"),
    ([{"role": "assistant", "content": "calc: 2 * 3"}], "its example's message 0 is {'role': 'assistant', 'content': "
     "'calc: 2 * 3'}, where the user's belongs ({'role': 'user', 'content': a text that is not blank}): write it as"),
    (["What is 2 * 3?", "calc: 2 * 3"], "its example's message 0 is 'What is 2 * 3?', where the user's belongs"),
    ([{"role": "user", "content": "What is 2 * 3?"}, {"role": "user", "content": "calc: 2 * 3"}],
     "its example's message 1 is {'role': 'user', 'content': 'calc: 2 * 3'}, where the assistant's belongs"),
    ([{"role": "user", "content": "What is 2 * 3?"}, {"role": "assistant", "content": " "}],
     "its example's message 1 is {'role': 'assistant', 'content': ' '}, where the assistant's belongs"),
    (reward_fns.episode("What is 2 * 3?", "calc: 2 * 3", "6"), "its example ends with the user's message '6', and an "
     "episode ends with the model's last reply (the assistant's): write it as"),
    (reward_fns.episode("Q", "calc: 1", "1", "calc: 1", "1", "calc: 1", "1", "1"), "its example has 4 replies, and its "
     "episodes at most max_turns=3: show an episode that fits, or raise max_turns")])
def test_a_tasks_worked_example_that_is_no_episode_is_one_clear_error_at_start(tiny_model, example, says):
    """A student's example of another shape (a str, a list of texts, the roles out of turn, a blank reply, no last
    reply, more replies than max_turns) is one error at start that names the task and shows an example's shape."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(reward_fns.TASKS, "mine", dataclasses.replace(reward_fns.TASKS["calculator"], example=example))
        with pytest.raises(g.UserError) as e:
            g.load_data(g.Config(model=tiny_model, dataset="builtin", task="mine"))
    assert str(e.value).startswith(f"--task mine (TASKS['mine'] in reward_fns.py): {says}"), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("base, reply, flags, says", [
    (True, None, {"max_turns": 1}, "--max_turns 1: the worked example of --task mine, before each question (--example "
                                   "auto), takes 2 replies, and this run's episodes at most 1: raise --max_turns to 2 "
                                   "or more, or --example off"),
    (False, None, {"max_turns": 1, "example": "on"}, "--max_turns 1: the worked example of --task mine, before each "
                                                     "question (--example on), takes 2 replies"),
    (True, "347 * 29\n= 10063", {}, "--task mine's worked example, before each question (--example auto), has the "
                                    "reply '347 * 29\\n= 10063', which holds '\\n', where a reply ends (--stop auto: "
                                    "plain prompts of episodes end a reply at a newline): the model would learn from "
                                    "replies it cannot write. Write each reply of its Task.example on one line "
                                    "(reward_fns.py), or --example off"),
    (False, None, {"stop": "*", "example": "on"}, "--task mine's worked example, before each question (--example on), "
                                                  "has the reply 'calc: 347 * 29', which holds '*', where a reply ends "
                                                  "(--stop *): the model would learn from replies it cannot write. "
                                                  "Drop '*' from --stop, write the example's replies without it "
                                                  "(reward_fns.py), or --example off"),
    (True, None, {"max_turns": 2}, None), (False, "347 * 29\n= 10063", {}, None),  # fits; a chat prompt: no example
    (True, "347 * 29\n= 10063", {"example": "off"}, None), (False, "347 * 29\n= 10063", {"example": "on"}, None)])
def test_a_worked_example_this_runs_limits_cannot_follow_is_one_clear_error(tmp_path, base, reply, flags, says):
    """The example before each question is an episode the model learns the protocol from: one of more replies than
    --max_turns allows, or with a reply that holds a string where replies end (plain prompts of episodes end one at a
    newline: 'write each reply on one line' was checked nowhere), taught replies the run cannot sample. Each is one
    error; an example not shown (a chat prompt, --example off) or that fits is fine."""
    model = build_tiny(str(tmp_path / "m"), chat_template=not base)
    calc = reward_fns.TASKS["calculator"]
    example = reward_fns.episode("What is 347 * 29?", "calc: 347 * 29", "10063", reply or "347 * 29 = 10063")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(reward_fns.TASKS, "mine", dataclasses.replace(calc, example=example,
                                                                 rows=lambda: reward_fns.calculator_rows(n=40)))
        load = lambda: g.load_data(g.Config(model=model, dataset="builtin", task="mine", max_prompt_tokens=1024,
                                            **flags))
        if says is None:
            assert load()[3]["mine"].max_turns == flags.get("max_turns", 3)
        else:
            with pytest.raises(g.UserError) as e:
                load()
            assert str(e.value) == says or str(e.value).startswith(says), str(e.value)


def test_a_base_model_trains_the_calculator_with_its_worked_example_in_every_prompt_the_server_gets(tmp_path):
    """--task calculator on a base model, end to end: the server's every request of the step starts with the ids of
    the worked example and the question as text (computed here from the text), and the step trains."""
    base = build_tiny(str(tmp_path / "base"), chat_template=False)
    s = StandIn(base)
    try:
        code, out = run(train_cmd(base, s.url, tmp_path / "run", "--task", "calculator", "--dataset", "builtin",
                                  "--steps", "1", "--max_new_tokens", "12", "--max_reply_tokens", "4",
                                  "--eval_every", "0", "--save_every", "0"))
    finally:
        s.close()
    assert code == 0 and "each question after a worked episode of the task (--example)" in out, out
    # the word-level tokenizer reads every 'What is a * b?' of the task alike (each number one unknown word)
    want = tuple(s.tok(CALC_EXAMPLE + f"What is 123 * 45?\n{CALC_INSTRUCTION}\n")["input_ids"])
    asked = [p for r in s.rollouts for p in r]
    assert asked and all(p[: len(want)] == want for p in asked) and want in asked, (want, asked[:1])
    assert len([r for r in read_metrics(tmp_path / "run") if "loss" in r]) == 1


# ---------------------------------------------------------------------------------------------
# 17. against a real SGLang server on a GPU (skipped where there is no GPU or no SGLang: CI is CPU-only)
#    GRPO_TEST_MODEL (or the GPU kit's KIT_MODEL_DIR) names a small model; serve.sh is started on the
#    last GPU (or reused if GRPO_TEST_PIDFILE's server is already up), the trainer runs on GPU 0.

@gpu
@pytest.mark.parametrize("sync", ["tensor", "nccl"])
def test_gpu_real_server_holds_exactly_the_trainers_weights(real_server, tmp_path, sync):
    import requests
    if sync == "nccl" and real_server["colocate"]:
        pytest.skip("NCCL needs the server on a second GPU")
    flags = ["--colocate"] if real_server["colocate"] else ["--server_gpu", str(real_server["gpu"])]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", f"--master_port={free_port()}",
           os.path.join(HERE, "grpo_sglang.py"), "--model", real_server["model"], "--server_url", real_server["url"],
           "--sync", sync, "--dataset", "builtin", "--steps", "3", "--prompts_per_step", "8", "--group_size", "4",
           "--max_new_tokens", "32", "--lr", "1e-5", "--eval_every", "0", "--eval_size", "32", "--out_dir", str(tmp_path),
           "--no-async", *flags]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0") if sync == "nccl" else None  # the server's GPU hidden, as on another host
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=HERE)
    out = p.stdout + p.stderr
    print(out[-3000:])
    assert p.returncode == 0, out
    assert f"weight sync: {sync}" in out
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert [r["sampled_from_version"] for r in m] == [0, 1, 2]  # every rollout came from the version it had to
    assert all(r["mismatch_mean"] < g.Config.mismatch_max for r in m)
    import re
    k, n = map(int, re.search(r"weight check: (\d+) of (\d+) tensors of the server", out).groups())
    assert k == n > 0 and all(r["weights_checked"] == n for r in m)  # every tensor it holds (fused ones too) compared
    trainer = ckpt_weights(tmp_path)
    last = max(int(n.split(".")[2]) for n in trainer if n.startswith("model.layers."))
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight",
                 f"model.layers.{last}.mlp.down_proj.weight"):
        r = requests.post(real_server["url"] + "/get_weights_by_name", json={"name": name, "truncate_size": 16}, timeout=60)
        served = torch.tensor(r.json(), dtype=torch.float32)
        assert torch.equal(served, trainer[name][:16].to(torch.bfloat16).float()), name


@gpu
@pytest.mark.parametrize("layout", ["tp2_colocated", "two_servers_tensor", "two_servers_nccl"])
def test_gpu_real_several_servers_hold_exactly_the_trainers_weights_on_every_rank(tmp_path, layout):
    """Servers started beforehand (as `git show 0e3eade:results/run_x2.sh` did, PHASES=multi): GRPO_TEST_TP_URL, a
    TP-2 server over GPUs 0-1; GRPO_TEST_TWO_URLS, two servers on GPU 1; both serving GRPO_TEST_MULTI_MODEL. The
    trainer on GPU 0 (colocated with the TP server, tensor path; with the two servers: tensor, and NCCL with their GPU
    hidden) runs 3 steps; AdamW's weight decay moves every weight by 1% a step (more than bf16 rounds away), whatever
    the rewards of a random model. Then every rank of every server holds exactly the trainer's weights: its checksums
    (/weights_checker, per rank) do not change when the server loads the trainer's checkpoint from disk with its own
    loader, and they do when it loads the model the run started from."""
    import requests
    model, urls = os.environ.get("GRPO_TEST_MULTI_MODEL"), os.environ.get(
        "GRPO_TEST_TP_URL" if layout == "tp2_colocated" else "GRPO_TEST_TWO_URLS")
    if not model or not urls:
        pytest.skip("start the servers first: GRPO_TEST_TP_URL, GRPO_TEST_TWO_URLS and GRPO_TEST_MULTI_MODEL (this "
                    "test's docstring)")
    flags = {"tp2_colocated": ["--server_gpu", "0+1", "--colocate", "--sync", "tensor"],
             "two_servers_tensor": ["--server_gpu", "1,1", "--sync", "tensor"],
             "two_servers_nccl": ["--server_gpu", "1,1", "--sync", "nccl"]}[layout]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", f"--master_port={free_port()}",
           os.path.join(HERE, "grpo_sglang.py"), "--model", model, "--server_url", urls, "--dataset", "builtin", "--steps", "3",
           "--prompts_per_step", "8", "--group_size", "4", "--max_new_tokens", "32", "--lr", "0.1", "--weight_decay", "0.1",
           "--eval_every", "0", "--eval_size", "32", "--out_dir", str(tmp_path), "--no-async", *flags]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0") if layout == "two_servers_nccl" else None  # as on another host
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=HERE)
    out = p.stdout + p.stderr
    print(out[-3000:])
    assert p.returncode == 0, out
    assert f"weight sync: {flags[-1]}" in out
    m = [r for r in read_metrics(tmp_path) if "reward_mean" in r]
    assert [r["sampled_from_version"] for r in m] == [0, 1, 2] and all(r["check_mismatch_mean"] < 0.1 for r in m)
    ckpt = g.latest_checkpoint(str(tmp_path))
    for url in urls.split(","):
        checksums = lambda: sorted((r["parallelism_info"]["tp_rank"], r["per_gpu_checksum"]) for r in requests.post(
            url + "/weights_checker", json={"action": "checksum"}, timeout=300).json()["ranks"])
        pushed = checksums()
        loaded = []
        for path in (ckpt, model):
            r = requests.post(url + "/update_weights_from_disk", json={"model_path": path}, timeout=600).json()
            assert r["success"], r
            loaded.append(checksums())
        print(url, pushed, loaded)
        assert len(pushed) == (2 if layout == "tp2_colocated" else 1) and pushed == loaded[0], (url, pushed, loaded)
        assert all(a != b for a, b in zip(pushed, loaded[1])), "the weights did not move: the test proves nothing"



# ---------------------------------------------------------------------------------------------
# 18. inputs once taken without a word, one-line bugs no test saw, the finish of a cut last reply

def data_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_stop_strings_keep_any_character_as_written_and_read_only_escapes():
    """--stop '。,\\n': the escape is read, the ideographic full stop (and an emoji) stays itself, not its UTF-8 bytes
    read as Latin-1 ('ã\x80\x82'), which no reply ever holds."""
    assert g.stop_strings("。,\\n,a\\tb,😀", "chat", 1) == ["。", "\n", "a\tb", "😀"]
    assert g.stop_strings("終わり", "plain", 3) == ["終わり"]


@pytest.mark.parametrize("flag, says", [
    ("calculator:\\n", "--stop 'calculator:\\n': 'calculator:\\n' reads as a stop string of --task calculator, but "
                        "--stop is one list for every task, and would end a reply at the text 'calculator:\\n': give "
                        "the strings alone, for all tasks (--stop '\\n'), or --stop auto: each task's own"),
    ("\\n\\n,arithmetic: ###", "'arithmetic: ###' reads as a stop string of --task arithmetic, but --stop is one list "
                              "for every task, and would end a reply at the text 'arithmetic: ###': give the strings "
                              "alone, for all tasks (--stop '\\n\\n,###'), or --stop auto: each task's own")])
def test_a_stop_string_spelled_per_task_is_one_clear_error_and_a_colon_elsewhere_is_a_string(flag, says):
    """--stop has one form for all tasks; 'calculator:\\n' (as if per task) was taken as the literal text
    'calculator:' and a newline, which no reply ends with, without a word."""
    with pytest.raises(g.UserError) as e:
        g.stop_strings(flag, "plain", 3)
    assert str(e.value).endswith(says), str(e.value)
    assert g.stop_strings("calc:,Answer: ,a:b", "plain", 3) == ["calc:", "Answer: ", "a:b"]  # no task's name


def test_a_stop_string_the_answers_hold_is_warned_at_start_naming_the_flag(tiny_model, tmp_path, capsys):
    """--stop 0 where the answers are 10, 20, ...: a reply would stop before its answer; the start says so, naming
    --stop. A stop string no answer holds says nothing; a numeric task looks at the answers' numbers only."""
    rows = [{"question": f"What is {k} + {k}?", "answer": str(20 * k)} for k in range(1, 21)]
    cfg = lambda stop, **kw: g.Config(model=tiny_model, dataset=data_file(tmp_path / "d.jsonl", rows), task="arithmetic",
                                      stop=stop, eval_size=2, **kw)
    g.load_data(cfg("0"))
    assert "warning: --stop '0': the answers hold '0'" in capsys.readouterr().out
    g.load_data(cfg("x,\\n\\n"))
    assert "warning: --stop" not in capsys.readouterr().out
    rows = [{"question": f"What is {k} + 3?", "answer": f"so it is\n#### {k + 3}"} for k in range(20)]  # its number
    g.load_data(g.Config(model=tiny_model, task="gsm8k", stop="\\n", eval_size=2,
                         dataset=data_file(tmp_path / "e.jsonl", rows)))
    assert "warning: --stop" not in capsys.readouterr().out


def test_exact_keeps_the_vowel_signs_of_indic_scripts_and_choice_reads_full_width_letters():
    """exact: punctuation is Unicode's (P*, S*, Z*), so the vowel signs of Devanagari (M*) are part of their word:
    दील and दिल are different words; the danda '।' is punctuation. choice: NFKC first, so 'Ｂ' is B (a full-width answer
    is a letter, not a skipped row)."""
    assert not reward_fns.exact_correct("दील", "दिल") and reward_fns.exact_correct("दिल।", "दिल")
    assert reward_fns.exact_correct("The Eiffel-Tower!", "eiffel tower") and reward_fns.exact_correct("கா", "கா.")
    assert reward_fns.choice_correct("The answer is Ｂ", "B") and reward_fns.choice_correct("(B)", "Ｂ")
    assert not reward_fns.choice_correct("Ａ", "B") and reward_fns.letter_problem("Ｃ") is None


def test_numpy_bools_from_a_reward_are_numbers():
    """The docs say bools are fine: numpy's (a reward written with numpy comparisons) too, without a warning."""
    import numpy as np
    warn = {}
    assert reward_fns.safe_reward(lambda c, a: np.bool_(True), "x", "y", warn) == 1.0
    assert reward_fns.safe_reward(lambda c, a: np.int64(3) == 3, "x", "y", warn) == 1.0
    assert reward_fns.safe_reward(lambda c, a: np.bool_(False), "x", "y", warn) == 0.0 and warn == {}


def test_a_rows_task_field_naming_another_task_is_refused_and_any_other_is_said_to_be_unread(tiny_model, tmp_path,
                                                                                            capsys):
    rows = [{"question": f"Capital {k}?", "answer": f"city{k}", "task": "choice"} for k in range(20)]
    cfg = g.Config(model=tiny_model, dataset=data_file(tmp_path / "d.jsonl", rows), task="exact", eval_size=2)
    with pytest.raises(g.UserError, match=r"20 rows name the task 'choice' in their 'task' field, and this run trains "
                                          r"--task exact alone. Pass --task exact,choice to train both \(each row by its "
                                          r"task\), --task choice, or drop those rows"):
        g.load_data(cfg)
    rows = [dict(r, task="geography") for r in rows]
    g.load_data(dataclasses.replace(cfg, dataset=data_file(tmp_path / "e.jsonl", rows)))
    assert ("note: the rows' 'task' field (geography) names no task of reward_fns.py, and is not read: --task exact "
            "scores them") in capsys.readouterr().out


def test_a_task_or_reward_registered_as_auto_is_refused_naming_the_keyword(tmp_path, monkeypatch):
    monkeypatch.setitem(reward_fns.TASKS, "auto", reward_fns.TASKS["arithmetic"])
    with pytest.raises(g.UserError, match=r"reward_fns.TASKS has an entry named 'auto', the keyword of --task"):
        g.check_config(g.Config(out_dir=str(tmp_path / "r")), 1)


def test_a_reward_part_named_like_a_trainer_metric_is_namespaced_or_refused(tiny_model, tmp_path, monkeypatch):
    """A dict reward's part 'mean' would overwrite reward_mean (the trainer's mean reward): it is logged as
    reward_<term>.mean. A reward registered as 'mean' in a mix is refused at start, naming it."""
    monkeypatch.setitem(reward_fns.REWARD_FNS, "halves", lambda c, a: {"mean": 0.5, "other": 0.25})
    monkeypatch.setitem(reward_fns.REWARD_FNS, "mean", lambda c, a: 1.0)
    seqs = table([{"ids": [4, 5], "answer": "1"}], [(COMPLETIONS[0], [-1.0] * 2, "stop")] * 2, KnownTok(), 2)
    m = g.Metrics()
    g.score(seqs, task_of(reward_fns.combine("halves", None, g.TAKEN_PARTS)), 2, m)
    assert seqs["reward"].tolist() == [0.75, 0.75]
    assert {k for k in m.sums if k.startswith("reward_") and "#" not in k} >= {"reward_halves.mean", "reward_other"}
    assert "reward_mean" not in m.sums
    with pytest.raises(g.UserError, match=r"--reward: 'mean': its part would be logged as reward_mean, which the "
                                          r"trainer logs itself"):
        g.load_data(g.Config(model=tiny_model, dataset="builtin", reward="arithmetic:1,mean:1"))
    # a part named like another term of the mix, in a run of one task (a mixed run renames it for the task names):
    # its entry overwrote that term's logged value (0.25 for arithmetic's 0.0 here), whichever came first
    monkeypatch.setitem(reward_fns.REWARD_FNS, "halves", lambda c, a: {"arithmetic": 0.25, "other": 0.5})
    for spec in ("arithmetic:1,halves:1", "halves:1,arithmetic:1"):
        m = g.Metrics()
        g.score(seqs, task_of(reward_fns.combine(spec, "arithmetic", g.TAKEN_PARTS)), 2, m)
        assert seqs["reward"].tolist() == [0.75, 0.75]
        got = {k: m.sums[k] / m.sums[k + "#n"] for k in m.sums if k.startswith("reward_") and k + "#n" in m.sums}
        assert got == {"reward_arithmetic": 0.0, "reward_halves.arithmetic": 0.25, "reward_other": 0.5}, spec


def test_flags_that_would_be_ignored_are_refused_naming_the_flag(tiny_model, tmp_path):
    """--min_lr_ratio with --lr_schedule constant; --max_reply_tokens above --max_new_tokens on a one-turn task."""
    with pytest.raises(g.UserError, match=r"--min_lr_ratio 0.1 is the end of a decay, and --lr_schedule is constant: "
                                          r"add --lr_schedule linear"):
        g.check_config(g.Config(min_lr_ratio=0.1, out_dir=str(tmp_path / "r")), 1)
    g.check_config(g.Config(min_lr_ratio=0.1, lr_schedule="cosine", out_dir=str(tmp_path / "r")), 1)
    with pytest.raises(g.UserError, match=r"--max_reply_tokens 9 is more than --max_new_tokens 8, which caps --task "
                                          r"arithmetic's one reply"):
        g.load_data(g.Config(model=tiny_model, dataset="builtin", max_new_tokens=8, max_reply_tokens=9))


def test_an_environment_that_returns_an_empty_message_ends_the_episode_with_a_named_warning(tiny_model):
    """'' (or blanks) as the next user message: the episode ends there (finish from the server), with a counted
    warning that says so, not empty user turns up to max_turns."""
    tok, task = tiny_task(tiny_model, lambda m, a: "  ")
    IS, END = tok.convert_tokens_to_ids(["is", "<|im_end|>"])
    batch = g.rollout(g.Config(group_size=1, max_new_tokens=14), Scripted([[([IS, END], "stop")]]), task,
                      [{"ids": [4, 5], "answer": "1", "text": "What", "task": "t"}], 0)
    (e,) = batch["episodes"]
    assert (e["turns"], e["finish"], e["completion"]) == (1, "stop", [IS, END])
    assert dict(batch["warnings"]) == {"<lambda>: returned '  ', an empty message (the episode ends; return None to end "
                                       "it, or say something)": 1}


def test_serve_sh_names_servers_0_and_tp_0(tmp_path):
    for settings, says in (({"SERVERS": "0"}, "SERVERS=0 starts no server: write SERVERS=1"),
                           ({"TP": "0"}, "TP=0 gives a server no GPU: write TP=1")):
        p, env = _serve_sh(tmp_path, **settings)
        try:
            assert p.returncode == 1 and says in p.stderr and "GPU" not in p.stderr.replace("no GPU", ""), p.stderr
            assert not (tmp_path / "argv").exists()
        finally:
            _serve_sh_stop(env)


def test_an_out_dir_inside_the_dataset_folder_is_refused_naming_both(tmp_path):
    (tmp_path / "rows").mkdir()
    with pytest.raises(g.UserError, match=r"--out_dir .*rows.runs.a is inside --dataset .*rows: the run's files would "
                                          r"be read as rows"):
        g.check_config(g.Config(dataset=str(tmp_path / "rows"), out_dir=str(tmp_path / "rows" / "runs" / "a")), 1)
    g.check_config(g.Config(dataset=str(tmp_path / "rows"), out_dir=str(tmp_path / "rows2")), 1)  # a prefix is not in


def test_the_async_check_at_a_temperature_counts_only_the_sampled_tokens_of_episodes(tiny_model, server):
    """--async at temperature 0.7 on episodes (tokens of mask 0 inside the completions: the environment's): the
    re-scored check's gap is counted on the tokens the model sampled only, the same count as the mask's."""
    import torch.distributed as dist
    from types import SimpleNamespace
    batch = known_batch(0.7)
    for e in batch["episodes"]:  # the middle tokens of the longer ones are the environment's
        e["mask"] = [1] + [0] * (len(e["completion"]) - 2) + [1] if len(e["completion"]) > 2 else e["mask"]
    dist_init()
    try:
        srv = g.Server.__new__(g.Server)
        srv.cfg = g.Config(check_seqs=12, group_size=4, server_url=server.url)
        srv.rt, srv.urls, srv.link = SimpleNamespace(rank=0, world=1, device=torch.device("cpu")), [server.url], None
        server.version = "1"
        check, m = srv.check(batch, 1, sharded(tiny_model), 0), g.Metrics()
        check(g.sequences(batch, 4, "cpu"), m)
        got = m.reduce("cpu")
    finally:
        dist.destroy_process_group()
    sampled = sum(sum(e["mask"]) for e in batch["episodes"])
    assert sampled < sum(len(c) for c in COMPLETIONS)  # (else the test proves nothing)
    assert m.sums["check_mismatch_mean#n"] == sampled and 0 < got["check_mismatch_mean"] < 0.01, (m.sums, sampled)


def test_lora_a_starts_at_the_scale_peft_gives_it():
    """A ~ U(-b, b) with b PEFT's (kaiming_uniform_ with a = sqrt(5)): b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 +
    a^2)), so b = 1 / sqrt(fan_in); B is 0."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(400, 8)

        def get_output_embeddings(self):
            return None
    net = g.add_lora(Net(), 64, 16.0, ["q_proj"])
    a, fan_in = net.q_proj.lora_A.detach(), 400
    bound = math.sqrt(2 / (1 + 5)) * math.sqrt(3 / fan_in)
    assert a.abs().max() <= bound and a.abs().max() > 0.99 * bound, (a.abs().max(), bound)
    assert abs(a.std().item() - bound / math.sqrt(3)) < 0.02 * bound, (a.std(), bound)
    assert not net.q_proj.lora_B.any() and net.q_proj.lora_scale == 16.0 / 64


def test_checkpoints_are_ordered_by_step_not_by_name(tmp_path):
    """step_9 beside step_10: --keep_checkpoints 2 at step 11 deletes step_9; a resume whose latest is gone names
    step_10 as the last complete one."""
    for n in (9, 10):
        (tmp_path / f"step_{n}").mkdir()
        torch.save({"step": n}, tmp_path / f"step_{n}" / "trainer_state.pt")
        (tmp_path / f"step_{n}" / "config.json").write_text("{}")
    assert g.old_checkpoints(str(tmp_path), 11, 2) == [str(tmp_path / "step_9")]
    (tmp_path / "latest").write_text("step_11")
    with pytest.raises(g.UserError, match=r"Complete checkpoints here: step_9, step_10; to resume from the last one: "
                                          r"echo step_10 > "):
        g.checkpoint_to_resume(str(tmp_path))


def test_a_lock_file_left_with_a_dead_pid_neither_blocks_nor_is_named(tmp_path):
    """A run killed leaves its pid in out_dir/.lock; the next run takes the lock (the kernel freed it) and writes its
    own pid over it, so a third is refused naming the live run's pid only."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(f"{dead.pid}\n")
    f = g.lock_out_dir(str(tmp_path))
    try:
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(g.UserError, match=rf"is in use by another run \(pid {os.getpid()}\)"):
            g.lock_out_dir(str(tmp_path))
    finally:
        f.close()


def test_stop_auto_comes_from_the_tasks_turns_not_the_max_turns_flag(tmp_path):
    """Plain prompts: a task of episodes (guess: 5 turns, --max_turns 0) ends its replies at a newline, a one-turn task
    at a blank line."""
    base = build_tiny(str(tmp_path / "base"), chat_template=False)
    _, _, _, task = one_task(g.load_data(g.Config(model=base, dataset="builtin", task="guess")))
    assert task.max_turns == reward_fns.GUESS_TURNS and task.stop == ["\n"]
    _, _, _, task = one_task(g.load_data(g.Config(model=base, dataset="builtin", task="arithmetic")))
    assert task.stop == ["\n\n"]


def test_a_last_reply_cut_by_the_token_budget_finishes_length_and_is_truncated(tiny_model):
    """Two turns; the environment always answers. A last reply cut by the budget (the server says 'length') ends the
    episode 'length': truncated 1, counted by truncated_frac, dropped by --mask_truncated, not out of room. A last
    reply that stopped ends it 'turns'."""
    tok, task = tiny_task(tiny_model, lambda m, a: "the number ?", max_turns=2)
    IS, END, WHAT = tok.convert_tokens_to_ids(["is", "<|im_end|>", "What"])
    rows = [{"ids": [4, 5], "answer": "1", "text": "What", "task": "t"}]
    server = Scripted([[([IS, END], "stop"), ([IS, END], "stop")], [([WHAT, IS, WHAT], "length"), ([IS, END], "stop")]])
    cfg = g.Config(group_size=2, max_new_tokens=30, max_reply_tokens=3, mask_truncated=True)
    batch = g.rollout(cfg, server, task, rows, 0)
    assert [(e["turns"], e["finish"], e["out_of_room"]) for e in batch["episodes"]] == [(2, "length", False),
                                                                                         (2, "turns", False)]
    seqs = g.sequences(batch, 2, "cpu")
    m = g.Metrics()
    g.score(seqs, task_of(lambda s, w: (1.0 if s["finish"] == "turns" else 0.0, {})), 2, m)
    assert seqs["truncated"].tolist() == [1, 0] and m.sums["truncated_frac"] / m.sums["truncated_frac#n"] == 0.5
    assert g.weights(cfg, seqs).tolist() == [0, 1]


@pytest.mark.parametrize("flags, says", [
    (("--train_split", "train"), "--train_split names a part of a dataset on the HF hub, and --dataset builtin is the "
                                 "task's own rows: drop --train_split"),
    (("--dataset", "data/capitals.jsonl", "--prompt_field", "problem", "--answer_field", "solution", "--eval_split",
      "test"), "--eval_split names a part of a dataset on the HF hub, and --dataset data/capitals.jsonl is one file, "
               "with no splits: drop --eval_split"),
    (("--dataset", "FOLDER", "--dataset_config", "main"), "--dataset_config names a part of a dataset on the HF hub, "
                                                          "and --dataset FOLDER is a local folder, with no config: "
                                                          "drop --dataset_config"),
    (("--out_dir", "OUT "), "--out_dir 'OUT ' is blank or starts or ends with a blank: name the run's folder without "
                            "them (e.g. runs/grpo)")])
def test_a_dataset_flag_the_dataset_has_no_use_for_and_a_blank_out_dir_are_one_clear_error(tiny_model, server, tmp_path,
                                                                                         flags, says):
    """--train_split, --eval_split and --dataset_config name the parts of a hub dataset: given for the built-in rows, one
    file or a local folder (its splits are its files), they were ignored without a word. An --out_dir of blanks made a
    folder of that name in the working directory."""
    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"question": f"{k} + 1", "answer": str(k + 1)}) + "\n"
                                                for k in range(20)))
    names = {"FOLDER": str(folder), "OUT": str(tmp_path / "run")}
    flags, says = [names.get(f, f).replace("OUT", names["OUT"]) for f in flags], says.replace("FOLDER", str(folder))
    cmd = train_cmd(tiny_model, server.url, tmp_path / "run", "--steps", "1")
    if "--out_dir" in flags:  # (train_cmd names one: this one replaces it)
        cmd[cmd.index("--out_dir") + 1], flags = flags[1], []
    code, out = run(cmd + flags)
    assert code == 1 and out.strip().splitlines()[-1] == "error: " + says.replace("OUT", names["OUT"]), out
    assert not (tmp_path / "run ").exists()


# 19. several tasks in one run: each row's task, groups of one task, per-task metrics, the weights, resume

def two_tasks(tiny_model):
    """Two tasks as load_data builds them on the tiny model's tokenizer: 'a' of one reply (stop 'x'; reward 1 when the
    reply holds 'number'; right when it is 'number') and 'b' of up to 2 replies (its environment asks once; no stop;
    reward 2 when the last reply holds 'is'; never right)."""
    from types import SimpleNamespace
    tok, tasks = tiny_task(tiny_model, lambda m, a: "the number ?" if len(m) < 3 else None, max_turns=2)
    b = SimpleNamespace(**vars(tasks["t"]), reward_fn=lambda row, w: (2.0 * ("is" in row["text"].split()), {}),
                        correct=lambda c, a: False)
    a = SimpleNamespace(**{**vars(b), "env": None, "max_turns": 1, "stop": ["x"], "correct": lambda c, ans: c == "number",
                           "reward_fn": lambda row, w: (1.0 * ("number" in row["text"].split()), {"a_part": 1.0})})
    return tok, {"a": a, "b": b}


def test_a_mixed_batch_is_each_tasks_own_rollout_with_its_rewards_checks_and_turns(tiny_model):
    """rollout() and score() of one row of task 'a' and one of task 'b' in one batch, groups of 2: each episode asks
    with its task's stop strings, the 'b' episodes take a second turn and the 'a' ones do not, and each reward, check
    and turn count is its task's (hand values). The mixed batch's episodes are each task's rows rolled out alone."""
    tok, tasks = two_tasks(tiny_model)
    IS, NUMBER, END = tok.convert_tokens_to_ids(["is", "number", "<|im_end|>"])
    rows = [{"ids": [4, 5], "answer": "1", "text": "A?", "task": "a"}, {"ids": [4, 6], "answer": "1", "text": "B?",
                                                                        "task": "b"}]
    turn1 = [([NUMBER, END], "stop"), ([IS, END], "stop"), ([NUMBER, END], "stop"), ([NUMBER, END], "stop")]
    turn2 = [([IS, END], "stop"), ([NUMBER, END], "stop")]  # the 'b' episodes only
    server = Scripted([turn1, turn2])
    cfg = g.Config(group_size=2, max_new_tokens=30)
    batch = g.rollout(cfg, server, tasks, rows, 0)
    assert server.stops == [[["x"], ["x"], [], []], [[], []]]  # each episode its task's; turn 2: the 'b' ones
    seqs = g.sequences(batch, 2, "cpu")
    m = g.Metrics()
    g.score(seqs, tasks, 2, m)
    assert seqs["task"] == ["a", "a", "b", "b"] and seqs["turns"].tolist() == [1, 1, 2, 2]
    assert seqs["reward"].tolist() == [1.0, 0.0, 2.0, 0.0] and seqs["correct"].tolist() == [1.0, 0.0, 0.0, 0.0]
    mean = lambda k: m.sums[k] / m.sums[k + "#n"]
    assert (mean("reward_a"), mean("reward_b"), mean("accuracy_a"), mean("accuracy_b")) == (0.5, 1.0, 0.5, 0.0)
    assert (mean("turns_a"), mean("turns_b"), mean("reward_a_part")) == (1.0, 2.0, 1.0)  # a part: over its task's rows
    alone = {k: g.rollout(cfg, Scripted(s), {k: tasks[k]}, [r], 0)["episodes"] for k, r, s in (
        ("a", rows[0], [turn1[:2]]), ("b", rows[1], [turn1[2:], turn2]))}
    assert batch["episodes"] == alone["a"] + alone["b"]
    # the evaluation (greedy, one episode a row): each task's numbers over its own rows, and all of them together
    got = g.evaluate(cfg, Scripted([[([NUMBER, END], "stop"), ([NUMBER, END], "stop")], [([IS, END], "stop")]]), tasks,
                     rows, 5)
    assert got == {"step": 5, "eval_accuracy": 0.5, "eval_reward": 1.5, "eval_turns_mean": 1.5,
                   "eval_accuracy_a": 1.0, "eval_reward_a": 1.0, "eval_turns_a": 1.0,
                   "eval_accuracy_b": 0.0, "eval_reward_b": 2.0, "eval_turns_b": 2.0}


def test_dynamic_sampling_over_several_tasks_keeps_each_group_one_task(tiny_model):
    """--dynamic_sampling draws rounds of rows of both tasks: every group of the batch it fills is one row's episodes,
    of one task, scored by that task's reward (which decides which groups are flat)."""
    tok, tasks = two_tasks(tiny_model)
    IS, NUMBER, END, WHAT = tok.convert_tokens_to_ids(["is", "number", "<|im_end|>", "What"])
    tasks["b"].max_turns, tasks["b"].env = 1, None  # one reply each here: one script call a round
    rows = [{"ids": [4, k], "answer": "1", "text": "?", "task": "ab"[k % 2]} for k in range(4)]
    r = lambda *w: [([{"n": NUMBER, "i": IS, "w": WHAT}[x], END], "stop") for x in w]
    # round 0: a (1, 1) flat; b (0, 0) flat by b's reward ('is'), though a's ('number') would call it 1, 0
    server = Scripted([r("n", "n", "n", "w"), r("n", "i", "i", "n")])  # round 1: a 1, 0; b 2, 0
    batch = g.sample_groups(g.Config(group_size=2, dynamic_sampling=2), server, tasks, [rows[:2], rows[2:]], 0)
    assert [e["task"] for e in batch["episodes"]] == ["a", "a", "b", "b"]  # round 1's, the groups whose rewards differ
    assert batch["groups"] == {"drawn": 4, "kept": 2, "rounds": 2}


@pytest.mark.parametrize("spec, says", [
    ("arithmetic,nope", r"--task 'nope' is not a task of reward_fns.py \(in --task 'arithmetic,nope'\): it must be auto"),
    ("arithmetic:0,calculator", r"arithmetic's weight '0' is not a positive number: a weight is the task's share"),
    ("arithmetic:-1,calculator:x", r"arithmetic's weight '-1' is not a positive number"),
    ("arithmetic:inf,calculator", r"arithmetic's weight 'inf' is not a positive number"),
    ("arithmetic,,calculator", r"has an empty task name"),
    ("arithmetic,arithmetic", r"names 'arithmetic' twice"),
    ("auto,calculator", r"auto picks one task by the dataset's answers: name each task of the run"),
    ("arithmetic:2", r"a weight is a task's share of the prompts among several tasks: with one task, drop ':2'"),
])
def test_a_task_list_with_an_unknown_name_or_a_bad_weight_is_one_error_at_start(spec, says, tmp_path):
    with pytest.raises(g.UserError, match=says):
        g.check_config(g.Config(task=spec, out_dir=str(tmp_path / "r")), 1)


def test_rows_naming_no_task_of_the_list_are_one_error_and_the_weights_set_each_tasks_share(tiny_model, tmp_path,
                                                                                            capsys):
    """A dataset of rows for two tasks: each row to its task's check (exact's rows are words, arithmetic's numbers);
    a row without a task, or naming one outside --task, is one error naming it. The weights 3:1 give a list of as
    many rows as there are, three quarters the first task's (its rows repeated), each row tagged with its task."""
    rows = ([{"question": f"What is {k} + 1?", "answer": str(k + 1), "task": "arithmetic"} for k in range(20)]
            + [{"question": f"Capital {k}?", "answer": f"city{k}", "task": "exact"} for k in range(20)])
    cfg = g.Config(model=tiny_model, dataset=data_file(tmp_path / "d.jsonl", rows), task="arithmetic:3,exact:1",
                   eval_size=4)
    _, train, evals, tasks = g.load_data(cfg)
    assert list(tasks) == ["arithmetic", "exact"] and tasks["exact"].correct is reward_fns.exact_correct
    n = collections.Counter(r["task"] for r in train)
    assert n["arithmetic"] + n["exact"] == 36 and n["arithmetic"] == 27  # 36 train rows, 3/4 of them arithmetic
    assert all(r["question"].startswith("What") == (r["task"] == "arithmetic") for r in train + evals)
    assert "by --task 'arithmetic:3,exact:1'; each group one task" in capsys.readouterr().out
    assert train == g.load_data(cfg)[1]  # the same mix every time (the seed's): a resumed run draws the same rows
    for bad, says in (({"question": "Q?", "answer": "1"}, r"a row has no 'task' field, and each row must name its "
                                                           r"task, one of --task arithmetic:3,exact:1"),
                      ({"question": "Q?", "answer": "1", "task": "choice"}, r"a row names the task 'choice', which is "
                                                                            r"not one of --task arithmetic:3,exact:1")):
        with pytest.raises(g.UserError, match=says):
            g.load_data(dataclasses.replace(cfg, dataset=data_file(tmp_path / "e.jsonl", rows + [bad])))


def mixed_folder(path, n_arithmetic, n_exact, n_eval=4):
    """A dataset folder of two tasks' rows, each naming its task: train.jsonl (n_arithmetic and n_exact rows) and
    test.jsonl (n_eval rows of each task, other questions)."""
    arithmetic = lambda ks: [{"question": f"What is {k} + 1?", "answer": str(k + 1), "task": "arithmetic"} for k in ks]
    exact = lambda ks: [{"question": f"Capital {k}?", "answer": f"city{k}", "task": "exact"} for k in ks]
    path.mkdir()
    data_file(path / "train.jsonl", arithmetic(range(n_eval, n_eval + n_arithmetic)) +
              exact(range(n_eval, n_eval + n_exact)))
    data_file(path / "test.jsonl", arithmetic(range(n_eval)) + exact(range(n_eval)))
    return str(path)


@pytest.mark.parametrize("spec, says", [
    ("arithmetic:1,exact:0.0001", "tasks: arithmetic 99.7% of the prompts (300 rows), exact 0.3% of the prompts (10 "
                                  "rows; its weight asks for 0.031 of the 311 prompts: it gets 1, the fewest a task "
                                  "gets), by --task 'arithmetic:1,exact:0.0001'; each group one task"),
    ("arithmetic:1e307,exact:1", "tasks: arithmetic 99.7% of the prompts (300 rows), exact 0.3% of the prompts (10 "
                                 "rows; its weight asks for 3.1e-305 of the 311 prompts: it gets 1, the fewest a task "
                                 "gets), by --task 'arithmetic:1e307,exact:1'; each group one task"),
    ("arithmetic:1e308,exact:1e308", "tasks: arithmetic 50% of the prompts (300 rows), exact 50% of the prompts (10 "
                                     "rows), by --task 'arithmetic:1e308,exact:1e308'; each group one task")])
def test_a_tasks_share_too_small_to_print_or_weights_that_would_overflow_are_said_as_they_are(tiny_model, tmp_path,
                                                                                              capsys, spec, says):
    """A share of one prompt in 311 read '0%' (and the other '100%'); weights whose sum overflows a float (1e307 x 310
    rows) raised OverflowError. Now the start line says each share with the decimals it needs, and that a task whose
    weight asks for less than one prompt gets one; the mix holds what the line says."""
    cfg = g.Config(model=tiny_model, dataset=mixed_folder(tmp_path / "d", 300, 10), task=spec, eval_size=4)
    _, train, _, _ = g.load_data(cfg)
    assert capsys.readouterr().out.count(says) == 1
    n = collections.Counter(r["task"] for r in train)
    assert (n["arithmetic"], n["exact"]) == ((310, 1) if "exact:1e308" not in spec else (155, 155))


def test_each_task_of_a_mixed_run_is_held_out_by_itself_and_a_task_left_without_eval_rows_says_why(tiny_model,
                                                                                                      tmp_path):
    """--eval_size 4 of an eval split whose first rows are all arithmetic's left exact without any, and the error said
    only 'no usable rows left for evaluation (--task exact) (skipped: {})'. Now each task's rows are held out by
    themselves (--eval_size of each); a split that holds no row of a task, or a file too small to hold any of a task's
    rows out, is one error that names the task and the fix."""
    cfg = g.Config(model=tiny_model, dataset=mixed_folder(tmp_path / "d", 30, 20, n_eval=6), task="arithmetic,exact",
                   eval_size=4)
    _, train, evals, _ = g.load_data(cfg)
    assert collections.Counter(r["task"] for r in evals) == {"arithmetic": 4, "exact": 4}
    assert [r["question"] for r in evals] == [f"What is {k} + 1?" for k in range(4)] + [f"Capital {k}?" for k in range(4)]
    data_file(tmp_path / "d" / "test.jsonl", [{"question": "What is 0 + 1?", "answer": "1", "task": "arithmetic"}])
    with pytest.raises(g.UserError, match=re.escape(f"--dataset {cfg.dataset}: its 'test' split holds no row of --task "
                                                    f"exact, so it could not be evaluated: add rows of --task exact to "
                                                    f"that split (each naming its task), or --eval_split '' to hold out "
                                                    f"10% of its training rows")):
        g.load_data(cfg)
    rows = ([{"question": f"What is {k} + 1?", "answer": str(k + 1), "task": "arithmetic"} for k in range(40)]
            + [{"question": f"Capital {k}?", "answer": f"city{k}", "task": "exact"} for k in range(9)])
    one_file = data_file(tmp_path / "one.jsonl", rows)  # no splits: 10% of each task's rows, and exact has 9
    with pytest.raises(g.UserError, match=re.escape(f"--dataset {one_file} has 9 row(s) of --task exact: too few to "
                                                    f"hold any out for evaluation (the file has no splits; 10% are held "
                                                    f"out, so it needs at least 10)")):
        g.load_data(dataclasses.replace(cfg, dataset=one_file))
    data_file(tmp_path / "one.jsonl", rows + [{"question": "Capital 9?", "answer": "city9", "task": "exact"}])
    _, train, evals, _ = g.load_data(dataclasses.replace(cfg, dataset=one_file))
    assert collections.Counter(r["task"] for r in evals) == {"arithmetic": 4, "exact": 1}  # min(4, 10%) of each
    assert collections.Counter(r["task"] for r in train) == {"arithmetic": 22, "exact": 22}  # 36 and 9: equal halves of 45


EPISODE_FLAGS = [{}, {"max_turns": 5}, {"max_turns": 2, "stop": "X,\\n"}, {"max_reply_tokens": 6},
                 {"example": "on"}, {"example": "off"}, {"max_turns": 4, "example": "on", "stop": "none"}]


@pytest.mark.parametrize("flags", EPISODE_FLAGS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "none")
@pytest.mark.parametrize("base", [True, False], ids=["plain", "chat"])
def test_a_mixed_runs_episode_flags_act_on_each_task_as_on_the_task_alone(tmp_path_factory, flags, base):
    """--task arithmetic,calculator with each run-wide episode flag (--max_turns, --max_reply_tokens, --stop,
    --example): each task gets what it would get alone -- its turns, stop strings and prompts (ids, question by
    question), and in the rollout each reply's token budget and stop strings. A flag that means nothing to a task is
    its default there, not a refusal: --max_turns for arithmetic (no environment; applied to every task it refused
    --max_turns 5), --example on for arithmetic (no worked example)."""
    d = tmp_path_factory.mktemp("flags")
    model = build_tiny(str(d / "m"), chat_template=not base)
    arithmetic = [{"question": f"What is {k} + 1?", "answer": str(k + 1), "task": "arithmetic"} for k in range(20)]
    calculator = [{"question": f"What is {k} * 3?", "answer": str(3 * k), "task": "calculator"} for k in range(20)]
    cfg = lambda data, task, **kw: g.Config(model=model, dataset=data_file(d / f"{task}.jsonl", data), task=task,
                                            eval_size=2, max_prompt_tokens=1024, max_new_tokens=12, **kw)
    mixed = g.load_data(cfg(arithmetic + calculator, "arithmetic,calculator", **flags))
    means = {"arithmetic": {k: v for k, v in flags.items() if k != "max_turns" and (k, v) != ("example", "on")},
             "calculator": flags}  # the flags that mean something to the task
    view = lambda loaded, name: (loaded[3][name].max_turns, loaded[3][name].stop,
                                 {r["question"]: r["ids"] for r in loaded[1] + loaded[2] if r["task"] == name})
    for name, rows in (("arithmetic", arithmetic), ("calculator", calculator)):
        alone = g.load_data(cfg(rows, name, **means[name]))
        assert view(mixed, name) == view(alone, name), name
    tasks = mixed[3]
    assert tasks["arithmetic"].max_turns == 1 and tasks["calculator"].max_turns == flags.get("max_turns", 3)
    stop = {"X,\\n": ["X", "\n"], "none": []}.get(flags.get("stop"))
    assert [tasks[n].stop for n in tasks] == ([stop, stop] if stop is not None else [["\n\n"], ["\n"]] if base
                                              else [[], []])
    without = view(g.load_data(cfg(calculator, "calculator", example="off")), "calculator")[2]  # its prompts bare
    shown = all(len(ids) > len(without[q]) for q, ids in view(mixed, "calculator")[2].items())
    assert shown == (flags.get("example") == "on" or base and "example" not in flags)  # auto: in plain prompts
    # the rollout: one row of each task, one episode each; both replies end the episode (no 'calc:')
    tok, run_cfg = mixed[0], cfg(arithmetic + calculator, "arithmetic,calculator", group_size=1, **flags)
    rows = [next(r for r in mixed[1] if r["task"] == n) for n in ("arithmetic", "calculator")]
    server = Scripted([[(tok("5", add_special_tokens=False)["input_ids"], "stop")] * 2])
    batch = g.rollout(run_cfg, server, tasks, rows, 0)
    assert server.asked[0][1] == [flags.get("max_reply_tokens", run_cfg.max_new_tokens)] * 2  # each reply's budget
    assert server.stops[0] == [tasks["arithmetic"].stop, tasks["calculator"].stop]
    assert [e["turns"] for e in batch["episodes"]] == [1, 1]


def epoch_draws(model, data, seed):
    """-> what each rank draws, step by step, over one epoch of --task arithmetic,exact of `data` (10 prompts a step
    over 2 ranks): [step][rank] -> the questions, in order."""
    cfg = g.Config(model=model, dataset=data, task="arithmetic,exact", eval_size=4, seed=seed)
    train = g.load_data(cfg)[1]
    n, per_step, world = len(train), 10, 2  # one epoch: n draws
    return [[[train[i]["question"] for r in g.rank_rounds(n, step, per_step, seed, rank, world) for i in r]
             for rank in range(world)] for step in range(n // per_step)]


def test_the_mix_uses_every_row_of_a_task_over_an_epoch_of_its_share_in_one_order_in_every_process(tiny_model, tmp_path):
    """--task arithmetic,exact, equal shares of 50 prompts: exact (10 rows, 25 prompts) trains on every row over an
    epoch, each 2 or 3 times; arithmetic (40 rows, 25 prompts) on 25 distinct rows drawn by the seed, not the first 25
    of its split (a mix that computed its shuffle and did not use it). What each rank draws, step by step over the
    epoch, is the same in a new process (as a resumed run is, with another hash seed) as in this one, and on each rank
    (a shuffle seeded by hash(name) differed from process to process): the ranks' draws of the epoch are the mix,
    each prompt once. (One new process, not one per draw: each takes ~8 s to import and load.)"""
    data = mixed_folder(tmp_path / "d", 40, 10)
    epoch = epoch_draws(tiny_model, data, 0)
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # not this process's
    show = (f"import json, sys; sys.path.insert(0, {HERE!r}); import test_smoke; "
            f"print(json.dumps([hash('exact'), test_smoke.epoch_draws({tiny_model!r}, {data!r}, 0)]))")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONHASHSEED=hash_seed)
    hashed, there = json.loads(subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True,
                                              timeout=120, check=True).stdout.strip().splitlines()[-1])
    assert hashed != hash("exact") and there == epoch  # another process, another hash: the same draws, rank by rank
    _, train, _, _ = g.load_data(g.Config(model=tiny_model, dataset=data, task="arithmetic,exact", eval_size=4))
    drawn = collections.Counter(q for step in epoch for rank in step for q in rank)
    assert drawn == collections.Counter(r["question"] for r in train)  # each prompt of the mix once over the epoch
    exact = {q: k for q, k in drawn.items() if q.startswith("Capital")}
    assert sorted(exact) == sorted(f"Capital {k}?" for k in range(4, 14)) and set(exact.values()) == {2, 3}
    arithmetic = [q for q in drawn if q.startswith("What")]
    first = [f"What is {k} + 1?" for k in range(4, 44)]  # its split's order
    assert len(arithmetic) == 25 == len(set(arithmetic)) and set(arithmetic) != set(first[:25])
    other = {q for step in epoch_draws(tiny_model, data, 1) for rank in step for q in rank if q.startswith("What")}
    assert other != set(arithmetic) and other != set(first[:25])  # another --seed, another draw


def test_a_mixed_run_logs_each_tasks_metrics_and_resumed_equals_one_that_never_stopped(tiny_model, tmp_path):
    """--task arithmetic,talk (one reply; episodes of the test's 'talk') against the stand-in: every step logs
    reward_, accuracy_ and turns_ of each task (turns_arithmetic 1, turns_talk 1 to 2 where drawn: a reply may use up
    the tokens), the evaluation each task's accuracy, and a run stopped after step 2 and resumed is, row for row and weight for weight, the one that
    never stopped."""
    mixed = ("--task", "arithmetic,talk", "--max_new_tokens", "24", "--eval_every", "4", "--reward", "has_number")
    (rows, w, s), (rows1, w1, s1) = stopped_and_resumed(tiny_model, tmp_path, *mixed).values()
    assert len(rows) == 4 and rows == rows1 and all(torch.equal(w[k], w1[k]) for k in w)
    for r in rows:
        assert {"reward_arithmetic", "accuracy_arithmetic", "turns_arithmetic", "reward_talk", "turns_talk"} <= set(r)
        assert r["turns_arithmetic"] in (None, 1.0) and (r["turns_talk"] is None or 1.0 <= r["turns_talk"] <= 2.0)
    evals = [r for r in read_metrics(tmp_path / "ref") if "eval_accuracy" in r]
    assert {"eval_accuracy_arithmetic", "eval_accuracy_talk", "eval_turns_talk"} <= set(evals[-1])
    assert evals[-1]["eval_turns_arithmetic"] == 1.0 and 1.0 <= evals[-1]["eval_turns_talk"] <= 2.0


def test_a_mixed_run_trains_on_two_ranks_with_async_and_lora(tiny_model, server, tmp_path):
    """--task arithmetic,talk on 2 ranks, --async, LoRA: it runs to the end, and each step logs both tasks' metrics,
    reduced over the ranks (a task one rank did not draw counts nothing there): arithmetic's episodes are one reply.
    What each rank asked the stand-in: its first turn, a request of its 4 rows' groups, each group 4 copies of one
    row (of one task), some requests holding both tasks; a second turn only for talk's episodes, whichever rank."""
    code, out = run(train_cmd(tiny_model, server.url, tmp_path, "--task", "arithmetic,talk", "--max_new_tokens", "24",
                              "--prompts_per_step", "8", "--async", "--lora_rank", "4", "--save_every", "0",
                              nproc=2, rewards=True), timeout=240)
    assert code == 0, out
    rows = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert len(rows) == 2 and all({"reward_talk", "accuracy_arithmetic", "turns_talk"} <= set(r) for r in rows)
    assert all(r["turns_arithmetic"] in (None, 1.0) for r in rows)
    assert "tasks: arithmetic 50% of the prompts" in out and "eval step 2 (--task talk)" in out
    from transformers import AutoTokenizer
    text = AutoTokenizer.from_pretrained(tiny_model).decode
    task = lambda p: "arithmetic" if "Answer with the number only" in text(p) else "talk"  # (its instruction)
    first = [q for q in server.rollouts if "What is the number" not in text(q[0])]  # (a second turn's holds it)
    later = [p for q in server.rollouts if q not in first for p in q]
    assert len(first) >= 4 and all(len(q) == 16 for q in first)  # 2 ranks x 2 steps at least (--async: one ahead)
    groups = [q[k:k + 4] for q in first for k in range(0, 16, 4)]
    assert all(len(set(gr)) == 1 for gr in groups)  # a group: one row's prompt 4 times
    assert any(len({task(p) for p in q}) == 2 for q in first)  # a rank's request of both tasks' groups
    assert later and all(task(p) == "talk" for p in later)  # the environment's turn: talk's episodes only


if __name__ == "__main__":  # python test_smoke.py N [pytest's flags]: section N's tests, each by its node id
    tests = [t for n, _, ts in sections() if sys.argv[1:2] == [str(n)] for t in ts]
    if not tests:
        sys.exit(f"usage: python test_smoke.py N [pytest's flags], N a section of 1-{len(sections())} (see the index)")
    ids = [f"{__file__}::{t}" for t in tests]
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", *sys.argv[2:], *ids]))
