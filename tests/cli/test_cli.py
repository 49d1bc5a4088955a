"""The `policyopt` command: help, errors, quickstart, compare and bench on tiny budgets."""

import json
import re
import subprocess
import sys

import pytest

from policyopt.cli.main import main

TINY = [
    "sft.steps=8",
    "sft.batch_size=8",
    "train.steps=2",
    "train.num_threads=1",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=12",
    "eval.size=6",
    "task.options={train_size: 100, eval_size: 10}",
    "train.loggers=[jsonl]",
]


def test_help_lists_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "policyopt.cli.main", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for command in ("quickstart", "sft", "train", "eval", "compare", "bench"):
        assert command in out


def test_bad_config_is_a_clear_error(capsys) -> None:
    assert main(["train", "rollout.grup_size=3"]) == 2
    err = capsys.readouterr().err
    assert "rollout.grup_size" in err and "did you mean 'rollout.group_size'" in err


def test_print_config_shows_resolved_preset(capsys) -> None:
    assert main(["train", "algorithm.name=dapo", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "clip_high: 0.28" in out and "dynamic_sampling: true" in out


@pytest.mark.slow
def test_quickstart_writes_summary_plot_metrics_checkpoint(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "qs"
    assert main(["quickstart", "--output-dir", str(out), *TINY]) == 0
    summary = json.loads((out / "summary.json").read_text())
    printed = capsys.readouterr().out
    last = printed.strip().splitlines()[-1]
    # What it is doing before each phase, then its total time (issue 22).
    phases = re.findall(r"^\[(\d+) min (\d\d) s\] (\S.*?) \.\.\.", printed, re.M)
    assert [text.split(":")[0].split(" of ")[0] for _, _, text in phases] == [
        "SFT warm start",
        "held-out evaluation before RL",
        "RL",
        "held-out evaluation after RL",
    ]
    assert re.search(r"^total time \d+ min \d\d s \(SFT \d+ min \d\d s, RL ", printed, re.M)
    # The evaluation table: no per-group style rows, no reward row that repeats accuracy.
    rows = re.findall(r"^│ (\S+)", printed, re.M)
    assert "accuracy" in rows and "reward" not in rows
    assert not [r for r in rows if "/style/" in r]
    before, after = summary["initial_eval"]["eval/reward"], summary["final_eval"]["eval/reward"]
    assert f"mean reward {before:.3f} -> {after:.3f}" in last
    assert 0.0 <= summary["initial_accuracy"] <= 1.0 and 0.0 <= summary["final_accuracy"] <= 1.0
    assert summary["rl_steps"] == 2
    assert (out / "curves.png").exists() and (out / "metrics.jsonl").exists()
    assert (out / "checkpoints" / "step-00000002" / "model.safetensors").exists()
    # The SFT warm start is cached: a second run with the same SFT settings reuses it.
    cached = list((tmp_path / "cache" / "sft").iterdir())
    assert len(cached) == 1 and (cached[0] / "model.safetensors").exists()


@pytest.mark.slow
def test_compare_table_over_seeds(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "grpo",
                "dr_grpo",
                "--seeds",
                "2",
                "--samples",
                "2",
                "--output-dir",
                str(out),
                "--reach",
                "reward/mean=-1",
                "--reach-window",
                "1",
                *TINY,
            ]
        )
        == 0
    )
    result = json.loads((out / "compare.json").read_text())
    # Every run's first logged step already has a reward above -1.
    assert result["rows"][0]["steps to reward/mean >= -1 (1-step mean)"] == [1.0, 0.0]
    methods = [r["method"] for r in result["rows"]]
    assert methods == ["grpo", "dr_grpo"]
    row = result["rows"][0]
    mean, half = row["pass@2"]
    per_seed = [s["final_eval"]["eval/pass@2"] for s in result["runs"]["grpo"]]
    assert mean == pytest.approx(sum(per_seed) / 2)
    # 95% t interval with 1 degree of freedom: t = 12.706; half-width = t * sd / sqrt(2).
    sd = abs(per_seed[0] - per_seed[1]) / 2**0.5
    assert half == pytest.approx(12.706 * sd / 2**0.5, rel=1e-3)
    assert (out / "compare.md").read_text().count("|") > 10
    assert (out / "compare.png").exists()


def test_steps_to_reach_a_threshold_by_hand() -> None:
    from policyopt.cli.compare import parse_reach, reach_summary, steps_to_reach

    records = [{"step": s, "r": v} for s, v in enumerate([0.1, 0.5, 0.2, 0.6, 0.7, 0.1], 1)]
    records.insert(2, {"step": 99})  # a record without the metric does not count
    # Trailing 2-step means: -, 0.30, 0.35, 0.40, 0.65 (step 5), 0.40.
    assert steps_to_reach(records, "r", 0.6, window=2) == 5
    assert steps_to_reach(records, "r", 0.5, window=1) == 2
    assert steps_to_reach(records, "r", 0.9, window=2) is None
    # Relative: the first 2-step mean is 0.30, so +0.09 needs 0.39 (step 4; 0.35 at step 3).
    assert steps_to_reach(records, "r", 0.09, relative=True, window=2) == 4
    assert parse_reach("reward/docparse=0.45") == ("reward/docparse", 0.45, False)
    assert parse_reach("reward/docparse=+0.05") == ("reward/docparse", 0.05, True)
    for bad in ("reward", "=0.4", "r=x", "r=nan"):
        with pytest.raises(ValueError, match="METRIC=VALUE"):
            parse_reach(bad)
    # sd = 10 / sqrt(2); half-width = t(1 df) * sd / sqrt(2) = 12.706 * 5.
    assert reach_summary([10, 20]) == pytest.approx((15.0, 12.706 * 5), rel=1e-3)
    assert reach_summary([10, None, 20]) == "15.0 over 2/3 runs; the rest never"
    assert reach_summary([None]) == "not reached (0/1)"


def test_compare_keeps_the_metrics_every_run_has() -> None:
    from policyopt.cli.compare import metric_keys, summarise

    def run(pass_keys):
        final = {"eval/accuracy": 0.5, **{f"eval/pass@{k}": 0.5 for k in pass_keys}}
        return {
            "final_eval": final,
            "initial_accuracy": 0.4,
            "final_accuracy": 0.5,
            "rl_seconds": 1,
        }

    runs = {"grpo": [run([1, 2, 4])], "dapo": [run([1, 2])]}
    assert metric_keys(runs) == ["eval/accuracy", "eval/pass@1", "eval/pass@2"]
    assert "pass@4" not in summarise(runs)[0]


def test_bench_json(tmp_path) -> None:
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--algos",
                "grpo,dr_grpo",
                "--steps",
                "2",
                "--prompts",
                "2",
                "--group-size",
                "4",
                "--max-new-tokens",
                "8",
                "--json-out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert set(report["step_time_s"]) == {"grpo", "dr_grpo"}
    assert all(v > 0 for v in report["tokens_per_s"].values())
    assert report["peak_rss_mb"] > 0


def test_bench_arms_carry_their_own_overrides() -> None:
    from policyopt.cli.bench import bench_config, split_arm

    assert split_arm("grpo") == ("grpo", [])
    assert split_arm("docpo+reward.prefetch=false+optim.lr=1e+5") == (
        "docpo",
        ["reward.prefetch=false", "optim.lr=1e+5"],
    )
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        split_arm("grpo+oops")
    settings = {
        "prompts_per_step": 2,
        "group_size": 4,
        "max_new_tokens": 8,
        "lr": 1e-5,
        "model": "tiny",
        "temperature": 1.0,
    }
    common = ["reward.prefetch=true", "train.seed=3"]
    plain = bench_config("docpo", settings, 2, common, "out")
    arm = bench_config("docpo+reward.prefetch=false+train.seed=1", settings, 2, common, "out")
    assert plain.reward.prefetch and plain.train.seed == 3
    assert not arm.reward.prefetch and arm.train.seed == 1  # the arm's own come last
    assert arm.algorithm.group_filter == "docpo"


@pytest.mark.slow
def test_bench_from_a_saved_model_dir(tmp_path) -> None:
    """`--model DIR` starts every method from a saved model (here the tiny one, saved as an
    SFT or training checkpoint would be); the report says how many rollouts were correct."""
    from policyopt.models.loading import load_model

    model_dir = tmp_path / "start"
    model, tok = load_model("tiny")
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "bench.json"
    args = ["bench", "--algos", "grpo,gar", "--model", str(model_dir), "--steps", "2"]
    args += ["--prompts", "2", "--group-size", "4", "--max-new-tokens", "8"]
    assert main([*args, "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["model"] == str(model_dir)
    assert report["settings"]["measured_steps"] == 2
    keys = ("step_time_s", "cpu_time_s", "fraction_correct", "step_time_paired_ratio_to_grpo")
    for key in (*keys, "cpu_time_ratio_to_grpo", "step_times_s"):
        assert set(report[key]) == {"grpo", "gar"}
    assert [len(v) for v in report["step_times_s"].values()] == [2, 2]
    assert all(0.0 <= f <= 1.0 for f in report["fraction_correct"].values())
    assert report["step_time_ratio_to_grpo"]["grpo"] == 1.0


@pytest.mark.slow
def test_bench_interleaving_keeps_each_method_s_samples(monkeypatch) -> None:
    """Steps run round-robin across methods, each trainer with its own RNG state: a method
    samples the same completions alone as next to another method (with one global RNG,
    grpo's draws would follow dr_grpo's and differ)."""
    from policyopt.cli import bench
    from policyopt.train.trainer import Trainer

    settings = {
        "prompts_per_step": 2,
        "group_size": 4,
        "max_new_tokens": 12,
        "lr": 1e-5,
        "model": "tiny",
        "temperature": 1.0,
    }
    from policyopt.train import step

    sampled: dict[str, list[str]] = {}
    shape = step.shape  # each sampling round is shaped (then filtered)
    owner: dict[int, str] = {}  # id(parts) -> the method whose trainer built them

    def recording(parts, state, batch):
        sampled.setdefault(owner[id(parts)], []).extend(batch.completions)
        return shape(parts, state, batch)

    init = Trainer.__init__

    def remember(self, config, **kwargs):
        init(self, config, **kwargs)
        owner[id(self.parts)] = config.algorithm.name

    monkeypatch.setattr(step, "shape", recording)
    monkeypatch.setattr(Trainer, "__init__", remember)
    bench.time_policyopt(["grpo"], settings, 2, [])
    alone = sampled.pop("grpo")
    bench.time_policyopt(["dr_grpo", "grpo"], settings, 2, [])
    assert sampled["grpo"] == alone and len(alone) == 3 * 2 * 4
    assert sampled["dr_grpo"][:8] == alone[:8]  # same seed and start: same first step


def test_sft_then_eval(tmp_path, capsys) -> None:
    model_dir = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                "--output-dir",
                str(model_dir),
                "sft.steps=3",
                "sft.batch_size=4",
                "task.options={train_size: 50, eval_size: 10}",
            ]
        )
        == 0
    )
    assert (model_dir / "model.safetensors").exists() and (model_dir / "tokenizer.json").exists()
    out = tmp_path / "eval.json"
    args = [
        "eval",
        "--model",
        str(model_dir),
        "--samples",
        "2",
        "--json-out",
        str(out),
        "eval.size=4",
        "rollout.max_new_tokens=8",
        "task.options={train_size: 50, eval_size: 10}",
    ]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert {
        "eval/accuracy",
        "eval/reward",
        "eval/pass@1",
        "eval/pass@2",
        "eval/avg@2",
        "eval/maj@2",
    } <= set(result)
    assert any(k.startswith("eval/level_") for k in result)
    assert result["eval/pass@2"] >= result["eval/pass@1"]


