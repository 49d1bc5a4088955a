"""Every registered name and every option under it is checked when the config is loaded."""

import pytest

from policyopt.config.load import ConfigError, load_config
from policyopt.methods import PRESETS


@pytest.mark.parametrize(
    ("override", "where", "nearest"),
    [
        ("rollout.engine=hff", "rollout.engine", "hf"),
        ("rollout.strategy=datpo_tre", "rollout.strategy", "datpo_tree"),
        (
            "rollout.annotators=[{name: hispo_segment}]",
            "rollout.annotators.0.name",
            "hispo_segments",
        ),
        (
            "reward.functions=[{name: arithmetic_formatt}]",
            "reward.functions.0.name",
            "arithmetic_format",
        ),
        ("reward.shapers=[{name: garr}]", "reward.shapers.0.name", "gar"),
        ("algorithm.group_filter=docp", "algorithm.group_filter", "docpo"),
        ("algorithm.advantage=rlo", "algorithm.advantage", "rloo"),
        ("algorithm.loss=gspoo", "algorithm.loss", "gspo"),
        ("algorithm.kl_estimator=k33", "algorithm.kl_estimator", "k3"),
        ("algorithm.agg=token-means", "algorithm.agg", "token-mean"),
        ("task.name=arithmatic", "task.name", "arithmetic"),
        ("train.loggers=[jsonl, tensorbord]", "train.loggers.1", "tensorboard"),
        ("optim.schedule=cosin", "optim.schedule", "cosine"),
    ],
)
def test_unknown_names_are_caught_at_load_with_the_nearest(override, where, nearest) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    message = str(info.value)
    assert where in message and f"did you mean '{nearest}'" in message, message


def test_reward_function_module_that_does_not_import_is_caught_at_load() -> None:
    with pytest.raises(ConfigError, match=r"reward\.functions\.0\.name.*cannot import"):
        load_config(overrides=["reward.functions=[{name: 'no_such_module_xyz:f'}]"])


@pytest.mark.parametrize(
    ("overrides", "where", "nearest"),
    [
        (
            ["rollout.strategy=datpo_tree", "rollout.strategy_options={k_maxx: 3}"],
            "rollout.strategy_options.k_maxx",
            "k_max",
        ),
        (
            ["rollout.annotators=[{name: hispo_segments, options: {alpah: 0.2}}]"],
            "rollout.annotators.0.options.alpah",
            "alpha",
        ),
        (
            ["reward.shapers=[{name: gar, options: {bta: 1.0}}]"],
            "reward.shapers.0.options.bta",
            "beta",
        ),
        (
            ["reward.shapers=[{name: step_aware_annealing, options: {gama_init: 1.0}}]"],
            "reward.shapers.0.options.gama_init",
            "gamma_init",
        ),
        (["algorithm.advantage_options={epss: 0.1}"], "algorithm.advantage_options.epss", "eps"),
        (
            ["algorithm.loss_options={clip_ratio: 3.0}"],
            "algorithm.loss_options.clip_ratio",
            "clip_ratio_c",
        ),
        (["task.options={train_sise: 10}"], "task.options.train_sise", "train_size"),
    ],
)
def test_unknown_options_are_caught_at_load_with_the_nearest(overrides, where, nearest) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    message = str(info.value)
    assert where in message and f"did you mean '{nearest}'" in message, message


def test_a_part_without_options_says_so() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.strategy_options\.foo.*takes no options"):
        load_config(overrides=["rollout.strategy_options={foo: 1}"])
    with pytest.raises(ConfigError, match=r"algorithm\.advantage_options\.eps.*takes no options"):
        load_config(overrides=["algorithm.advantage=rloo", "algorithm.advantage_options={eps: 1}"])


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        (["task.options={train_size: many}"], "task.options.train_size"),
        (["reward.shapers=[{name: gar, options: {beta: high}}]"], "reward.shapers.0.options.beta"),
        (
            ["rollout.strategy=datpo_tree", "rollout.strategy_options={k_max: 2.5}"],
            "rollout.strategy_options.k_max",
        ),
        (["algorithm.advantage_options={scale_by_std: [1]}"], "algorithm.advantage_options"),
        (["task.options={ops: '+-'}"], "task.options.ops"),
    ],
)
def test_option_types_are_checked_at_load(overrides, where) -> None:
    with pytest.raises(ConfigError, match="expected|should be|valid") as info:
        load_config(overrides=overrides)
    assert where in str(info.value), str(info.value)


def test_a_required_option_that_is_missing_is_named() -> None:
    with pytest.raises(ConfigError, match=r"task\.options.*'hf_dataset' needs option 'path'"):
        load_config(overrides=["task.name=hf_dataset"])


def test_values_the_run_supplies_are_not_options() -> None:
    # Per-token structure comes from the rollouts, normalisers from the batch.
    with pytest.raises(ConfigError, match=r"loss_options\.segment_ids.*not an option"):
        load_config(overrides=["algorithm.name=hispo", "algorithm.loss_options={segment_ids: 1}"])
    # Normalisers (max_len, the global counts) reach a loss in LossInputs, never as options.
    with pytest.raises(ConfigError, match=r"loss_options\.max_len: unknown option"):
        load_config(overrides=["algorithm.loss_options={max_len: 3}"])
    with pytest.raises(ConfigError, match=r"loss_options\.agg.*algorithm\.agg"):
        load_config(overrides=["algorithm.loss_options={agg: token-mean}"])
    with pytest.raises(ConfigError, match=r"loss_options\.clip_high.*algorithm\.clip_high"):
        load_config(overrides=["algorithm.loss_options={clip_high: 0.3}"])
    with pytest.raises(ConfigError, match=r"strategy_options\.group_size.*rollout\.group_size"):
        load_config(overrides=["rollout.strategy_options={group_size: 3}"])


