#!/bin/bash
# DATPO vs GRPO at equal generated tokens, pass@64 (issue 19). Two lanes of one thread each.
# DATPO's run for seed S stops once it has generated GRPO seed S's total (train.max_generated_tokens).
cd /work/studies
wait_for() { while [ ! -f $1/summary.json ]; do sleep 20; done; }
grpo_total() { python3 -c "
import json,sys
rows=[json.loads(l) for l in open('p64/grpo/seed-$1/metrics.jsonl')]
print(int(max(r.get('generated_tokens_total',0) for r in rows)))"; }
run() { # method seed extra...
  local m=$1 s=$2; shift 2
  local cell=$m; [ "$m" = datpo ] && cell=datpo@eq
  local out=p64/$cell/seed-$s
  [ -f $out/summary.json ] && return
  mkdir -p $out
  echo "\$ policyopt quickstart countdown --output-dir $out --seed $s algorithm.name=$m algorithm.minibatches=4 eval.samples=64 $* train.num_threads=1 ($(date -u +%T))" >> $out/run.log
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 policyopt quickstart countdown --output-dir $out --seed $s \
    algorithm.name=$m algorithm.minibatches=4 eval.samples=64 "$@" train.num_threads=1 >> $out/run.log 2>&1
  echo "$(date -u +%T) done $cell seed $s rc=$?" >> p64/lanes.log
}
datpo_eq() { wait_for p64/grpo/seed-$1; run datpo $1 train.steps=60 train.max_generated_tokens=$(grpo_total $1); }
# `p64.sh first`: seeds 0-2 (grpo 0 and 1 were already running when it started, from an
# earlier script, hence the waits); `p64.sh second`: seeds 3-4. Both lanes of a part run at once.
case "${1:-}" in
  first)
    laneA() { wait_for p64/grpo/seed-0; datpo_eq 0; datpo_eq 2; }
    laneB() { wait_for p64/grpo/seed-1; run grpo 2; datpo_eq 1; } ;;
  second)
    laneA() { run grpo 3; datpo_eq 3; }
    laneB() { run grpo 4; datpo_eq 4; } ;;
  *) echo "usage: p64.sh first|second" >&2; exit 2 ;;
esac
laneA & laneB & wait
echo "$(date -u +%T) all done" >> p64/lanes.log
