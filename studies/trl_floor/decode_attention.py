"""Decode attention alone (issue 22): transformers' SDPA path against a plain
matmul-softmax-matmul over grouped query heads, q length 1, bool padding mask, KV views of a
preallocated cache; one thread.

    python studies/trl_floor/decode_attention.py
"""

import time
from collections.abc import Callable
from types import SimpleNamespace

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def grouped_attention(q, k, v, mask, scaling):  # noqa: ANN001, ANN201
    n, heads, _, dim = q.shape
    kv_heads = k.shape[1]
    s = torch.matmul(q.reshape(n, kv_heads, heads // kv_heads, dim), k.transpose(-1, -2))
    s = (s * scaling).masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v).reshape(n, heads, 1, dim).transpose(1, 2)


def micros(f: Callable[[], object], n: int = 100) -> float:
    for _ in range(5):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    torch.set_num_threads(1)
    # (batch, query heads, KV heads, head dim, cache length): the embedded model at the two
    # bench settings, SmolLM2-135M's layout
    for batch, heads, kv_heads, dim, cache in [
        (128, 4, 4, 32, 60),
        (64, 4, 4, 32, 44),
        (16, 9, 3, 64, 80),
    ]:
        module = SimpleNamespace(
            num_key_value_groups=heads // kv_heads, is_causal=True, training=False
        )
        keys = torch.randn(batch, kv_heads, cache, dim)
        values = torch.randn(batch, kv_heads, cache, dim)
        pad = torch.ones(batch, 1, 1, cache, dtype=torch.bool)
        pad[: batch // 2, :, :, :3] = False  # left padding on half the rows
        for length in (cache // 4, cache // 2, cache):
            q = torch.randn(batch, heads, 1, dim)
            k, v, m = keys[:, :, :length], values[:, :, :length], pad[..., :length]
            scale = dim**-0.5
            ref, _ = sdpa_attention_forward(module, q, k, v, m, dropout=0.0, scaling=scale)
            diff = (ref - grouped_attention(q, k, v, m, scale)).abs().max().item()
            sdpa = micros(
                lambda q=q, k=k, v=v, m=m, s=scale, a=module: sdpa_attention_forward(
                    a, q, k, v, m, dropout=0.0, scaling=s
                )
            )
            plain = micros(lambda q=q, k=k, v=v, m=m, s=scale: grouped_attention(q, k, v, m, s))
            print(
                f"batch {batch} heads {heads}/{kv_heads} dim {dim} length {length}: "
                f"sdpa {sdpa:.0f} us, plain {plain:.0f} us, max diff {diff:.1e}"
            )


if __name__ == "__main__":
    main()
