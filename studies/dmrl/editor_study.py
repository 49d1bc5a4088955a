"""DMRL's editor study (issue 20): the true 7-day lift of the editor's *proposals* per step,
and the final deployed value as regret to a large search, per arm, over seeds.

    python -m studies.dmrl.editor_study --seeds 0 1 2 3 4 --out runs/dmrl_editor
    python -m studies.dmrl.editor_study --recipe dmrl_smollm2 --arms random sft drpo ...
    python -m studies.dmrl.editor_study --arms drpo drpo_free drpo_episode ...

Arms (each the `dmrl` recipe, one seed's LRP and the shared SFT warm start, both cached):
`drpo`, `no_mad`, `no_control`, `no_edit_cost`, `grpo` (the ablation's variants,
`dmrl_ablation.VARIANTS`); `sft`, the warm start without learning (the same loop and
DRPO, with `optim.lr=1e-12`: Adam moves each weight by about lr per step, so 60 steps
change nothing); `random`, the deployment loop with random well-formed edits
(`scripted_edit`) in place of the editor, as many per day as the editor proposes;
`drpo_episode`, DRPO with the editor as an episode of up to 3 edits (recipe `dmrl_episode`
over the study's recipe: edit, read the A/B result, edit again; `policyopt.envs.ads.
episode`), which decodes without the edit grammar (the multi_turn strategy refuses one);
`drpo_free`, the one-edit DRPO arm without the grammar too, so that the episode's effect
and the grammar's are measured apart.

Every run also scores, from the same states and on the same evaluation users, as many
random well-formed edits (`random_true_lift` of the day records): the paired baseline of
"proposals against random edits". For an episode arm a proposal is an episode's final
document, and its random counterpart as many random edits in sequence as the episode had
turns (3 unless the token budget cut it): both sides make the same number of edits. The
large search (`adsim.search.large_search`, 7-day value on the task's evaluation users) is
run once per seed and cached in `<out>/search`.
Runs are skipped when their `summary.json` exists, so a killed study resumes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from policyopt.config.load import Config
from policyopt.core.stats import mean_ci
from policyopt.envs.ads.adsim.search import large_search
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT, scripted_edit
from policyopt.models.threads import apply_num_threads
from policyopt.pipelines.dmrl import live_options, proposal_summary, run_dmrl_pipeline
from policyopt.recipes import recipe_config
from policyopt.tasks.base import get_task
from policyopt.train.parts import build_parts
from studies.dmrl.ablation import VARIANTS

FROZEN_LR = 1e-12
# arm -> the one-edit variant it runs as an episode (recipe `<recipe>_episode`)
EPISODE_ARMS = {"drpo_episode": "drpo"}
# arm -> the one-edit variant it runs without the edit grammar
FREE_ARMS = {"drpo_free": "drpo"}
STUDY_ARMS = ["random", "sft", *VARIANTS]  # the arms of the recorded study: the default
ARMS = [*STUDY_ARMS, *FREE_ARMS, *EPISODE_ARMS]
TAIL = 10  # the "last steps" window, as in the quickstart's summary
# the shipped recipe that makes a recipe's editor an episode
EPISODE_RECIPES = {"dmrl": "dmrl_episode"}


def arm_overrides(arm: str) -> list[str]:
    """The config overrides of an LM arm (`sft`: DRPO with the update switched off; an
    episode arm its variant's, over the episode recipe: `arm_recipe`)."""
    base = EPISODE_ARMS.get(arm) or FREE_ARMS.get(arm) or arm
    variant = VARIANTS["drpo" if base == "sft" else base]
    extra = [f"optim.lr={FROZEN_LR}"] if arm == "sft" else []
    if arm in FREE_ARMS:
        extra.append('rollout.engine_options={"grammar": null}')
    return [f"{k}={json.dumps(v)}" for k, v in variant.items()] + extra


def arm_recipe(arm: str, recipe: str) -> str:
    """The recipe an arm runs: the study's, or for an episode arm the study's recipe with
    the editor as an episode."""
    if arm not in EPISODE_ARMS:
        return recipe
    if recipe not in EPISODE_RECIPES:
        raise ValueError(
            f"editor study: arm {arm!r} needs the episode recipe of --recipe {recipe!r}; "
            f"there is one for {', '.join(EPISODE_RECIPES)}"
        )
    return EPISODE_RECIPES[recipe]


def run_random(config: Config, run_dir: Path) -> dict[str, Any]:
    """The deployment loop of the `dmrl` task with random well-formed edits as proposals:
    `train.steps` days, `prompts_per_step x group_size` edits a day."""
    apply_num_threads(config.train.num_threads, None)
    start = time.perf_counter()
    live = config.model_copy(deep=True)
    live.task.options = live_options(config, run_dir)[0]
    parts = build_parts(live)  # the run's own task and reward pipeline, as training builds them
    task, reward = parts.task, parts.reward
    env = task.env  # type: ignore[attr-defined]
    per_day = config.rollout.prompts_per_step * config.rollout.group_size
    rng = np.random.default_rng([config.train.seed, 11])  # not the day records' stream
    initial = task.value(START_DOCUMENT)  # type: ignore[attr-defined]
    for _ in range(config.train.steps):
        texts = [scripted_edit(env.document, rng).text() + "\n" for _ in range(per_day)]
        reward(["p"] * per_day, texts, {})
        task.end_of_round()
    final = task.value(env.document)  # type: ignore[attr-defined]
    with (run_dir / "dmrl_days.jsonl").open("w") as f:
        for record in env.log:
            f.write(json.dumps(record) + "\n")
    summary = {
        "arm": "random",
        "seed": config.train.seed,
        "initial_long_term_value": initial,
        "final_long_term_value": final,
        "relative_gain": final / initial - 1.0,
        "deployments": len(env.deployed_days),
        "final_document": env.document.render(),
        **proposal_summary(env.log),
        "wall_seconds": time.perf_counter() - start,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def search_value(config: Config, out: Path, budget: int) -> dict[str, Any]:
    """The large search's best 7-day value on the task's evaluation users (cached)."""
    path = out / "search" / f"seed{config.train.seed}_b{budget}.json"
    if path.exists():
        return json.loads(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    task = get_task("dmrl_skill", **{**config.task.options, "seed": config.train.seed})
    platform, users = task.platform, task.eval_users  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    res = large_search(lambda q: platform.value(q, users), budget, config.train.seed)
    rec = {
        "value": res.value,
        "evaluations": res.evaluations,
        "best": res.params().as_dict(),
        "start_value": task.value(START_DOCUMENT),  # type: ignore[attr-defined]
        "seconds": time.perf_counter() - t0,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=2))
    tmp.rename(path)
    return rec


def run_arm(
    arm: str, seed: int, out: Path, overrides: list[str], recipe: str = "dmrl"
) -> dict[str, Any]:
    run_dir = out / arm / f"seed{seed}"
    path = run_dir / "summary.json"
    if path.exists():
        return json.loads(path.read_text())
    extra = [] if arm == "random" else arm_overrides(arm)
    config = recipe_config(
        arm_recipe(arm, recipe),
        [*overrides, *extra, "train.resume=null", "train.progress=false"],
        str(run_dir),
        seed,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    if arm == "random":
        return run_random(config, run_dir)
    return run_dmrl_pipeline(config, Console())


def days(out: Path, arm: str, seed: int) -> list[dict[str, Any]]:
    lines = (out / arm / f"seed{seed}" / "dmrl_days.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def seed_row(out: Path, arm: str, seed: int, search: dict[str, Any]) -> dict[str, float]:
    """One run's numbers: proposals' true lift (and minus the paired random edits) over
    all steps, the second half and the last TAIL steps; final value, gain and regret."""
    log = days(out, arm, seed)
    s = json.loads((out / arm / f"seed{seed}" / "summary.json").read_text())
    lift = np.array([r["true_lift"] for r in log])
    rand = np.array([r["random_true_lift"] for r in log])
    half = len(log) // 2  # the second half: steps 31-60 of the recipe's 60
    row = {
        "lift_all": float(lift.mean()),
        "lift_half": float(lift[half:].mean()),
        "lift_tail": float(lift[-TAIL:].mean()),
        "vs_random_all": float((lift - rand).mean()),
        "vs_random_half": float((lift - rand)[half:].mean()),
        "vs_random_tail": float((lift - rand)[-TAIL:].mean()),
        "gain": float(s["relative_gain"]),
        "final": float(s["final_long_term_value"]),
        "regret": 1.0 - float(s["final_long_term_value"]) / float(search["value"]),
        "start_regret": 1.0 - float(s["initial_long_term_value"]) / float(search["value"]),
        "deployments": float(s["deployments"]),
        "malformed": float(s["malformed_fraction"]),
        "truncated": float(s["truncated_fraction"]),
        # well-formed edits per proposal (an episode's may be up to its turns)
        "edits": sum(r["ok"] for r in log) / sum(r["proposals"] for r in log),
    }
    return row


def paired_bases(arm: str) -> list[str]:
    """The arms `arm` is compared with seed by seed: random edits and the SFT editor; an
    episode arm also its one-edit variant with and without the grammar, a no-grammar arm its
    variant with the grammar."""
    bases = ["random", "sft"]
    if arm in EPISODE_ARMS:
        variant = EPISODE_ARMS[arm]
        bases += [variant, *(a for a, v in FREE_ARMS.items() if v == variant)]
    if arm in FREE_ARMS:
        bases.append(FREE_ARMS[arm])
    return bases


def report(out: Path, seeds: list[int], arms: list[str], budget: int) -> dict[str, Any]:
    """Per arm: mean ± 95% t over the seeds that finished; paired differences to the arms
    of `paired_bases` where both finished on a seed."""
    searches = {
        s: json.loads((out / "search" / f"seed{s}_b{budget}.json").read_text())
        for s in seeds
        if (out / "search" / f"seed{s}_b{budget}.json").exists()
    }
    rows: dict[str, dict[int, dict[str, float]]] = {}
    for arm in arms:
        rows[arm] = {
            s: seed_row(out, arm, s, searches[s])
            for s in seeds
            if s in searches and (out / arm / f"seed{s}" / "summary.json").exists()
        }
    result: dict[str, Any] = {"seeds": seeds, "arms": {}}
    for arm, per in rows.items():
        keys = next(iter(per.values())).keys() if per else []
        stats = {
            k: dict(zip(("mean", "ci95"), mean_ci([r[k] for r in per.values()]), strict=True))
            for k in keys
        }
        for base in paired_bases(arm):
            if base == arm or base not in rows:
                continue
            common = sorted(set(per) & set(rows[base]))
            for k in ("lift_all", "lift_half", "vs_random_all", "vs_random_half", "gain", "regret"):
                diffs = [per[s][k] - rows[base][s][k] for s in common]
                if len(diffs) >= 2:
                    m, h = mean_ci(diffs)
                    stats[f"{k}_minus_{base}"] = {"mean": m, "ci95": h, "per_seed": diffs}
        result["arms"][arm] = {"seeds": sorted(per), "per_seed": per, "stats": stats}
    # the mean curve per arm: proposals' true lift per step, over the finished seeds
    result["curves"] = {
        arm: np.mean([[r["true_lift"] for r in days(out, arm, s)] for s in per], 0).tolist()
        for arm, per in rows.items()
        if per
    }
    (out / "study.json").write_text(json.dumps(result, indent=2))
    return result


def table(result: dict[str, Any]) -> str:
    def f(st: dict[str, Any], k: str) -> str:
        if k not in st:
            return "-"
        return f"{st[k]['mean'] * 100:+.2f} ± {st[k]['ci95'] * 100:.2f}"

    lines = [
        "| arm | seeds | proposals' true lift, all steps (%) | second half | last 10 "
        "| proposals − paired random edits, all steps | second half | final gain (%) "
        "| regret to search (%) | deployments | edits per proposal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in result["arms"].items():
        st = a["stats"]
        if not st:
            continue
        lines.append(
            f"| {arm} | {len(a['seeds'])} | {f(st, 'lift_all')} | {f(st, 'lift_half')} "
            f"| {f(st, 'lift_tail')} | {f(st, 'vs_random_all')} | {f(st, 'vs_random_half')} "
            f"| {f(st, 'gain')} | {st['regret']['mean'] * 100:.1f} ± {st['regret']['ci95'] * 100:.1f} "
            f"| {st['deployments']['mean']:.0f} | {st['edits']['mean']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--out", default="runs/dmrl_editor")
    p.add_argument("--arms", nargs="+", default=STUDY_ARMS, choices=ARMS)
    p.add_argument("--search-budget", type=int, default=1000)
    p.add_argument("--recipe", default="dmrl", help="dmrl or a recipe over it (dmrl_smollm2)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for seed in args.seeds:  # seed-major: a partial study has every arm on its seeds
            cfg = recipe_config(args.recipe, list(args.overrides), None, seed)
            search_value(cfg, out, args.search_budget)
            for arm in args.arms:
                run_arm(arm, seed, out, list(args.overrides), args.recipe)
    result = report(out, args.seeds, args.arms, args.search_budget)
    print(table(result))


if __name__ == "__main__":
    main()
