r"""
Benchmarks for grpo_sglang: weight sync, rollout throughput, and the training step.

One GPU (--layout colocated, the default); the server shares GPU 0 with this process (the layout of
`grpo_sglang.py --colocate`):

    MODEL=$KIT_MODEL_DIR GPU=0 MEM_FRACTION=0.25 ATTENTION_BACKEND=triton \
        EXTRA_ARGS="--sampling-backend pytorch --cuda-graph-max-bs-decode 256" bash serve.sh
    python3 dev/bench.py --model $KIT_MODEL_DIR --out runs/bench                  # all three parts
    python3 dev/bench.py --model $KIT_MODEL_DIR --parts sync --no-large            # no second server
    python3 dev/bench.py --model $KIT_MODEL_DIR --parts step --step_args --steps 10 --lr 2e-6   # --step_args last
    python3 dev/bench.py --merge OUT_DIR run1/bench.json run2/bench.json   # one report from several runs
    bash serve.sh stop

Two GPUs (--layout x2, issue 11; sync only): the weights live on cuda:0 (the trainer's GPU), each model's server
runs on GPU 1 (--server_gpu), started here with serve.sh on port --large_port and stopped after its model; no
server needs to be running before. ATTENTION_BACKEND, EXTRA_ARGS and MEM_FRACTION come from the environment,
else triton, "--sampling-backend pytorch --cuda-graph-max-bs-decode 256" and 0.7:

    python3 dev/bench.py --layout x2 --model $KIT_MODEL_DIR --parts sync \
        --extra_models qwen1.5b=/tmp/models/qwen2.5-1.5b-random,qwen7b=/tmp/models/qwen2.5-7b-random \
        --out runs/x2_sync
    # or with the --model server already on GPU 1 (the --extra_models servers would need room next to it):
    MODEL=$KIT_MODEL_DIR GPU=1 bash serve.sh
    python3 dev/bench.py --layout x2 --model $KIT_MODEL_DIR --server_url http://127.0.0.1:30000 --out runs/x2_sync

Parts (--parts; a part, model or method that fails is recorded in bench.json and the others still run):
  sync     time from "the trainer has new bf16 weights on cuda:0" to "the server generated with them"
           (update answered, cache flushed, a 1-token /generate answered), median of --reps after a warm-up;
           each push tags the weights with a new version. Colocated:
             disk       save_pretrained to --tmp_dir + POST /update_weights_from_disk
             tensor     one payload of per-tensor CUDA-IPC handles, POST /update_weights_from_tensor
             bucket_MB  grpo_sglang.push_weights (flattened buckets of MB), its pack + serialize_bucket timed inside
             raw copy   a device-to-device copy of the same bytes: the floor
           for the served model and a random ~1.3B Llama (saved to /tmp/bench_large, served on --large_port
           by a second serve.sh, started and stopped here; GPU memory --large_mem_fraction).
           x2, for --model and every --extra_models name=path:
             disk       as above
             tensor     grpo_sglang.push_weights, buckets of --x2_bucket_mb staged on the server's GPU (cuda:1)
             nccl       grpo_sglang.push_weights over the group of grpo_sglang.connect_nccl (formed once, not timed)
             raw copy   cuda:0 -> cuda:1, the same bytes: the floor
           Before every push a few matrices get noise; "changed" says the server's logprobs of a fixed sequence
           moved after every push (a no-push control must not move them), "tagged" that they came from the
           version that push set.
  rollout  output tokens/s, SGLang /generate vs transformers generate, same prompts, fixed length.
  step     grpo_sglang.py --colocate for 30 steps; medians of its per-step times from metrics.jsonl.

Writes to --out: bench.json (raw timings, medians, errors; after every model and part), summary.json (sync:
[{"model", "bytes", "disk_s", "tensor_s", "nccl_s", "raw_copy_s", ...}], null where a method failed),
bench.md (tables), bench.png (bar charts), serve_<model>.log, step_train.log, step_metrics.jsonl.
"""
import argparse
import dataclasses
import json
import math
import os
import random
import re
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

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root
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
# sync. Each push_* updates the server at ctx.url with ctx.model's weights, tags them ctx.version, and returns
# its phases in seconds ("prep": save_pretrained / serialize / pack + serialize_bucket, "post": the rest of the
# push, i.e. the update request(s)); bench_method adds the 1-token probe ("gen").

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 12 + 30 = 42"
SYNC_TIMEOUT = 120  # s: grpo_sglang's request timeout in the push_weights methods (a bucket, the NCCL group)


