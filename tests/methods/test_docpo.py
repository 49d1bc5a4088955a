"""DocPO: step-aware γ, the dispersion controller's rule on constructed reward streams, the
shaper on hand values, and the all-perfect / all-zero group filter."""

import math
from dataclasses import replace

import pytest
import torch

from policyopt.core.filters import GROUP_FILTERS
from policyopt.methods.docpo import (
    DispersionController,
    StepAwareShaper,
    filter_degenerate_groups,
    step_aware_gamma,
)
from policyopt.rewards.shaping import SHAPERS, ShapingContext
from policyopt.train.batch import Batch

torch.set_num_threads(1)

GAMMA_AT_TAU = 6.0569644706  # 1 + 8 (1 - e^-1) = 1 + 8 * 0.6321205588


def test_gamma_by_hand():
    assert step_aware_gamma(0, 50.0) == 1.0
    assert step_aware_gamma(50, 50.0) == pytest.approx(GAMMA_AT_TAU)
    assert step_aware_gamma(1e6, 50.0) == pytest.approx(9.0)  # limit γ_init + Δγ
    # γ_init 2, Δγ 4, s = 2τ: 2 + 4 (1 - e^-2) = 2 + 4 * 0.8646647 = 5.4586588
    assert step_aware_gamma(20, 10.0, gamma_init=2.0, delta=4.0) == pytest.approx(5.4586588)
    with pytest.raises(ValueError, match="tau"):
        step_aware_gamma(1, 0.0)
    with pytest.raises(ValueError, match="step"):
        step_aware_gamma(-1, 10.0)


def controller(**kw):
    defaults = dict(
        tau_init=100.0,
        tau_min=10.0,
        tau_max=1000.0,
        cv_target=0.25,
        band=0.2,
        rate=0.1,
        window=4,
        min_samples=4,
    )
    return DispersionController(**{**defaults, **kw})


def test_controller_shrinks_tau_when_rewards_bunch_and_grows_it_when_they_spread():
    c = controller()
    c.observe("table", [0.9, 0.9, 0.9, 0.9])  # CV 0 < 0.25 * 0.8
    assert c.update("table") == pytest.approx(100 * math.exp(-0.1))  # 90.4837
    c.observe("text", [0.0, 1.0, 0.0, 1.0])  # mean 0.5, std 0.5: CV 1 > 0.25 * 1.2
    assert c.update("text") == pytest.approx(100 * math.exp(0.1))  # 110.5171
    c.observe("formula", [0.6, 1.0, 0.6, 1.0])  # mean 0.8, std 0.2: CV 0.25, in the band
    assert c.update("formula") == 100.0
    c.observe("zero", [0.0] * 4)  # mean 0: CV = inf -> anneal slower
    assert c.cv("zero") == math.inf
    assert c.update("zero") == pytest.approx(100 * math.exp(0.1))


def test_controller_waits_for_min_samples_rolls_its_window_and_clamps():
    c = controller()
    c.observe("t", [0.9, 0.9, 0.9])
    assert c.cv("t") is None
    assert c.update("t") == 100.0  # 3 < min_samples
    c.observe("t", [0.0, 1.0, 0.0, 1.0])  # the 0.9s roll out of the window of 4
    assert c.cv("t") == pytest.approx(1.0)
    assert c.update("t") == pytest.approx(100 * math.exp(0.1))
    c.observe("t", [0.9, 0.9, 0.9, 0.9])
    for _ in range(100):
        c.update("t")
    assert c.tau("t") == 10.0  # tau_min
    fixed = controller(rate=0.0)
    fixed.observe("t", [0.9] * 4)
    assert fixed.update("t") == 100.0  # rate 0: τ fixed
    with pytest.raises(ValueError, match="tau_min <= tau_init"):
        controller(tau_init=5.0)
    with pytest.raises(ValueError, match="min_samples <= window"):
        controller(min_samples=8)


def test_controller_state_round_trip_resumes_identically():
    a = controller()
    a.observe("table", [0.9, 0.8, 0.9, 0.95])
    a.update("table")
    b = controller()
    b.load_state_dict(a.state_dict())
    assert b.tau("table") == a.tau("table")
    for c in (a, b):
        c.observe("table", [0.1, 0.9])
    assert b.cv("table") == a.cv("table")
    assert b.update("table") == a.update("table")


