"""Break one line of grpo_sglang.py at a time, in a scratch copy of the repo, and run the tests that guard
it: each must fail ("CAUGHT"). The mutations are the bugs issue 9 listed plus one per new safeguard (the TF32 head of
c5458af and the checkpoint write error of 32cd255).

    python3 results/tools/mutation_check.py [name-substring ...]      # from the repo root, CPU only
"""
import os, shutil, subprocess, sys, tempfile
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
M = [  # (name, file, old, new, -k expression)
 ("prompts right-padded", "grpo_sglang.py", "ids[i, P - len(p): P + len(c)] = torch.tensor(p + c)", "ids[i, : len(p) + len(c)] = torch.tensor(p + c)", "left_padding"),
 ("flush_cache never sent", "grpo_sglang.py", '"flush_cache": last, "weight_version": version if last else None}\n    answered = POOL.submit(post_update, cfg, "/update_weights_from_tensor"', '"flush_cache": False, "weight_version": version if last else None}\n    answered = POOL.submit(post_update, cfg, "/update_weights_from_tensor"', "several_buckets"),
 ("* world dropped", "grpo_sglang.py", "cfg.max_new_tokens) * world", "cfg.max_new_tokens)", "one_rank_and_two"),
 ("token count not all-reduced", "grpo_sglang.py", 'totals = all_reduce_named({"seqs": sums["seqs"], "tokens": sums["completion_tokens"]}, dist.ReduceOp.SUM, device)', 'totals = {"seqs": sums["seqs"], "tokens": sums["completion_tokens"]}', "one_rank_and_two"),
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
 ("no version check", "grpo_sglang.py", 'if str(meta.get("weight_version")) != version:', 'if False:', "skipped_push"),
 ("no mismatch check", "grpo_sglang.py", 'if mm["mismatch_abs"] / mm["tokens"] > cfg.mismatch_max:', 'if False:', "dropped_under"),
 ("temperature unchecked", "grpo_sglang.py", '("temperature", cfg.temperature > 0,', '("temperature", True,', "out_of_range or bad_flag"),
 ("ranks race rank 0 to the error file", "grpo_sglang.py", "time.sleep(3 if rank else 0)", "time.sleep(0)", "said_once"),
 ("async pushes mid-generation", "grpo_sglang.py", "        next_batch = on_all_ranks(pending.result) if pending else None\n        t_sync_start = time.time()\n        nbytes = sync_weights(step + 1)\n", "        t_sync_start = time.time()\n        nbytes = sync_weights(step + 1)\n        next_batch = on_all_ranks(pending.result) if pending else None\n", "async_trains"),
 ("nccl flushes every bucket", "grpo_sglang.py", '"group_name": link["group_name"], "load_format": "flattened_bucket", "flush_cache": last,', '"group_name": link["group_name"], "load_format": "flattened_bucket", "flush_cache": True,', "nccl_path_protocol"),
 ("plain format ignored", "grpo_sglang.py", 'fmt = ("chat" if tok.chat_template else "plain") if', 'fmt = "chat" if', "base_model"),
 ("version on every bucket", "grpo_sglang.py", '"flush_cache": last, "weight_version": version if last else None}\n    answered = POOL', '"flush_cache": last, "weight_version": version}\n    answered = POOL', "several_buckets"),
 ("async resume keeps stale version", "grpo_sglang.py", "batch = next_batch or on_all_ranks(rollout, step, step)", "batch = next_batch or on_all_ranks(rollout, step, max(step - 1, 0) if async_ and step > 0 else step)", "async_resume"),
 ("no bf16 cast in recompute", "grpo_sglang.py", "            m.register_forward_pre_hook(lambda m, args, kwargs: tree_map(to_compute, (args, kwargs)), with_kwargs=True)\n", "", "recompute_in_bf16"),
 ("default group bound", "grpo_sglang.py", 'dist.init_process_group("nccl" if use_cuda else "gloo")', 'dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)', "not_bound"),
 ("nccl send waited first, no timeout", "grpo_sglang.py", "    def wait():\n        try:\n            answered.result()", "    def wait():\n        sent.result()\n        try:\n            answered.result()", "nccl_path_failures"),
]
only = sys.argv[1:]
for name, f, old, new, k in M:
    if only and not any(o in name for o in only):
        continue
    d = os.path.join(tempfile.gettempdir(), "grpo_mutant")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(SRC, d, ignore=shutil.ignore_patterns(".venv-ci", ".gpukit", ".git", "runs"))
    p = os.path.join(d, f); s = open(p).read()
    if old not in s:
        print(f"?? {name}: pattern not found"); continue
    open(p, "w").write(s.replace(old, new, 1))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "test_smoke.py", "-k", k], cwd=d,
                       capture_output=True, text=True, timeout=900)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-200:]
    print(f"{'CAUGHT' if r.returncode else 'MISSED'}  {name:35s} [{k}] {last}", flush=True)
