"""Build random-weight test models from transformers configs and save them in bf16, with the kit's tokenizer.

    python dev/make_models.py OUT_DIR --tokenizer $KIT_MODEL_DIR [--only name,...] [--device auto|cuda|cpu|meta]

Each model lands in OUT_DIR/<name> (config.json, generation_config.json, *.safetensors, tokenizer files), ready
for `MODEL=OUT_DIR/<name> bash serve.sh` and `grpo_sglang.py --model OUT_DIR/<name>`:

    qwen2.5-0.5b-random  Qwen2ForCausalLM, the shapes of Qwen2.5-0.5B-Instruct (0.49e9 parameters, 1.0 GB)
    qwen2.5-1.5b-random  Qwen2ForCausalLM, the shapes of Qwen2.5-1.5B-Instruct (1.54e9 parameters, 3.1 GB)
    qwen2.5-3b-random    Qwen2ForCausalLM, the shapes of Qwen2.5-3B-Instruct   (3.09e9 parameters, 6.2 GB)
    qwen2.5-7b-random    Qwen2ForCausalLM, the shapes of Qwen2.5-7B-Instruct   (7.62e9 parameters, 15.2 GB)
    qwen3-tiny-random    a 4-layer Qwen3ForCausalLM, the tokenizer's vocabulary, untied LM head
    gemma3-tiny-random   a 4-layer Gemma3ForCausalLM (text only), sliding window 512, tied LM head

The weights are random (fixed seed, the model's own initialisation), so the models say nothing useful: they
are for measuring memory, speed and weight-sync cost at real sizes, and for checking that other
architectures go through the trainer and the server. The weights are created directly on the GPU in bf16
(cuda:0 when there is one), which keeps the 7B build to seconds. `--device meta` builds nothing real: it
only prints the parameter count of each config (a check that needs no GPU and no memory).
"""
import argparse
import os
import time

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, GenerationConfig, Qwen2Config,
                          Qwen3Config)


def configs(vocab):
    """name -> config (without token ids). `vocab` is the kit tokenizer's size, for the tiny models."""
    qwen25 = dict(rope_theta=1e6, max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu")
    return {
        # https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/blob/main/config.json
        "qwen2.5-0.5b-random": Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                           num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                           tie_word_embeddings=True, **qwen25),
        # https://huggingface.co/Qwen/Qwen2.5-1.5B-Instruct/blob/main/config.json
        "qwen2.5-1.5b-random": Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                           num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                           tie_word_embeddings=True, **qwen25),
        # https://huggingface.co/Qwen/Qwen2.5-3B-Instruct/blob/main/config.json
        "qwen2.5-3b-random": Qwen2Config(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                         num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                                         tie_word_embeddings=True, **qwen25),
        # https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json
        "qwen2.5-7b-random": Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                         num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                         tie_word_embeddings=False, **qwen25),
        # Qwen3: q/k norms, head_dim not tied to hidden_size / heads
        "qwen3-tiny-random": Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=vocab,
                                         tie_word_embeddings=False, rope_theta=1e6, max_position_embeddings=32768,
                                         rms_norm_eps=1e-6),
        # Gemma 3: sliding-window layers with one global layer (as in Gemma's 5:1 pattern), scaled embeddings,
        # (1 + w) RMSNorm, tied LM head. query_pre_attn_scalar = head_dim, as in the real Gemma 3 configs.
        "gemma3-tiny-random": Gemma3TextConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                               num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                               query_pre_attn_scalar=64, vocab_size=vocab, sliding_window=512,
                                               layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                               max_position_embeddings=32768, tie_word_embeddings=True),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--tokenizer", required=True, help="the kit model's folder (SmolLM2-135M-Instruct): its tokenizer is copied")
    p.add_argument("--only", default="", help="comma-separated names (default: all)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "meta"],
                   help="where to create the weights (auto: cuda:0 if there is a GPU); meta: count parameters only")
    args = p.parse_args()
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu") if args.device == "auto" else torch.device(args.device)

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if im_end is None or im_end == tok.unk_token_id:
        raise SystemExit(f"the tokenizer in {args.tokenizer} has no <|im_end|> token")
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=im_end, pad_token_id=im_end)  # as the kit model

    all_cfgs = configs(len(tok))
    names = args.only.split(",") if args.only else list(all_cfgs)
    unknown = [n for n in names if n not in all_cfgs]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {', '.join(all_cfgs)}")

    print(f"{'name':22s} {'parameters':>14s} {'bytes':>15s} {'build s':>8s} {'save s':>7s}  (on {device})", flush=True)
    for name in names:
        cfg = all_cfgs[name]
        for k, v in ids.items():
            setattr(cfg, k, v)
        cfg.dtype = torch.bfloat16  # config.json says bfloat16, so SGLang's --dtype auto agrees with the weights

        t0 = time.time()
        torch.manual_seed(0)  # same weights every time (per model, whatever --only says)
        with torch.device(device):  # parameters are created, and initialised by the model's _init_weights, right there
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        if device.type == "cuda":
            torch.cuda.synchronize()
        build_s = time.time() - t0
        n_params = sum(p.numel() for p in model.parameters())  # a tied LM head is counted once
        n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if device.type == "meta":  # nothing to save: just the sizes the config implies
            print(f"{name:22s} {n_params:14,d} {n_bytes:15,d} {build_s:8.1f} {'-':>7s}  ({type(model).__name__}, not saved)", flush=True)
            continue

        # Token ids only: no sampling defaults (SGLang would take them over) and nothing model-specific.
        model.generation_config = GenerationConfig(**ids)
        d = os.path.join(args.out_dir, name)
        t0 = time.time()
        # safetensors (the only format transformers 5 writes; the flag is for older versions), 5 GB shards
        model.save_pretrained(d, safe_serialization=True, max_shard_size="5GB")
        tok.save_pretrained(d)
        save_s = time.time() - t0
        on_disk = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))
        print(f"{name:22s} {n_params:14,d} {on_disk:15,d} {build_s:8.1f} {save_s:7.1f}  ({type(model).__name__} -> {d})", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
