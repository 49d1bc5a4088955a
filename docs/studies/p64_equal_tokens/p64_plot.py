"""pass@k against k for the SFT start, grpo and datpo at equal tokens (mean and 95% band over seeds)."""
import json, sys
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from policyopt.core.stats import mean_ci
root = Path("/work/studies/p64")
seeds = [s for s in range(5) if all((root / c / f"seed-{s}/summary.json").exists() for c in ("grpo", "datpo@eq"))]
ks = [1, 2, 4, 8, 16, 32, 64]
def series(cell, which):
    out = []
    for k in ks:
        xs = [json.load(open(root / cell / f"seed-{s}/summary.json"))[which][f"eval/pass@{k}"] for s in seeds]
        out.append(mean_ci(xs))
    return out
fig, ax = plt.subplots(figsize=(6, 4))
for label, cell, which in [("SFT start", "grpo", "initial_eval"), ("grpo, 30 steps", "grpo", "final_eval"), ("datpo, equal tokens", "datpo@eq", "final_eval")]:
    s = series(cell, which)
    m = [a for a, _ in s]; h = [b for _, b in s]
    ax.plot(ks, m, marker="o", label=label)
    ax.fill_between(ks, [a - b for a, b in zip(m, h)], [min(1, a + b) for a, b in zip(m, h)], alpha=0.15)
ax.set_xscale("log", base=2); ax.set_xticks(ks, [str(k) for k in ks])
ax.set_xlabel("k (of 64 samples per problem)"); ax.set_ylabel("pass@k (100 held-out problems)")
ax.set_title(f"Countdown, equal generated tokens, {len(seeds)} seeds (95% t band)")
ax.legend(); ax.grid(alpha=0.3); fig.tight_layout()
fig.savefig(sys.argv[1], dpi=110)
