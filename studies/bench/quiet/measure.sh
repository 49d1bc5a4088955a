#!/bin/bash
# Benches run alone on the 2 cores (nothing else running), one after another:
# TRL ratios without TRL's activation checkpointing (float32 and bf16-mixed), SmolLM2 + LoRA
# against TRL with the same adapter, the multi-turn step against a single-turn step, GAR's
# authors' preset against GRPO. Each line of times.log: the bench, and the load average
# (1, 5, 15 min) at its start and end.
set -u
OUT=${OUT:-studies/bench/quiet}
SFT=${SFT:-$HOME/.cache/policyopt/sft/10c8e805e2aab8cf}
run() {  # tag, command...
  tag=$1; shift
  echo "$(date -u +%T) $tag start load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.log
  "$@" > $OUT/$tag.log 2>&1
  echo "$(date -u +%T) $tag end rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.log
}
run tiny_8x8x32 policyopt bench --algos grpo --against trl --steps 8 --prompts 8 --group-size 8 --max-new-tokens 32 --json-out $OUT/tiny_8x8x32.json
run tiny_8x16x48 policyopt bench --algos grpo --against trl --steps 8 --prompts 8 --group-size 16 --max-new-tokens 48 --json-out $OUT/tiny_8x16x48.json
run tiny_8x8x32_bf16 policyopt bench --algos grpo --against trl --steps 8 --prompts 8 --group-size 8 --max-new-tokens 32 --json-out $OUT/tiny_8x8x32_bf16.json model.precision=bf16-mixed
run multiturn python -m studies.bench.multiturn_cost --turns 3 --turn-tokens 16 --rounds 10 --json-out $OUT/multiturn_cost.json
run gar_authors policyopt bench --model $SFT --algos grpo,gar,gar_authors --steps 8 --prompts 8 --group-size 8 --max-new-tokens 48 --json-out $OUT/gar_authors.json train.num_threads=1
run smollm2_lora policyopt bench --model smollm2 --algos grpo --against trl --steps 3 --prompts 4 --group-size 4 --max-new-tokens 64 --json-out $OUT/smollm2_lora.json model.lora.enabled=true model.lora.rank=16 model.lora.alpha=32 model.precision=bf16-mixed
echo ALLDONE >> $OUT/times.log