@pytest.mark.slow
def test_bench_against_trl(tmp_path) -> None:
    pytest.importorskip("trl")
    out = tmp_path / "bench.json"
    args = [
        "bench",
        "--algos",
        "grpo",
        "--against",
        "trl",
        "--steps",
        "1",
        "--prompts",
        "2",
        "--group-size",
        "4",
        "--max-new-tokens",
        "8",
        "--json-out",
        str(out),
    ]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert set(report["step_time_s"]) == {"grpo", "trl"}
    ratio = report["step_time_ratio_to_trl"]["grpo"]
    assert ratio == pytest.approx(report["step_time_s"]["grpo"] / report["step_time_s"]["trl"])


@pytest.mark.slow
def test_bench_against_trl_interleaves_and_keeps_each_rng(tmp_path) -> None:
    """TRL's steps and the methods' rounds alternate in one process; each keeps its own RNG
    stream, so a method samples the same rollouts as in a bench without TRL."""
    small = ["--steps", "2", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "8"]
    with_trl, alone = tmp_path / "trl.json", tmp_path / "alone.json"
    assert (
        main(["bench", "--algos", "grpo", "--against", "trl", *small, "--json-out", str(with_trl)])
        == 0
    )
    assert main(["bench", "--algos", "grpo", *small, "--json-out", str(alone)]) == 0
    report, plain = json.loads(with_trl.read_text()), json.loads(alone.read_text())
    for key in ("step_time_ratio_to_trl", "cpu_time_ratio_to_trl", "step_time_paired_ratio_to_trl"):
        assert set(report[key]) == {"grpo", "trl"} and report[key]["trl"] == 1.0
        assert report[key]["grpo"] > 0
    assert [len(v) for v in report["step_times_s"].values()] == [2, 2]
    assert report["cpu_time_s"]["trl"] > 0
    leaf = "generated_tokens_per_leaf"
    assert report[leaf]["grpo"] == plain[leaf]["grpo"]


