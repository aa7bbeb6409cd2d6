"""The trainer with weight pushes skipped on purpose: the negative controls of the sync checks on a real server.

    torchrun --nproc_per_node 1 results/tools/negative_control.py --skip 6 [--tag_skipped] -- <grpo_sglang.py flags>

--skip '6', '4-40' or '3,7-9': the pushes of those versions (the weights after those steps) are not sent. With
--tag_skipped the server still gets the version tag (/update_weight_version, without aborting requests): a server
that drops the weights but keeps the tag, which only the logprob check can see. Until grpo_sglang.py at 3daebff
these were its flags --debug_skip_sync and --debug_tag_skipped; results/ runs before it name them so.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import grpo_sglang as g  # noqa: E402


def versions(spec):
    out = set()
    for part in filter(None, spec.replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skip", required=True, help="versions whose push is skipped: '6', '4-40', '3,7-9'")
    p.add_argument("--tag_skipped", action="store_true", help="still send the version tag of a skipped push")
    args, rest = p.parse_known_args()
    skip, push = versions(args.skip), g.Server.push

    def skipping_push(self, model, version):
        if version not in skip:
            return push(self, model, version)
        g.print0(f"negative control: the push of version {version} is skipped"
                 + (", its tag is sent" if args.tag_skipped else ""))
        if args.tag_skipped:
            g.on_all_ranks(lambda: self.rt.master and [g.call(self.cfg, u, "/update_weight_version", {
                "new_version": str(version), "abort_all_requests": False}) for u in self.urls])
        return 0
    g.Server.push = skipping_push
    try:
        g.main(g.parse_config([a for a in rest if a != "--"]))
    except g.UserError as e:
        g.exit_now(1, f"error: {e}")
    g.exit_now(0)


if __name__ == "__main__":
    main()
