"""The Qwen2.5 model folder that dev/run_gpu.sh's qwen_model phase converts from a GGUF: its tokenizer splits text
as Qwen's own (GPT-2 byte-level BPE, digits one a token), its chat template is ChatML with Qwen's default system
prompt, a reply ends at <|im_end|>, and the template only appends turns (the trainer's environments need that).

    python3 dev/check_qwen.py MODEL_DIR      # exit 1 with what differs
"""
import sys

from transformers import AutoTokenizer

sys.path.insert(0, __file__.rsplit("/dev/", 1)[0])
import grpo_sglang as g

tok = AutoTokenizer.from_pretrained(sys.argv[1])
got = {
    "tokens": tok.tokenize("What is 347 * 29?"),
    "eos": tok.eos_token, "pad": tok.pad_token,
    "chat": tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True),
}
want = {
    "tokens": ["What", "Ġis", "Ġ", "3", "4", "7", "Ġ*", "Ġ", "2", "9", "?"],
    "eos": "<|im_end|>", "pad": "<|endoftext|>",
    "chat": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
}
bad = [f"{k}: {got[k]!r}, not {want[k]!r}" for k in want if got[k] != want[k]]
said = g.env_ids(tok, "chat", "python")("4214", tok.convert_tokens_to_ids("<|im_end|>"))  # raises if it cannot
if bad:
    sys.exit("check_qwen: " + "; ".join(bad))
print(f"check_qwen: {sys.argv[1]}: tokens {got['tokens']}, eos {got['eos']}, pad {got['pad']}, ChatML with Qwen's "
      f"system prompt; an environment's message: {tok.decode(said)!r}")
