r"""
Benchmarks for grpo_sglang: weight sync, rollout throughput, and the training step.

One GPU; the server shares GPU 0 with this process (the layout of `grpo_sglang.py --colocate`):

    MODEL=$KIT_MODEL_DIR GPU=0 MEM_FRACTION=0.25 ATTENTION_BACKEND=triton \
        EXTRA_ARGS="--sampling-backend pytorch --cuda-graph-max-bs-decode 256" bash serve.sh
    python3 bench.py --model $KIT_MODEL_DIR --out results/bench               # all three parts
    python3 bench.py --model $KIT_MODEL_DIR --parts sync --no-large            # no second server
    python3 bench.py --model $KIT_MODEL_DIR --parts step --step_args --steps 10 --lr 2e-6   # --step_args last
    python3 bench.py --merge OUT_DIR run1/bench.json run2/bench.json   # one report from several runs
    bash serve.sh stop

Parts (--parts; a part that fails is recorded in bench.json and the others still run):
  sync     time from "the trainer has new bf16 weights on cuda:0" to "the server generated with them"
           (update answered, cache flushed, a 1-token /generate answered), median of --reps after a warm-up:
             disk       save_pretrained to --tmp_dir + POST /update_weights_from_disk
             tensor     one payload of per-tensor CUDA-IPC handles, POST /update_weights_from_tensor
             bucket_MB  grpo_sglang.push_weights (flattened buckets of MB), its make_payload timed inside
             raw copy   a device-to-device copy of the same bytes: the floor
           for the served model and a random ~1.3B Llama (saved to /tmp/bench_large, served on --large_port
           by a second serve.sh, started and stopped here; ATTENTION_BACKEND / EXTRA_ARGS from the environment,
           else the values above). Before every push a few matrices get noise; "changed" says the server's
           logprobs of a fixed sequence moved after every push (a no-push control must not move them).
  rollout  output tokens/s, SGLang /generate vs transformers generate, same prompts, fixed length.
  step     grpo_sglang.py --colocate for 30 steps; medians of its per-step times from metrics.jsonl.

Writes to --out: bench.json (raw timings, medians, errors), bench.md (tables), bench.png (bar charts),
serve_large.log, step_train.log, step_metrics.jsonl.
"""
import argparse
import json
import math
import os
import random
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from types import SimpleNamespace

import requests
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
DEV = torch.device("cuda", 0)
LARGE_DIR = "/tmp/bench_large"
HTTP_TIMEOUT = 600
TARGETS = {"disk_over_bucket": 50.0, "bucket_over_raw": 3.0, "sglang_over_hf": 10.0, "step_s": 1.3, "sync_share": 0.05}


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def err(e):
    traceback.print_exc()
    return f"{type(e).__name__}: {e}"


