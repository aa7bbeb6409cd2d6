"""A GGUF's SentencePiece tokenizer (tokenizer.ggml.model "llama": its tokens, its scores as merge ranks, its token
types) rebuilt as a `tokenizers` BPE with byte fallback, written as tokenizer.json: each normal token is the merge of
a split of it into two tokens, ranked by its score. Gemma-3-270m's GGUF converted by the GPU kit's gguf_to_hf.py reads
text one character a token (82 characters: 82 tokens), which the model never saw in training; rebuilt, "What is 347 *
29?" is 'What', '▁is', '▁', '3', '4', '7', ... as Gemma's own tokenizer writes it (docs/log.md, 2026-12-06).

    python3 dev/gguf_tokenizer.py MODEL.gguf MODEL_DIR       # MODEL_DIR/tokenizer.json replaced (the old one kept as
                                                             # tokenizer.json.converted)
    python3 dev/gguf_tokenizer.py --compare MODEL_DIR        # on the CPU: the model's loss per character of plain
        # English and its greedy reply to the calculator's plain prompt (the worked example first, as the trainer
        # writes it), with tokenizer.json.converted and with tokenizer.json
"""
import os, sys


def build(path):
    """GGUF file -> (tokenizers.Tokenizer, how many merges)."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    f = gguf.GGUFReader(path).fields
    arr = lambda k: [f[k].parts[i] for i in f[k].data]
    model = bytes(f["tokenizer.ggml.model"].parts[-1]).decode()
    if model != "llama":
        raise SystemExit(f"{path}: tokenizer.ggml.model is {model!r}; this rebuilds SentencePiece's ('llama') only")
    toks = [bytes(p).decode("utf-8", errors="replace") for p in arr("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in arr("tokenizer.ggml.scores")]
    types = [int(p[0]) for p in arr("tokenizer.ggml.token_type")]  # 1 normal, 3 control, 4 user-defined, 6 byte
    vocab = {t: i for i, t in enumerate(toks)}
    plain = lambda t: t in vocab and types[vocab[t]] in (1, 6)
    merges = sorted((-scores[i], vocab[t[:k]], vocab[t[k:]], t[:k], t[k:]) for i, t in enumerate(toks)
                    if types[i] == 1 for k in range(1, len(t)) if plain(t[:k]) and plain(t[k:]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], byte_fallback=True,
                               fuse_unk=True, unk_token=toks[int(f["tokenizer.ggml.unknown_token_id"].parts[-1][0])]))
    space = bool(f["tokenizer.ggml.add_space_prefix"].parts[-1][0]) if "tokenizer.ggml.add_space_prefix" in f else False
    tok.normalizer = normalizers.Sequence(([normalizers.Prepend("▁")] if space else [])
                                          + [normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if space else []))
    tok.add_tokens([AddedToken(t, special=types[i] == 3, normalized=False) for i, t in enumerate(toks)
                    if types[i] in (3, 4)])
    if "tokenizer.ggml.add_bos_token" in f and f["tokenizer.ggml.add_bos_token"].parts[-1][0]:
        bos = toks[int(f["tokenizer.ggml.bos_token_id"].parts[-1][0])]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, vocab[bos])])
    return tok, len(merges)


def compare(model_dir):
    """The model under each tokenizer of model_dir: nats per character of a paragraph, the greedy calculator reply."""
    import shutil, tempfile, torch
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import reward_fns
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    text = ("The quick start trains a small model to add two numbers. Each step samples a group of answers for every "
            "question, scores them, and moves the model towards the answers that scored above their group's mean.")
    t = reward_fns.TASKS["calculator"]
    prompt = "".join(m["content"] + ("\n" + t.instruction if k == 0 else "") + "\n" for k, m in enumerate(t.example))
    prompt += "\nWhat is 434 * 27?\n" + t.instruction + "\n"
    for name in ("tokenizer.json.converted", "tokenizer.json"):
        with tempfile.TemporaryDirectory() as d:
            for f in os.listdir(model_dir):
                if f.startswith("tokenizer") and not f.startswith("tokenizer.json"):
                    shutil.copy(os.path.join(model_dir, f), d)
            shutil.copy(os.path.join(model_dir, name), os.path.join(d, "tokenizer.json"))
            tok = AutoTokenizer.from_pretrained(d)
        bos = [tok.convert_tokens_to_ids("<bos>")]
        x = torch.tensor([bos + tok(text, add_special_tokens=False)["input_ids"]])
        p = torch.tensor([bos + tok(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            nll = torch.nn.functional.cross_entropy(model(x).logits[0, :-1], x[0, 1:], reduction="sum").item()
            out = model.generate(p, max_new_tokens=20, do_sample=False)
        reply = tok.decode(out[0, p.shape[1]:], skip_special_tokens=True).split("\n")[0]
        print(f"[gguf_tokenizer] {name}: {x.shape[1] - 1} tokens for {len(text)} characters, {nll / len(text):.3f} "
              f"nats a character; the prompt {p.shape[1]} tokens, greedy reply {reply!r}")


def main():
    if sys.argv[1:2] == ["--compare"] and len(sys.argv) == 3:
        return compare(sys.argv[2])
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, out = sys.argv[1:]
    tok, n = build(path)
    dst = os.path.join(out, "tokenizer.json")
    if os.path.exists(dst) and not os.path.exists(dst + ".converted"):
        os.replace(dst, dst + ".converted")
    tok.save(dst)
    s = "What is 347 * 29?"
    print(f"[gguf_tokenizer] {dst}: {len(tok.get_vocab())} tokens, {n} merges; {s!r} -> {tok.encode(s).tokens}")


if __name__ == "__main__":
    main()
