"""Grammar-constrained decoding (`rollout/grammar.py`): samples in the grammar, the mask's
effect on the distribution, and the trainer's log-probs equal to the sampler's."""

import math

import numpy as np
import pytest
import torch

from policyopt.envs.ads.skilldoc.document import read_edit
from policyopt.envs.ads.skilldoc.env import render_prompt
from policyopt.envs.ads.skilldoc.scripted import START_DOCUMENT, random_document
from policyopt.models.loading import load_model
from policyopt.models.logprobs import chunked_head_logprobs, response_logprobs
from policyopt.rollout.base import SamplingParams, concat_rollouts
from policyopt.rollout.grammar import mask_logits
from policyopt.rollout.hf_engine import HFEngine
from policyopt.rollout.sampling import sample_next
from policyopt.train.distributed import PolicyForward
from policyopt.train.update import allowed_of
from token_bits_for_tests import pack_token_bits

pytest.importorskip("xgrammar")

# the longest edit ("replace population 4: " + 60 characters + newline) and EOS fit
BUDGET = 90


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mask_logits_is_the_unpacked_mask_and_leaves_the_input(dtype) -> None:
    """xgrammar's packed-bitmask kernel against masked_fill with the bool mask, on a width
    that is not a multiple of 32; the model's logits tensor itself is not written."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 101, generator=gen).to(dtype)
    allowed = torch.rand(6, 101, generator=gen) < 0.3
    allowed[:, 0] = True  # no row without an allowed token
    before = logits.clone()
    got = mask_logits(logits, pack_token_bits(allowed))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, logits.float().masked_fill(~allowed, float("-inf")))
    assert torch.equal(logits, before)


def test_mask_keeps_the_allowed_tokens_relative_probabilities() -> None:
    """p = (1, 2, 3, 4) / 10, token 2 disallowed: the constrained p = (1, 2, 0, 4) / 7."""
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 2000))
    allowed = torch.tensor([[True, True, False, True]] * 2000)
    gen = torch.Generator().manual_seed(0)
    tok, logp, ent = sample_next(
        mask_logits(logits, pack_token_bits(allowed)),
        temperature=1.0,
        top_p=1.0,
        greedy=False,
        generator=gen,
    )
    assert not (tok == 2).any()
    expected = torch.log(torch.tensor([1.0, 2.0, 0.0, 4.0]) / 7)
    torch.testing.assert_close(logp, expected[tok])
    h = -sum(p * math.log(p) for p in (1 / 7, 2 / 7, 4 / 7))
    torch.testing.assert_close(ent, torch.full((2000,), h))
    # the sampled frequencies follow (1, 2, 4) / 7: 2000 draws, within 4 standard errors
    for token, p in ((0, 1 / 7), (1, 2 / 7), (3, 4 / 7)):
        assert abs(float((tok == token).float().mean()) - p) < 4 * math.sqrt(p * (1 - p) / 2000)


@pytest.mark.slow
def test_constrained_samples_are_well_formed_edits(tiny) -> None:
    """An untrained model writes garbage; under the grammar every sample is an ok edit."""
    model, tok = tiny
    rng = np.random.default_rng(0)
    for seed in range(12):
        doc = START_DOCUMENT if seed == 0 else random_document(rng)
        ids = tok(render_prompt(doc, []), add_special_tokens=False)["input_ids"]
        engine = HFEngine(
            model, tok, grammar="skill_edit", generator=torch.Generator().manual_seed(seed)
        )
        r = engine.generate([ids] * 8, SamplingParams(max_new_tokens=BUDGET))
        assert not r.truncated.any()
        for row in range(8):
            text = tok.decode(r.response_ids[row, : int(r.lengths[row])], skip_special_tokens=True)
            assert read_edit(text, doc)[1] == "ok", text


def test_unconstrained_samples_are_mostly_malformed(tiny) -> None:
    """The test above can fail: the same model without the grammar writes no edit."""
    model, tok = tiny
    ids = tok(render_prompt(START_DOCUMENT, []), add_special_tokens=False)["input_ids"]
    engine = HFEngine(model, tok, generator=torch.Generator().manual_seed(0))
    r = engine.generate([ids] * 8, SamplingParams(max_new_tokens=BUDGET))
    texts = [
        tok.decode(r.response_ids[i, : int(r.lengths[i])], skip_special_tokens=True)
        for i in range(8)
    ]
    assert all(read_edit(t, START_DOCUMENT)[1] != "ok" for t in texts)


def test_trainer_logprobs_are_the_constrained_distributions(tiny) -> None:
    """The sampler's log-probs (and entropies) equal the trainer's recomputation with the
    rollouts' allowed sets, and differ from the unconstrained ones (by log Z < 0)."""
    model, tok = tiny
    ids = tok(render_prompt(START_DOCUMENT, []), add_special_tokens=False)["input_ids"]
    engine = HFEngine(model, tok, grammar="skill_edit", generator=torch.Generator().manual_seed(1))
    r = engine.generate([ids] * 4, SamplingParams(max_new_tokens=BUDGET, temperature=0.8))
    width = r.response_ids.shape[1]
    words = -(-model.config.vocab_size // 32)  # packed: 32 tokens per int32 word
    assert r.allowed_bits is not None and r.allowed_bits.shape == (4, width, words)
    assert r.allowed_bits.dtype == torch.int32
    m = r.response_mask.bool()
    args = (model, r.input_ids(), r.attention_mask(), width)
    kw = {"temperature": 0.8, "with_entropy": True}
    constrained = response_logprobs(*args, allowed_bits=r.allowed_bits, **kw)
    torch.testing.assert_close(constrained.logp[m], r.logp[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(constrained.entropies[m], r.entropies[m], atol=1e-4, rtol=1e-4)
    # the trainer's path: the policy forward of the update, given the rollouts' allowed sets
    rows = torch.arange(4)
    policy = PolicyForward(model, temperature=0.8, chunk_size=16)
    trained = policy(r.input_ids(), r.attention_mask(), width, **allowed_of(r, rows, width))
    torch.testing.assert_close(trained[m], r.logp[m], atol=1e-4, rtol=1e-4)
    plain = response_logprobs(*args, **kw).logp
    # log π(y) = log π_c(y) + log Z, Z < 1 wherever the grammar excludes some mass
    assert (plain[m] <= constrained.logp[m] + 1e-5).all()
    assert (constrained.logp[m] - plain[m]).max() > 0.1


def test_constrained_logprob_gradient_matches_autograd() -> None:
    """The linear head's hand-written backward, masked, equals autograd on a masked
    log-softmax; with one token allowed the log-prob is 0 and its gradient 0."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 6)
    h = torch.randn(5, 8, requires_grad=True)
    y = torch.tensor([0, 1, 2, 3, 5])
    allowed = torch.rand(5, 6) < 0.6
    allowed[torch.arange(5), y] = True
    allowed[4] = False
    allowed[4, 5] = True  # a position where the grammar forces the token
    bits = pack_token_bits(allowed)
    logp, _ = chunked_head_logprobs(h, y, head, temperature=0.7, chunk_size=2, allowed_bits=bits)
    (g,) = torch.autograd.grad(logp.sum(), h)
    z = (head(h) / 0.7).masked_fill(~allowed, float("-inf"))
    ref = torch.log_softmax(z, -1).gather(-1, y[:, None]).squeeze(-1)
    (g_ref,) = torch.autograd.grad(ref.sum(), h)
    torch.testing.assert_close(logp, ref)
    torch.testing.assert_close(g, g_ref)
    assert float(logp[4].detach()) == 0.0 and float(g[4].abs().max()) == 0.0


def test_allowed_sets_survive_select_and_concat(tiny) -> None:
    model, tok = tiny
    ids = tok(render_prompt(START_DOCUMENT, []), add_special_tokens=False)["input_ids"]
    constrained = HFEngine(model, tok, grammar="skill_edit").generate(
        [ids] * 2, SamplingParams(max_new_tokens=BUDGET)
    )
    plain = HFEngine(model, tok).generate([ids], SamplingParams(max_new_tokens=5))
    both = concat_rollouts([constrained, plain], tok.pad_token_id)
    width = both.response_ids.shape[1]
    bits = constrained.allowed_bits
    assert both.allowed_bits.shape == (3, width, bits.shape[-1])
    assert torch.equal(both.allowed_bits[:2, : bits.shape[1]], bits)
    assert (both.allowed_bits[2] == -1).all()  # unconstrained rows allow every token
    assert (both.allowed_bits[:2, bits.shape[1] :] == -1).all()  # and so does padding
    assert torch.equal(both.select(torch.tensor([1])).allowed_bits, both.allowed_bits[1:2])
    assert not HFEngine(model, tok, grammar="skill_edit").tree_rollouts
