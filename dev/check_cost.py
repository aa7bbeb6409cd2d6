"""What the weight check costs per push at real shapes, on one GPU, with random weights from a config: the trainer's
side (grpo_sglang.hash_sent over the bf16 buckets it sends, fused recipes included, as push_weights runs it) and the
server's (SGLang's own gpu_tensor_hash over every tensor as SGLang names and fuses them, the loop its /weights_checker
runs). The HTTP round trip is not in these; it is in a real run's time_weight_check (results/h200/trust).

    python dev/check_cost.py --out check_cost.json [--shapes 135m,1.5b,7b] [--repeats 5]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402

SHAPES = {  # SmolLM2-135M, Qwen2.5-1.5B, Qwen2.5-7B
    "135m": ("LlamaConfig", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)),
    "1.5b": ("Qwen2Config", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)),
    "7b": ("Qwen2Config", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)),
    "tiny": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True)),
}
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}


def server_names(names):
    """The trainer's (HF) names -> SGLang's for Llama / Qwen2 at TP 1: q, k, v in qkv_proj; gate, up in gate_up_proj."""
    out = []
    for n in names:
        parts = n.split(".")
        parts = [FUSED.get(p, p) for p in parts]
        if ".".join(parts) not in out:
            out.append(".".join(parts))
    return out


def time_shape(shape, device, repeats, bucket_mb=1024):
    import torch
    import transformers
    cls, kw = SHAPES[shape]
    config = getattr(transformers, cls)(**kw)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    named = [(n, p.data) for n, p in model.named_parameters()]
    rec = g.recipes([(0, s) for s in server_names([n for n, _ in named])], [n for n, _ in named])
    buckets, cur, size = [], [], 0
    for n, t in named:  # weight_buckets' split, on one rank
        cur, size = cur + [(n, t)], size + t.numel() * 2
        if size >= bucket_mb * 2**20:
            buckets, cur, size = buckets + [cur], [], 0
    buckets += [cur] if cur else []
    packed = [g.pack(b, torch.device(device)) for b in buckets]
    trainer, server = [], []
    for _ in range(repeats):
        link = {"servers": [{"recipes": rec}], "hashes": {}, "hash_s": 0.0}
        held = {}
        for flat, meta in packed:
            held = g.hash_sent(link, flat, meta, held)
        trainer.append(link["hash_s"])
        assert len(link["hashes"]) == len(set(rec.values())) and not held, "every recipe hashed, nothing held"
        tensors = dict(named)  # the server's tensors, fused as SGLang holds them
        full = [tensors[p[0]] if len(p) == 1 else torch.cat([tensors[x] for x in p]) for p in rec.values()]
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.time()
        for t in full:  # WeightChecker._compute_checksum: one hash per tensor, each read back
            g.tensor_hash(t)
        if device != "cpu":
            torch.cuda.synchronize()
        server.append(time.time() - t0)
        del full
    out = {"params": sum(t.numel() for _, t in named), "bytes": sum(t.numel() * 2 for _, t in named),
           "trainer_tensors": len(named), "server_tensors": len(rec), "buckets": len(packed),
           "trainer_hash_ms": [round(1e3 * x, 2) for x in trainer],
           "server_checksum_ms": [round(1e3 * x, 2) for x in server],
           "trainer_hash_ms_median": round(1e3 * statistics.median(trainer[1:] or trainer), 2),
           "server_checksum_ms_median": round(1e3 * statistics.median(server[1:] or server), 2)}
    del model, named, packed
    if device != "cpu":
        torch.cuda.empty_cache()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="135m,1.5b,7b")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    import torch
    got = {"gpu": torch.cuda.get_device_name() if a.device != "cpu" else "cpu", "torch": torch.__version__}
    for shape in a.shapes.split(","):
        got[shape] = time_shape(shape, a.device, a.repeats)
        print(shape, json.dumps(got[shape]), flush=True)
    json.dump(got, open(a.out, "w"), indent=1)
    print(json.dumps({k: (v["trainer_hash_ms_median"], v["server_checksum_ms_median"]) if isinstance(v, dict) else v
                      for k, v in got.items()}))


if __name__ == "__main__":
    main()
