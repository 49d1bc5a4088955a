from __future__ import annotations

import pytest

from policyopt.methods.dmrl.lm_agent import LMAgent, parse_parameters
from policyopt.models.loading import load_model
from policyopt.tasks.adsim.params import RANGES, AdParams
from policyopt.tasks.skilldoc.scripted import START_DOCUMENT


def test_parse_clips_and_defaults():
    p, missing = parse_parameters(
        "ad_load=0.5, frequency_cap: 20 quality_weight=abc pacing_rate=0.7"
    )
    assert p.ad_load == RANGES["ad_load"][1]
    assert p.frequency_cap == RANGES["frequency_cap"][1]
    assert p.pacing_rate == pytest.approx(0.7)
    assert p.quality_weight == AdParams().quality_weight
    assert set(missing) == {"quality_weight", "exploration_rate"}


def test_tiny_model_agent_returns_parameters_in_range():
    model, tok = load_model("tiny")
    agent = LMAgent(model, tok, max_new_tokens=40)
    p = agent(START_DOCUMENT)
    for name, (lo, hi) in RANGES.items():
        assert lo <= getattr(p, name) <= hi
    assert isinstance(agent.last_missing, list)