def sync_devices(*devs):
    for d in devs:
        if isinstance(d, torch.device) and d.type == "cuda":
            torch.cuda.synchronize(d)


def probe(ctx):
    """/generate of 1 token that also returns the logprobs of the fixed sequence ctx.ids.
    -> (logprobs, the weight version that answered)"""
    out = post(ctx.url, "/generate", {"input_ids": ctx.ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                                      "return_logprob": True, "logprob_start_len": 0})
    meta = out["meta_info"]
    return [float(lp) for lp, *_ in meta["input_token_logprobs"] if lp is not None], meta.get("weight_version")


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
    post(ctx.url, "/update_weights_from_disk", {"model_path": d, "weight_version": ctx.version},
         check=True)  # flushes the cache by default
    return {"prep": t1 - t0, "post": time.perf_counter() - t1}


def push_tensor(ctx):
    """Colocated only: CUDA-IPC handles of the parameters themselves, one per tensor."""
    from sglang.srt.utils import MultiprocessingSerializer
    t0 = time.perf_counter()
    named = [(n, p.detach()) for n, p in ctx.model.named_parameters()]  # handles of the parameters themselves
    payload = MultiprocessingSerializer.serialize(named, output_str=True)
    t1 = time.perf_counter()
    post(ctx.url, "/update_weights_from_tensor", {"serialized_named_tensors": [payload], "flush_cache": True,
                                                  "weight_version": ctx.version}, check=True)
    return {"prep": t1 - t0, "post": time.perf_counter() - t1}


def push_link(kind, mb):
    """grpo_sglang.push_weights as the trainer calls it, through ctx.links[kind] ('tensor': flat buckets staged
    on the link's device, sent as CUDA-IPC handles; 'nccl': broadcast to the server), buckets of `mb` MiB.
    Its pack and serialize_bucket are wrapped in a timer: prep = their sum, post = the rest of the push."""
    def run(ctx):
        import grpo_sglang as g
        link = ctx.links.get(kind)
        if not isinstance(link, dict):
            raise RuntimeError(link or f"no {kind} link to the server")
        times, orig = {"pack": [], "serialize": []}, (g.pack, g.serialize_bucket)

        def timed(fn, key):
            def wrapped(*a):
                t = time.perf_counter()
                try:
                    return fn(*a)
                finally:
                    times[key].append(time.perf_counter() - t)
            return wrapped
        g.pack, g.serialize_bucket = timed(g.pack, "pack"), timed(g.serialize_bucket, "serialize")
        try:
            t0 = time.perf_counter()
            sent = g.push_weights(dataclasses.replace(ctx.cfg, sync_bucket_mb=mb), ctx.model, link, ctx.version)
            push = time.perf_counter() - t0
        finally:
            g.pack, g.serialize_bucket = orig
        prep = sum(times["pack"]) + sum(times["serialize"])
        return {"prep": prep, "post": push - prep, "buckets": len(times["pack"]), "bytes_sent": sent}
    return run


def connect(ctx):
    """Before the nccl method, not timed: the 2-rank group with the server, as the trainer forms it at start."""
    import grpo_sglang as g
    t0 = time.perf_counter()
    ctx.links["nccl"] = g.connect_nccl(ctx.cfg, DEV, [{"url": ctx.url, "tp": 1, "begin_end": ctx.begin_end}])
    ctx.out["nccl_connect_s"] = time.perf_counter() - t0


def disconnect(ctx):
    """Both ends leave the group at once (neither waits on the other). Needed before the next server: the
    trainer names its group after host and pid, and a process cannot hold two groups of one name."""
    import torch.distributed as dist
    import grpo_sglang as g
    link = ctx.links.pop("nccl")
    srv = link["servers"][0]
    left = g.POOL.submit(g.call, ctx.cfg, ctx.url, "/destroy_weights_update_group", {"group_name": srv["group_name"]},
                         timeout=60, retries=0)
    gone = g.POOL.submit(dist.destroy_process_group, srv["group"])
    g.waited(gone, SYNC_TIMEOUT, "leaving the NCCL group")
    g.waited(left, SYNC_TIMEOUT, "the server leaving the NCCL group")


@torch.no_grad()
def perturb(model, scale, n=4):
    """New weights before every push (outside the timer), so every push must move the server's logprobs."""
    for p in [p for p in model.parameters() if p.dim() == 2][:n]:
        p.add_(torch.randn_like(p), alpha=scale)
    sync_devices(DEV)


