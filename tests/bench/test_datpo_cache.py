"""The DATPO fork-cache benchmark (`python -m policyopt.bench.datpo_cache`) times both arms
on the same forks."""

from policyopt.bench.datpo_cache import run


def test_cache_bench_times_both_arms_on_the_same_forks():
    out = run("tiny", prompts=1, n_base=2, forks=1, branches=2, max_new_tokens=8, rounds=1, seed=0)
    assert out["generated_tokens"]["reuse"] == out["generated_tokens"]["recompute"] > 0
    assert out["tokens_fed_at_forks"]["reuse"] == out["forks"] >= 1
    assert out["prefix_tokens_prefilled"]["recompute"] > out["forks"]
    assert out["cpu_ratio_recompute_over_reuse"] > 0
