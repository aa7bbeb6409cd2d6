"""Break one line of grpo_sglang.py at a time, in a scratch copy of the repo, and run the tests that guard
it: each must fail ("CAUGHT"). The mutations: the bugs of the first sync-check work, one per safeguard added since
(the TF32 head of c5458af, the checkpoint write error of 32cd255), the one-line bugs the exact-async-check issue put
into a copy of the script (its part 4), and one per fix of that issue and of the layout issue (GSPO, entropy).

    python3 results/tools/mutation_check.py [name-substring ...]      # from the repo root, CPU only
    python3 results/tools/mutation_check.py --full [name-substring ...]  # the whole suite per mutation, not just -k
"""
import os, shutil, subprocess, sys, tempfile
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
M = [  # (name, file, old, new, -k expression)
 ("prompts right-padded", "grpo_sglang.py", "ids[i, P - len(p): P + len(c)] = torch.tensor(p + c)", "ids[i, : len(p) + len(c)] = torch.tensor(p + c)", "left_padding"),
 ("flush_cache never sent", "grpo_sglang.py", '{"load_format": "flattened_bucket", "flush_cache": last,', '{"load_format": "flattened_bucket", "flush_cache": False,', "several_buckets"),
 ("flush_cache on every bucket", "grpo_sglang.py", '{"load_format": "flattened_bucket", "flush_cache": last,', '{"load_format": "flattened_bucket", "flush_cache": True,', "nccl_path_protocol or several_buckets"),
 ("version on every bucket", "grpo_sglang.py", '"weight_version": version if last else None}', '"weight_version": version}', "several_buckets"),
 ("* world dropped", "grpo_sglang.py", "(loss * world).backward()", "loss.backward()", "one_rank_and_two"),
 ("token count not all-reduced", "grpo_sglang.py", "return sum(s for _, s, _ in got), sum(t for _, _, t in got)", "return got[dist.get_rank()][1], got[dist.get_rank()][2]", "one_rank_and_two"),
 ("kl_k3 args swapped", "grpo_sglang.py", "kl = kl_k3(logp, ref_logp) if", "kl = kl_k3(ref_logp, logp) if", "grpo_token_loss"),
 ("same order every epoch", "grpo_sglang.py", "manual_seed(seed + epoch)", "manual_seed(seed)", "epochs_are"),
 ("no fp32 cast at the head", "grpo_sglang.py", "y = TF32Matmul.apply(x.float(), head.weight)", "y = TF32Matmul.apply(x, head.weight)", "architectures and gemma3"),
 ("no fp32 cast at the plain head", "grpo_sglang.py", "head.register_forward_pre_hook(lambda m, args: (args[0].float(), *args[1:]))", "head.register_forward_pre_hook(lambda m, args: args)", "tf32 and gemma3"),
 ("TF32 head: wrong input gradient", "grpo_sglang.py", "dx = dy @ w if", "dx = 1.01 * dy @ w if", "tf32"),
 ("TF32 head: wrong weight gradient", "grpo_sglang.py", "dw = dy.flatten(0, -2).T @ x.flatten(0, -2) if", "dw = 0.99 * dy.flatten(0, -2).T @ x.flatten(0, -2) if", "tf32"),
 ("TF32 left on after the head (RoPE)", "grpo_sglang.py", "        torch.set_float32_matmul_precision(before)", "        pass", "tf32"),
 ("checkpoint write error raw", "grpo_sglang.py", "        except Exception as e:  # a full disk", "        except ZeroDivisionError as e:  # a full disk", "cannot_be_written"),
 ("eval mode kept", "grpo_sglang.py", "dtype=torch.float32).to(device).train()", "dtype=torch.float32).to(device)", "training_mode"),
 ("dropout left on", "grpo_sglang.py", "            setattr(config, k, 0.0)", "            pass", "training_mode"),
 ("kl times mu", "grpo_sglang.py", '"kl": s["kl"] / s["trained_tokens"]', '"kl": s["kl"] / s["trained_tokens"] * cfg.mu', "mu_2"),
 ("no version check", "grpo_sglang.py", 'if str(o["meta_info"].get("weight_version")) != version:', "if False:", "skipped_push"),
 ("no sync check", "grpo_sglang.py", "if n and d / n > self.cfg.mismatch_max:", "if False:", "dropped_under"),
 ("temperature unchecked", "grpo_sglang.py", '("temperature", cfg.temperature > 0,', '("temperature", True,', "out_of_range or bad_flag"),
 ("ranks race rank 0 to the error file", "grpo_sglang.py", "time.sleep(3 if rank else 0)", "time.sleep(0)", "said_once"),
 ("nccl send waited first, no timeout", "grpo_sglang.py", "    def wait():\n        for srv, answered in zip(", "    def wait():\n        sent and sent.result()\n        for srv, answered in zip(", "nccl_path_failures"),
 ("plain format ignored", "grpo_sglang.py", 'fmt = ("chat" if tok.chat_template else "plain") if', 'fmt = "chat" if', "base_model"),
 ("async resume keeps stale version", "grpo_sglang.py", "batch = next_batch or on_all_ranks(server.rollout, my_prompts(step), step)", "batch = next_batch or on_all_ranks(server.rollout, my_prompts(step), max(step - 1, 0) if cfg.async_ and step > 0 else step)", "async_resume"),
 ("no bf16 cast in recompute", "grpo_sglang.py", "            m.register_forward_pre_hook(lambda m, args, kwargs: tree_map(to_compute, (args, kwargs)), with_kwargs=True)\n", "", "recompute_in_bf16"),
 ("default group bound", "grpo_sglang.py", 'dist.init_process_group("nccl" if use_cuda else "gloo")', 'dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)', "not_bound"),
 # the exact-async-check issue, part 4: one-line bugs the suite missed before
 ("TIS args swapped at the call site", "grpo_sglang.py", 'tis = tis_weights(old, b["server"], cfg.tis_cap)', 'tis = tis_weights(b["server"], old, cfg.tis_cap)', "policy_loss or train_step_is"),
 ("clip_high on both sides", "grpo_sglang.py", 'b["mask"], cfg.clip_low, cfg.clip_high, cfg.ratio_level', 'b["mask"], cfg.clip_high, cfg.clip_high, cfg.ratio_level', "policy_loss"),
 ("trainer logprobs at temperature 1", "grpo_sglang.py", 'logp = token_logprobs(logits, b["ids"][:, b["P"]:], T)', 'logp = token_logprobs(logits, b["ids"][:, b["P"]:], 1.0)', "train_step_is or async_check_compares"),
 ("advantages shifted by one group", "grpo_sglang.py", "group_advantages(rewards, group_size, scale).tolist()", "group_advantages(rewards, group_size, scale).roll(group_size).tolist()", "score_counts or train_step_is or known_reward"),
 ("advantages shifted in the micro-batches", "grpo_sglang.py", '"adv": torch.tensor([s["adv"] for s in part], device=device)', '"adv": torch.tensor([s["adv"] for s in part], device=device).roll(1)', "train_step_is or known_reward"),
 ("rank slices overlap", "grpo_sglang.py", "[rt.rank * n: (rt.rank + 1) * n]", "[rt.rank * (n // 2): rt.rank * (n // 2) + n]", "one_rank_and_two"),
 ("auto prompt format picks plain", "grpo_sglang.py", 'fmt = ("chat" if tok.chat_template else "plain") if', 'fmt = ("plain" if tok.chat_template else "plain") if', "trains_and_server_gets"),
 ("maxima summed over ranks", "grpo_sglang.py", "for k in maxes}, dist.ReduceOp.MAX, device)", "for k in maxes}, dist.ReduceOp.SUM, device)", "one_rank_and_two"),
 ("means from one rank's share", "grpo_sglang.py", "s = all_reduce_named({k: self.sums.get(k, 0.0) for k in sums}, dist.ReduceOp.SUM, device)", "s = {k: float(self.sums.get(k, 0.0)) for k in sums}", "one_rank_and_two"),
 ("wait for the next batch before training", "grpo_sglang.py", "        train_sums, maxes = train_step(", "        next_batch = on_all_ranks(pending.result) if pending else None\n        train_sums, maxes = train_step(", "async_trains"),
 ("async pushes mid-generation", "grpo_sglang.py", '        next_batch = on_all_ranks(pending.result) if pending else None\n        clock.lap("next_rollout_wait")\n        nbytes = server.push(model, step + 1)\n', '        nbytes = server.push(model, step + 1)\n        next_batch = on_all_ranks(pending.result) if pending else None\n        clock.lap("next_rollout_wait")\n', "async_trains"),
 # the fixes of that issue, and of the layout issue
 ("async check on the stale batch", "grpo_sglang.py", 'if batch["version"] == version:', "if True:", "async_check_compares"),
 ("re-score misaligned by one token", "grpo_sglang.py", "logprob_start_len=[len(p) - 1 for p, _ in seqs]", "logprob_start_len=[len(p) for p, _ in seqs]", "async_check_compares"),
 ("re-score compared at the sampling temperature", "grpo_sglang.py", "t1 = list(completion_logprobs(model, b, 1.0)[0])", "t1 = list(completion_logprobs(model, b, cfg.temperature)[0])", "async_check_compares"),
 ("re-score version unchecked", "grpo_sglang.py", 'version, "re-scored the batch", "this check"', 'str(int(version) - 1), "re-scored the batch", "this check"', "async_a_skipped or async_check_compares"),
 ("accuracy from the reward", "grpo_sglang.py", '"correct": reward_fns.safe_reward(correct_fn,', '"correct": reward_fns.safe_reward(reward_fn,', "score_counts or new_reward"),
 ("eval accuracy from the reward", "grpo_sglang.py", 'acc, reward = seqs["correct"].mean().item(), seqs["reward"].mean().item()', 'acc, reward = seqs["reward"].mean().item(), seqs["reward"].mean().item()', "new_reward"),
 ("metrics kept after the checkpoint", "grpo_sglang.py", 'keep = [r for r in rows if r["step"] < start or (r["step"] == start and "eval_accuracy" not in r)]', "keep = rows", "fresh_run"),
 ("a fresh run into another run's folder", "grpo_sglang.py", "    if there and not cfg.resume:", "    if False:", "fresh_run"),
 ("eval split typo held out", "grpo_sglang.py", "        if split and split not in ds:", '        if flag == "train_split" and split not in ds:', "splits_of"),
 ("grad_norm of the last update only", "grpo_sglang.py", 'merge(sums, maxes, {"grad_norm": grad_norm / world, "nonfinite"', 'sums["grad_norm"] = cfg.mu * grad_norm / world; merge(sums, maxes, {"nonfinite"', "train_step_is"),
 ("server_url unchecked", "grpo_sglang.py", 'ok = p.scheme in ("http", "https") and p.hostname and p.port != 0', "ok = True", "out_of_range or several_servers_flags"),
 ("nccl_port unbounded", "grpo_sglang.py", '("nccl_port", 0 <= cfg.nccl_port < 65536,', '("nccl_port", cfg.nccl_port >= 0,', "out_of_range"),
 ("broken checkpoint resumed", "grpo_sglang.py", "    if d is None or complete(d):", "    if True:", "resume_from"),
 ("bad JSONL line unnamed", "grpo_sglang.py", 'raise UserError(f"{path} line {n} is not valid JSON', 'raise UserError(f"{path} is not valid JSON', "bad_data"),
 ("entropy at temperature 1", "grpo_sglang.py", '"entropy": (token_entropy(logits, T) * b["mask"]).sum()', '"entropy": (token_entropy(logits) * b["mask"]).sum()', "train_step_is"),
 ("GSPO ratio per token", "grpo_sglang.py", '    if level == "sequence":\n        d = ', '    if level == "sequences":\n        d = ', "gspo"),
 # the several-servers issue
 ("every prompt to the first server", "grpo_sglang.py", "srv = [(self.rt.rank * len(rows) + j) % len(self.urls)", "srv = [0 * (self.rt.rank * len(rows) + j) % len(self.urls)", "several_servers_and"),
 ("pushes to the first server only", "grpo_sglang.py", 'range(s["tp"])]})\n                 for s in link["servers"]]', 'range(s["tp"])]})\n                 for s in link["servers"][:1]]', "several_servers_and"),
 ("one payload for a TP server", "grpo_sglang.py", 'meta) for _ in range(s["tp"])]', 'meta) for _ in range(1)]', "several_servers_and"),
 ("nccl broadcast to the first group only", "grpo_sglang.py", 'sent = POOL.submit(lambda: [broadcast(flat, s["group"]) for s in link["servers"]])', 'sent = POOL.submit(lambda: [broadcast(flat, s["group"]) for s in link["servers"][:1]])', "several_servers_and"),
 ("a missed push on one server unseen", "grpo_sglang.py", 'asked = {k: POOL.submit(generate, cfg, url,', 'asked = {k: POOL.submit(generate, cfg, self.urls[0],', "one_server_of_two"),
 ("serve.sh starts shared-GPU servers at once", "serve.sh", "share=$(( SERVERS * TP > ${#GPUS[@]} ))", "share=0", "serve_sh"),
 ("a re-scored row for other tokens accepted", "grpo_sglang.py", "if lp is None or t not in (x, 0)]", "if lp is None]", "out_of_line"),
 ("a re-scored row with a None accepted", "grpo_sglang.py", "if lp is None or t not in (x, 0)]", "if t not in (x, 0)]", "out_of_line"),
 ("SGLang's id 0 for the last ids taken as misaligned", "grpo_sglang.py", "if lp is None or t not in (x, 0)]", "if lp is None or t != x]", "out_of_line"),
 ("GSPO ratio counts padding", "grpo_sglang.py", "d = ((d * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)).expand_as(d)", "d = d.mean(1, keepdim=True).expand_as(d)", "gspo"),
 # the resume-and-layouts issue: its one-line bugs the suite missed, and one per safeguard it added
 ("async check finds lp0 by group", "grpo_sglang.py", 'lps = t1 or [seqs["lp0"][i, : len(outs[i][0])] for i in rows]', 'lps = t1 or [seqs["lp0"][i // cfg.group_size, : len(outs[i][0])] for i in rows]', "other_shapes"),
 ("check rows per rank rounded down", "grpo_sglang.py", "rows = check_rows(srv, -(-cfg.check_seqs // self.rt.world))", "rows = check_rows(srv, cfg.check_seqs // self.rt.world)", "other_shapes"),
 ("verdict pairs rows with other rows' servers", "grpo_sglang.py", "                         [srv[i] for i in rows], m)", "                         srv[:len(rows)], m)", "drops_weights_is_named"),
 ("one logprob_start_len for a request", "grpo_sglang.py", "logprob_start_len=[len(p) - 1 for p, _ in seqs]", "logprob_start_len=[max(len(p) for p, _ in seqs) - 1] * len(seqs)", "other_shapes"),
 ("every NCCL group on --nccl_port", "grpo_sglang.py", "port = cfg.nccl_port + k if cfg.nccl_port else get_free_port()", "port = cfg.nccl_port if cfg.nccl_port else get_free_port()", "several_servers_and and nccl"),
 ("ratio_level checked against seq", "grpo_sglang.py", '("ratio_level", ("token", "sequence"))', '("ratio_level", ("token", "seq"))', "documented_names"),
 ("eval rows from the train split", "grpo_sglang.py", 'return train, [dict(r) for r in ds[eval_split]][: cfg.eval_size], f"its', 'return train[cfg.eval_size:], train[: cfg.eval_size], f"its', "splits_of"),
 ("zero_grad only after finite steps", "grpo_sglang.py", "            opt.step()\n        opt.zero_grad(set_to_none=True)", "            opt.step()\n            opt.zero_grad(set_to_none=True)", "one_nan_step"),
 ("max_grad_norm 0 reaches clip_grad_norm_", "grpo_sglang.py", 'cfg.max_grad_norm or float("inf")', "cfg.max_grad_norm", "max_grad_norm_0"),
 ("re-score misses a server", "grpo_sglang.py", "    for server in sorted(set(srv)):", "    for server in sorted(set(srv))[:1]:", "drops_weights_is_named"),
 ("resume ignores the saved config", "grpo_sglang.py", "    if cfg.resume:\n        restore_config(cfg)", "    if False:\n        restore_config(cfg)", "resumed_run"),
 ("resume takes any flag", "grpo_sglang.py", "    if changed:\n", "    if False:\n", "resumed_run"),
 ("resume restores nothing", "grpo_sglang.py", "        if k in fields and k not in given and k != \"api_key\":", "        if False:", "resumed_run"),
 ("checkpoint architecture unchecked", "grpo_sglang.py", "    if diff:\n        raise UserError(f\"--resume: the checkpoint", "    if False:\n        raise UserError(f\"--resume: the checkpoint", "another_architecture"),
 ("api key saved", "grpo_sglang.py", 'return {**dataclasses.asdict(cfg), "api_key": ""}', "return dataclasses.asdict(cfg)", "api_key_is_never"),
 ("a URL twice blamed on --server_gpu", "grpo_sglang.py", "    if twice:\n", "    if False:\n", "two_names"),
 ("one server under two names", "grpo_sglang.py", "            if (host, port) == where[i] or here:", "            if False:", "two_names"),
 ("TP server's GPUs unchecked", "grpo_sglang.py", '        if on_this_host(host) and len(gpus) != s["tp"]', '        if False and len(gpus) != s["tp"]', "all_its_gpus"),
 ("read-only out_dir found late", "grpo_sglang.py", "        tempfile.TemporaryFile(dir=cfg.out_dir).close()", "        pass", "cannot_be_written_is_refused"),
 ("too-long prompts blamed on the fields", "grpo_sglang.py", 'fields = any("_field" in why for why in skipped) and raw_train', "fields = bool(raw_train)", "all_too_long"),
 ("the server's context ignored", "grpo_sglang.py", "    if context and context - cfg.max_new_tokens - 1 < max_len:", "    if False:", "beyond_the_servers"),
 ("a broken file in a data folder unnamed", "grpo_sglang.py", "                    read_rows(os.path.join(cfg.dataset, f))", "                    pass", "broken_file"),
 ("GSPO with GRPO's clips unwarned", "grpo_sglang.py", '    if cfg.ratio_level == "sequence" and max(cfg.clip_low, cfg.clip_high) >= 0.01:', "    if False:", "gspo_with"),
 ("run() leaves torchrun's workers running", "test_smoke.py", "            kill_tree(p.pid)", "            p.kill()", "ends_every_process"),
 ("serve.sh GPU list with spaces or empty entries read", "serve.sh", "if ! [[ $GPU =~ ^[0-9]+(,[0-9]+)*$ ]]; then", "if false; then", "serve_sh and refuses"),
 ("serve.sh a GPU listed twice accepted", "serve.sh", 'if [ -n "$dup" ]; then', "if false; then", "serve_sh and refuses"),
 ("serve.sh servers sharing GPUs unevenly accepted", "serve.sh", 'if [ $((SERVERS * TP)) -gt "$n" ] && {', "if false && {", "serve_sh and refuses"),
 ("serve.sh a TP server across the wrap accepted", "serve.sh", "{ [ $((n % TP)) -ne 0 ] || [ $((SERVERS", "{ [ $((SERVERS", "serve_sh and refuses"),
 ("serve.sh GPUs with unequal server counts accepted", "serve.sh", "[ $((n % TP)) -ne 0 ] || [ $((SERVERS * TP % n)) -ne 0 ]; }", "[ $((n % TP)) -ne 0 ]; }", "serve_sh and refuses"),
 ("serve.sh MEM_FRACTION unchecked", "serve.sh", 'if ! awk -v v="$MEM_FRACTION"', 'if false && awk -v v="$MEM_FRACTION"', "serve_sh and refuses"),
 ("serve.sh shared default MEM_FRACTION not split", "serve.sh", "int(v / k * 10000 + 1e-6) / 10000", "v", "serve_sh and shares"),
 ("serve.sh over-committed MEM_FRACTION accepted", "serve.sh", "exit !(k * v > 0.9 + 1e-9)", "exit 1", "serve_sh and refuses"),
 ("serve.sh a MEM_FRACTION the user set split anyway", "serve.sh", "MEM_SET=${MEM_FRACTION:+1}", "MEM_SET=", "serve_sh"),
 ("serve.sh servers per GPU not counted", "serve.sh", "per=$(( SERVERS * TP > n ? SERVERS * TP / n : 1 ))", "per=1", "serve_sh"),
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
