"""SGLang's input-logprob ids for the last vocabulary id, from its own code (CPU, no server): the function that
builds `input_token_logprobs` (logprob_result_processor.py, `_process_input_token_logprobs`) run on a request whose
input holds the ids vocab_size - 1 and vocab_size - 2 of a Qwen2.5-sized vocabulary. It reports the first as 0.

    python3 results/tools/sglang_last_id.py      # prints the sglang version and the (logprob, id) pairs
"""
import ast
import os
import textwrap
from types import SimpleNamespace
from typing import List

import sglang

path = os.path.join(os.path.dirname(sglang.__file__), "srt/managers/scheduler_components/logprob_result_processor.py")
src = open(path).read()
fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "_process_input_token_logprobs")
ns = {"List": List, "Req": object, "MIS_DELIMITER_TOKEN_ID": -1}
exec(textwrap.dedent(ast.get_source_segment(src, fn)), ns)  # the method alone: importing the module needs the server's deps
V = 151936
self = SimpleNamespace(_is_multi_item_scoring=lambda req: False, model_config=SimpleNamespace(vocab_size=V))
req = SimpleNamespace(origin_input_ids=[10, 11, 12, V - 1, V - 2, 7], logprob_start_len=2, logprob=SimpleNamespace())
ns["_process_input_token_logprobs"](self, req, [-1.0, -2.0, -3.0, -4.0, -5.0])  # the logprobs of positions 2.. (+1)
print("sglang", sglang.__version__, "input ids from logprob_start_len:", req.origin_input_ids[2:])
print("input_token_logprobs (logprob, id):", list(zip(req.logprob.input_token_logprobs_val, req.logprob.input_token_logprobs_idx)))
