"""The story's size and prose, as issue 62 counts them: lines and characters above grpo_sglang.py's fence, lines wider
than 100 columns, and in its prose (comments and docstrings) the sentences, their median length in words and the
colons per sentence (a colon followed by a space or a line's end: prose, not a slice or a dict).

    python dev/story_stats.py [grpo_sglang.py]      # one line of numbers
"""
import ast
import io
import re
import statistics
import sys
import tokenize


def story(src):
    """The text above the fence (the line that starts '# ---- Plumbing below', or the '# ====' line before it)."""
    lines = src.splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if line.startswith("# ---- Plumbing below"))
    while end and lines[end - 1].startswith("# ===="):
        end -= 1
    return "".join(lines[:end])


def prose(text):
    """The comments and docstrings of `text`, each on its own (a run of whole-line comments is one), joined by blank
    lines: what a reader reads as sentences."""
    parts, tree = [], ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node):
            parts.append(ast.get_docstring(node))
    run, last_row = [], None
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type != tokenize.COMMENT:
            continue
        whole_line = not tok.line[: tok.start[1]].strip()
        if not (whole_line and last_row == tok.start[0] - 1 and run):
            parts.append(" ".join(run))
            run = []
        run.append(tok.string.lstrip("#").strip())
        last_row = tok.start[0] if whole_line else None
    parts.append(" ".join(run))
    return "\n\n".join(p for p in parts if p)


def sentences(text):
    """Sentences: runs of words that end at '.', '?' or '!' before a space or a line's end, or at a blank line; code
    lines (indented commands) left out."""
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    text = re.sub(r"\b(e\.g|i\.e|et al|vs|cf)\.", r"\1", text)
    out = [s.strip() for s in re.split(r"(?<=[.?!])\s+|\n\s*\n", text)]
    return [s for s in out if len(s.split()) >= 3]


def stats(path):
    src = open(path).read()
    text = story(src)
    sents = sentences(prose(text))
    colons = sum(len(re.findall(r":(?=\s|$)", s)) for s in sents)
    return {"lines": text.count("\n"), "chars": len(text),
            "over_100": sum(len(line) > 100 for line in text.splitlines()),
            "sentences": len(sents), "median_words": statistics.median(len(s.split()) for s in sents),
            "colons_per_sentence": round(colons / len(sents), 2)}


if __name__ == "__main__":
    print(stats(sys.argv[1] if len(sys.argv) > 1 else "grpo_sglang.py"))
