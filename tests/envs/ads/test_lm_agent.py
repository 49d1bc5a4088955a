from __future__ import annotations

import pytest
import torch

from policyopt.envs.ads.adsim.params import RANGES, AdParams
from policyopt.envs.ads.skilldoc.document import Edit
from policyopt.envs.ads.skilldoc.lm_agent import LMAgent, parse_parameters
from policyopt.envs.ads.skilldoc.rule_agent import RuleAgent
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT
from policyopt.models.tiny import build_char_tokenizer
from policyopt.tasks.base import get_task


def test_parse_clips_and_defaults():
    p, missing = parse_parameters(
        "ad_load=0.5, frequency_cap: 20 quality_weight=abc pacing_rate=0.7"
    )
    assert p.ad_load == RANGES["ad_load"][1]
    assert p.frequency_cap == RANGES["frequency_cap"][1]
    assert p.pacing_rate == pytest.approx(0.7)
    assert p.quality_weight == AdParams().quality_weight
    assert set(missing) == set(RANGES) - {"ad_load", "frequency_cap", "pacing_rate"}


class ScriptedLM:
    """A stand-in causal LM whose greedy output is a fixed text (records its prompts)."""

    def __init__(self, tokenizer, text):
        self.tokenizer, self.text, self.prompts, self.frozen = tokenizer, text, [], False

    def eval(self):
        return self

    def requires_grad_(self, flag):
        self.frozen = not flag
        return self

    def generate(self, input_ids, **kwargs):
        self.prompts.append(self.tokenizer.decode(input_ids[0]))
        out = self.tokenizer(self.text, add_special_tokens=False, return_tensors="pt")
        return torch.cat([input_ids, out["input_ids"]], 1)


def test_agent_sets_what_the_model_wrote_and_counts_the_parse_rate():
    tok = build_char_tokenizer()
    lm = ScriptedLM(tok, "ad_load=0.07 quality_weight=0.9\nexploration_rate=0.2")
    agent = LMAgent(lm, tok, max_new_tokens=60)
    p = agent(START_DOCUMENT)
    assert lm.frozen and "keep ad load very high" in lm.prompts[0]  # reads the document
    assert (p.ad_load, p.quality_weight, p.exploration_rate) == pytest.approx((0.07, 0.9, 0.2))
    assert p.pacing_rate == AdParams().pacing_rate
    named = {"ad_load", "quality_weight", "exploration_rate"}
    assert set(agent.last_missing) == set(RANGES) - named
    agent(START_DOCUMENT)  # memoised: greedy decoding of a frozen model
    assert len(lm.prompts) == 1
    assert agent.stats() == {"documents": 1.0, "parse_rate": 0.0, "mean_named": 3.0}
    lm.text = " ".join(f"{n}={v}" for n, v in AdParams().as_dict().items())  # all of them
    agent(START_DOCUMENT.apply(Edit("ads", "delete", 0, "")))
    assert agent.stats()["parse_rate"] == 0.5


@pytest.mark.slow
def test_lower_agent_option_selects_the_agent():
    task = get_task("dmrl_skill", users_per_arm=10, eval_users=10)
    assert isinstance(task.env.agent, RuleAgent)
    with pytest.raises(ValueError, match="lower_agent must be one of"):
        get_task("dmrl_skill", users_per_arm=10, eval_users=10, lower_agent="llm")
    lm = get_task(
        "dmrl_skill", users_per_arm=10, eval_users=10, lower_agent="lm", lm_agent_model="tiny"
    )
    assert isinstance(lm.env.agent, LMAgent)


def test_lm_agent_probe_counts_parse_and_agreement_by_hand() -> None:
    """A fake agent that reads the rules exactly except one parameter it leaves out (so it
    keeps its default): parse rate 0, 13 named, agreement from the one wrong parameter."""
    import numpy as np
    from studies.dmrl.lm_agent_probe import AGREE, compare, range_distance

    from policyopt.envs.ads.adsim.params import RANGES, AdParams
    from policyopt.envs.ads.skilldoc.rule_agent import RuleAgent
    from policyopt.envs.ads.skilldoc.scripted import random_document

    class DropsReserve:
        last_missing: list[str] = []

        def __call__(self, doc):
            values = RuleAgent()(doc).as_dict()
            values["reserve_price"] = AdParams().reserve_price
            self.last_missing = ["reserve_price"]
            return AdParams.clipped(values)

    rng = np.random.default_rng(3)
    docs = [random_document(rng) for _ in range(6)]
    got = compare(DropsReserve(), docs)
    assert got["parse_rate"] == 0 and got["mean_named"] == len(RANGES) - 1
    wrong = [range_distance(RuleAgent()(d), DropsReserve()(d))["reserve_price"] for d in docs]
    n = len(RANGES) * len(docs)
    assert got["agreement"] == (n - sum(w > AGREE for w in wrong)) / n
    assert got["per_parameter_distance"]["reserve_price"] == np.mean(wrong)
    assert got["per_parameter_distance"]["ad_load"] == 0


@pytest.mark.slow
def test_grammar_agent_writes_every_parameter_in_the_format() -> None:
    """An untrained model writes nothing parseable on its own; under `params_ebnf` every
    output is the 14 `name=value` lines in order, so the parse rate is 1."""
    pytest.importorskip("xgrammar")
    import re

    from policyopt.envs.ads.skilldoc.lm_agent import LM_AGENT_TOKENS, params_ebnf
    from policyopt.models.loading import load_model

    torch.manual_seed(0)
    lm, tok = load_model("tiny")
    free = LMAgent(lm, tok, max_new_tokens=40)
    free(START_DOCUMENT)
    assert free.stats()["mean_named"] == 0.0
    agent = LMAgent(lm, tok, max_new_tokens=LM_AGENT_TOKENS, grammar=True)
    doc2 = START_DOCUMENT.apply(Edit("ads", "delete", 0, ""))
    for doc in (START_DOCUMENT, doc2):
        agent(doc)
        text = agent.outputs[doc.render()][0]
        lines = text.split("\n")
        assert lines[-1] == "" and [ln.split("=")[0] for ln in lines[:-1]] == list(RANGES)
        assert all(re.fullmatch(r"\d{1,2}(\.\d{1,3})?", ln.split("=")[1]) for ln in lines[:-1])
    assert agent.stats() == {"documents": 2.0, "parse_rate": 1.0, "mean_named": 14.0}
    assert "value ::=" in params_ebnf() and params_ebnf().count('=" value') == len(RANGES)
