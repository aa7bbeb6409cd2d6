"""Rollout time of one SGLang server against the same requests split over two (nothing else on the GPUs).

For each batch size N: N sequences of --new_tokens tokens (ignore_eos: every one the full length, so both sides
generate the same number of tokens) from the first server alone, then N/2 from each server at the same time.
Prompts are random token ids of --prompt_tokens; one warm-up, then --reps timed runs, medians.

    python3 results/tools/rollout_split.py --urls http://127.0.0.1:30011,http://127.0.0.1:30012 --batches 192,768 \
        --out results/x2/multi/rollout_split.json
"""
import argparse
import concurrent.futures
import json
import random
import statistics
import time

import requests


def generate(url, n, args, seed):
    rng = random.Random(seed)
    ids = [[rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)] for _ in range(n)]
    r = requests.post(url + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": args.new_tokens, "temperature": 1.0, "ignore_eos": True}}, timeout=900)
    r.raise_for_status()
    out = r.json()
    assert len(out) == n and all(len(o["output_ids"]) == args.new_tokens for o in out), "unexpected /generate answer"
    return sum(len(o["output_ids"]) for o in out)


def timed(parts, args, seed):
    """parts: [(url, n)] at the same time -> (seconds, tokens)."""
    with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:
        t0 = time.time()
        tokens = sum(pool.map(lambda p: generate(p[0], p[1], args, seed), parts))
        return time.time() - t0, tokens


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--urls", required=True, help="two servers, comma-separated; the first also runs 'one server'")
    p.add_argument("--batches", default="192,768")
    p.add_argument("--new_tokens", type=int, default=1024)
    p.add_argument("--prompt_tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    a, b = args.urls.split(",")
    res = {"args": vars(args), "batches": {}}
    timed([(a, 8), (b, 8)], args, 0)  # warm-up
    for n in map(int, args.batches.split(",")):
        one = [timed([(a, n)], args, 1 + k)[0] for k in range(args.reps)]
        two = [timed([(a, n // 2), (b, n - n // 2)], args, 1 + k)[0] for k in range(args.reps)]
        res["batches"][n] = {"one_server_s": one, "two_servers_s": two, "ratio": statistics.median(two) / statistics.median(one),
                             "one_server_tok_s": n * args.new_tokens / statistics.median(one)}
        print(n, json.dumps(res["batches"][n]), flush=True)
        json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
