"""Paired table for the equal-token pass@64 study (grpo vs datpo@eq), from each run's summary."""
import json, sys
from pathlib import Path
from policyopt.core.stats import mean_ci
root = Path("/work/studies/p64")
keys = ["eval/accuracy", "eval/pass@1", "eval/pass@8", "eval/pass@16", "eval/pass@32", "eval/pass@64", "eval/distinct_correct@64"]
seeds = [s for s in range(5) if all((root / c / f"seed-{s}/summary.json").exists() for c in ("grpo", "datpo@eq"))]
def load(c, s): return json.load(open(root / c / f"seed-{s}/summary.json"))
def tokens(c, s):
    rows = [json.loads(l) for l in open(root / c / f"seed-{s}/metrics.jsonl")]
    return max(r.get("generated_tokens_total", 0) for r in rows), sum(1 for r in rows if "generated_tokens_total" in r)
print("seeds", seeds)
for s in seeds:
    g, d = load("grpo", s), load("datpo@eq", s)
    print(s, "tokens", tokens("grpo", s), tokens("datpo@eq", s), "rl_s", round(g["rl_seconds"]), round(d["rl_seconds"]))
    for k in keys:
        print(f"   {k:28s} sft {g['initial_eval'][k]:.3f}  grpo {g['final_eval'][k]:.3f}  datpo {d['final_eval'][k]:.3f}  sft(d) {d['initial_eval'][k]:.3f}")
def fmt(xs):
    m, h = mean_ci(xs)
    return f"{m:+.3f} ± {h:.3f} ({', '.join(f'{x:+.3f}' for x in xs)})"
def fmtm(xs):
    m, h = mean_ci(xs)
    return f"{m:.3f} ± {h:.3f}"
print("| quantity | SFT start | grpo | datpo (equal tokens) | datpo − grpo | grpo − SFT | datpo − SFT |")
for k in keys:
    sft = [load("grpo", s)["initial_eval"][k] for s in seeds]
    g = [load("grpo", s)["final_eval"][k] for s in seeds]
    d = [load("datpo@eq", s)["final_eval"][k] for s in seeds]
    print(f"| {k} | {fmtm(sft)} | {fmtm(g)} | {fmtm(d)} | {fmt([b-a for a,b in zip(g,d)])} | {fmt([b-a for a,b in zip(sft,g)])} | {fmt([b-a for a,b in zip(sft,d)])} |")