def post(url, path, payload, check=False):
    key = os.environ.get("SGLANG_API_KEY")
    r = requests.post(url + path, json=payload, timeout=HTTP_TIMEOUT,
                      headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        body = r.json()
    except ValueError:
        body = r.text
    if r.status_code >= 400 or (check and not (isinstance(body, dict) and body.get("success"))):
        raise RuntimeError(f"{path}: HTTP {r.status_code}: {str(body)[:500]}")
    return body


def fs_type(path):
    """The file system under `path`: is the 'disk' a disk or tmpfs?"""
    try:
        path, mounts = os.path.realpath(path), [line.split()[1:3] for line in open("/proc/mounts")]
    except OSError:
        return "?"
    hits = [(mnt, fs) for mnt, fs in mounts if path == mnt or path.startswith(mnt.rstrip("/") + "/")]
    return "{1} ({0})".format(*max(hits, key=lambda h: len(h[0]))) if hits else "?"


# ----------------------------------------------------------------------------------------------
# sync. Each push_* updates the server and returns its phases in seconds ("prep": save / serialize /
# make_payload, "post": the update request(s)); bench_method adds the 1-token probe ("gen").

def probe(ctx):
    """/generate of 1 token that also returns the logprobs of the fixed sequence ctx.ids."""
    out = post(ctx.url, "/generate", {"input_ids": ctx.ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                                      "return_logprob": True, "logprob_start_len": 0})
    return [float(lp) for lp, *_ in out["meta_info"]["input_token_logprobs"] if lp is not None]


def maxdiff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if a and b and len(a) == len(b) else None


def save_model(model, d):
    import inspect  # transformers 5 always writes safetensors and may no longer take the flag
    kw = {"safe_serialization": True} if "safe_serialization" in inspect.signature(model.save_pretrained).parameters else {}
    model.save_pretrained(d, **kw)


def push_disk(ctx):
    d = tempfile.mkdtemp(prefix="bench_disk_", dir=ctx.tmp)
    ctx.trash.append(d)  # deleted after the timed part
    t0 = time.perf_counter()
    save_model(ctx.model, d)
    t1 = time.perf_counter()
    post(ctx.url, "/update_weights_from_disk", {"model_path": d}, check=True)  # flushes the cache by default
    return {"prep": t1 - t0, "post": time.perf_counter() - t1}


def push_tensor(ctx):
    from sglang.srt.utils import MultiprocessingSerializer
    t0 = time.perf_counter()
    named = [(n, p.detach()) for n, p in ctx.model.named_parameters()]  # handles of the parameters themselves
    payload = MultiprocessingSerializer.serialize(named, output_str=True)
    t1 = time.perf_counter()
    post(ctx.url, "/update_weights_from_tensor", {"serialized_named_tensors": [payload], "flush_cache": True},
         check=True)
    return {"prep": t1 - t0, "post": time.perf_counter() - t1}


def push_bucket(mb):
    """grpo_sglang.push_weights as the trainer calls it, with its make_payload (pack + serialize) wrapped in a
    timer, so one push splits into prep (make_payload) and post (HTTP + server)."""
    def run(ctx):
        import grpo_sglang
        cfg = grpo_sglang.Config(model=ctx.model_path, server_url=ctx.url, sync_bucket_mb=mb,
                                 api_key=os.environ.get("SGLANG_API_KEY", ""))
        packs, orig = [], grpo_sglang.make_payload

        def timed(named, device):
            t = time.perf_counter()
            out = orig(named, device)
            packs.append(time.perf_counter() - t)
            return out
        grpo_sglang.make_payload = timed
        try:
            t0 = time.perf_counter()
            grpo_sglang.push_weights(cfg, ctx.model, DEV, begin_end=False)
            return {"prep": sum(packs), "post": time.perf_counter() - t0 - sum(packs), "buckets": len(packs)}
        finally:
            grpo_sglang.make_payload = orig
    return run


@torch.no_grad()
def perturb(model, scale, n=4):
    """New weights before every push (outside the timer), so every push must move the server's logprobs."""
    for p in [p for p in model.parameters() if p.dim() == 2][:n]:
        p.add_(torch.randn_like(p), alpha=scale)
    torch.cuda.synchronize()


def bench_method(ctx, push, reps, scale):
    res = {"reps": [], "diffs": []}
    for i in range(reps + 1):  # rep 0: warm-up
        perturb(ctx.model, scale)
        t0 = time.perf_counter()
        t = push(ctx)
        t1 = time.perf_counter()
        lp = probe(ctx)
        t2 = time.perf_counter()
        t.update(push=t1 - t0, gen=t2 - t1, total=t2 - t0)
        diff, ctx.prev = maxdiff(lp, ctx.prev), lp
        while ctx.trash:
            shutil.rmtree(ctx.trash.pop(), ignore_errors=True)
        if i == 0:
            res["warmup"] = t
        else:
            res["reps"].append(t)
            res["diffs"].append(diff)
    res["median"] = {k: med([r[k] for r in res["reps"]]) for k in res["reps"][0]}
    res["gbps"] = ctx.nbytes / res["median"]["total"] / 1e9
    res["changed"] = all(d is not None and d > ctx.thresh for d in res["diffs"])
    return res


def raw_copy(nbytes, n=20):
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    dst, ts = torch.empty_like(src), []
    for _ in range(n + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return {"reps": ts[1:], "median": {"total": med(ts[1:])}, "gbps": nbytes / med(ts[1:]) / 1e9}


def sync_model(args, url, model, model_path, ids):
    nbytes = sum(p.numel() for p in model.parameters()) * 2  # bf16; tied embeddings once, as pushed
    ctx = SimpleNamespace(url=url, model=model, model_path=model_path, ids=ids, tmp=args.tmp_dir, nbytes=nbytes, trash=[])
    out = {"url": url, "model": model_path, "params": nbytes // 2, "bytes": nbytes, "methods": {}}
    a, b = probe(ctx), probe(ctx)  # noise: same weights twice
    perturb(model, args.perturb_scale)
    ctx.prev = probe(ctx)  # negative control: new weights, not pushed
    out["probe_noise"], out["control_no_push_diff"] = maxdiff(a, b), maxdiff(b, ctx.prev)
    noise = max(out["probe_noise"] or 0, out["control_no_push_diff"] or 0)
    ctx.thresh = out["changed_threshold"] = max(1e-4, 2 * noise)  # "changed": every push moved the probe more than this
    methods = [("disk", push_disk), ("tensor", push_tensor)]
    methods += [(f"bucket_{mb}", push_bucket(mb)) for mb in args.bucket_mb]
    for name, push in methods:
        try:
            out["methods"][name] = r = bench_method(ctx, push, args.reps, args.perturb_scale)
            print(f"  {name}: {r['median']['total']:.4f}s {r['gbps']:.2f} GB/s changed={r['changed']}", flush=True)
        except Exception as e:
            out["methods"][name] = {"error": err(e)}
        while ctx.trash:
            shutil.rmtree(ctx.trash.pop(), ignore_errors=True)
    try:
        out["raw_copy"] = raw_copy(nbytes)
    except Exception as e:
        out["raw_copy"] = {"error": err(e)}
    tot = lambda k: ((out["methods"].get(k) or {}).get("median") or {}).get("total")
    buckets = {k: tot(k) for k in out["methods"] if k.startswith("bucket_") and tot(k)}
    raw = out["raw_copy"].get("median", {}).get("total")
    r = out["ratios"] = {"best_bucket": min(buckets, key=buckets.get) if buckets else None}
    if tot("disk") and tot("tensor"):
        r["disk_over_tensor"] = tot("disk") / tot("tensor")
    if buckets and tot("disk"):
        r["disk_over_bucket"] = tot("disk") / buckets[r["best_bucket"]]
        r["disk_over_bucket_ok"] = r["disk_over_bucket"] >= TARGETS["disk_over_bucket"]
    if buckets and raw:
        r["bucket_over_raw"] = buckets[r["best_bucket"]] / raw
        r["bucket_push_over_raw"] = out["methods"][r["best_bucket"]]["median"]["push"] / raw  # without the probe
        r["bucket_over_raw_ok"] = r["bucket_over_raw"] <= TARGETS["bucket_over_raw"]
    return out


def build_large(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
    cfg = LlamaConfig(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                      num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=4096,
                      rms_norm_eps=1e-6, rope_theta=1e6)  # Qwen2.5-1.5B's shapes, SmolLM2's vocab
    torch.manual_seed(0)
    with torch.device(DEV):  # random init of 1.3B params is slow on the CPU
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model = model.to(DEV, torch.bfloat16).eval().requires_grad_(False)
    shutil.rmtree(LARGE_DIR, ignore_errors=True)
    save_model(model, LARGE_DIR)
    AutoTokenizer.from_pretrained(args.model).save_pretrained(LARGE_DIR)
    return model


def serve(args, stop=False):
    out = os.path.abspath(args.out)
    env = dict(os.environ, MODEL=LARGE_DIR, GPU="0", PORT=str(args.large_port), MEM_FRACTION=str(args.large_mem_fraction),
               ATTENTION_BACKEND=os.environ.get("ATTENTION_BACKEND", "triton"), TIMEOUT="600",
               EXTRA_ARGS=os.environ.get("EXTRA_ARGS", "--sampling-backend pytorch --cuda-graph-max-bs-decode 256"),
               PYTHON=os.environ.get("PYTHON", sys.executable), LOG=os.path.join(out, "serve_large.log"),
               PIDFILE=os.path.join(out, "serve_large.pid"))  # not serve.pid: that one is the main server's
    cmd = ["bash", os.path.join(HERE, "serve.sh")] + (["stop"] if stop else [])
    subprocess.run(cmd, env=env, check=True, timeout=700)


def part_sync(args, res):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    if DEV.type == "cuda":  # as in the trainer: IPC handles name the GPU by UUID (the patch breaks CPU tensors)
        monkey_patch_torch_reductions()
    if not dist.is_initialized():  # push_weights asks dist.get_rank()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    out = res["sync"] = {"tmp_dir": args.tmp_dir, "tmp_fs": fs_type(args.tmp_dir), "reps": args.reps}
    ids = AutoTokenizer.from_pretrained(args.model)("The quick brown fox jumps over the lazy dog. 12 + 30 = 42",
                                                    add_special_tokens=False)["input_ids"]
    url = args.server_url.rstrip("/")
    try:
        if not args.small:
            raise RuntimeError("skipped (--no-small)")
        served = requests.get(url + "/model_info", timeout=30).json()["model_path"]
        if served != args.model and os.path.realpath(served) != os.path.realpath(args.model):
            raise RuntimeError(f"the server at {url} serves {served!r}, not --model {args.model!r}")
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(DEV).eval()
        model.requires_grad_(False)
        try:
            out["small"] = sync_model(args, url, model, args.model, ids)
        finally:  # the disk method left the server on a deleted temp dir: back to its own path and weights
            try:
                post(url, "/update_weights_from_disk", {"model_path": served}, check=True)
                out.setdefault("small", {})["restored"] = True
            except Exception as e:
                out.setdefault("small", {})["restore_error"] = err(e)
        del model
    except Exception as e:
        out.setdefault("small", {})["error"] = err(e)
    torch.cuda.empty_cache()
    if not args.large:
        return
    try:
        print(f"  building the large model in {LARGE_DIR}, starting its server on :{args.large_port}", flush=True)
        model = build_large(args)
        t0 = time.time()
        serve(args)
        out["large_server_start_s"] = time.time() - t0
        out["large"] = sync_model(args, f"http://127.0.0.1:{args.large_port}", model, LARGE_DIR, ids)
        del model
    except Exception as e:
        out.setdefault("large", {})["error"] = err(e)
    finally:
        try:
            serve(args, stop=True)
        except Exception as e:
            out["large_server_stop_error"] = err(e)
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# rollout: SGLang vs transformers, the same prompts, every completion exactly max_new_tokens long

def rollout_prompts(tok, n, group_size):
    rng, prompts = random.Random(0), []
    for _ in range(math.ceil(n / group_size)):
        q = f"What is {rng.randint(0, 30)} + {rng.randint(0, 30)}?\nAnswer with the number only."
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    return [p for p in prompts for _ in range(group_size)][:n]


def sglang_rollout(args, batch, _model=None, _pad=None):
    sp = {"max_new_tokens": args.max_new_tokens, "ignore_eos": True, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    return sum(len(o["output_ids"]) for o in post(args.server_url.rstrip("/"), "/generate",
                                                   {"input_ids": batch, "sampling_params": sp}))


@torch.no_grad()
def hf_rollout(args, batch, model, pad):
    L = max(map(len, batch))  # left padding
    ids = torch.tensor([[pad] * (L - len(b)) + b for b in batch], device=DEV)
    attn = torch.tensor([[0] * (L - len(b)) + [1] * len(b) for b in batch], device=DEV)
    out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                         max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, pad_token_id=pad)
    torch.cuda.synchronize()
    return (out.shape[1] - L) * len(batch)


def part_rollout(args, res):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(DEV).eval()
    out = res["rollout"] = {"group_size": args.group_size, "max_new_tokens": args.max_new_tokens, "batches": {}}
    for n in args.rollout_batches:
        batch, row = rollout_prompts(tok, n, args.group_size), {}
        out["batches"][str(n)] = row
        for name, fn in (("sglang", sglang_rollout), ("hf", hf_rollout)):
            try:
                ts = []
                for i in range(args.rollout_reps + 1):  # the first is the warm-up
                    t0 = time.perf_counter()
                    tokens = fn(args, batch, model, pad)
                    ts.append(time.perf_counter() - t0)
                row[name] = {"reps": ts[1:], "tokens": tokens, "median_s": med(ts[1:])}
                row[name]["tok_per_s"] = tokens / row[name]["median_s"]
                print(f"  rollout {n} seqs, {name}: {row[name]['tok_per_s']:.0f} tok/s", flush=True)
            except Exception as e:
                row[name] = {"error": err(e)}
                torch.cuda.empty_cache()
        if "tok_per_s" in row["sglang"] and "tok_per_s" in row["hf"]:
            row["ratio"] = row["sglang"]["tok_per_s"] / row["hf"]["tok_per_s"]
            row["ratio_ok"] = row["ratio"] >= TARGETS["sglang_over_hf"]
    del model
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# step: the real trainer, timings from its metrics.jsonl

def part_step(args, res):
    out = res["step"] = {}
    tmp = tempfile.mkdtemp(prefix="bench_step_", dir=args.tmp_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", os.path.join(HERE, "grpo_sglang.py"),
           "--colocate", "--model", args.model, "--server_url", args.server_url, "--dataset", "builtin",
           "--prompts_per_step", "16", "--group_size", str(args.group_size), "--max_new_tokens",
           str(args.max_new_tokens), "--beta", "0", "--steps", "30", "--eval_every", "0", "--save_every", "0",
           "--out_dir", tmp] + args.step_args  # later flags win in argparse: --step_args overrides
    out["cmd"], log = shlex.join(cmd), os.path.join(args.out, "step_train.log")
    print(f"  {out['cmd']}\n  (log: {log})", flush=True)
    try:
        t0 = time.time()
        with open(log, "w") as f:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=HERE, timeout=3600)
        out["wall_s"], out["returncode"] = time.time() - t0, p.returncode
        mpath = os.path.join(tmp, "metrics.jsonl")
        if p.returncode:
            lines = open(log).readlines()  # the trainer's own "error: ..." line, else the end of the log
            why = [l for l in lines if l.startswith(("error:", "Traceback"))] or lines[-15:]
            out["error"] = f"trainer exited with {p.returncode} (see {log}): " + "".join(why).strip()
            if not os.path.exists(mpath):
                raise RuntimeError(out["error"])
        shutil.copy(mpath, os.path.join(args.out, "step_metrics.jsonl"))
        rows = [json.loads(line) for line in open(mpath) if line.strip()]
        rows = sorted((r for r in rows if "time_rollout" in r), key=lambda r: r["step"])  # not the eval-only rows
        used = rows[args.step_warmup:]
        if not used:
            raise RuntimeError(f"{len(rows)} step rows, none after the {args.step_warmup} warm-up steps")
        keys = ["time_rollout", "time_ref", "time_train", "time_sync", "time_step"]
        if not all("time_step" in r for r in used):
            out["note"] = "no time_step in metrics.jsonl: step = rollout + ref + train + sync"
            for r in used:
                r["time_step"] = sum(r[k] for k in keys[:4])
        out["steps_total"], out["steps_used"] = len(rows), len(used)
        out["per_step"] = {k: [r.get(k) for r in used] for k in keys}
        out["medians"] = {k: med(v) for k, v in out["per_step"].items()}
        out["sync_share"] = sum(r["time_sync"] for r in used) / sum(r["time_step"] for r in used)  # of total time
        out["step_ok"] = out["medians"]["time_step"] <= TARGETS["step_s"]
        out["sync_share_ok"] = out["sync_share"] <= TARGETS["sync_share"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# reports

def fmt(x, spec=".3f"):
    return "-" if x is None else (("yes" if x else "NO") if isinstance(x, bool) else format(x, spec))


def total(entry):
    return ((entry or {}).get("median") or {}).get("total")


def summary_rows(res):
    """-> [(metric, value, target, met)]: the table printed at the end and on top of bench.md."""
    rows = [(f"{p} FAILED", res[p]["error"].splitlines()[0][:90], "", None) for p in ("sync", "rollout", "step")
            if (res.get(p) or {}).get("error")]
    for m in ("small", "large"):
        s = (res.get("sync") or {}).get(m) or {}
        rows += [(f"sync {m} FAILED", s[k][:90], "", None) for k in ("error", "restore_error") if s.get(k)]
        if s.get("methods"):
            r, ms = s["ratios"], s["methods"]
            rows += [(f"sync {m}: disk / tensor / {r['best_bucket']} s",
                      " / ".join(fmt(total(ms.get(k)), ".4f") for k in ("disk", "tensor", r["best_bucket"])), "", None),
                     (f"sync {m}: disk / best bucket", fmt(r.get("disk_over_bucket"), ".1f") + "x", ">= 50x",
                      r.get("disk_over_bucket_ok")),
                     (f"sync {m}: best bucket / raw copy", fmt(r.get("bucket_over_raw"), ".1f") + "x", "<= 3x",
                      r.get("bucket_over_raw_ok")),
                     (f"sync {m}: every push changed the server", "", "yes", all(v.get("changed") for v in ms.values()))]
    for n, b in ((res.get("rollout") or {}).get("batches") or {}).items():
        rows.append((f"rollout {n} seqs: sglang / hf tok/s", fmt(b.get("ratio"), ".1f") + "x", ">= 10x", b.get("ratio_ok")))
    st = res.get("step") or {}
    if st.get("medians"):
        rows += [("step: median step s", fmt(st["medians"]["time_step"]), "<= 1.3", st["step_ok"]),
                 ("step: sync share", fmt(100 * st["sync_share"], ".1f") + "%", "<= 5%", st["sync_share_ok"])]
    return rows


def table(header, rows):
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def write_md(res, path):
    L = ["# grpo_sglang benchmarks", "", f"{res['meta']['time']}, {res['meta']['gpu']}, {res['meta']['versions']}", ""]
    L += table(["metric", "value", "target", "met"], [(a, b, c, "" if d is None else fmt(d)) for a, b, c, d in summary_rows(res)])
    sync = res.get("sync") or {}
    for m in ("small", "large"):
        s = sync.get(m) or {}
        if not s.get("methods"):
            continue
        raw, disk = total(s.get("raw_copy")), total(s["methods"].get("disk"))
        L += ["", f"## Weight sync, {m}: {s['params'] / 1e6:.0f}M params, {s['bytes'] / 2**20:.0f} MiB bf16 ({s['url']})", "",
              f"Medians of {sync['reps']} reps. prep = save_pretrained / serialize / make_payload; post = the update "
              f"request(s) (bucket: HTTP + server); gen = the 1-token /generate. Temp dir on {sync['tmp_fs']}. "
              f"Probe noise {fmt(s['probe_noise'], '.2g')}, no-push control {fmt(s['control_no_push_diff'], '.2g')}; "
              f"'changed' = every push moved the probe by > {s['changed_threshold']:.2g} nats.", ""]
        rows = [(k, "error: " + v["error"][:70], *[""] * 7) if "error" in v else
                (k, *(fmt(v["median"][c], ".4f") for c in ("prep", "post", "gen", "total")), fmt(v["gbps"], ".2f"),
                 fmt(disk / total(v) if disk else None, ".1f"), fmt(total(v) / raw if raw else None, ".1f"), fmt(v["changed"]))
                for k, v in s["methods"].items()]
        if raw:
            rows.append(("raw d2d copy", "", "", "", fmt(raw, ".6f"), fmt(s["raw_copy"]["gbps"], ".0f"), "", "1.0", ""))
        L += table(["method", "prep s", "post s", "gen s", "total s", "GB/s", "disk / this", "this / raw", "changed"], rows)
    ro = res.get("rollout") or {}
    if ro.get("batches"):
        L += ["", f"## Rollout: {ro['max_new_tokens']} new tokens per sequence, groups of {ro['group_size']}, "
              "temperature 1", ""]
        L += table(["sequences", "SGLang tok/s", "HF tok/s", "SGLang / HF"],
                   [(n, fmt(b.get("sglang", {}).get("tok_per_s"), ".0f"), fmt(b.get("hf", {}).get("tok_per_s"), ".0f"),
                     fmt(b.get("ratio"), ".1f")) for n, b in ro["batches"].items()])
    st = res.get("step") or {}
    if st.get("medians"):
        L += ["", f"## Training step: medians of {st['steps_used']} of {st['steps_total']} steps", "", f"`{st['cmd']}`", ""]
        L += table(["rollout s", "ref s", "train s", "sync s", "step s", "sync share"],
                   [(*(fmt(st["medians"][k]) for k in ("time_rollout", "time_ref", "time_train", "time_sync", "time_step")),
                     fmt(100 * st["sync_share"], ".1f") + "%")])
    open(path, "w").write("\n".join(L) + "\n")


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(18, 5))
    sync, nan = res.get("sync") or {}, float("nan")
    models = [m for m in ("small", "large") if (sync.get(m) or {}).get("methods")]
    names = list(dict.fromkeys(k for m in models for k in sync[m]["methods"])) + ["raw_copy"]
    w = 0.8 / max(len(models), 1)
    for j, m in enumerate(models):
        vals = [total(sync[m]["methods"].get(k) or (sync[m].get(k) if k == "raw_copy" else None)) or nan for k in names]
        a1.bar([i + (j - (len(models) - 1) / 2) * w for i in range(len(names))], vals, w, label=m)
    a1.set(yscale="log", ylabel="s, new weights -> server generated", title="weight sync (median)")
    a1.set_xticks(range(len(names)), names, rotation=30)
    ro = (res.get("rollout") or {}).get("batches") or {}
    for j, eng in enumerate(("sglang", "hf")):
        a2.bar([i + 0.4 * j - 0.2 for i in range(len(ro))], [b.get(eng, {}).get("tok_per_s", nan) for b in ro.values()],
               0.4, label=eng)
    a2.set(yscale="log", ylabel="output tokens / s", xlabel="sequences per batch", title="rollout throughput")
    a2.set_xticks(range(len(ro)), list(ro))
    md, bottom = (res.get("step") or {}).get("medians") or {}, 0.0
    for k in ("time_rollout", "time_ref", "time_train", "time_sync"):
        if md.get(k) is not None:
            a3.bar(["median step"], [md[k]], 0.4, bottom=bottom, label=k[5:])
            bottom += md[k]
    if md.get("time_step") is not None:
        a3.bar(["median step"], [max(md["time_step"] - bottom, 0.0)], 0.4, bottom=bottom, label="other")
    a3.axhline(TARGETS["step_s"], color="k", ls="--", label=f"target {TARGETS['step_s']} s")
    a3.set(ylabel="s", title="GRPO step, colocated (medians)")
    for ax in (a1, a2, a3):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ----------------------------------------------------------------------------------------------

PARTS = {"sync": part_sync, "rollout": part_rollout, "step": part_step}


def parse_args(argv=None):
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="sync,rollout,step", help="comma-separated subset of sync,rollout,step")
    p.add_argument("--out", default="results/bench", help="folder for bench.json, bench.md, bench.png and logs")
    p.add_argument("--server_url", default="http://127.0.0.1:30000", help="the running server (serve.sh, GPU 0)")
    p.add_argument("--model", default=os.environ.get("KIT_MODEL_DIR"), help="the model it serves (default $KIT_MODEL_DIR)")
    p.add_argument("--reps", type=int, default=5, help="sync: timed reps per method, after one warm-up")
    p.add_argument("--bucket_mb", type=ints, default=[64, 256, 1024], help="sync: bucket sizes for push_weights")
    p.add_argument("--perturb_scale", type=float, default=1e-3, help="sync: std of the noise added before each push")
    p.add_argument("--tmp_dir", default="/tmp", help="local disk for the disk method and the step run's out_dir")
    p.add_argument("--large", action=argparse.BooleanOptionalAction, default=True, help="sync: also the ~1.3B model")
    p.add_argument("--large_port", type=int, default=30001, help="sync: port of the large model's server")
    # SGLang sizes its pool as free memory - total * (1 - fraction): with the main server (0.3) and
    # this process already on the GPU, the second server needs a fraction above ~0.35 to start at all
    p.add_argument("--large_mem_fraction", type=float, default=0.45, help="sync: its MEM_FRACTION")
    p.add_argument("--small", action=argparse.BooleanOptionalAction, default=True, help="sync: the served model")
    p.add_argument("--rollout_batches", type=ints, default=[32, 128, 256], help="rollout: sequences per batch")
    p.add_argument("--rollout_reps", type=int, default=3, help="rollout: timed reps after one warm-up")
    p.add_argument("--group_size", type=int, default=8, help="rollout and step: completions per prompt")
    p.add_argument("--max_new_tokens", type=int, default=128, help="rollout and step")
    p.add_argument("--step_warmup", type=int, default=3, help="step: first steps left out of the medians")
    p.add_argument("--step_args", nargs=argparse.REMAINDER, default=[],
                   help="step: everything after it goes to grpo_sglang.py, overriding; must come last")
    args = p.parse_args(argv)
    args.parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    if set(args.parts) - set(PARTS):
        p.error(f"unknown parts {sorted(set(args.parts) - set(PARTS))}; choose from {list(PARTS)}")
    if not args.model:
        p.error("--model is required (or set $KIT_MODEL_DIR)")
    return args


def has_dist(name):
    from importlib.metadata import PackageNotFoundError, version
    try:
        return bool(version(name))
    except PackageNotFoundError:
        return False


def merge(paths):
    """Several bench.json files (runs of different parts) -> one result; later files win, except that
    a part that only failed or was skipped never replaces a real one."""
    res = {}
    for path in paths:
        for part, val in json.load(open(path)).items():
            if isinstance(val, dict) and isinstance(res.get(part), dict):
                for k, v in val.items():
                    if not (isinstance(v, dict) and set(v) <= {"error", "restored", "restore_error"} and "error" in v):
                        res[part][k] = v
            else:
                res[part] = val
    return res


def main():
    if sys.argv[1:2] == ["--merge"]:  # bench.py --merge OUT_DIR a/bench.json b/bench.json ...
        out, res = sys.argv[2], merge(sys.argv[3:])
        os.makedirs(out, exist_ok=True)
        json.dump(res, open(os.path.join(out, "bench.json"), "w"), indent=1, default=str)
        write_md(res, os.path.join(out, "bench.md"))
        plot(res, os.path.join(out, "bench.png"))
        return
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    from importlib.metadata import version
    res = {"meta": {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "targets": TARGETS,
                    "versions": {k: version(k) for k in ("torch", "sglang", "transformers") if has_dist(k)},
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}
    jpath = os.path.join(args.out, "bench.json")
    for part in args.parts:
        print(f"== {part}", flush=True)
        t0 = time.time()
        try:
            PARTS[part](args, res)
        except Exception as e:
            res.setdefault(part, {})["error"] = err(e)
        res[part]["part_wall_s"] = time.time() - t0
        json.dump(res, open(jpath, "w"), indent=1, default=str)  # after every part: partial results survive
    for name, fn in (("bench.md", write_md), ("bench.png", plot)):
        try:
            fn(res, os.path.join(args.out, name))
        except Exception as e:
            res["meta"][f"{name}_error"] = err(e)
    json.dump(res, open(jpath, "w"), indent=1, default=str)
    rows = summary_rows(res)
    w = max([len(r[0]) for r in rows] + [6])
    print(f"\n{'metric':<{w}}  {'value':<28} {'target':<8} met")
    for a, b, c, d in rows:
        print(f"{a:<{w}}  {b:<28} {c:<8} {'' if d is None else fmt(d)}")
    print(f"\nwrote bench.json, bench.md, bench.png to {args.out}")
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
