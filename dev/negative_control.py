"""The trainer with weight pushes skipped on purpose: the negative controls of the sync checks on a real server.

    torchrun --nproc_per_node 1 dev/negative_control.py --skip 6 [--tag_skipped] -- <grpo_sglang.py flags>
    torchrun --nproc_per_node 1 dev/negative_control.py --half 6 -- <grpo_sglang.py flags>
    torchrun --nproc_per_node 1 dev/negative_control.py --base_only 10-100 -- --lora_rank 16 <grpo_sglang.py flags>

    torchrun --nproc_per_node 1 dev/negative_control.py --no_hashes_after_rollout -- <grpo_sglang.py flags>

--skip '6', '4-40' or '3,7-9': the pushes of those versions (the weights after those steps) are not sent. With
--tag_skipped the server still gets the version tag (/update_weight_version, without aborting requests): a server
that drops the weights but keeps the tag, which the version check cannot see. --half: those pushes send only every
other tensor of each bucket, with the tag: a server that loads part of a push. The trainer still gathers and hashes
every tensor it should have sent, so the weight check (the server's hashes against ours) sees what was not sent;
the log-prob check sees it only once the weights have moved far enough. --base_only (with --lora_rank): those pushes
send each adapted weight without its adapters (the base model's), tagged: a server sampling without the adapters.
Until grpo_sglang.py at 3daebff --skip and --tag_skipped were its flags --debug_skip_sync and --debug_tag_skipped.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402


def versions(spec):
    out = set()
    for part in filter(None, spec.replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skip", default="", help="versions whose push is skipped: '6', '4-40', '3,7-9'")
    p.add_argument("--tag_skipped", action="store_true", help="still send the version tag of a skipped push")
    p.add_argument("--half", default="", help="versions whose push sends every other tensor of each bucket, tagged")
    p.add_argument("--base_only", default="", help="--lora_rank: versions whose push sends the base's weights, tagged")
    p.add_argument("--no_hashes_after_rollout", action="store_true", help="no /weights_checker after each rollout "
                   "(the check of the hashes off, to time what it costs)")
    args, rest = p.parse_known_args()
    skip, half, base = versions(args.skip), versions(args.half), versions(args.base_only)
    send, push, trainer = g.send_bucket, g.push_weights, {}

    def pushing(cfg, model, link, version):  # (one rank: its parameters are whole)
        trainer["base"] = {n: p.data.to_local() for n, p in g.served(model)}
        return push(cfg, model, link, version)

    def faulty_send(cfg, link, flat, meta, last, version):  # rank 0, each bucket of a push (hashed already)
        v = int(version)
        if last and v in base:
            g.print0(f"negative control: the push of version {v} sends the base model's weights, not merged, tagged")
        if v in base:  # hashed as merged (the trainer's side), sent as the base's
            flat, meta = g.pack([(m.name, trainer["base"][m.name]) for m in meta], flat.device)
        if last and v in skip | half:
            g.print0(f"negative control: the push of version {v} is "
                     + ("skipped" + (", its tag is sent" if args.tag_skipped else "") if v in skip
                        else "sent with every other tensor left out, its tag too"))
        if v in skip:
            for u in link["servers"] if args.tag_skipped and last else []:
                g.call(cfg, u["url"], "/update_weight_version", {"new_version": version, "abort_all_requests": False})
            return lambda: 0
        if v in half:
            flat, meta = g.pack([(m.name, flat[m.start_idx: m.end_idx].view(m.dtype).view(m.shape)) for m in meta[::2]],
                                flat.device)
        return send(cfg, link, flat, meta, last, version)
    g.send_bucket, g.push_weights = faulty_send, pushing
    if args.no_hashes_after_rollout:
        g.Server.weights_after = lambda self, batch: batch
    try:
        g.main(g.parse_config([a for a in rest if a != "--"]))
    except g.UserError as e:
        g.exit_now(1, f"error: {e}")
    g.exit_now(0)


if __name__ == "__main__":
    main()
