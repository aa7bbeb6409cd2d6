"""docs/reference.md's flag tables, written from grpo_sglang.Config (its groups, defaults, rules and help lines):

    python3 tools/flags_md.py            # prints them; test_smoke checks that docs/reference.md holds exactly this
"""
import dataclasses
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402


def tables():
    src = open(g.__file__).read()
    start = src.index("class Config:")
    body = src[start: src.index("\n# ", start)]  # up to the next top-level comment
    fields, groups = {f.name: f for f in dataclasses.fields(g.Config)}, []
    for line in body.splitlines():  # the Config's comment lines name its groups
        if re.match(r"    # (.+)", line):
            groups.append((line.strip()[2:], []))
        elif re.match(r"    (\w+): \w+ = arg\(", line) and groups:
            groups[-1][1].append(fields[line.split(":")[0].strip()])
    out = []
    for title, group in groups:
        out += [f"### {title[0].upper() + title[1:]}", "", "| flag | default | allowed | what it does |",
                "|---|---|---|---|"]
        for f in group:
            flag, ok, d = f.name.rstrip("_"), f.metadata["ok"], f.default
            allowed = " \\| ".join(f"`{o}`" for o in ok) if isinstance(ok, tuple) else f"`{ok}`" if ok else ""
            default = {False: "off", True: "on", "": "`''`"}.get(d, f"`{d}`") if type(d) in (bool, str) else f"`{d}`"
            name = f"`--{flag}`" + (f" / `--no-{flag}`" if type(d) is bool else "")
            out.append(f"| {name} | {default} | {allowed} | {f.metadata['help'].replace('|', '/')} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(tables())