def bench_method(ctx, name, push, reps, scale):
    res = {"reps": [], "diffs": [], "versions": []}
    for i in range(reps + 1):  # rep 0: warm-up
        perturb(ctx.model, scale)
        ctx.pushes += 1
        ctx.version = f"bench_{ctx.pushes}"
        t0 = time.perf_counter()
        t = push(ctx)
        t1 = time.perf_counter()
        lp, version = probe(ctx)
        t2 = time.perf_counter()
        t.update(push=t1 - t0, gen=t2 - t1, total=t2 - t0)
        diff, ctx.prev = maxdiff(lp, ctx.prev), lp
        while ctx.trash:
            shutil.rmtree(ctx.trash.pop(), ignore_errors=True)
        print(f"    {name} {'warm-up' if i == 0 else f'rep {i}'}: {t['total']:.4f}s, probe moved {fmt(diff, '.3g')}, "
              f"version {version}", flush=True)
        if i == 0:
            res["warmup"] = t
        else:
            res["reps"].append(t)
            res["diffs"].append(diff)
            res["versions"].append(version)
    res["median"] = {k: med([r[k] for r in res["reps"]]) for k in res["reps"][0]}
    res["gbps"] = ctx.nbytes / res["median"]["total"] / 1e9
    res["changed"] = all(d is not None and d > ctx.thresh for d in res["diffs"])
    res["tagged"] = res["versions"] == [f"bench_{ctx.pushes - reps + i}" for i in range(1, reps + 1)]  # the probe
    return res                                                                         # saw each push's own tag


def raw_copy(nbytes, dst, n=20, chunk=2**30):
    """The floor: nbytes copied from DEV to `dst` (DEV itself colocated, the server's GPU in x2) in pieces of at
    most `chunk` bytes (as the buckets go; only 2 x chunk of memory), median of n after a warm-up."""
    if not isinstance(dst, torch.device):
        raise RuntimeError(dst or "no destination device")
    size = min(nbytes, chunk)
    src = torch.empty(size, dtype=torch.uint8, device=DEV)
    out, ts = torch.empty(size, dtype=torch.uint8, device=dst), []
    for _ in range(n + 1):
        sync_devices(DEV, dst)
        t0 = time.perf_counter()
        for off in range(0, nbytes, size):
            k = min(size, nbytes - off)
            out[:k].copy_(src[:k])
        sync_devices(DEV, dst)
        ts.append(time.perf_counter() - t0)
    return {"reps": ts[1:], "chunk_bytes": size, "dst": str(dst), "median": {"total": med(ts[1:])},
            "gbps": nbytes / med(ts[1:]) / 1e9}