@pytest.mark.slow
def test_bench_against_trl_trains_the_same_adapter_at_the_same_precision(tmp_path) -> None:
    """With LoRA and bf16-mixed, TRL's arm gets the same adapter (as many trainable
    parameters as ours) and bf16; the time split names the log-prob passes and the update."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    out = tmp_path / "bench.json"
    small = ["--steps", "1", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "6"]
    lora = ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"]
    args = ["bench", "--algos", "grpo", "--against", "trl", *small, "--json-out", str(out)]
    assert main([*args, *lora, "model.precision=bf16-mixed"]) == 0
    report = json.loads(out.read_text())
    trainable = report["trainable_parameters"]
    assert trainable["trl"] == trainable["grpo"] > 0
    assert trainable["grpo"] < 100_000  # the adapter, not the 1.1 M-parameter model
    # TRL's GRPOConfig turns activation checkpointing on by default; ours never recomputes
    # the forward, so neither may TRL's arm (a recompute would be time charged to TRL only).
    assert report["trl_settings"]["gradient_checkpointing"] is False
    split = report["time_split_s"]["grpo"]
    assert {"generation", "scoring", "logprobs", "update", "training"} <= set(split)
    assert split["update"] == pytest.approx(split["training"] - split["logprobs"], abs=1e-6)
