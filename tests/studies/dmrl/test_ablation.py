from __future__ import annotations

from studies.dmrl.ablation import VARIANTS


def test_variants_are_the_papers_table_4():
    assert set(VARIANTS) == {"drpo", "no_mad", "no_control", "no_edit_cost", "grpo"}
    assert VARIANTS["no_mad"]["algorithm.advantage_options"]["robust"] is False
    assert VARIANTS["no_control"]["algorithm.advantage_options"]["alpha"] == 1.0
    assert VARIANTS["no_edit_cost"]["algorithm.advantage_options"]["lambda_edit"] == 0.0
    assert VARIANTS["grpo"]["algorithm.advantage"] == "grpo"
