"""Benchmarks: what `policyopt bench` (`cli/bench.py`) runs besides the trainer, and the ones
run by hand with `python -m`.

- `stats`: paired step-time ratios and their 95% interval (`--ci-width`);
- `trl`: TRL's `GRPOTrainer` under the same settings (`--against trl`);
- `background_load`: competing CPU-bound processes (`--background-load`);
- `head_memory`: peak memory of chunked vs full-logits LM-head log-probs
  (`--memory`, or `python -m policyopt.bench.head_memory`);
- `datpo_cache`: what reusing the bases' KV cache saves when DATPO forks
  (`python -m policyopt.bench.datpo_cache`).

Imports flow one way: this package uses the library; only `cli` imports it.
"""
