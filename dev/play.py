"""Greedy episodes on the first held-out rows of a task, played by whatever weights a running server holds (the trainer's
own rollout(), as its evaluation plays them): to show one as the model played it, before and after training.

    python3 dev/play.py --model M --task python [--url http://127.0.0.1:30000] [--rows 8] [--out episodes.json]

Prints each episode (its messages after the prompt, the answer, right or not) and writes them as JSON.
"""
import argparse
import json
import os
import sys
from types import SimpleNamespace

import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--task", default="python")
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--max_new_tokens", type=int, default=640)
    p.add_argument("--max_reply_tokens", type=int, default=256)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cfg = g.Config(model=a.model, dataset="builtin", task=a.task, max_new_tokens=a.max_new_tokens,
                   max_reply_tokens=a.max_reply_tokens)
    _, _, evals, tasks = g.load_data(cfg)
    version = requests.post(a.url + "/generate", json={"input_ids": [[1, 2, 3]], "sampling_params": {
        "max_new_tokens": 1}}, timeout=60).json()[0]["meta_info"]["weight_version"]
    server = type("Server", (), {"sample": g.Server.sample, "place": g.Server.place, "cfg": cfg, "urls": [a.url],
                                 "rt": SimpleNamespace(rank=0)})()  # the trainer's requests, without its setup
    batch = g.rollout(cfg, server, tasks, evals[: a.rows], version, greedy=True)
    out = []
    for e in batch["episodes"]:
        last = [m["content"] for m in e["messages"] if m["role"] == "assistant"][-1]
        out.append({"messages": e["messages"], "answer": e["answer"], "turns": e["turns"], "finish": e["finish"],
                    "correct": bool(tasks[e["task"]].correct(last, e["answer"])), "weight_version": version})
        print(json.dumps(out[-1]["messages"][-(2 * e["turns"]):], ensure_ascii=False)[:1500])
        print(f"  answer {e['answer']}: {'right' if out[-1]['correct'] else 'wrong'} ({e['turns']} turns)\n")
    print(f"play: {sum(o['correct'] for o in out)} of {len(out)} right (server weights {version})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
