"""What a turn of an episode costs on the server: episodes of T replies of K tokens each (an environment's message of
fixed tokens between replies, the whole episode sent again each turn, as the trainer's rollout does) against one
reply of T x K tokens per prompt, the same prompts and the same sampled tokens in all, side by side.

    python3 dev/turn_cost.py --model M [--url http://127.0.0.1:30000] [--episodes 128] [--turns 4] [--tokens 16]

Every reply is exactly K tokens (ignore_eos), so both sides sample as many tokens; the difference is what the turns
cost: one /generate per turn, the prefill of the environment's message, and the re-sent prefix (SGLang's radix cache
holds it between turns). Prints one JSON object: each side's median seconds over --reps (the first run of each is a
warm-up), their range, and the ratio.
"""
import argparse
import json
import os
import statistics
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402


def generate(url, prompts, tokens):
    r = requests.post(url + "/generate", json={"input_ids": prompts, "sampling_params": {
        "max_new_tokens": tokens, "temperature": 1.0, "ignore_eos": True}}, timeout=600)
    r.raise_for_status()
    return [o["output_ids"] for o in r.json()]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16, help="tokens per reply")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.model)
    said = g.env_ids(tok, "chat", "turn_cost")("My number is higher than 8. Guess again.", None)  # reply left open
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Guess my number ({k})."}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False) for k in range(a.episodes)]

    def episodes():
        eps = [list(q) for q in prompts]
        for turn in range(a.turns):
            for e, out in zip(eps, generate(a.url, eps, a.tokens)):
                e += out + (said if turn + 1 < a.turns else [])
        return eps

    def one_turn():
        return generate(a.url, prompts, a.turns * a.tokens)
    times = {"episodes": [], "single_turn": []}
    for rep in range(a.reps + 1):
        for name, fn in (("episodes", episodes), ("single_turn", one_turn)):
            requests.post(a.url + "/flush_cache", timeout=60)  # each side starts from an empty cache
            t0 = time.time()
            fn()
            if rep:  # the first is a warm-up
                times[name].append(time.time() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"episodes": a.episodes, "turns": a.turns, "tokens_per_reply": a.tokens, "env_tokens": len(said),
           "sampled_tokens_each": a.turns * a.tokens, "median_s": med,
           "range_s": {k: [min(v), max(v)] for k, v in times.items()},
           "ratio_episodes_to_single_turn": med["episodes"] / med["single_turn"],
           "per_extra_turn_s": (med["episodes"] - med["single_turn"]) / max(a.turns - 1, 1)}
    print(json.dumps(out))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
