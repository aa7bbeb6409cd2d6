"""What a turn of an episode costs on the server, side by side in one run (one JSON object out):

  synthetic   episodes of T replies of K tokens each (an environment's message of fixed tokens between replies, the
              whole episode sent again each turn) against one reply of T x K tokens per prompt, the same number of
              sampled tokens (ignore_eos), the episodes in three shapes:
                lockstep     one batched /generate per turn for all episodes: the trainer's rollout()
                per_group    a thread per group of 8 episodes, each group in lockstep
                per_episode  a thread per episode, one /generate per reply (and the same on connections kept
                             open)
              and the single reply the same two ways (one request per prompt; one batched request).
  breakdown   where a turn's fixed cost goes, on the synthetic episodes' prompts (cached on the server): a batched
              1-token /generate, the same per prompt, decode per token, the prefill of the environment's message, one
              request's round trip, and the client's own work (the message's token ids, JSON).
  tasks       a built-in task of episodes (--tasks calculator guess, the README's budgets) with the trainer's own
              rollout() (lockstep), and the same with the environment's token ids not remembered (each message through
              the chat template, as before remembered()), each against one batched reply per episode of as many tokens
              as that episode sampled (ignore_eos): what the turns cost in a real task, where replies differ in length.
              (Before 4f3f72d also a thread per group of 8 and a thread per episode: results/h200/calls_1203.)

    python3 dev/turn_cost.py --model M [--url http://127.0.0.1:30000] [--episodes 128] [--turns 4] [--tokens 16]
                             [--tasks calculator guess] [--out turn_cost.json]

Each timed run starts from an empty cache (/flush_cache); the first run of each kind is a warm-up; medians and ranges
over --reps.
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import threading
import time
from types import SimpleNamespace

import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402

THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=512)


LOCAL = threading.local()


def generate(url, prompts, tokens, keepalive=False):
    """One batched /generate, as the trainer asks (ids in, ids and log-probs out) -> each prompt's sampled ids.
    keepalive: on this thread's own connection, kept open between requests (otherwise one per request)."""
    tokens = tokens if isinstance(tokens, list) else [tokens] * len(prompts)
    if keepalive and not hasattr(LOCAL, "session"):
        LOCAL.session = requests.Session()
    r = (LOCAL.session if keepalive else requests).post(url + "/generate", json={"input_ids": prompts, "return_logprob": True, "sampling_params": [
        {"max_new_tokens": t, "temperature": 1.0, "ignore_eos": True} for t in tokens]}, timeout=600)
    r.raise_for_status()
    return [o["output_ids"] for o in r.json()]


def each(url, prompts, tokens):
    """A request per prompt, all in flight at once (the per-episode shape)."""
    tokens = tokens if isinstance(tokens, list) else [tokens] * len(prompts)
    return list(THREADS.map(lambda pt: generate(url, [pt[0]], pt[1])[0], zip(prompts, tokens)))


def once(url, fn):
    """fn() from an empty cache -> seconds"""
    requests.post(url + "/flush_cache", timeout=60)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def stats(xs):
    return {"median_s": statistics.median(xs), "range_s": [min(xs), max(xs)], "n": len(xs)}


def synthetic(a, url, tok):
    said = g.env_ids(tok, "chat", "turn_cost")("My number is higher than 8. Guess again.", None)  # reply left open
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Guess my number ({k})."}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False) for k in range(a.episodes)]

    def lockstep(prompts=prompts):
        eps = [list(q) for q in prompts]
        for turn in range(a.turns):
            for e, out in zip(eps, generate(url, eps, a.tokens)):
                e += out + (said if turn + 1 < a.turns else [])

    def one_episode(q, keepalive=False):
        e = list(q)
        for turn in range(a.turns):
            e += generate(url, [e], a.tokens, keepalive)[0] + (said if turn + 1 < a.turns else [])

    def groups(size=8):  # a thread per group of `size` episodes, each group in lockstep
        return list(THREADS.map(lockstep, [prompts[k: k + size] for k in range(0, len(prompts), size)]))

    shapes = {"episodes_per_group": groups,
              "episodes_per_episode": lambda: list(THREADS.map(one_episode, prompts)),
              "episodes_per_episode_keepalive": lambda: list(THREADS.map(lambda q: one_episode(q, True), prompts)),
              "single_turn_per_request": lambda: each(url, prompts, a.turns * a.tokens),
              "episodes_lockstep": lockstep,
              "single_turn_batched": lambda: generate(url, prompts, a.turns * a.tokens)}
    times = {k: [] for k in shapes}
    for rep in range(a.reps + 1):  # the shapes interleaved: the machine's drift falls on all alike
        for name, fn in shapes.items():
            t = once(url, fn)
            times[name] += [t] if rep else []
    med = {k: statistics.median(v) for k, v in times.items()}
    extra = max(a.turns - 1, 1)
    return said, prompts, {
        "episodes": a.episodes, "turns": a.turns, "tokens_per_reply": a.tokens, "env_tokens": len(said),
        "sampled_tokens_each": a.turns * a.tokens, **{k: stats(v) for k, v in times.items()},
        "ratio_per_episode": med["episodes_per_episode"] / med["single_turn_per_request"],
        "ratio_per_group": med["episodes_per_group"] / med["single_turn_batched"],
        "ratio_lockstep": med["episodes_lockstep"] / med["single_turn_batched"],
        "ratio_per_episode_to_single_turn_batched": med["episodes_per_episode"] / med["single_turn_batched"],
        "per_extra_turn_s": {"per_episode": (med["episodes_per_episode"] - med["single_turn_per_request"]) / extra,
                             "lockstep": (med["episodes_lockstep"] - med["single_turn_batched"]) / extra}}


