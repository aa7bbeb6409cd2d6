"""LoRA weight sync, measured both ways against ONE running SGLang (0.5.16) server started with LoRA on, on the same
GPU as this tool (colocated, as the trainer's --colocate): (merged) W + (alpha/r)·B·A for every adapted layer, pushed
as bf16 through the trainer's tensor path, or (adapter) the rank-r tensors pushed to the server's LoRA slots and
named in every request. Random adapters (A (r, in), B (out, r) nonzero, fp32; sent as bf16, what the server keeps)
on every q, k, v, o, gate, up, down Linear of the model.

    MODEL=$DIR GPU=0 MEM_FRACTION=0.2 PORT=30010 EXTRA_ARGS="--enable-lora --max-lora-rank 16 \\
        --lora-target-modules all --max-loras-per-batch 2" bash serve.sh
    python dev/lora_sync_bench.py --model $DIR --url http://127.0.0.1:30010 --rank 16 --alpha 32 --repeats 3 \\
        --prompts 128 --new_tokens 128 --out result.json [--shape NAME] [--prompt_len 64] [--timeout 180]

merged: merge_s (all W + s·B@A in bf16, on the GPU), push_s (grpo_sglang's pack + send_bucket in 1024 MiB buckets, the
loop of push_weights). adapter: push_s (/unload_lora_adapter + /load_lora_adapter_from_tensors, a dict of CUDA-IPC
tensors, as a trainer would after every optimizer step), first_request_s (a 1-token /generate naming it next: SGLang
copies a new adapter into its GPU slot then); adapter_flat: the same as one flattened bucket. rollout: one batched
/generate of --prompts x --new_tokens (ignore_eos, T = 1) without and with lora_path, after a warm-up each.
checks: adapter_changes_output (greedy, with vs without), and the server's logprobs of one sequence under the merged
weights vs base + adapter (merged_vs_adapter_lp_diff: far below adapter_effect_lp_diff if both apply alpha/r·B·A).
The server's own weights and version tag are pushed back at the end. Medians over --repeats; a measurement that fails
records its error in the JSON (written after each one; --out must not exist) and the others still run. Every HTTP
call has a timeout (--timeout s).
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NAME = "lora_bench"  # the adapter's name on the server, which /generate's lora_path names


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, *a, **kw):
    """-> (seconds, fn's result), the GPU's queued work included."""
    sync()
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    sync()
    return time.perf_counter() - t0, out


def make_adapters(model, r, seed=0):
    """-> {module name: (A (r, in), B (out, r))} fp32 on the model's device, for every Linear named in TARGETS."""
    gen, out = torch.Generator().manual_seed(seed), {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
            a = torch.randn(r, m.in_features, generator=gen) / m.in_features ** 0.5
            b = torch.randn(m.out_features, r, generator=gen) * 0.02  # nonzero: the adapter changes the outputs
            out[name] = (a.to(m.weight.device), b.to(m.weight.device))
    return out


def peft_tensors(adapters):
    """-> {PEFT name: bf16 tensor}: the names SGLang's LoRAAdapter reads (layer id from 'layers.N', lora_A / lora_B)."""
    return {f"base_model.model.{n}.lora_{k}.weight": t.bfloat16() for n, (a, b) in adapters.items()
            for k, t in (("A", a), ("B", b))}


def peft_config(args, adapters):
    """The adapter_config.json a PEFT LoraConfig would write; SGLang reads r, lora_alpha, target_modules from it."""
    return {"peft_type": "LORA", "r": args.rank, "lora_alpha": args.alpha, "bias": "none", "task_type": "CAUSAL_LM",
            "target_modules": sorted({n.rsplit(".", 1)[-1] for n in adapters}), "base_model_name_or_path": args.model}


def adapter_payload(adapters, flat, device):
    """-> (serialized_tensors, load_format or None, the tensors it points at (alive till the server answers), bytes)"""
    from sglang.srt.utils import MultiprocessingSerializer
    tensors = peft_tensors(adapters)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    if flat:  # one buffer, as grpo_sglang sends weights (pack synchronizes)
        buf, meta = g.pack(list(tensors.items()), device)
        return g.serialize_bucket(buf, meta), "flattened_bucket", buf, nbytes
    sync()  # the casts are done before the server reads them
    return MultiprocessingSerializer.serialize(tensors, output_str=True), None, tensors, nbytes


def push_adapter(cfg, args, adapters, device, flat=False, unload=True):
    """What a trainer would do after each step: drop the adapter of that name (SGLang refuses a name twice), load the
    new tensors under it. -> bytes"""
    payload, fmt, alive, nbytes = adapter_payload(adapters, flat, device)
    if unload:
        g.call(cfg, args.url, "/unload_lora_adapter", {"lora_name": NAME}, retries=0)
    req = {"lora_name": NAME, "config_dict": peft_config(args, adapters), "serialized_tensors": payload}
    r = g.call(cfg, args.url, "/load_lora_adapter_from_tensors", {**req, **({"load_format": fmt} if fmt else {})},
               retries=0)  # an HTTP 400 (success false) raises in g.call with its error_message
    if not (isinstance(r, dict) and r.get("success")):
        raise RuntimeError(f"/load_lora_adapter_from_tensors: {str(r)[:500]}")
    del alive
    return nbytes


def lora_field(lora):
    """/generate's field naming the adapter to use: its lora_name (None: the base weights)"""
    return {"lora_path": lora} if lora else {}


def generate(cfg, url, ids, new_tokens, lora=None, temperature=1.0):
    """One batched /generate of len(ids) prompts -> [output ids]; `lora`: the adapter's name (lora_path)."""
    sp = {"max_new_tokens": new_tokens, "temperature": temperature, "ignore_eos": True}
    out = g.call(cfg, url, "/generate", {"input_ids": ids, "sampling_params": sp, **lora_field(lora)})
    if not isinstance(out, list) or len(out) != len(ids):
        raise RuntimeError(f"/generate: wanted {len(ids)} answers, got {str(out)[:300]}")
    return [o["output_ids"] for o in out]


def seq_logprobs(cfg, url, seq, lora=None):
    """The server's logprobs of the tokens of `seq` after the first (a prefill, as grpo_sglang's rescore)."""
    req = {"input_ids": [seq], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 0}
    out = g.call(cfg, url, "/generate", {**req, **lora_field(lora)})
    return [lp for lp, *_ in out[0]["meta_info"]["input_token_logprobs"][1:]]


def lp_diff(a, b):
    return statistics.fmean(abs(x - y) for x, y in zip(a, b))


@torch.no_grad()
def merge(model, adapters, s):
    """-> {parameter name: W + s·B@A in bf16} for every adapted layer (fp32 sums, then bf16 as the server holds it)."""
    mods = dict(model.named_modules())
    return {f"{n}.weight": torch.addmm(mods[n].weight.float(), b, a, alpha=s).bfloat16()
            for n, (a, b) in adapters.items()}


def push_named(cfg, link, named, version):
    """grpo_sglang.push_weights' loop on one rank: ~sync_bucket_mb bf16 buckets (weight_buckets' split), pack, send
    bucket k while packing k+1; the last flushes the cache and tags `version`. -> bytes sent"""
    srv, sent, in_flight, bucket, size = link["servers"][0], 0, None, [], 0
    if srv["begin_end"]:
        g.call(cfg, srv["url"], "/begin_weight_update", {"selector": "all"})
    for i, (name, t) in enumerate(named):
        bucket.append((name, t))
        size += t.numel() * 2
        last = i == len(named) - 1
        if last or size >= cfg.sync_bucket_mb * 2**20:
            flat, meta = g.pack(bucket, link["device"])
            sent += in_flight() if in_flight else 0  # one update at a time
            in_flight, bucket, size = g.send_bucket(cfg, link, flat, meta, last, version), [], 0
    sent += in_flight()
    if srv["begin_end"]:
        g.call(cfg, srv["url"], "/end_weight_update", {})
    return sent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    for flag, kind, default in [("--model", str, None), ("--url", str, "http://127.0.0.1:30010"), ("--rank", int, 16),
                                ("--alpha", float, 32.0), ("--repeats", int, 3), ("--prompts", int, 128),
                                ("--new_tokens", int, 128), ("--prompt_len", int, 64), ("--out", str, None),
                                ("--shape", str, None), ("--timeout", float, 180.0)]:
        p.add_argument(flag, type=kind, default=default, required=default is None and flag != "--shape")
    args = p.parse_args(argv)
    args.url = args.url.rstrip("/")
    if os.path.exists(args.out):
        sys.exit(f"{args.out} exists: name a new --out (this tool does not overwrite files)")
    res = {"shape": args.shape or os.path.basename(os.path.normpath(args.model)), "model": args.model,
           "rank": args.rank, "alpha": args.alpha}
    cfg = g.Config(model=args.model, server_url=args.url, api_key=os.environ.get("SGLANG_API_KEY", ""),
                   request_timeout=args.timeout, request_retries=1, sync_bucket_mb=1024.0)
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    st = {}

    def measure(key, fn):
        try:
            res[key] = fn()
        except Exception as e:  # noqa: BLE001 (record it, go on)
            traceback.print_exc()
            res[key] = {"error": f"{type(e).__name__}: {str(e)[:1000]}"}
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    def setup():
        from transformers import AutoModelForCausalLM
        info = g.check_server(cfg, args.url)  # up, serving --model; the update API it has (begin_end)
        st["version"] = g.call(cfg, args.url, "/model_info", timeout=30).get("weight_version")
        st["model"] = model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(dev)
        st["link"] = {"kind": "tensor", "servers": [{"url": args.url, **info, "device": dev}], "device": dev}
        st["adapters"] = make_adapters(model, args.rank)
        gen = torch.Generator().manual_seed(1)
        v = model.config.vocab_size  # ids past the special ones, below 30000: real tokens in every vocabulary here
        st["ids"] = torch.randint(min(100, v // 2), min(v, 30000), (args.prompts, args.prompt_len), generator=gen)
        st["ids"] = st["ids"].tolist()
        res["params"] = sum(q.numel() for q in model.parameters())
        res["lora_params"] = sum(a.numel() + b.numel() for a, b in st["adapters"].values())
        res["server"] = {k: info[k] for k in ("begin_end", "tp", "context")} | {"weight_version": st["version"]}
        return True

    measure("setup", setup)
    if not isinstance(res["setup"], bool):
        print(f"setup failed: {res['setup']['error']}")
        return res
    ids, adapters, model = st["ids"], st["adapters"], st["model"]

    def adapter(flat):
        def run():
            try:  # one that an earlier run left (unknown name: HTTP 400)
                g.call(cfg, args.url, "/unload_lora_adapter", {"lora_name": NAME}, retries=0)
            except g.UserError:
                pass
            push_adapter(cfg, args, adapters, dev, flat, unload=False)  # the first load: not timed
            push, first = [], []
            for _ in range(args.repeats):
                t, nbytes = timed(push_adapter, cfg, args, adapters, dev, flat)
                push.append(t)
                first.append(timed(generate, cfg, args.url, ids[:1], 1, NAME)[0])
            return {"push_s": statistics.median(push), "first_request_s": statistics.median(first), "bytes": nbytes,
                    "push_reps_s": push}
        return run

    def checks():
        base = generate(cfg, args.url, ids[:4], 32, temperature=0.0)
        lora = generate(cfg, args.url, ids[:4], 32, NAME, temperature=0.0)
        st["seq"] = ids[0] + base[0]
        st["lp"] = {k: seq_logprobs(cfg, args.url, st["seq"], k) for k in (None, NAME)}
        return {"adapter_changes_output": base != lora, "adapter_effect_lp_diff": lp_diff(*st["lp"].values())}

    def rollout():
        out = {}
        for key, lora in (("base", None), ("lora", NAME)):
            generate(cfg, args.url, ids, args.new_tokens, lora)  # warm-up (lora: the adapter into its GPU slot)
            out[f"{key}_s"], got = timed(generate, cfg, args.url, ids, args.new_tokens, lora)
            out["tokens"] = sum(map(len, got))
            out[f"{key}_tok_s"] = out["tokens"] / out[f"{key}_s"]
        out["per_token_extra_us"] = (out["lora_s"] - out["base_s"]) / out["tokens"] * 1e6
        return out

    def merged():
        merge_s, push_s, s = [], [], args.alpha / args.rank
        for i in range(args.repeats):
            st.pop("merged", None)  # free the last one first
            t, st["merged"] = timed(merge, model, adapters, s)
            merge_s.append(t)
            named = [(n, st["merged"].get(n, q.data)) for n, q in model.named_parameters()]
            t, nbytes = timed(push_named, cfg, st["link"], named, f"lora_bench_merged_{i}")
            push_s.append(t)
            del named
        out = {"merge_s": statistics.median(merge_s), "push_s": statistics.median(push_s), "bytes": nbytes,
               "merge_reps_s": merge_s, "push_reps_s": push_s}
        if "lp" in st:  # the server's logprobs under the merged weights vs under base + adapter
            out["merged_vs_adapter_lp_diff"] = lp_diff(seq_logprobs(cfg, args.url, st["seq"]), st["lp"][NAME])
        return out

    def restore():  # the server's own weights and version tag back, the adapter gone
        st.pop("merged", None)
        push_named(cfg, st["link"], [(n, q.data) for n, q in model.named_parameters()], str(st["version"]))
        out = {"version": st["version"]}
        if "lp" in st:  # the server's logprobs as before the merged pushes (kernel noise aside: ~0)
            out["base_lp_diff"] = lp_diff(seq_logprobs(cfg, args.url, st["seq"]), st["lp"][None])
        g.call(cfg, args.url, "/unload_lora_adapter", {"lora_name": NAME}, retries=0)
        return out

    for key, fn in [("adapter", adapter(False)), ("adapter_flat", adapter(True)), ("checks", checks),
                    ("rollout", rollout), ("merged", merged), ("restored", restore)]:
        measure(key, fn)
    v = lambda k, f, fmt=".3g": (f"{res[k][f]:{fmt}}" if isinstance(res[k], dict) and f in res[k] else "error")
    print(f"{res['shape']}: merged merge {v('merged', 'merge_s')} s + push {v('merged', 'push_s')} s; adapter push "
          f"{v('adapter', 'push_s')} s (flat {v('adapter_flat', 'push_s')} s); rollout base "
          f"{v('rollout', 'base_tok_s', '.0f')} tok/s, lora {v('rollout', 'lora_tok_s', '.0f')} tok/s "
          f"(+{v('rollout', 'per_token_extra_us')} us/token); changes output: "
          f"{v('checks', 'adapter_changes_output', '')}; merged vs adapter "
          f"{v('merged', 'merged_vs_adapter_lp_diff')} nats (adapter effect {v('checks', 'adapter_effect_lp_diff')})")
    return res


if __name__ == "__main__":
    main()
