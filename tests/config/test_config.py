"""Config: YAML + dotted overrides, presets under user values, clear errors."""

import pytest

from policyopt.config.check import loss_settings
from policyopt.config.load import ConfigError, dump_config, load_config


def test_defaults_are_grpo() -> None:
    cfg = load_config()
    assert cfg.algorithm.name == "grpo"
    assert (cfg.algorithm.advantage, cfg.algorithm.loss) == ("grpo", "ppo_clip")
    s = loss_settings(cfg)
    assert (s["agg"], s["clip_low"], s["clip_high"]) == ("seq-mean-token-mean", 0.2, 0.2)


def test_dapo_preset_carries_paper_defaults() -> None:
    cfg = load_config(overrides=["algorithm.name=dapo"])
    s = loss_settings(cfg)
    assert (s["clip_low"], s["clip_high"], s["agg"]) == (0.2, 0.28, "token-mean")
    assert cfg.algorithm.dynamic_sampling
    assert [s.name for s in cfg.reward.shapers] == ["overlong"]
    assert cfg.algorithm.kl_coef == 0.0


def test_each_preset_part_is_overridable() -> None:
    cfg = load_config(
        overrides=[
            "algorithm.name=dapo",
            "algorithm.dynamic_sampling=false",
            "algorithm.clip_high=0.3",
        ]
    )
    assert not cfg.algorithm.dynamic_sampling
    assert cfg.algorithm.clip_high == 0.3
    assert cfg.algorithm.agg == "token-mean"  # the rest of the preset stays


def test_other_presets() -> None:
    gspo = load_config(overrides=["algorithm.name=gspo"])
    assert gspo.algorithm.loss == "gspo"
    assert loss_settings(gspo) == {"clip_low": 3e-4, "clip_high": 4e-4}
    dr = load_config(overrides=["algorithm.name=dr_grpo"]).algorithm
    assert (dr.advantage, dr.agg) == ("dr_grpo", "seq-mean-token-sum-norm")
    assert load_config(overrides=["algorithm.name=rloo"]).algorithm.advantage == "rloo"


def test_yaml_then_overrides(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.001\nrollout:\n  group_size: 4\n")
    cfg = load_config(path, ["rollout.group_size=6"])
    assert cfg.optim.lr == 0.001
    assert cfg.rollout.group_size == 6


def test_unknown_key_names_nearest(tmp_path) -> None:
    with pytest.raises(
        ConfigError, match=r"rollout\.group_sise.*did you mean 'rollout\.group_size'"
    ):
        load_config(overrides=["rollout.group_sise=4"])
    path = tmp_path / "c.yaml"
    path.write_text("optimm:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match="did you mean 'optim'"):
        load_config(path)


def test_bad_values_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        load_config(overrides=["rollout.group_size=0"])
    with pytest.raises(ConfigError, match="valid names"):
        load_config(overrides=["algorithm.loss=nope"])
    with pytest.raises(ConfigError, match="method preset"):
        load_config(overrides=["algorithm.name=nope"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(overrides=["rollout.group_size"])


def test_dump_round_trips(tmp_path) -> None:
    cfg = load_config(overrides=["algorithm.name=dapo", "train.steps=7"])
    path = tmp_path / "dump.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg
