"""GAR's own trunk pass (the hidden states of an engine that records none, as the vllm engine
without its entropies pass): equal to a full-logit forward hooked at the LM head, and GAR's
rewards from it equal to those from the hf engine's hidden states recorded while sampling."""

from dataclasses import replace

import pytest
import torch

import policyopt.methods.gar.shaper as shaper_mod
from policyopt.methods.gar import GARShaper
from policyopt.models.loading import load_model
from policyopt.models.logprobs import naive_response_logprobs
from policyopt.rewards.shaping import ShapingContext
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.hf_engine import HFEngine
from policyopt.train.batch import Batch

torch.set_num_threads(1)

SOLUTION = {
    "Q:3+4=?\n": "3+4=7. A:7",
    "Q:(9-2)+5=?\n": "9-2=7. 7+5=12. A:12",
    "Q:8+8=?\n": "8+8=16. A:16",
}
G = 4


@pytest.fixture(scope="module")
def sampled():
    """The tiny model (its head spread so that signals differ) and G rollouts per prompt
    sampled by the hf engine, which records the hidden states while sampling."""
    model, tok = load_model("tiny")
    torch.manual_seed(0)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    model.eval()
    texts = [t for t in SOLUTION for _ in range(G)]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    engine = HFEngine(model, tok, generator=torch.Generator().manual_seed(1))
    r = engine.generate(ids, SamplingParams(max_new_tokens=14, with_hidden=True))
    assert r.hidden is not None
    # The untrained model rarely ends a response: cut row i to 5 + i % 8 tokens, as if it had
    # (causal attention: the kept positions' hidden states stay what they were), so that the
    # longest span is shorter than the batch's response width.
    keep = torch.arange(r.response_ids.shape[1])[None, :] < 5 + torch.arange(len(r))[:, None] % 8
    r = replace(
        r,
        response_ids=torch.where(keep, r.response_ids, tok.pad_token_id),
        response_mask=r.response_mask * keep,
        logp=r.logp * keep,
        entropies=r.entropies * keep,
        hidden=r.hidden * keep[..., None],
    )
    return model, tok, texts, r


def test_trunk_pass_equals_a_full_logit_forward(sampled, monkeypatch):
    model, _, _, r = sampled
    monkeypatch.setattr(shaper_mod, "FORWARD_BATCH", 3)  # chunks that cut groups apart
    rows = torch.tensor([0, 1, 2, 4, 5, 9, 10, 11])
    width = int(r.lengths[rows].max())
    assert width < r.response_ids.shape[1]  # the pass is cut to what the rows need
    got = shaper_mod.rollout_hidden(model, r, rows, width)
    with torch.no_grad():
        ref = naive_response_logprobs(
            model,
            r.input_ids()[rows],
            r.attention_mask()[rows],
            r.response_ids.shape[1],
            with_hidden=True,
        ).hidden[:, :width]
    mask = r.response_mask[rows, :width].bool()
    assert got.shape == (len(rows), width, model.config.hidden_size)
    torch.testing.assert_close(got[mask], ref[mask], atol=1e-5, rtol=0)


def test_rewards_from_the_trunk_pass_equal_those_from_recorded_hidden_states(sampled, monkeypatch):
    model, tok, texts, r = sampled
    monkeypatch.setattr(shaper_mod, "FORWARD_BATCH", 5)  # chunks that cut groups apart
    batch = Batch(
        rollouts=r,
        group_ids=torch.arange(len(SOLUTION)).repeat_interleave(G),
        prompts=texts,
        completions=tok.batch_decode(r.response_ids.tolist(), skip_special_tokens=True),
        columns={"solution": [SOLUTION[t] for t in texts]},
        # three of each group pass, so that centring leaves bonuses to compare
        correct=torch.tensor([True, True, True, False] * len(SOLUTION)),
    )

    def gar(rollouts):
        ctx = ShapingContext(
            replace(batch, rollouts=rollouts),
            step=0,
            total_steps=1,
            model=model,
            tokenizer=tok,
            logit_chunk_size=7,
        )
        return GARShaper()(torch.zeros(len(texts)), ctx)

    recorded, on_recorded = gar(r)
    own, on_own = gar(replace(r, hidden=None))
    assert on_recorded["gar/rollout_pass_rows"] == 0.0
    assert on_own["gar/rollout_pass_rows"] == 9.0  # the correct rollouts only
    torch.testing.assert_close(own, recorded, atol=1e-5, rtol=0)
    wrong = torch.tensor([False, False, False, True] * len(SOLUTION))
    assert (recorded[wrong] == 0).all()
    assert (recorded[~wrong] >= 1.0).all() and (recorded > 1.0).sum() >= 2  # bonuses paid
