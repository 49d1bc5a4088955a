#!/bin/bash
# issue 22, on main 4006ad3: benches (reps 3, 4), then the quickstart from an empty cache with 0, 1, 2 competing jobs
cd /tmp/s37/bench
SFT=/tmp/s37/cache/sft/10c8e805e2aab8cf
for rep in 3 4; do
  for setting in "tiny 8 8 32" "tiny 8 16 48" "$SFT 16 8 48"; do
    set -- $setting
    tag=$(basename $1)_$2x$3x$4_r$rep
    echo "$(date -u +%T) $tag load $(cut -d' ' -f1-3 /proc/loadavg)" >> times.log
    policyopt bench --model $1 --algos grpo --against trl --steps 8 --prompts $2 --group-size $3 --max-new-tokens $4 --background-load 1 --json-out $tag.json > $tag.log 2>&1
    echo "$(date -u +%T) $tag done load $(cut -d' ' -f1-3 /proc/loadavg)" >> times.log
  done
done
cd /tmp/s37/qs
for n in 0 1 2; do
  sleep 20
  pids=""
  for i in $(seq 1 $n); do python -m policyopt.bench.background_load --threads 2 --parent $$ & pids="$pids $!"; done
  sleep 2
  echo "$(date -u +%T) qs$n start load $(cut -d' ' -f1-3 /proc/loadavg)" >> times.log
  start=$(date +%s)
  POLICYOPT_CACHE=$(mktemp -d) policyopt quickstart --output-dir /tmp/s37/qs/out$n > log$n 2>&1
  echo "$(date -u +%T) qs$n done $(( $(date +%s) - start )) s load $(cut -d' ' -f1-3 /proc/loadavg)" >> times.log
  [ -n "$pids" ] && kill $pids
  wait $pids 2>/dev/null
done
echo ALLDONE >> times.log