def breakdown(a, url, tok, said, prompts):
    """On prompts the server has cached (as a turn's episodes are): what a turn's pieces cost."""
    ext = [q + [5] * 16 + said for q in prompts]  # an episode after a 16-token reply and the environment's message
    warm = lambda: (generate(url, ext, 1), generate(url, prompts, 1))

    def cached(fn):  # fn()'s seconds with the prefixes in the radix cache, as a turn finds them (the first: warm-up)
        times = []
        for _ in range(a.reps + 1):
            warm()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return stats(times[1:])
    out = {
        "batched_1_token": cached(lambda: generate(url, prompts, 1)),
        "per_request_1_token": cached(lambda: each(url, prompts, 1)),
        "batched_16_tokens": cached(lambda: generate(url, prompts, 16)),
        "one_request_1_token": cached(lambda: generate(url, prompts[:1], 1)),
        "batched_1_token_env_message_uncached": cached(lambda: generate(url, [q + [7] * 16 + said for q in prompts],
                                                                        1)),
    }
    out["decode_per_token_s"] = (out["batched_16_tokens"]["median_s"] - out["batched_1_token"]["median_s"]) / 15
    out["env_message_prefill_s"] = (out["batched_1_token_env_message_uncached"]["median_s"]
                                    - out["batched_1_token"]["median_s"])
    env = g.env_ids(tok, "chat", "turn_cost")
    t0 = time.perf_counter()
    for _ in range(a.episodes):
        env("My number is higher than 8. Guess again.", 2)
    out["client_env_ids_per_turn_s"] = time.perf_counter() - t0
    env = g.remembered(env)  # the trainer's: a message it has seen costs a lookup
    env("My number is higher than 8. Guess again.", 2)
    t0 = time.perf_counter()
    for _ in range(a.episodes):
        env("My number is higher than 8. Guess again.", 2)
    out["client_env_ids_remembered_per_turn_s"] = time.perf_counter() - t0
    body = {"input_ids": ext, "return_logprob": True, "sampling_params": {"max_new_tokens": 16}}
    t0 = time.perf_counter()
    json.loads(json.dumps(body))
    out["client_json_per_turn_s"] = time.perf_counter() - t0
    return out


def tasks(a, url):
    """Each task's episodes with the trainer's own rollout() (one batched /generate per turn), its environment's token
    ids remembered (the trainer's) and not; each against one batched reply per episode of as many tokens as that
    episode sampled (the trainer's single-turn request)."""
    version = requests.post(url + "/generate", json={"input_ids": [[1, 2, 3]], "sampling_params": {
        "max_new_tokens": 1}}, timeout=60).json()[0]["meta_info"]["weight_version"]
    # the README's --max_new_tokens, --max_reply_tokens
    budgets = {"calculator": (128, 32), "guess": (192, 16), "python": (640, 256)}
    out = {}
    for name in a.tasks:
        cfg = g.Config(model=a.model, dataset="builtin", task=name, max_new_tokens=budgets[name][0],
                       max_reply_tokens=budgets[name][1], group_size=8)
        tok, rows, _, tasks = g.load_data(cfg)
        plain = {name: SimpleNamespace(**{**vars(tasks[name]), "env_ids": g.env_ids(tok, "chat", name)})}  # not kept
        server = type("Server", (), {"sample": g.Server.sample, "place": g.Server.place, "cfg": cfg, "urls": [url],
                                     "rt": SimpleNamespace(rank=0)})()
        rows = rows[: a.episodes // cfg.group_size]
        shapes = {
            "lockstep": lambda: g.rollout(cfg, server, tasks, rows, version)["episodes"],
            "lockstep_env_ids_not_remembered": lambda: g.rollout(cfg, server, plain, rows, version)["episodes"]}
        got = {k: {"rollout": [], "single": [], "turns": [], "tokens": []} for k in shapes}
        for rep in range(a.reps + 1):
            for k, fn in shapes.items():
                requests.post(url + "/flush_cache", timeout=60)
                t0 = time.perf_counter()
                eps = fn()
                t1 = time.perf_counter()
                sampled = [sum(e["mask"]) for e in eps]
                t2 = once(url, lambda: generate(url, [e["prompt"] for e in eps], sampled))
                if rep:
                    got[k]["rollout"].append(t1 - t0), got[k]["single"].append(t2)
                    got[k]["turns"].append(statistics.mean(e["turns"] for e in eps))
                    got[k]["tokens"].append(sum(sampled))
        out[name] = {"episodes": len(rows) * cfg.group_size, **{k: {
            "rollout": stats(v["rollout"]), "single_turn_same_tokens": stats(v["single"]),
            "ratio": statistics.median(v["rollout"]) / statistics.median(v["single"]),
            "turns_mean": statistics.median(v["turns"]), "sampled_tokens": statistics.median(v["tokens"])}
            for k, v in got.items()}}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16, help="tokens per reply")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tasks", nargs="*", default=["calculator", "guess"])
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.model)
    said, prompts, out = synthetic(a, a.url, tok)
    print(json.dumps(out), flush=True)
    out = {"synthetic": out, "breakdown": breakdown(a, a.url, tok, said, prompts)}
    print(json.dumps(out["breakdown"]), flush=True)
    out["tasks"] = tasks(a, a.url)
    print(json.dumps(out["tasks"]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