def test_every_mistake_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["algorithm.loss=gspoo", "task.options={train_sise: 10}"])
    assert "algorithm.loss" in str(info.value) and "task.options.train_sise" in str(info.value)


def test_valid_options_and_every_preset_load() -> None:
    cfg = load_config(
        overrides=[
            "rollout.strategy=datpo_tree",
            "rollout.strategy_options={k_max: 3, fork_unit: token}",
            "rollout.annotators=[{name: hispo_segments, options: {alpha: 0.2}}]",
            "reward.shapers=[{name: gar, options: {beta: 1}}, "
            "{name: step_aware_annealing, options: {gamma_init: 2.0, tau_init: 0.1}}]",
            "algorithm.advantage_options={eps: 0.001}",
            "algorithm.loss_options={clip_ratio_c: 3}",
            "task.options={train_size: 10, ops: ['+']}",
            "algorithm.group_filter=docpo",
            "algorithm.kl_estimator=low_var_kl",
            "reward.functions=[{name: task}, {name: arithmetic_format, weight: 0.5}]",
        ]
    )
    # Options are checked, not converted: the part gets what the user wrote.
    assert cfg.reward.shapers[0].options == {"beta": 1}
    for name in PRESETS:
        assert load_config(overrides=[f"algorithm.name={name}"]).algorithm.name == name


def test_options_of_a_replaced_part_are_dropped(tmp_path) -> None:
    """A preset's or file's options belong to the part it names: naming another part drops
    them (DATPO's tree options mean nothing to the parallel strategy)."""
    datpo_on_parallel = [
        "algorithm.name=datpo",
        "rollout.strategy=parallel",
        "reward.shapers=[]",
        "algorithm.advantage=grpo",
    ]
    cfg = load_config(overrides=datpo_on_parallel)
    assert cfg.rollout.strategy_options == {}
    path = tmp_path / "c.yaml"
    path.write_text(
        "rollout:\n  strategy: datpo_tree\n  strategy_options: {k_max: 3}\n"
        "algorithm:\n  advantage: grpo\n  advantage_options: {eps: 0.1}\n"
    )
    cfg = load_config(path, ["rollout.strategy=parallel", "algorithm.advantage=rloo"])
    assert cfg.rollout.strategy_options == {} and cfg.algorithm.advantage_options == {}
    # The same part keeps its options, and options given with the new name are used alone.
    cfg = load_config(path, ["rollout.strategy=datpo_tree", "algorithm.advantage_options={}"])
    assert cfg.rollout.strategy_options == {"k_max": 3}
    cfg = load_config(
        path,
        ["algorithm.advantage=reinforce_pp", "algorithm.advantage_options.group_baseline=true"],
    )
    assert cfg.algorithm.advantage_options == {"group_baseline": True}


def test_engine_options_are_checked_at_load() -> None:
    with pytest.raises(
        ConfigError, match=r"rollout\.engine_options\.gpu_memory_utilization: unknown"
    ):
        load_config(overrides=["rollout.engine_options={gpu_memory_utilization: 0.5}"])
    with pytest.raises(ConfigError, match=r"engine_options\.batch_size.*rollout\.batch_size"):
        load_config(overrides=["rollout.engine_options={batch_size: 3}"])


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("reward.functions=[arithmetic_format]", "did you mean [{name: arithmetic_format}]"),
        ("reward.shapers=[gar]", "did you mean [{name: gar}]"),
        ("rollout.annotators=hispo_segments", "did you mean [{name: hispo_segments}]"),
        ("train.loggers=jsonl", "did you mean [jsonl]"),
    ],
)
def test_a_name_where_a_list_of_parts_is_expected_shows_the_form(override, hint) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert hint in str(info.value), str(info.value)


def test_one_sample_per_prompt_is_refused_by_what_an_estimator_declares(monkeypatch) -> None:
    """The check reads the estimator's declared `group_relative`, not a list of names: a
    newly registered group-relative estimator is covered without editing the check."""
    from policyopt.core import ADVANTAGES
    from policyopt.core.advantages import grpo_advantages

    def copy(rewards, group_ids):
        return grpo_advantages(rewards, group_ids)

    copy.group_relative = True
    name = "test_group_relative_copy"
    monkeypatch.setitem(ADVANTAGES._entries, name, copy)  # registered for this test only
    with pytest.raises(ConfigError, match="group_size: 1"):
        load_config(overrides=[f"algorithm.advantage={name}", "rollout.group_size=1"])
    with pytest.raises(ConfigError, match="group_size: 1"):
        load_config(
            overrides=[
                "algorithm.advantage=reinforce_pp",
                "algorithm.advantage_options={group_baseline: true}",
                "rollout.group_size=1",
            ]
        )
    load_config(overrides=["algorithm.advantage=reinforce_pp", "rollout.group_size=1"])
