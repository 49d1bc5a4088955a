"""The study runner (`policyopt compare` as a matrix): resume without rerunning finished runs,
a killed run resumes from its checkpoint, the Ray path on a local cluster, the report."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policyopt.cli import study
from policyopt.cli.main import main
from policyopt.cli.study import Run, Variant, parse_variant, plan
from policyopt.cli.study_report import band, paired

TINY = [
    "sft.steps=4",
    "sft.batch_size=8",
    "train.steps=2",
    "train.num_threads=1",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "eval.size=4",
    "task.options={train_size: 60, eval_size: 8}",
    "train.loggers=[jsonl]",
    "train.progress=false",
]


def test_plan_is_the_matrix_with_exact_commands(tmp_path):
    variants = [parse_variant("s0:rollout.staleness=0"), Variant("s2", ("rollout.staleness=2",))]
    runs = plan(["grpo", "gspo"], 2, tmp_path, ["train.steps=3"], recipe="countdown",
                variants=variants, one_thread=True)  # fmt: skip
    assert [r.cell for r in runs] == ["grpo@s0"] * 2 + ["grpo@s2"] * 2 + ["gspo@s0"] * 2 + [
        "gspo@s2"
    ] * 2
    assert [r.seed for r in runs[:4]] == [0, 1, 0, 1]
    last = runs[-1]
    assert last.out == tmp_path / "gspo@s2" / "seed-1"
    assert last.command == (
        f"policyopt quickstart countdown --output-dir {last.out} --seed 1 "
        "algorithm.name=gspo train.steps=3 rollout.staleness=2 train.num_threads=1"
    )
    for bad in ("s2", ":a=1", "s2:staleness", "a@b:x=1"):
        with pytest.raises(ValueError, match="--variant wants NAME:KEY=VALUE"):
            parse_variant(bad)


def test_paired_differences_and_bands_by_hand():
    def s(initial, final):
        return {"initial_accuracy": initial, "final_accuracy": final, "final_eval": {}}

    cells = {
        "grpo": {0: s(0.4, 0.5), 1: s(0.3, 0.6)},
        "dapo": {0: s(0.4, 0.7), 1: s(0.3, 0.7), 2: s(0.2, 0.9)},  # seed 2 has no pair
    }
    (mean, half), per_seed = paired(cells, "grpo", "final_accuracy")["dapo"]
    assert per_seed == pytest.approx([0.2, 0.1])
    # mean 0.15; sd = 0.0707; t(1 df) = 12.706; half = 12.706 * 0.0707 / sqrt(2) = 0.635
    assert mean == pytest.approx(0.15) and half == pytest.approx(0.6353, rel=1e-3)
    (gain, _), _ = paired(cells, "grpo", "gain")["dapo"]
    assert gain == pytest.approx(((0.3 - 0.1) + (0.4 - 0.3)) / 2)
    mean_curve, low, high = band([[1.0, 2.0], [3.0]])
    assert mean_curve == [2.0, 2.0] and low[1] == high[1] == 2.0  # one run at step 2: no band


def test_report_reads_cost_and_distinct_answers_per_run(tmp_path):
    """Generated tokens come from each run's last logged total (a step without one is
    skipped); distinct correct answers and RL seconds are outcomes like pass@k."""
    from policyopt.cli.study_report import fmt, outcome_keys, summaries

    runs = plan(["grpo"], 2, tmp_path, [])
    for run, (total, seconds) in zip(runs, [(1200.0, 30.0), (1800.0, 50.0)], strict=True):
        run.out.mkdir(parents=True)
        final = {"eval/pass@1": 0.2, "eval/pass@8": 0.5, "eval/distinct_correct@8": 0.7}
        summary = {"initial_accuracy": 0.1, "final_accuracy": 0.3, "rl_seconds": seconds}
        (run.out / "summary.json").write_text(json.dumps({**summary, "final_eval": final}))
        steps = [{"step": 1, "generated_tokens_total": total / 2}, {"step": 2},
                 {"step": 3, "generated_tokens_total": total}]  # fmt: skip
        (run.out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    cells = summaries(runs)
    assert [cells["grpo"][s]["generated_tokens"] for s in (0, 1)] == [1200.0, 1800.0]
    keys = outcome_keys(cells)
    assert keys[-4:] == ["eval/pass@8", "eval/distinct_correct@8", "generated_tokens", "rl_seconds"]
    # mean 1500, sd 424.26, t(1) 12.706: half-width 12.706 * 424.26 / sqrt(2) = 3811.9
    assert fmt((1500.0, 3811.9)) == "1500 ± 3812" and fmt((0.25, 0.1)) == "0.250 ± 0.100"


def count_in_process_runs(monkeypatch) -> list[Run]:
    started: list[Run] = []
    real = study.run_in_process

    def counted(run, cli):
        started.append(run)
        return real(run, cli)

    monkeypatch.setattr(study, "run_in_process", counted)
    return started


@pytest.mark.slow
def test_study_resumes_without_rerunning_finished_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "study"
    argv = ["compare", "grpo", "dr_grpo", "--seeds", "2", "--samples", "2"]
    argv += ["--output-dir", str(out), *TINY]
    started = count_in_process_runs(monkeypatch)
    assert main(argv) == 0
    assert len(started) == 4
    first = {p: p.stat().st_mtime_ns for p in out.glob("*/seed-*/summary.json")}
    assert len(first) == 4
    # One run lost (as if never finished): the same command runs only that one again.
    (out / "dr_grpo" / "seed-1" / "summary.json").unlink()
    assert main(argv) == 0
    assert [(r.cell, r.seed) for r in started[4:]] == [("dr_grpo", 1)]
    for path, mtime in first.items():
        if "dr_grpo/seed-1" not in str(path):
            assert path.stat().st_mtime_ns == mtime
    report = (out / "report.md").read_text()
    assert "Runs finished: 4 of 4." in report
    assert "## Paired differences against grpo" in report
    assert report.count("(finished earlier)") == 3 and report.count("(ran)") == 1
    assert f"`policyopt quickstart dr_grpo --output-dir {out / 'dr_grpo' / 'seed-1'}" in report
    assert "Study command: `policyopt compare grpo dr_grpo --seeds 2" in report
    assert (out / "curves.png").stat().st_size > 0


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint(tmp_path):
    env = {**os.environ, "POLICYOPT_CACHE": str(tmp_path / "cache")}
    env["PYTHONPATH"] = str(Path(__file__).parents[2] / "src")
    out = tmp_path / "study"
    argv = [sys.executable, "-m", "policyopt.cli.main", "compare", "grpo", "--seeds", "1"]
    argv += ["--samples", "1", "--output-dir", str(out), *TINY]
    argv += ["train.steps=40", "train.save_every=1"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    checkpoints = out / "grpo" / "seed-0" / "checkpoints"
    deadline = time.time() + 240

    def saved_past_step_2() -> bool:  # keep_last 2: a given step's folder lasts two steps
        return any(int(p.name.split("-")[1]) >= 3 for p in checkpoints.glob("step-*"))

    while time.time() < deadline and not saved_past_step_2():
        assert proc.poll() is None, "the study ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "grpo" / "seed-0" / "summary.json").exists()
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from step" in again.stdout
    summary = json.loads((out / "grpo" / "seed-0" / "summary.json").read_text())
    assert summary["rl_steps"] == 40
    records = [json.loads(line) for line in (out / "grpo" / "seed-0" / "metrics.jsonl").open()]
    steps = [r["step"] for r in records if "reward/mean" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 40


@pytest.mark.slow
def test_ray_path_on_a_local_cluster(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2] / "src"))
    out = tmp_path / "study"
    argv = ["compare", "grpo", "--seeds", "2", "--samples", "1", "--output-dir", str(out)]
    assert main([*argv, "--ray", "local", *TINY]) == 0
    for seed in (0, 1):
        log = (out / "grpo" / f"seed-{seed}" / "run.log").read_text()
        assert "$ policyopt quickstart grpo" in log and "train.num_threads=1" in log
        assert (out / "grpo" / f"seed-{seed}" / "summary.json").exists()
    assert "Runs finished: 2 of 2." in (out / "report.md").read_text()
