"""Break one line of grpo_sglang.py at a time, in a scratch copy of the repo, and run the tests that guard
it: each must fail ("CAUGHT"). The mutations: the bugs of the first sync-check work, one per safeguard added since
(the TF32 head of c5458af, the checkpoint write error of 32cd255), the one-line bugs the exact-async-check issue put
into a copy of the script (its part 4), one per fix of that issue and of the layout issue (GSPO, entropy), several
servers, the resume-and-layouts issue (its one-line bugs and each safeguard, serve.sh's included), the step's table
and weights, the LM head's log-probs (HeadLogprobs), and the GRPO variants.

    python3 results/tools/mutation_check.py [name-substring ...]      # from the repo root, CPU only
    python3 results/tools/mutation_check.py --full [name-substring ...]  # the whole suite per mutation, not just -k
"""
import os, shutil, subprocess, sys, tempfile
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
M = [  # (name, file, old, new, -k expression)
 ('prompts right-padded', 'grpo_sglang.py', 'ids[i, P - len(p): P + len(c)] = torch.tensor(p + c)', 'ids[i, : len(p) + len(c)] = torch.tensor(p + c)', 'left_padding'),
 ('flush_cache never sent', 'grpo_sglang.py', '{"load_format": "flattened_bucket", "flush_cache": last,', '{"load_format": "flattened_bucket", "flush_cache": False,', 'several_buckets'),
 ('flush_cache on every bucket', 'grpo_sglang.py', '{"load_format": "flattened_bucket", "flush_cache": last,', '{"load_format": "flattened_bucket", "flush_cache": True,', 'nccl_path_protocol or several_buckets'),
 ('version on every bucket', 'grpo_sglang.py', '"weight_version": version if last else None}', '"weight_version": version}', 'several_buckets'),
 ('* world dropped', 'grpo_sglang.py', '(loss * world).backward()', 'loss.backward()', 'one_rank_and_two'),
 ('token count not all-reduced', 'grpo_sglang.py', 'return sum(s for _, s, _ in got), sum(t for _, _, t in got)', 'return got[dist.get_rank()][1], got[dist.get_rank()][2]', 'one_rank_and_two'),
 ('kl_k3 args swapped', 'grpo_sglang.py', 'kl = kl_k3(logp, ref_logp) if', 'kl = kl_k3(ref_logp, logp) if', 'grpo_token_loss'),
 ('same order every epoch', 'grpo_sglang.py', 'manual_seed(seed + epoch)', 'manual_seed(seed)', 'epochs_are'),
 ('no fp32 cast at the head', 'grpo_sglang.py', 'raw = x.float() @ w.float().T', 'raw = (x @ w.float().T).float()', 'architectures and gemma3'),
 ('TF32 head: wrong input gradient', 'grpo_sglang.py', 'dx[r] = (gz @ w.float()).to(x.dtype)', 'dx[r] = (1.01 * gz @ w.float()).to(x.dtype)', 'tf32 or head_logprobs'),
 ('TF32 head: wrong weight gradient', 'grpo_sglang.py', 'dw = gz.T @ x[r].float() if dw is None else dw + gz.T @ x[r].float()', 'dw = gz.T @ x[r].float() if dw is None else dw + 0.99 * gz.T @ x[r].float()', 'head_logprobs'),
 ('TF32 left on after the head (RoPE)', 'grpo_sglang.py', '        torch.set_float32_matmul_precision(before)', '        pass', 'tf32'),
 ('checkpoint write error raw', 'grpo_sglang.py', '        except Exception as e:  # a full disk', '        except ZeroDivisionError as e:  # a full disk', 'cannot_be_written'),
 ('eval mode kept', 'grpo_sglang.py', 'dtype=torch.float32).to(device).train()', 'dtype=torch.float32).to(device)', 'training_mode'),
 ('dropout left on', 'grpo_sglang.py', '            setattr(config, k, 0.0)', '            pass', 'training_mode'),
 ('kl times mu', 'grpo_sglang.py', 'm.mean("kl", (kl.detach() * w).sum() if kl', 'm.mean("kl", (kl.detach() * w).sum() * cfg.mu if kl', 'mu_2'),
 ('no version check', 'grpo_sglang.py', 'if str(o["meta_info"].get("weight_version")) != version:', 'if False:', 'skipped_push'),
 ('no sync check', 'grpo_sglang.py', 'if n and d / n > self.cfg.mismatch_max:', 'if False:', 'dropped_under'),
 ('temperature unchecked', 'grpo_sglang.py', 'at the same temperature)", "v > 0")', 'at the same temperature)", None)', 'out_of_range or bad_flag'),
 ('ranks race rank 0 to the error file', 'grpo_sglang.py', 'time.sleep(3 if rank else 0)', 'time.sleep(0)', 'said_once'),
 ('nccl send waited first, no timeout', 'grpo_sglang.py', '    def wait():\n        for srv, answered in zip(', '    def wait():\n        sent and sent.result()\n        for srv, answered in zip(', 'nccl_path_failures'),
 ('plain format ignored', 'grpo_sglang.py', 'fmt = ("chat" if tok.chat_template else "plain") if', 'fmt = "chat" if', 'base_model'),
 ('async resume keeps stale version', 'grpo_sglang.py', 'batch = next_batch or on_all_ranks(server.rollout, my_prompts(step), step)', 'batch = next_batch or on_all_ranks(server.rollout, my_prompts(step), max(step - 1, 0) if cfg.async_ and step > 0 else step)', 'async_resume'),
 ('no bf16 cast in recompute', 'grpo_sglang.py', '            m.register_forward_pre_hook(lambda m, args, kwargs: tree_map(to_compute, (args, kwargs)), with_kwargs=True)\n', '', 'recompute_in_bf16'),
 ('default group bound', 'grpo_sglang.py', 'dist.init_process_group("nccl" if use_cuda else "gloo")', 'dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)', 'not_bound'),
 ('TIS args swapped at the call site', 'grpo_sglang.py', 'tis = tis_weights(old, x["server_lp"], cfg.tis_cap,', 'tis = tis_weights(x["server_lp"], old, cfg.tis_cap,', 'policy_loss or train_step_is'),
 ('clip_high on both sides', 'grpo_sglang.py', 'x["mask"], cfg.clip_low, cfg.clip_high, cfg.ratio_level', 'x["mask"], cfg.clip_high, cfg.clip_high, cfg.ratio_level', 'policy_loss'),
 ('trainer logprobs at temperature 1', 'grpo_sglang.py', 'head.job = (b["ids"][:, b["P"]:], b["mask"].bool(), temperature)', 'head.job = (b["ids"][:, b["P"]:], b["mask"].bool(), 1.0)', 'train_step_is or async_check_compares'),
 ('advantages shifted by one group', 'grpo_sglang.py', 'seqs["adv"] = advantages(cfg, seqs["reward"])  # (N,)', 'seqs["adv"] = advantages(cfg, seqs["reward"]).roll(cfg.group_size)  # (N,)', 'known_reward'),
 ('advantages shifted in the micro-batches', 'grpo_sglang.py', 'if v.dim() == 2 else v[b["rows"]] for k, v in seqs.items()', 'if v.dim() == 2 else v[b["rows"].roll(1)] for k, v in seqs.items()', 'train_step_is'),
 ('rank slices overlap', 'grpo_sglang.py', '[rt.rank * n: (rt.rank + 1) * n]', '[rt.rank * (n // 2): rt.rank * (n // 2) + n]', 'one_rank_and_two'),
 ('auto prompt format picks plain', 'grpo_sglang.py', 'fmt = ("chat" if tok.chat_template else "plain") if', 'fmt = ("plain" if tok.chat_template else "plain") if', 'trains_and_server_gets'),
 ('maxima summed over ranks', 'grpo_sglang.py', 'for k in maxes}, dist.ReduceOp.MAX, device)', 'for k in maxes}, dist.ReduceOp.SUM, device)', 'one_rank_and_two'),
 ("means from one rank's share", 'grpo_sglang.py', 's = all_reduce_named({k: self.sums.get(k, 0.0) for k in sums}, dist.ReduceOp.SUM, device)', 's = {k: float(self.sums.get(k, 0.0)) for k in sums}', 'one_rank_and_two'),
 ('wait for the next batch before training', 'grpo_sglang.py', '        train(cfg, model, opt, seqs, mbs, rt.world, check, m)', '        next_batch = on_all_ranks(pending.result) if pending else None\n        train(cfg, model, opt, seqs, mbs, rt.world, check, m)', 'async_trains'),
 ('async pushes mid-generation', 'grpo_sglang.py', '        next_batch = on_all_ranks(pending.result) if pending else None\n        clock.lap("next_rollout_wait")\n        nbytes = server.push(model, step + 1)\n', '        nbytes = server.push(model, step + 1)\n        next_batch = on_all_ranks(pending.result) if pending else None\n        clock.lap("next_rollout_wait")\n', 'async_trains'),
 ('async check on the stale batch', 'grpo_sglang.py', 'if batch["version"] == version:', 'if True:', 'async_check_compares'),
 ('re-score misaligned by one token', 'grpo_sglang.py', 'logprob_start_len=[len(p) - 1 for p, _ in seqs]', 'logprob_start_len=[len(p) for p, _ in seqs]', 'async_check_compares'),
 ('re-score compared at the sampling temperature', 'grpo_sglang.py', 't1 = list(completion_logprobs(model, b, 1.0)[0])', 't1 = list(completion_logprobs(model, b, cfg.temperature)[0])', 'async_check_compares'),
 ('re-score version unchecked', 'grpo_sglang.py', 'version, "re-scored the batch", "this check"', 'str(int(version) - 1), "re-scored the batch", "this check"', 'async_a_skipped or async_check_compares'),
 ('accuracy from the reward', 'grpo_sglang.py', 'seqs["correct"] = torch.tensor([reward_fns.safe_reward(correct_fn, t, a, warn) == 1 for t, a in', 'seqs["correct"] = torch.tensor([r == 1 for r, _ in got] or [reward_fns.safe_reward(correct_fn, t, a, warn) == 1 for t, a in', 'score_counts or new_reward'),
 ('eval accuracy from the reward', 'grpo_sglang.py', 'acc, reward = seqs["correct"].mean().item(), seqs["reward"].mean().item()', 'acc, reward = seqs["reward"].mean().item(), seqs["reward"].mean().item()', 'new_reward'),
 ('metrics kept after the checkpoint', 'grpo_sglang.py', 'keep = [r for r in rows if r["step"] < start or (r["step"] == start and "eval_accuracy" not in r)]', 'keep = rows', 'fresh_run'),
 ("a fresh run into another run's folder", 'grpo_sglang.py', '    if there and not cfg.resume:', '    if False:', 'fresh_run'),
 ('eval split typo held out', 'grpo_sglang.py', '        if split and split not in ds:', '        if flag == "train_split" and split not in ds:', 'splits_of'),
 ('grad_norm of the last update only', 'grpo_sglang.py', 'm.mean("grad_norm", grad_norm, 1)', 'm.sums.pop("grad_norm", 0), m.sums.pop("grad_norm#n", 0), m.mean("grad_norm", grad_norm, 1)', 'train_step_is'),
 ('server_url unchecked', 'grpo_sglang.py', 'ok = p.scheme in ("http", "https") and p.hostname and p.port != 0', 'ok = True', 'out_of_range or several_servers_flags'),
 ('nccl_port unbounded', 'grpo_sglang.py', '"0 <= v <= 65535")', '"v >= 0")', 'out_of_range'),
 ('broken checkpoint resumed', 'grpo_sglang.py', '    if d is None or complete(d):', '    if True:', 'resume_from'),
 ('bad JSONL line unnamed', 'grpo_sglang.py', 'raise UserError(f"{path} line {n} is not valid JSON', 'raise UserError(f"{path} is not valid JSON', 'bad_data'),
 ('entropy at temperature 1', 'grpo_sglang.py', 'ent[r] = lse[r] - torch.einsum(', 'ent[r] = lse[r] + torch.einsum(', 'head_logprobs or train_step_is'),
 ('GSPO ratio per token', 'grpo_sglang.py', '    if level == "sequence":\n        d = ', '    if level == "sequences":\n        d = ', 'gspo'),
 ('every prompt to the first server', 'grpo_sglang.py', 'srv = [(self.rt.rank * len(rows) + j) % len(self.urls)', 'srv = [0 * (self.rt.rank * len(rows) + j) % len(self.urls)', 'several_servers_and'),
 ('pushes to the first server only', 'grpo_sglang.py', 'range(s["tp"])]})\n                 for s in link["servers"]]', 'range(s["tp"])]})\n                 for s in link["servers"][:1]]', 'several_servers_and'),
 ('one payload for a TP server', 'grpo_sglang.py', 'meta) for _ in range(s["tp"])]', 'meta) for _ in range(1)]', 'several_servers_and'),
 ('nccl broadcast to the first group only', 'grpo_sglang.py', 'sent = POOL.submit(lambda: [broadcast(flat, s["group"]) for s in link["servers"]])', 'sent = POOL.submit(lambda: [broadcast(flat, s["group"]) for s in link["servers"][:1]])', 'several_servers_and'),
 ('a missed push on one server unseen', 'grpo_sglang.py', 'asked = {k: POOL.submit(generate, cfg, url,', 'asked = {k: POOL.submit(generate, cfg, self.urls[0],', 'one_server_of_two'),
 ('serve.sh starts shared-GPU servers at once', 'serve.sh', 'share=$(( SERVERS * TP > ${#GPUS[@]} ))', 'share=0', 'serve_sh'),
 ('a re-scored row for other tokens accepted', 'grpo_sglang.py', 'if lp is None or t not in (x, 0)]', 'if lp is None]', 'out_of_line'),
 ('a re-scored row with a None accepted', 'grpo_sglang.py', 'if lp is None or t not in (x, 0)]', 'if t not in (x, 0)]', 'out_of_line'),
 ("SGLang's id 0 for the last ids taken as misaligned", 'grpo_sglang.py', 'if lp is None or t not in (x, 0)]', 'if lp is None or t != x]', 'out_of_line'),
 ('GSPO ratio counts padding', 'grpo_sglang.py', 'd = ((d * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)).expand_as(d)', 'd = d.mean(1, keepdim=True).expand_as(d)', 'gspo'),
 ('async check finds lp0 by group', 'grpo_sglang.py', 'lps = t1 or [seqs["lp0"][i, : len(outs[i][0])] for i in rows]', 'lps = t1 or [seqs["lp0"][i // cfg.group_size, : len(outs[i][0])] for i in rows]', 'other_shapes'),
 ('check rows per rank rounded down', 'grpo_sglang.py', 'rows = check_rows(srv, -(-cfg.check_seqs // self.rt.world))', 'rows = check_rows(srv, cfg.check_seqs // self.rt.world)', 'other_shapes'),
 ("verdict pairs rows with other rows' servers", 'grpo_sglang.py', '                         [srv[i] for i in rows], m)', '                         srv[:len(rows)], m)', 'drops_weights_is_named'),
 ('one logprob_start_len for a request', 'grpo_sglang.py', 'logprob_start_len=[len(p) - 1 for p, _ in seqs]', 'logprob_start_len=[max(len(p) for p, _ in seqs) - 1] * len(seqs)', 'other_shapes'),
 ('every NCCL group on --nccl_port', 'grpo_sglang.py', 'port = cfg.nccl_port + k if cfg.nccl_port else get_free_port()', 'port = cfg.nccl_port if cfg.nccl_port else get_free_port()', 'several_servers_and and nccl'),
 ('ratio_level checked against seq', 'grpo_sglang.py', '("token", "sequence"))', '("token", "seq"))', 'documented_names'),
 ('eval rows from the train split', 'grpo_sglang.py', 'return train, [dict(r) for r in ds[eval_split]][: cfg.eval_size], f"its', 'return train[cfg.eval_size:], train[: cfg.eval_size], f"its', 'splits_of'),
 ('zero_grad only after finite steps', 'grpo_sglang.py', '            opt.step()\n        opt.zero_grad(set_to_none=True)', '            opt.step()\n            opt.zero_grad(set_to_none=True)', 'one_nan_step'),
 ('max_grad_norm 0 reaches clip_grad_norm_', 'grpo_sglang.py', 'cfg.max_grad_norm or float("inf")', 'cfg.max_grad_norm', 'max_grad_norm_0'),
 ('re-score misses a server', 'grpo_sglang.py', '    for server in sorted(set(srv)):', '    for server in sorted(set(srv))[:1]:', 'drops_weights_is_named'),
 ('resume ignores the saved config', 'grpo_sglang.py', '    if cfg.resume:\n        restore_config(cfg)', '    if False:\n        restore_config(cfg)', 'resumed_run'),
 ('resume takes any flag', 'grpo_sglang.py', '    if changed:\n', '    if False:\n', 'resumed_run'),
 ('resume restores nothing', 'grpo_sglang.py', '        if k in fields and k not in given and k != "api_key":', '        if False:', 'resumed_run'),
 ('checkpoint architecture unchecked', 'grpo_sglang.py', '    if diff:\n        raise UserError(f"--resume: the checkpoint', '    if False:\n        raise UserError(f"--resume: the checkpoint', 'another_architecture'),
 ('api key saved', 'grpo_sglang.py', 'return {**dataclasses.asdict(cfg), "api_key": ""}', 'return dataclasses.asdict(cfg)', 'api_key_is_never'),
 ('a URL twice blamed on --server_gpu', 'grpo_sglang.py', '    if twice:\n', '    if False:\n', 'two_names'),
 ('one server under two names', 'grpo_sglang.py', '            if (host, port) == where[i] or here:', '            if False:', 'two_names'),
 ("TP server's GPUs unchecked", 'grpo_sglang.py', '        if on_this_host(host) and len(gpus) != s["tp"]', '        if False and len(gpus) != s["tp"]', 'all_its_gpus'),
 ('read-only out_dir found late', 'grpo_sglang.py', '        tempfile.TemporaryFile(dir=cfg.out_dir).close()', '        pass', 'cannot_be_written_is_refused'),
 ('too-long prompts blamed on the fields', 'grpo_sglang.py', 'fields = any("_field" in why for why in skipped) and raw_train', 'fields = bool(raw_train)', 'all_too_long'),
 ("the server's context ignored", 'grpo_sglang.py', '    if context and context - cfg.max_new_tokens - 1 < max_len:', '    if False:', 'beyond_the_servers'),
 ('a broken file in a data folder unnamed', 'grpo_sglang.py', '                    read_rows(os.path.join(cfg.dataset, f))', '                    pass', 'broken_file'),
 ("GSPO with GRPO's clips unwarned", 'grpo_sglang.py', '    if cfg.ratio_level == "sequence" and max(cfg.clip_low, cfg.clip_high) >= 0.01:', '    if False:', 'gspo_with'),
 ("run() leaves torchrun's workers running", 'test_smoke.py', '            kill_tree(p.pid)', '            p.kill()', 'ends_every_process'),
 ('serve.sh GPU list with spaces or empty entries read', 'serve.sh', 'if ! [[ $GPU =~ ^[0-9]+(,[0-9]+)*$ ]]; then', 'if false; then', 'serve_sh and refuses'),
 ('serve.sh a GPU listed twice accepted', 'serve.sh', 'if [ -n "$dup" ]; then', 'if false; then', 'serve_sh and refuses'),
 ('serve.sh servers sharing GPUs unevenly accepted', 'serve.sh', 'if [ $((SERVERS * TP)) -gt "$n" ] && {', 'if false && {', 'serve_sh and refuses'),
 ('serve.sh a TP server across the wrap accepted', 'serve.sh', '{ [ $((n % TP)) -ne 0 ] || [ $((SERVERS', '{ [ $((SERVERS', 'serve_sh and refuses'),
 ('serve.sh GPUs with unequal server counts accepted', 'serve.sh', '[ $((n % TP)) -ne 0 ] || [ $((SERVERS * TP % n)) -ne 0 ]; }', '[ $((n % TP)) -ne 0 ]; }', 'serve_sh and refuses'),
 ('serve.sh MEM_FRACTION unchecked', 'serve.sh', 'if ! awk -v v="$MEM_FRACTION"', 'if false && awk -v v="$MEM_FRACTION"', 'serve_sh and refuses'),
 ('serve.sh shared default MEM_FRACTION not split', 'serve.sh', 'int(v / k * 10000 + 1e-6) / 10000', 'v', 'serve_sh and shares'),
 ('serve.sh over-committed MEM_FRACTION accepted', 'serve.sh', 'exit !(k * v > 0.9 + 1e-9)', 'exit 1', 'serve_sh and refuses'),
 ('serve.sh a MEM_FRACTION the user set split anyway', 'serve.sh', 'MEM_SET=${MEM_FRACTION:+1}', 'MEM_SET=', 'serve_sh'),
 ('serve.sh servers per GPU not counted', 'serve.sh', 'per=$(( SERVERS * TP > n ? SERVERS * TP / n : 1 ))', 'per=1', 'serve_sh'),
 ('flat groups by float std', 'grpo_sglang.py', '    return (r == r[:, :1]).all(dim=1)', '    return r.std(dim=1) == 0', 'group_advantages_hand'),
 ('weights ignored by the loss', 'grpo_sglang.py', '            loss = aggregate(loss, x["mask"], x["weight"], cfg.loss_agg, max(norm, 1e-9))', '            loss = aggregate(loss, x["mask"], torch.ones_like(x["weight"]), cfg.loss_agg, max(norm, 1e-9))', 'train_step_is'),
 ('normaliser unweighted', 'grpo_sglang.py', 'dist.all_gather_object(got, (len(mbs), float(w.sum()), float((w * seqs["length"]).sum())))', 'dist.all_gather_object(got, (len(mbs), float(len(w)), float(seqs["length"].sum())))', 'train_step_is'),
 ('micro-batch counts unchecked', 'grpo_sglang.py', '    if len({n for n, _, _ in got}) > 1:', '    if False:', 'different_numbers_of_micro'),
 ('an all-zero-weight step still steps', 'grpo_sglang.py', '        if finite and n_seqs > 0:', '        if finite:', 'all_0_skips'),
 ('metric names not agreed over ranks', 'grpo_sglang.py', '        sums, maxes = (sorted(set().union(*(n[j] for n in names))) for j in (0, 1))', '        sums, maxes = sorted(self.sums), sorted(self.maxes)', 'metrics_are or only_one_rank_logs'),
 ('reward parts not logged', 'grpo_sglang.py', '        m.mean(f"reward_{part}",', '        0 and m.mean(f"reward_{part}",', 'score_counts or worked_examples'),
 ('a reward never sees the sample', 'reward_fns.py', 'r = fn(completion, answer, sample=sample) if wants_sample(fn) else fn(completion, answer)', 'r = fn(completion, answer, sample=None) if wants_sample(fn) else fn(completion, answer)', 'score_counts or worked_examples'),
 ('a Config rule unchecked', 'grpo_sglang.py', '        if ok is not None and not (v in ok if isinstance(ok, tuple) else obeys(v, ok)):', '        if ok is not None and not (v in ok if isinstance(ok, tuple) else True):', 'out_of_range'),
 ('rows of a micro-batch written to other rows', 'grpo_sglang.py', '                seqs["lp0"][b["rows"], : b["C"]] = old', '                seqs["lp0"][b["rows"].flip(0), : b["C"]] = old', 'train_step_is or other_shapes'),
 ("head's entropy gradient wrong", 'grpo_sglang.py', 'gz = gz - p * (logp + ent[r, None]) * g_ent[r, None]', 'gz = gz - p * logp * g_ent[r, None]', 'head_logprobs'),
 ('soft-cap derivative dropped', 'grpo_sglang.py', 'gz = gz / temperature if dcap is None else gz * dcap / temperature', 'gz = gz / temperature', 'head_logprobs'),
 ('lr warmup off by one', 'grpo_sglang.py', '        return (step + 1) / warmup', '        return step / warmup', 'lr_schedule'),
 ('overlong penalty unclamped', 'grpo_sglang.py', '    return ((max_len - buffer - lengths) / buffer).clamp(-1.0, 0.0)', '    return ((max_len - buffer - lengths) / buffer).clamp(max=0.0)', 'overlong'),
 ('rloo without its G/(G-1)', 'grpo_sglang.py', '(group_size / (group_size - 1) if rloo else 1)', '1', 'rloo'),
 ('batch std ignored', 'grpo_sglang.py', '((r.std(dim=1, keepdim=True) if std is None else std) + eps)', '(r.std(dim=1, keepdim=True) + eps)', 'rloo'),
 ('sequence IS per token', 'grpo_sglang.py', 'ratio = torch.exp(d.sum(1, keepdim=True) if mode.startswith("sequence") else d)', 'ratio = torch.exp(d)', 'importance_sampling_modes'),
 ('IS mask keeps the ratio', 'grpo_sglang.py', 'else ratio * (ratio <= cap)', 'else ratio', 'importance_sampling_modes'),
 ('cispo weight with a gradient', 'grpo_sglang.py', 'torch.clamp(ratio, max=1 + clip_high).detach()', 'torch.clamp(ratio, max=1 + clip_high)', 'cispo'),
 ('entropy bonus with the wrong sign', 'grpo_sglang.py', '    return loss - cfg.entropy_coef * ent if cfg.entropy_coef else loss, clipped, kl', '    return loss + cfg.entropy_coef * ent if cfg.entropy_coef else loss, clipped, kl', 'entropy_bonus'),
 ('truncated not masked', 'grpo_sglang.py', '        w = w * (seqs["truncated"] == 0)', '        w = w', 'filters_set'),
 ('flat groups not filtered', 'grpo_sglang.py', '        w = w * ~flat_groups(seqs["reward"], cfg.group_size).repeat_interleave(cfg.group_size)', '        w = w', 'filters_set'),
 ('lr never set', 'grpo_sglang.py', '        group["lr"] = lr', '        pass', 'lr_schedule'),
]
full = "--full" in sys.argv
only = [a for a in sys.argv[1:] if a != "--full"]
for name, f, old, new, k in M:
    if only and not any(o in name for o in only):
        continue
    d = os.path.join(tempfile.gettempdir(), "grpo_mutant")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(SRC, d, ignore=shutil.ignore_patterns(".venv-*", ".gpukit", ".git", "runs"))
    p = os.path.join(d, f); s = open(p).read()
    if old not in s:
        print(f"?? {name}: pattern not found"); continue
    open(p, "w").write(s.replace(old, new, 1))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "test_smoke.py"] + ([] if full else ["-k", k]), cwd=d,
                       capture_output=True, text=True, timeout=1800)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-200:]
    print(f"{'CAUGHT' if r.returncode else 'MISSED'}  {name:45s} [{'all' if full else k}] {last}", flush=True)
