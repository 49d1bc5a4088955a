"""The LM-head memory benchmark (`python -m policyopt.bench.head_memory`): chunked
log-probs peak lower than full logits."""

import pytest

from policyopt.bench.head_memory import head_memory_benchmark


@pytest.mark.slow
def test_head_memory_benchmark_runs_and_chunked_uses_less() -> None:
    result = head_memory_benchmark(vocab=8192, hidden=64, batch=4, length=256, chunk_size=128)
    assert result["logits_mib"] == pytest.approx(4 * 256 * 8192 * 4 / 2**20)
    assert result["naive_peak_mib"] > result["logits_mib"]  # logits + log-softmax + grads
    assert result["chunked_peak_mib"] < result["naive_peak_mib"] / 2
