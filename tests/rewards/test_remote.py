"""Ray reward workers on a local CPU cluster: same values as in-process; a worker that dies
or hangs scores its samples 0 (logged), is replaced, and the pool goes on."""

import logging
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from policyopt.rewards.functions import (  # noqa: E402
    RewardFunctionError,
    RewardPipeline,
    task_reward_function,
)
from policyopt.rewards.remote import RayRewardPool  # noqa: E402
from policyopt.tasks.base import get_task  # noqa: E402
from rewards_for_tests import dies_or_hangs  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # One local cluster for the module (Ray starts in several seconds).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_pool_gives_the_in_process_values_of_the_task_verifier() -> None:
    task = get_task("arithmetic", train_size=40, eval_size=4)
    rows = [task.rows("train")[i] for i in range(12)]
    answers = [str(r["answer"]) for r in rows]
    # Right, wrong and unparseable completions.
    completions = [
        f"... A:{a}" if i % 3 == 0 else ("A:9999" if i % 3 == 1 else "no answer")
        for i, a in enumerate(answers)
    ]
    prompts = [task.format_prompt(r) for r in rows]
    columns = {c: [r[c] for r in rows] for c in rows[0]}
    fn = task_reward_function(task)
    pool = RayRewardPool("task", fn, num_workers=2, chunk_size=5)
    try:
        expected = fn(prompts, completions, **columns)
        assert pool(prompts, completions, **columns) == expected
        assert len(set(map(str, expected))) == 3  # 1.0, 0.0 and None all occur
        # Prefetched samples are collected, not scored twice, and give the same values.
        pool.prefetch(prompts[:4], completions[:4], **{c: v[:4] for c, v in columns.items()})
        assert pool(prompts, completions, **columns) == expected
    finally:
        pool.close()


def test_dead_or_hung_worker_scores_zero_is_replaced_and_the_pool_goes_on(caplog) -> None:
    pool = RayRewardPool("risky", dies_or_hangs, num_workers=2, chunk_size=1, timeout_s=3.0)
    pipeline = RewardPipeline([("risky", pool, 1.0)])
    completions = ["abc", "please die", "hang here", "de"]
    try:
        with caplog.at_level(logging.WARNING, logger="policyopt.rewards.remote"):
            t0 = time.monotonic()
            result = pipeline(["p"] * 4, completions, {})
            elapsed = time.monotonic() - t0
        assert result.raw["risky"] == [3.0, None, None, 2.0]
        assert result.total.tolist() == [3.0, 0.0, 0.0, 2.0]
        assert result.unparseable["risky"] == 2
        assert elapsed < 300  # the hung sample is given up after timeout_s, not 600 s
        reasons = " ".join(r.getMessage() for r in caplog.records)
        assert "died" in reasons and "timed out after 3 s" in reasons
        assert pool.failed_samples == 2 and pool.replaced_workers == 2
        # Fresh workers score the next batch.
        assert pool(["p", "p"], ["xyz", "wxyz"]) == [3.0, 4.0]
    finally:
        pool.close()


def test_training_with_a_remote_reward_runs_and_logs_its_rewards(tmp_path, small_config) -> None:
    from policyopt.store.metrics_log import read_metrics
    from policyopt.train.trainer import Trainer

    config = small_config(
        tmp_path,
        "reward.functions=[{name: 'rewards_for_tests:digit_fraction', remote: true}]",
        "reward.workers={num_workers: 2, timeout_s: 30, chunk_size: 4}",
        steps=2,
    )
    trainer = Trainer(config)
    try:
        ((_, pool, _),) = trainer.reward_fn.functions
        assert isinstance(pool, RayRewardPool)
        trainer.train()
    finally:
        trainer.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)
    assert pool.failed_samples == 0


def exits_on_b(prompts, completions, **columns):
    """Calls sys.exit(0) on the completion "b" (a reward must not end its worker quietly)."""
    if "b" in completions:
        sys.exit(0)
    return [1.0] * len(completions)


def test_sys_exit_in_a_worker_is_the_same_named_error_as_in_process() -> None:
    pool = RayRewardPool("exits", exits_on_b, num_workers=1, chunk_size=1)
    try:
        with pytest.raises(
            RewardFunctionError, match=r"'exits' failed on sample 1 .*called sys\.exit\(0\)"
        ):
            RewardPipeline([("exits", pool, 1.0)])(["p", "p"], ["a", "b"], {})
        assert pool.failed_samples == 0  # raised, not a dead worker scored 0
    finally:
        pool.close()


def test_trl_reward_function_in_workers_on_conversational_prompts() -> None:
    """TRL's functions take `completions` first: the workers call them by keyword, as the
    pipeline does, with conversational completions for conversational prompts."""
    from trl.rewards import think_format_reward

    pool = RayRewardPool("think", think_format_reward, num_workers=1, chunk_size=2)
    prompts = [[{"role": "user", "content": "Why?"}]] * 2
    try:
        result = RewardPipeline([("think", pool, 1.0)])(
            prompts, ["<think>\nso\n</think>\nBecause.", "Because."], {}
        )
    finally:
        pool.close()
    assert result.raw["think"] == [1.0, 0.0]