def test_shaper_by_hand_per_type():
    shaper = StepAwareShaper(controller=controller(tau_init=50.0, rate=0.0))
    shaped, metrics = shaper.shape(
        torch.tensor([0.9, 0.5, 1.0, 0.0], dtype=torch.float64),
        ["text", "table", "text", "formula"],
        50,
    )
    # 0.9 ** 6.0569645 = exp(6.0569645 * ln 0.9 = -0.6381646) = 0.5282609; 0.5 ** 6.0569645 = 0.0150201
    assert shaped.tolist() == pytest.approx([0.5282609, 0.0150201, 1.0, 0.0], abs=1e-7)
    assert shaped.dtype == torch.float64
    assert metrics["docpo/text/gamma"] == pytest.approx(GAMMA_AT_TAU)
    assert metrics["docpo/text/raw_mean"] == pytest.approx(0.95)
    # Step 0: γ = 1, rewards unchanged.
    same, _ = shaper.shape([0.3, 0.7], ["text", "table"], 0)
    assert same.tolist() == pytest.approx([0.3, 0.7])


def test_shaper_uses_each_types_own_tau():
    c = controller(rate=0.0)
    c.load_state_dict({"tau": {"table": 10.0, "text": 1000.0}, "rewards": {}})
    shaped, _ = StepAwareShaper(controller=c).shape([0.9, 0.9], ["table", "text"], 10)
    # table: γ = 6.0569645 -> 0.5282609;
    # text: γ = 1 + 8 (1 - e^-0.01) = 1.0796013 -> exp(1.0796013 * -0.1053605) = 0.8924834
    assert shaped.tolist() == pytest.approx([0.5282609, 0.8924834], abs=1e-6)


def test_shaper_updates_tau_from_raw_rewards_then_shapes():
    shaper = StepAwareShaper(controller=controller())
    _, metrics = shaper.shape([0.9, 0.9, 0.9, 0.9], ["t"] * 4, 100)
    tau = 100 * math.exp(-0.1)
    assert metrics["docpo/t/tau"] == pytest.approx(tau)
    assert metrics["docpo/t/gamma"] == pytest.approx(1 + 8 * (1 - math.exp(-100 / tau)))


def test_shaper_call_reads_the_type_column_and_state_survives_a_restart():
    shaper = SHAPERS.get("step_aware_annealing")(tau_init=20.0, window=4, min_samples=2, rate=0.1)
    round_ = Batch(
        rollouts=None,
        group_ids=torch.tensor([0, 0]),
        prompts=["p", "p"],
        completions=["a", "b"],
        columns={"element_type": ["table", "table"]},
        correct=torch.tensor([True, False]),
    )
    ctx = ShapingContext(round_, step=20, total_steps=100)
    shaped, metrics = shaper(torch.tensor([0.9, 0.8]), ctx)  # CV 0.0588 < 0.2: τ 20 -> 18.0967
    assert metrics["docpo/table/tau"] == pytest.approx(20 * math.exp(-0.1))
    restored = SHAPERS.get("step_aware_annealing")(tau_init=20.0, window=4, min_samples=2, rate=0.1)
    restored.load_state_dict(shaper.state_dict())
    assert restored.shape([0.5], ["table"], 30) == shaper.shape([0.5], ["table"], 30)
    with pytest.raises(KeyError, match="'element_type' column"):
        shaper(torch.tensor([0.9, 0.8]), replace(ctx, batch=replace(round_, columns={})))


def test_shaper_rejects_bad_input():
    shaper = StepAwareShaper()
    with pytest.raises(ValueError, match="sample 1 has 1.5"):
        shaper.shape([0.5, 1.5], ["t", "t"], 3)
    with pytest.raises(ValueError, match="one reward per sample"):
        shaper.shape([0.5, 0.5], ["t"], 3)
    with pytest.raises(ValueError, match="did you mean 'tau_init'"):
        SHAPERS.get("step_aware_annealing")(tau_inti=3.0)


def test_filter_drops_all_perfect_and_all_zero_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5, 1.0, 0.0, 0.3])
    groups = torch.tensor([7, 7, -2, -2, 3, 3, 9, 9])
    keep = filter_degenerate_groups(rewards, groups)
    assert keep.tolist() == [False, False, False, False, True, True, True, True]
    # high = 0.95 counts 0.96 as perfect; low = 0.3 counts 0.3 as zero.
    keep = filter_degenerate_groups(
        torch.tensor([0.96, 1.0, 0.2, 0.3]), torch.tensor([0, 0, 1, 1]), low=0.3, high=0.95
    )
    assert keep.tolist() == [False, False, False, False]
    assert GROUP_FILTERS.get("docpo") is filter_degenerate_groups
    assert filter_degenerate_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
    with pytest.raises(ValueError, match="same length"):
        filter_degenerate_groups(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="low < high"):
        filter_degenerate_groups(torch.zeros(2), torch.zeros(2), low=1.0, high=1.0)