def sync_model(args, ctx, methods, raw_dst):
    """Every method on ctx's server, then the raw copy; results into ctx.out."""
    out = ctx.out
    out.update(url=ctx.url, params=ctx.nbytes // 2, bytes=ctx.nbytes, methods={})
    a, b = probe(ctx)[0], probe(ctx)[0]  # noise: same weights twice
    perturb(ctx.model, args.perturb_scale)
    ctx.prev = probe(ctx)[0]  # negative control: new weights, not pushed
    out["probe_noise"], out["control_no_push_diff"] = maxdiff(a, b), maxdiff(b, ctx.prev)
    noise = max(out["probe_noise"] or 0, out["control_no_push_diff"] or 0)
    ctx.thresh = out["changed_threshold"] = max(1e-4, 2 * noise)  # "changed": every push moved the probe more than this
    for name, push, setup in methods:
        try:
            if setup:
                setup(ctx)
            out["methods"][name] = r = bench_method(ctx, name, push, args.reps, args.perturb_scale)
            print(f"  {name}: {r['median']['total']:.4f}s {r['gbps']:.2f} GB/s changed={r['changed']} "
                  f"tagged={r['tagged']}", flush=True)
        except Exception as e:
            out["methods"][name] = {"error": err(e)}
            print(f"  {name} FAILED: {out['methods'][name]['error'].splitlines()[0]}", flush=True)
        while ctx.trash:
            shutil.rmtree(ctx.trash.pop(), ignore_errors=True)
    try:
        out["raw_copy"] = r = raw_copy(ctx.nbytes, raw_dst)
        print(f"  raw copy to {raw_dst}: {r['median']['total']:.6f}s {r['gbps']:.1f} GB/s", flush=True)
    except Exception as e:
        out["raw_copy"] = {"error": err(e)}
    out["ratios"] = (x2_ratios if args.layout == "x2" else colocated_ratios)(out)


def colocated_ratios(out):
    ms, raw = out["methods"], total(out["raw_copy"])
    buckets = {k: total(v) for k, v in ms.items() if k.startswith("bucket_") and total(v)}
    r = {"best_bucket": min(buckets, key=buckets.get) if buckets else None}
    if total(ms.get("disk")) and total(ms.get("tensor")):
        r["disk_over_tensor"] = total(ms["disk"]) / total(ms["tensor"])
    if buckets and total(ms.get("disk")):
        r["disk_over_bucket"] = total(ms["disk"]) / buckets[r["best_bucket"]]
        r["disk_over_bucket_ok"] = r["disk_over_bucket"] >= TARGETS["disk_over_bucket"]
    if buckets and raw:
        r["bucket_over_raw"] = buckets[r["best_bucket"]] / raw
        r["bucket_push_over_raw"] = ms[r["best_bucket"]]["median"]["push"] / raw  # without the probe
        r["bucket_over_raw_ok"] = r["bucket_over_raw"] <= TARGETS["bucket_over_raw"]
    return r


def x2_ratios(out):
    """disk / tensor, disk / nccl, tensor / raw, nccl / raw (the same targets as the colocated bucket path)."""
    ms, raw, disk, r = out["methods"], total(out["raw_copy"]), total(out["methods"].get("disk")), {}
    for k in ("tensor", "nccl"):
        t = total(ms.get(k))
        if t and disk:
            r[f"disk_over_{k}"] = disk / t
            r[f"disk_over_{k}_ok"] = r[f"disk_over_{k}"] >= TARGETS["disk_over_bucket"]
        if t and raw:
            r[f"{k}_over_raw"] = t / raw
            r[f"{k}_push_over_raw"] = ms[k]["median"]["push"] / raw  # without the probe
            r[f"{k}_over_raw_ok"] = r[f"{k}_over_raw"] <= TARGETS["bucket_over_raw"]
    return r


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


def load_model(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(DEV).eval().requires_grad_(False)


def probe_ids(path, fallback, vocab):
    """PROBE_TEXT in the model's own tokenizer, else the served model's ids that fit its vocabulary."""
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path)(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    except Exception:
        return [i for i in fallback if i < vocab]


def serve(args, name, path, stop=False):
    """serve.sh for a server of our own on --large_port: on GPU 0 next to the main server (colocated) or on
    --server_gpu (x2). ATTENTION_BACKEND, EXTRA_ARGS and, in x2, MEM_FRACTION from the environment if set."""
    out, x2 = os.path.abspath(args.out), args.layout == "x2"
    env = dict(os.environ, MODEL=path, GPU=str(args.server_gpu) if x2 else "0", PORT=str(args.large_port),
               MEM_FRACTION=os.environ.get("MEM_FRACTION", "0.7") if x2 else str(args.large_mem_fraction),
               ATTENTION_BACKEND=os.environ.get("ATTENTION_BACKEND", "triton"), TIMEOUT="600",
               EXTRA_ARGS=os.environ.get("EXTRA_ARGS", "--sampling-backend pytorch --cuda-graph-max-bs-decode 256"),
               PYTHON=os.environ.get("PYTHON", sys.executable), LOG=os.path.join(out, f"serve_{name}.log"),
               PIDFILE=os.path.join(out, f"serve_{name}.pid"))  # not serve.pid: that one is the main server's
    cmd = ["bash", os.path.join(HERE, "serve.sh")] + (["stop"] if stop else [])
    subprocess.run(cmd, env=env, check=True, timeout=700)


def bench_model(args, name, path, url, load, server_dev, ids):
    """The sync of one model: loaded (or built) on cuda:0; served at `url` if given (already running; its own
    weights are restored afterwards), else by a server started here with serve.sh and stopped afterwards.
    `server_dev`: the server's GPU as this process sees it (x2), or why there is none. Never raises."""
    import grpo_sglang as g
    out, ctx, own = {"model": path, "layout": args.layout}, None, url is None
    print(f"== sync {name}: {path}", flush=True)
    try:
        model = load(path)
        if own:
            print(f"  starting its server on GPU {args.server_gpu if args.layout == 'x2' else 0}, "
                  f":{args.large_port} (log: serve_{name}.log)", flush=True)
            t0 = time.time()
            serve(args, name, path)
            out["server_start_s"] = time.time() - t0
            url = f"http://127.0.0.1:{args.large_port}"
        cfg = g.Config(model=path, server_url=url.rstrip("/"), api_key=os.environ.get("SGLANG_API_KEY", ""),
                       request_timeout=SYNC_TIMEOUT, request_retries=1)
        begin_end = g.check_server(cfg, cfg.server_url)["begin_end"]  # up, serves `path`; the update API it has
        ctx = SimpleNamespace(url=cfg.server_url, cfg=cfg, begin_end=begin_end, model=model, tmp=args.tmp_dir,
                              ids=probe_ids(path, ids, model.config.vocab_size), trash=[], out=out, pushes=0, links={},
                              nbytes=sum(p.numel() for p in model.parameters()) * 2)  # bf16; tied embeddings once
        methods = [("disk", push_disk, None)]
        if args.layout == "x2":
            ctx.links["tensor"] = ({"kind": "tensor", "device": server_dev, "servers": [{"url": ctx.url, "tp": 1, "begin_end":
                                    begin_end, "device": server_dev}]} if isinstance(server_dev, torch.device) else server_dev)
            methods += [("tensor", push_link("tensor", args.x2_bucket_mb), None),
                        ("nccl", push_link("nccl", args.x2_bucket_mb), connect)]  # last: a stuck NCCL group
        else:                                                                    # can hold up the server
            ctx.links["tensor"] = {"kind": "tensor", "device": DEV, "servers": [{"url": ctx.url, "tp": 1, "begin_end": begin_end,
                                                                                  "device": DEV}]}
            methods += [("tensor", push_tensor, None)]
            methods += [(f"bucket_{mb}", push_link("tensor", mb), None) for mb in args.bucket_mb]
        sync_model(args, ctx, methods, server_dev)
    except Exception as e:
        out["error"] = err(e)
    finally:
        if ctx and isinstance(ctx.links.get("nccl"), dict):
            try:
                disconnect(ctx)
            except Exception as e:
                out["nccl_disconnect_error"] = err(e)
        if own:
            try:
                serve(args, name, path, stop=True)
            except Exception as e:
                out["server_stop_error"] = err(e)
        elif ctx:  # the disk method left the server on a deleted temp dir: back to its own path and weights
            try:
                post(ctx.url, "/update_weights_from_disk", {"model_path": path}, check=True)
                out["restored"] = True
            except Exception as e:
                out["restore_error"] = err(e)
    return out


def part_sync(args, res):
    import torch.distributed as dist
    import grpo_sglang as g
    from transformers import AutoTokenizer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    if DEV.type == "cuda":  # as in the trainer: IPC handles name the GPU by UUID (the patch breaks CPU tensors)
        monkey_patch_torch_reductions()
    if not dist.is_initialized():  # push_weights asks dist.get_world_size()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    out = res["sync"] = {"layout": args.layout, "tmp_dir": args.tmp_dir, "tmp_fs": fs_type(args.tmp_dir), "reps": args.reps}
    ids = AutoTokenizer.from_pretrained(args.model)(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    if args.layout == "x2":
        # SGLang's scheduler runs NCCL with NCCL_CUMEM_ENABLE=0 unless the environment sets it; both ends of the
        # weight-update group must agree (a mismatch is a known cause of failed P2P setup between trainer and
        # server), so we take the same value, and so do the servers started here. And an NCCL operation that
        # times out aborts its communicator rather than the whole process: one failed method ends nothing else.
        os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        out["env"] = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE",
                                                     "TORCH_NCCL_ASYNC_ERROR_HANDLING", "MEM_FRACTION")}
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if DEV.type == "cuda":  # the server's GPU as we index it (None: hidden from us), as the trainer finds it
            servers = [(args.server_url or "http://127.0.0.1:1", [int(args.server_gpu)])]
            _, (idx,) = g.gpu_layout(servers, False, 0, 1, visible, torch.cuda.device_count())
            server_dev = torch.device("cuda", idx) if idx is not None else None
        else:
            server_dev = DEV  # a CPU dry run against a stand-in server (no GPU)
        if server_dev is None:  # the tensor method and the raw copy fail with the trainer's own explanation
            try:
                g.pick_sync(g.Config(sync="tensor", server_gpu=str(args.server_gpu)), servers, [None], visible)
            except g.UserError as e:
                server_dev = str(e)
        out["server_gpu"], out["server_device"] = args.server_gpu, str(server_dev)
        jobs = [("served", args.model, args.server_url)] + [(n, p, None) for n, p in args.extra_models]
    else:
        server_dev = DEV
        jobs = [("small", args.model, args.server_url)] + ([("large", LARGE_DIR, None)] if args.large else [])
    for name, path, url in jobs:
        if name in ("small", "served") and not args.small:
            out[name] = {"error": "skipped (--no-small)"}
            continue
        load = (lambda _: build_large(args)) if name == "large" else load_model
        out[name] = bench_model(args, name, path, url, load, server_dev, ids)
        torch.cuda.empty_cache()
        save(res, args.out)  # partial results survive a crash or a kill


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
        keys = ["time_rollout", "time_score", "time_train", "time_sync", "time_step"]
        if not all("time_step" in r for r in used):
            out["note"] = "no time_step in metrics.jsonl: step = rollout + score + train + sync"
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


def sync_models(sync):
    """The per-model entries of a sync result: 'small' / 'large' (colocated), 'served' / extra names (x2)."""
    return {k: v for k, v in (sync or {}).items() if isinstance(v, dict) and ("model" in v or "error" in v)}


def summary(res):
    """-> summary.json: one object per model of the sync part. *_s: median seconds from new weights on cuda:0
    to the server's answer with them; null where the method failed (its error is in bench.json). tensor_s is
    push_weights' tensor path: in x2 staged on the server's GPU; colocated, its best bucket size."""
    rows = []
    for name, s in sync_models(res.get("sync")).items():
        ms = s.get("methods") or {}
        tensor = "tensor" if s.get("layout") == "x2" else (s.get("ratios") or {}).get("best_bucket")
        errors = {k: v["error"].strip().splitlines()[-1][:300] for k, v in
                  [("model", s), ("raw_copy", s.get("raw_copy") or {}), *ms.items()] if v.get("error")}
        rows.append({"model": name, "bytes": s.get("bytes"), "disk_s": total(ms.get("disk")),
                     "tensor_s": total(ms.get(tensor)), "nccl_s": total(ms.get("nccl")),
                     "raw_copy_s": total(s.get("raw_copy")), "path": s.get("model"),
                     "layout": s.get("layout", "colocated"), "tensor_method": tensor,
                     "verified": {k: bool(v.get("changed") and v.get("tagged", True)) for k, v in ms.items()
                                  if "error" not in v}, "errors": errors})
    return rows


def save(res, out_dir):
    json.dump(res, open(os.path.join(out_dir, "bench.json"), "w"), indent=1, default=str)
    if "sync" in res:
        json.dump(summary(res), open(os.path.join(out_dir, "summary.json"), "w"), indent=1)


def summary_rows(res):
    """-> [(metric, value, target, met)]: the table printed at the end and on top of bench.md."""
    rows = [(f"{p} FAILED", res[p]["error"].splitlines()[0][:90], "", None) for p in ("sync", "rollout", "step")
            if (res.get(p) or {}).get("error")]
    for m, s in sync_models(res.get("sync")).items():
        rows += [(f"sync {m} {'' if k == 'error' else 'restore '}FAILED", s[k].strip().splitlines()[-1][:90], "", None)
                 for k in ("error", "restore_error") if s.get(k)]
        if not s.get("methods"):
            continue
        r, ms = s["ratios"], s["methods"]
        rows += [(f"sync {m}: {k} FAILED", v["error"].strip().splitlines()[-1][:90], "", None)
                 for k, v in [*ms.items(), ("raw copy", s.get("raw_copy") or {})] if v.get("error")]
        if s.get("layout") == "x2":
            rows.append((f"sync {m}: disk / tensor / nccl / raw s",
                         " / ".join(fmt(total(ms.get(k)), ".4f") for k in ("disk", "tensor", "nccl")) + " / "
                         + fmt(total(s.get("raw_copy")), ".5f"), "", None))
            for k in ("tensor", "nccl"):
                rows += [(f"sync {m}: disk / {k}", fmt(r.get(f"disk_over_{k}"), ".1f") + "x", ">= 50x",
                          r.get(f"disk_over_{k}_ok")),
                         (f"sync {m}: {k} / raw copy", fmt(r.get(f"{k}_over_raw"), ".1f") + "x", "<= 3x",
                          r.get(f"{k}_over_raw_ok"))]
        else:
            rows += [(f"sync {m}: disk / tensor / {r['best_bucket']} s",
                      " / ".join(fmt(total(ms.get(k)), ".4f") for k in ("disk", "tensor", r["best_bucket"])), "", None),
                     (f"sync {m}: disk / best bucket", fmt(r.get("disk_over_bucket"), ".1f") + "x", ">= 50x",
                      r.get("disk_over_bucket_ok")),
                     (f"sync {m}: best bucket / raw copy", fmt(r.get("bucket_over_raw"), ".1f") + "x", "<= 3x",
                      r.get("bucket_over_raw_ok"))]
        ran = [v for v in ms.values() if "error" not in v]  # (a failed method has its own row)
        rows.append((f"sync {m}: every push changed the server", "", "yes",
                     all(v["changed"] and v.get("tagged", True) for v in ran) if ran else None))
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
    for m, s in sync_models(sync).items():
        if not s.get("methods"):
            continue
        raw, disk = total(s.get("raw_copy")), total(s["methods"].get("disk"))
        where = (f"x2: weights on cuda:0, server on GPU {sync.get('server_gpu')} ({s['url']})" if s.get("layout") == "x2"
                 else s["url"])
        L += ["", f"## Weight sync, {m}: {s['params'] / 1e6:.0f}M params, {s['bytes'] / 2**20:.0f} MiB bf16 ({where})", "",
              f"Medians of {sync['reps']} reps. prep = save_pretrained / serialize / pack + serialize of the buckets; "
              f"post = the update request(s) (bucket: HTTP + server); gen = the 1-token /generate. Temp dir on "
              f"{sync['tmp_fs']}. Probe noise {fmt(s['probe_noise'], '.2g')}, no-push control "
              f"{fmt(s['control_no_push_diff'], '.2g')}; 'changed' = every push moved the probe by > "
              f"{s['changed_threshold']:.2g} nats.", ""]
        rows = [(k, "error: " + v["error"][:70], *[""] * 7) if "error" in v else
                (k, *(fmt(v["median"][c], ".4f") for c in ("prep", "post", "gen", "total")), fmt(v["gbps"], ".2f"),
                 fmt(disk / total(v) if disk else None, ".1f"), fmt(total(v) / raw if raw else None, ".1f"),
                 fmt(v["changed"] and v.get("tagged", True)))
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
        L += table(["rollout s", "score s", "train s", "sync s", "step s", "sync share"],
                   [(*(fmt(st["medians"][k]) for k in ("time_rollout", "time_score", "time_train", "time_sync", "time_step")),
                     fmt(100 * st["sync_share"], ".1f") + "%")])
    open(path, "w").write("\n".join(L) + "\n")


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(18, 5))
    sync, nan = res.get("sync") or {}, float("nan")
    models = [m for m, s in sync_models(sync).items() if s.get("methods")]
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
    for k in ("time_rollout", "time_score", "time_train", "time_sync"):
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
    p.add_argument("--layout", choices=["colocated", "x2"], default="colocated",
                   help="colocated: one GPU shared with the server; x2: weights on cuda:0, server on --server_gpu "
                        "(sync only)")
    p.add_argument("--parts", default=None, help="comma-separated subset of sync,rollout,step (default: all three; "
                                                 "x2: sync)")
    p.add_argument("--out", default="runs/bench", help="folder for bench.json, summary.json, bench.md, bench.png, logs")
    p.add_argument("--server_url", default=None,
                   help="the running server of --model (default colocated: http://127.0.0.1:30000; x2: none, "
                        "bench.py starts one on --server_gpu)")
    p.add_argument("--model", default=os.environ.get("KIT_MODEL_DIR"), help="the model it serves (default $KIT_MODEL_DIR)")
    p.add_argument("--reps", type=int, default=3, help="sync: timed reps per method, after one warm-up")
    p.add_argument("--bucket_mb", type=ints, default=[64, 256, 1024], help="sync, colocated: bucket sizes for push_weights")
    p.add_argument("--x2_bucket_mb", type=float, default=1024.0, help="sync, x2: bucket size of the tensor and nccl "
                                                                      "methods (the trainer's --sync_bucket_mb)")
    p.add_argument("--server_gpu", default=None, help="x2: the servers' GPU, as serve.sh's GPU (default: the second "
                                                      "of CUDA_VISIBLE_DEVICES, else 1)")
    p.add_argument("--extra_models", default="", help="x2: more models, name=path,name=path; each gets its own "
                                                      "server on --server_gpu, started and stopped here")
    p.add_argument("--perturb_scale", type=float, default=1e-3, help="sync: std of the noise added before each push")
    p.add_argument("--tmp_dir", default="/tmp", help="local disk for the disk method and the step run's out_dir")
    p.add_argument("--large", action=argparse.BooleanOptionalAction, default=True,
                   help="sync, colocated: also a random ~1.3B model")
    p.add_argument("--large_port", type=int, default=30001,
                   help="sync: port of the servers started here (the large model's; x2: every model's)")
    # SGLang sizes its pool as free memory - total * (1 - fraction): with the main server (0.3) and
    # this process already on the GPU, the second server needs a fraction above ~0.35 to start at all
    p.add_argument("--large_mem_fraction", type=float, default=0.45, help="sync, colocated: its MEM_FRACTION")
    p.add_argument("--small", action=argparse.BooleanOptionalAction, default=True, help="sync: the --model")
    p.add_argument("--rollout_batches", type=ints, default=[32, 128, 256], help="rollout: sequences per batch")
    p.add_argument("--rollout_reps", type=int, default=3, help="rollout: timed reps after one warm-up")
    p.add_argument("--group_size", type=int, default=8, help="rollout and step: completions per prompt")
    p.add_argument("--max_new_tokens", type=int, default=128, help="rollout and step")
    p.add_argument("--step_warmup", type=int, default=3, help="step: first steps left out of the medians")
    p.add_argument("--step_args", nargs=argparse.REMAINDER, default=[],
                   help="step: everything after it goes to grpo_sglang.py, overriding; must come last")
    args = p.parse_args(argv)
    x2 = args.layout == "x2"
    args.parts = [s.strip() for s in (args.parts or ("sync" if x2 else "sync,rollout,step")).split(",") if s.strip()]
    if set(args.parts) - set(PARTS):
        p.error(f"unknown parts {sorted(set(args.parts) - set(PARTS))}; choose from {list(PARTS)}")
    if x2 and args.parts != ["sync"]:
        p.error("--layout x2 measures the sync part only (rollout and step are colocated): use --parts sync")
    if not args.model:
        p.error("--model is required (or set $KIT_MODEL_DIR)")
    if not x2:
        args.server_url = args.server_url or "http://127.0.0.1:30000"
    if args.server_gpu is None:  # our cuda:1, as serve.sh names it
        vis = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        args.server_gpu = vis[1] if len(vis) > 1 else "1"
    extra = [e.strip() for e in args.extra_models.split(",") if e.strip()]
    args.extra_models = [tuple(x.strip() for x in e.split("=", 1)) for e in extra]
    names = [n for n, *_ in args.extra_models]
    if extra and not x2:
        p.error("--extra_models needs --layout x2")
    if any(len(e) != 2 or not all(e) for e in args.extra_models) or len(set(names)) != len(names) or \
            not all(re.fullmatch(r"[\w.-]+", n) for n in names) or \
            set(names) & {"served", "small", "large", "layout", "tmp_dir", "tmp_fs", "reps", "env", "error"}:
        p.error(f"--extra_models: name=path,name=path with distinct names (letters, digits, . _ -) other than "
                f"'served', got {extra}")
    return args


def has_dist(name):
    from importlib.metadata import PackageNotFoundError, version
    try:
        return bool(version(name))
    except PackageNotFoundError:
        return False


def merge(paths):
    """Several bench.json files (runs of different parts) -> one result; later files win, except that
    a part (or a model of the sync part) that only failed or was skipped never replaces a real one."""
    res = {}
    for path in paths:
        for part, val in json.load(open(path)).items():
            if isinstance(val, dict) and isinstance(res.get(part), dict):
                for k, v in val.items():
                    if not (isinstance(v, dict) and "error" in v and "methods" not in v):
                        res[part][k] = v
            else:
                res[part] = val
    return res


def main():
    if sys.argv[1:2] == ["--merge"]:  # bench.py --merge OUT_DIR a/bench.json b/bench.json ...
        out, res = sys.argv[2], merge(sys.argv[3:])
        os.makedirs(out, exist_ok=True)
        save(res, out)
        write_md(res, os.path.join(out, "bench.md"))
        plot(res, os.path.join(out, "bench.png"))
        return
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    from importlib.metadata import version
    res = {"meta": {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "targets": TARGETS,
                    "versions": {k: version(k) for k in ("torch", "sglang", "transformers") if has_dist(k)},
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                    "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None}}
    for part in args.parts:
        print(f"== {part}", flush=True)
        t0 = time.time()
        try:
            PARTS[part](args, res)
        except Exception as e:
            res.setdefault(part, {})["error"] = err(e)
        res[part]["part_wall_s"] = time.time() - t0
        save(res, args.out)  # after every part: partial results survive
    for name, fn in (("bench.md", write_md), ("bench.png", plot)):
        try:
            fn(res, os.path.join(args.out, name))
        except Exception as e:
            res["meta"][f"{name}_error"] = err(e)
    save(res, args.out)
    rows = summary_rows(res)
    w = max([len(r[0]) for r in rows] + [6])
    print(f"\n{'metric':<{w}}  {'value':<28} {'target':<8} met")
    for a, b, c, d in rows:
        print(f"{a:<{w}}  {b:<28} {c:<8} {'' if d is None else fmt(d)}")
    print(f"\nwrote bench.json, {'summary.json, ' if 'sync' in res else ''}bench.md, bench.png to {args.out}", flush=True)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
