"""The committed config reference is the one the code generates (regenerate it with
`policyopt config-reference --write docs/reference/config.md`)."""

from pathlib import Path

from policyopt.cli.config_reference import DEFAULT_PATH, config_reference, field_comments
from policyopt.config.load import OptimConfig

ROOT = Path(__file__).resolve().parents[2]


def test_committed_config_reference_is_current() -> None:
    committed = (ROOT / DEFAULT_PATH).read_text()
    assert committed == config_reference(), (
        "docs/reference/config.md is stale: run "
        "`policyopt config-reference --write docs/reference/config.md`"
    )


def test_reference_lists_every_config_key_and_registered_part() -> None:
    text = config_reference()
    for key in ("`optim.lr`", "`train.output_dir`", "`rollout.group_size`", "`model.lora.rank`"):
        assert key in text
    for part in ("`grpo`", "`ppo_clip`", "`hispo_segments`", "`datpo_tree`", "`gar`"):
        assert part in text


def test_field_comments_come_from_the_source() -> None:
    comments = field_comments(OptimConfig)
    assert set(comments) == set(OptimConfig.model_fields)
