"""A task of episodes against a single-turn run of the same sampled tokens: the trainer's step time, turns and all,
against the step of a run whose every episode is one reply of as many tokens as that episode sampled in its turns.

    torchrun --nproc_per_node 1 dev/same_tokens.py --record T.json -- <grpo_sglang.py flags of a task of episodes>
    torchrun --nproc_per_node 1 dev/same_tokens.py --replay T.json -- <the same flags> --max_turns 1

--record: the run as the flags say; after each training rollout, the tokens each episode sampled (its mask's ones),
its turns and its environment's tokens go to T.json. --replay: the same run with one turn (--max_turns 1: the same
prompt rows, step by step); each training rollout's one /generate asks every episode for exactly the tokens the
recorded episode sampled (ignore_eos, no stop strings), so the steps train on as many sampled tokens as the recorded
steps, without the turns and the environment's messages. Both runs' metrics.jsonl hold the step's times
(time_step, time_rollout, time_train); the replay ends with an error if a rollout's tokens are not the recorded ones.
One process, one server; the rollout of the final evaluation (greedy) is left as it is.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--record", help="write each training rollout's sampled tokens per episode to this JSON file")
    p.add_argument("--replay", help="sample exactly the tokens of this recorded JSON file, one reply per episode")
    args, rest = p.parse_known_args()
    if bool(args.record) == bool(args.replay) or rest[:1] != ["--"]:
        p.error("give --record FILE or --replay FILE, then -- and the trainer's flags")
    if int(os.environ.get("WORLD_SIZE", 1)) != 1:
        p.error("one process only (torchrun --nproc_per_node 1)")
    real_rollout, real_generate = g.rollout, g.generate
    recorded = json.load(open(args.replay))["rollouts"] if args.replay else []
    done, asked = [], []  # the training rollouts so far; the replay's budgets for the rollout in flight

    def rollout(cfg, server, tasks, rows, version, greedy=False):
        if not greedy and args.replay:
            if len(done) == len(recorded):
                raise g.UserError(f"{args.replay} holds {len(recorded)} rollouts; this run asks for more")
            asked.append(recorded[len(done)]["sampled"])
        batch = real_rollout(cfg, server, tasks, rows, version, greedy)
        if greedy:
            return batch
        eps = batch["episodes"]
        done.append({"version": version, "sampled": [sum(e["mask"]) for e in eps], "turns": [e["turns"] for e in eps],
                     "env_tokens": [len(e["mask"]) - sum(e["mask"]) for e in eps]})
        if args.replay and done[-1]["sampled"] != recorded[len(done) - 1]["sampled"]:
            raise g.UserError(f"rollout {len(done)}: the replay sampled other token counts than {args.replay}")
        if args.record:
            g.write_whole(args.record, json.dumps({"rollouts": done}))
        return batch

    def generate(cfg, url, input_ids, version, did, what, **req):
        sp = req.get("sampling_params")
        sp0 = sp[0] if isinstance(sp, list) else sp
        if asked and what == "this rollout" and sp0 and sp0.get("temperature", 1.0) > 0:
            budgets = asked.pop()
            if len(budgets) != len(input_ids):
                raise g.UserError(f"the replay asks for {len(input_ids)} replies; {args.replay} has {len(budgets)}")
            base = {k: v for k, v in sp0.items() if k != "stop"}
            req["sampling_params"] = [{**base, "max_new_tokens": b, "ignore_eos": True} for b in budgets]
        return real_generate(cfg, url, input_ids, version, did, what, **req)

    g.rollout, g.generate = rollout, generate
    try:
        g.main(g.parse_config(rest[1:]))
    except g.UserError as e:
        g.exit_now(1, f"error: {e}")
    g.exit_now(0)


if __name__ == "__main__":
    main()
