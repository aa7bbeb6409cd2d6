"""A turn of 128 episodes of --task python on the CPU: env_answers with ENV_POOL at 32 threads (the default) against 1
(one environment at a time), 3 runs each. Each reply runs a snippet that sums the numbers of its question.

    python3 dev/env_pool_bench.py
"""
import concurrent.futures, collections, statistics, sys
sys.path.insert(0, __file__.rsplit("/dev/", 1)[0])
import grpo_sglang as g, reward_fns as rf
from types import SimpleNamespace
rows = rf.word_problem_rows()[:128]
code = lambda q: "```python\nimport re\nnums = [int(x) for x in re.findall(r'\\d+', %r)]\nprint(sum(nums))\n```" % q
eps = [{"task": "python", "answer": r["answer"], "messages": [{"role": "user", "content": r["question"]},
        {"role": "assistant", "content": code(r["question"])}]} for r in rows]
tasks = {"python": SimpleNamespace(env=rf.python_env)}
out = collections.defaultdict(list)
for rep in range(3):
    for workers in (32, 1):
        g.ENV_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        said, s = g.env_answers(tasks, eps, collections.Counter())
        assert all(x and x.isdigit() for x in said), said[:3]
        out[workers].append(s)
for w, v in out.items():
    print(f"ENV_POOL {w:2d}: a turn of 128 snippets median {statistics.median(v):.2f} s (range {min(v):.2f}-{max(v):.2f}, 3 runs)")
