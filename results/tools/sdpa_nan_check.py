"""Does PyTorch's cuDNN attention backward give NaN gradients for the masks the trainer builds? (pytorch/pytorch
#196678: an explicit attn_mask, a key length of 64 mod 128 and a query row whose logsumexp is below -88.7 give NaN
in grad_q.) One line of JSON per case: the mask, the length, the backend, how many grad_q elements are not finite.

    python results/tools/sdpa_nan_check.py > sdpa_nan_check.jsonl

Masks, batch 16, 9 heads of 64 (SmolLM2's attention), bf16, random q, k, v of the usual scale:
  left_padded  the trainer's layout up to 29bd791: prompts left-padded, completions right-padded; the pad rows at
               the left attend to nothing (their logsumexp is -inf)
  packed       pack_batch's layout: sequences end to end in a row, each attending within itself, every pad token
               to itself only (no row attends to nothing)
  issue        the issue's own repro: causal mask, every logit ~ -120 (one row of batch 1)"""
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def left_padded(L, gen):
    """(16, L, L) bool, as transformers builds it: causal, and each row's first `pad` keys (0 .. L/2) masked; the
    pad tokens' own query rows then attend to nothing."""
    pads = torch.randint(0, L // 2, (16,), generator=gen)
    keep = torch.arange(L)[None, :] >= pads[:, None]  # (16, L) the real tokens
    return torch.ones(L, L, dtype=torch.bool).tril()[None] & keep[:, None, :]


def packed(L, gen):
    """(16, L, L) bool: causal within blocks of random lengths 8 .. 60, the row's tail single-token blocks."""
    masks = []
    for _ in range(16):
        seg, at, k = torch.zeros(L, dtype=torch.long), 0, 0
        while at < L:
            n = int(torch.randint(8, 60, (1,), generator=gen)) if at < L * 3 // 4 else 1
            seg[at: at + n], at, k = k, at + n, k + 1
        masks.append((seg[:, None] == seg[None, :]) & torch.ones(L, L, dtype=torch.bool).tril())
    return torch.stack(masks)


def run(kind, L, backend, gen):
    B, H, D = (1, 1, 64) if kind == "issue" else (16, 9, 64)
    q, k, v = (torch.randn(B, H, L, D, generator=gen) for _ in range(3))
    if kind == "issue":
        q, k = q * 0.1, k * 0.1
        q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(D)
        mask = torch.ones(L, L, dtype=torch.bool).tril()[None, None]
    else:
        mask = (left_padded if kind == "left_padded" else packed)(L, gen)[:, None]
    q, k, v = (t.to("cuda", torch.bfloat16).requires_grad_() for t in (q, k, v))
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.cuda())
        out.backward(torch.randn(out.shape, generator=gen).to(out))
    bad = lambda t: int((~torch.isfinite(t)).sum())
    return {"mask": kind, "L": L, "backend": backend.name, "out_nonfinite": bad(out), "grad_q_nonfinite": bad(q.grad),
            "grad_k_nonfinite": bad(k.grad), "grad_v_nonfinite": bad(v.grad)}


if __name__ == "__main__":
    print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                      "gpu": torch.cuda.get_device_name()}), flush=True)
    for kind in ("issue", "left_padded", "packed"):
        for L in (192, 193, 256, 320, 704, 705):
            for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
                try:
                    print(json.dumps(run(kind, L, backend, torch.Generator().manual_seed(L))), flush=True)
                except RuntimeError as e:  # a backend that refuses the inputs
                    print(json.dumps({"mask": kind, "L": L, "backend": backend.name, "error": str(e)[:200]}), flush=True)
