"""SIGKILL a training process while it samples, updates, logs and saves; restart it each
time; the finished run equals an uninterrupted one bit for bit (issue 13, item 12).

The same check with random kill points, 20 runs:
`python tests/train/kill_harness.py --runs 20` (results in docs/results/faults.md).
"""

import pytest
from kill_harness import Kill, Zygote, differences, run_with_kills

STEPS = 5
# One run, killed seven times: every phase once, and once from outside after a delay.
KILLS = [
    Kill("sample", 2),  # checkpoint 1 is the newest complete one: resume at 1
    Kill("update", 3),  # resume at 2
    Kill("log", 3),  # torn metrics line; resume at 2
    Kill("save_state", 3),  # half-written checkpoint folder (temporary); resume at 2
    Kill("save_marker", 4),  # every file but the marker; resume at 3
    Kill("save_publish", 4),  # complete, not yet in place; resume at 3
    Kill("save_prune", 4),  # in place, older ones not yet pruned; resume at 4
    Kill(delay=1.0),  # from outside, wherever it is (during start-up on a slow machine)
]


@pytest.mark.slow
def test_killed_and_restarted_run_equals_an_uninterrupted_one(tmp_path) -> None:
    zygote = Zygote()
    try:
        assert zygote.run(tmp_path / "reference", STEPS, None) == {"killed": False, "code": 0}
        done = run_with_kills(zygote, tmp_path / "killed", STEPS, KILLS)
    finally:
        zygote.close()
    assert all(hit for kill, hit, _ in done if kill.phase), done  # every phase kill happened
    assert [step for _, _, step in done][:7] == [1, 2, 2, 2, 3, 3, 4]
    assert differences(tmp_path / "reference", tmp_path / "killed") == []
