"""docs/reference.md's flag tables, written from grpo_sglang's GRPOConfig and Config (their groups, defaults, rules and
help lines):

    python3 tools/flags_md.py            # prints them; test_smoke checks that docs/reference.md holds exactly this
    python3 tools/flags_md.py --write    # writes them into docs/reference.md (between its flags markers)
"""
import dataclasses
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo_sglang as g  # noqa: E402


def tables():
    src = open(g.__file__).read()
    bodies = []
    for head in ("class GRPOConfig:", "class Config(GRPOConfig):"):  # the story's knobs, then the plumbing's flags
        start = src.index(head)
        bodies.append(src[start: src.index("\n\n\n", start)])  # up to the class's end
    fields, groups = {f.name: f for f in dataclasses.fields(g.Config)}, []
    for line in "\n".join(bodies).splitlines():  # the classes' comment lines name their groups
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


def write(path=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "reference.md")):
    """The tables into `path`, between `<!-- flags: begin ... -->` and `<!-- flags: end -->`."""
    text = open(path).read()
    head, rest = text.split("<!-- flags: begin", 1)
    marker, rest = rest.split("-->", 1)
    tail = rest.split("<!-- flags: end -->", 1)[1]
    open(path, "w").write(f"{head}<!-- flags: begin{marker}-->\n{tables()}\n<!-- flags: end -->{tail}")


if __name__ == "__main__":
    write() if "--write" in sys.argv[1:] else print(tables())
