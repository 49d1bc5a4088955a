"""The Plackett–Luce ranking policy, its engine and the log-prob hook the update uses."""

import math

import pytest
import torch

from policyopt.core.plackett_luce import plackett_luce_logprobs
from policyopt.models.item_tokenizer import ItemTokenizer
from policyopt.models.logprobs import response_logprobs
from policyopt.models.ranker import PLRanker, squash
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.pl_engine import PLEngine


def make_ranker(num_items=12, features=3, seed=0):
    torch.manual_seed(seed)
    ranker = PLRanker(features, [8])
    ranker.set_items(torch.randn(num_items, features) * 5)
    ranker.fit_normalizer(torch.arange(1, num_items + 1))
    return ranker


def test_normalizer_is_squash_then_standardise():
    ranker = make_ranker()
    x = squash(ranker.items[1:])
    assert torch.allclose(ranker.feature_mean, x.mean(0))
    assert torch.allclose(ranker.feature_std, x.std(0))
    assert float(squash(torch.tensor(-math.e + 1))) == pytest.approx(-1.0)


def test_logprobs_equal_core_pl_on_candidates():
    ranker = make_ranker()
    # Two queries, left-padded: candidates (3, 5, 7, 9) and (2, 4, 6) (one pad column).
    prompt = torch.tensor([[3, 5, 7, 9], [0, 2, 4, 6]])
    pmask = (prompt != 0).long()
    response = torch.tensor([[7, 3], [6, 0]])  # the second ranks only one item
    rmask = torch.tensor([[1, 1], [1, 0]])
    out = response_logprobs(
        ranker, torch.cat([prompt, response], 1), torch.cat([pmask, rmask], 1), 2, with_entropy=True
    )
    with torch.no_grad():
        s0 = ranker.scores(prompt[:1], pmask[:1])
        s1 = ranker.scores(prompt[1:, 1:], pmask[1:, 1:])
    want0 = plackett_luce_logprobs(s0, torch.tensor([[2, 0]]))
    want1 = plackett_luce_logprobs(s1, torch.tensor([[2]]))
    assert torch.allclose(out.logp[0], want0[0], atol=1e-5)
    assert float(out.logp[1, 0]) == pytest.approx(float(want1[0, 0]), abs=1e-5)
    assert float(out.logp[1, 1]) == 0.0  # padding position
    assert out.entropies is not None and (out.entropies[0] > 0).all()


def test_placing_a_non_candidate_is_an_error():
    ranker = make_ranker()
    ids = torch.tensor([[3, 5, 8]])
    with pytest.raises(ValueError, match="not among its candidates"):
        response_logprobs(ranker, ids, torch.ones_like(ids), 1)


def test_engine_samples_valid_rankings_with_matching_logprobs():
    ranker = make_ranker()
    engine = PLEngine(ranker)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    torch.manual_seed(1)
    r = engine.generate([p for p in prompts for _ in range(4)], SamplingParams(max_new_tokens=4))
    assert r.response_ids.shape == (8, 4)
    assert r.response_mask[4:].sum(1).tolist() == [3.0] * 4  # only 3 candidates
    for row in range(8):
        placed = r.response_ids[row][r.response_mask[row].bool()].tolist()
        assert len(set(placed)) == len(placed)
        assert set(placed) <= set(prompts[row // 4])
    # The recorded log-probs are those the update recomputes (on-policy ratio exactly 1).
    again = response_logprobs(ranker, r.input_ids(), r.attention_mask(), 4).logp
    assert torch.allclose(again * r.response_mask, r.logp, atol=1e-6)
    greedy = engine.generate([prompts[0]], SamplingParams(max_new_tokens=5, greedy=True))
    with torch.no_grad():
        s = ranker.scores(torch.tensor([prompts[0]]), torch.ones(1, 5))
    assert greedy.response_ids[0].tolist() == [prompts[0][i] for i in s[0].argsort(descending=True)]


def test_engine_records_the_placed_candidates():
    # item_columns: each placed item's index among its row's candidates (left padding not
    # counted), -1 past a shorter ranking; kept by select and by concatenation.
    from policyopt.rollout.base import concat_rollouts

    engine = PLEngine(make_ranker())
    prompts = [[9, 2, 11, 4, 5], [6, 7, 8], [3, 10]]
    torch.manual_seed(2)
    r = engine.generate([p for p in prompts for _ in range(3)], SamplingParams(max_new_tokens=4))
    for row in range(9):
        cands = prompts[row // 3]
        ids = r.response_ids[row].tolist()
        mask = r.response_mask[row].tolist()
        want = [cands.index(t) if m else -1 for t, m in zip(ids, mask, strict=True)]
        assert r.item_columns[row].tolist() == want
    picked = r.select(torch.tensor([8, 0]))
    assert torch.equal(picked.item_columns, r.item_columns[[8, 0]])
    short = engine.generate([[1, 2]], SamplingParams(max_new_tokens=4))
    both = concat_rollouts([short, r], pad_id=0)
    assert both.item_columns.shape == (10, 4)
    assert both.item_columns[0].tolist() == short.item_columns[0].tolist() + [-1, -1]
    assert torch.equal(both.item_columns[1:], r.item_columns)


def test_engine_temperature_and_gradient_flow():
    ranker = make_ranker()
    ids = torch.tensor([[1, 2, 3, 4, 2, 1]])
    mask = torch.ones_like(ids)
    lp_hot = response_logprobs(ranker, ids, mask, 2, temperature=100.0).logp
    assert torch.allclose(lp_hot, torch.tensor([[math.log(1 / 4), math.log(1 / 3)]]), atol=0.02)
    lp = response_logprobs(ranker, ids, mask, 2).logp
    lp.sum().backward()
    assert all(p.grad is not None for p in ranker.mlp.parameters())


def test_save_and_load(tmp_path):
    ranker = make_ranker()
    ranker.save_pretrained(tmp_path)
    loaded = PLRanker.from_pretrained(tmp_path)
    loaded.set_items(ranker.items[1:])
    ids = torch.tensor([[1, 2, 3]])
    assert torch.allclose(
        loaded.scores(ids, torch.ones_like(ids)), ranker.scores(ids, torch.ones_like(ids))
    )


def test_item_tokenizer_round_trip(tmp_path):
    tok = ItemTokenizer(50)
    assert tok("i3 i12 i7")["input_ids"] == [3, 12, 7]
    assert tok.decode([3, 12, 0]) == "i3 i12"
    with pytest.raises(ValueError, match="outside"):
        tok("i51")
    tok.save_pretrained(tmp_path)
    assert ItemTokenizer.from_pretrained(tmp_path).num_items == 50


def test_nucleus_sampling_frequencies():
    """top_p keeps the fewest most probable remaining items whose mass reaches top_p."""
    from policyopt.rollout.pl_engine import nucleus_rankings

    # softmax(log(0.5, 0.3, 0.15, 0.05)): with top_p = 0.7 the first position is drawn from
    # {0, 1} renormalised (0.5/0.8, 0.3/0.8); given 0 first, the second from the remaining
    # (0.6, 0.3, 0.1) nucleus {1, 2} (0.6 < 0.7): (0.6/0.9, 0.3/0.9).
    scores = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(20000, 4)
    out = nucleus_rankings(scores, 2, 0.7, generator=torch.Generator().manual_seed(0))
    first = torch.bincount(out[:, 0], minlength=4).double() / 20000
    assert first.tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=0.015)
    second = out[out[:, 0] == 0, 1]
    freq = torch.bincount(second, minlength=4).double() / len(second)
    assert freq.tolist() == pytest.approx([0.0, 2 / 3, 1 / 3, 0.0], abs=0.02)
    # A tiny top_p is greedy; top_p = 1 keeps every item.
    greedy = nucleus_rankings(scores[:5], 4, 1e-9)
    assert greedy.tolist() == [[0, 1, 2, 3]] * 5
    full = nucleus_rankings(scores, 1, 1.0, generator=torch.Generator().manual_seed(1))
    assert (torch.bincount(full[:, 0], minlength=4) > 0).all()


def test_engine_applies_top_p():
    ranker = make_ranker()
    engine = PLEngine(ranker)
    prompts = [[1, 2, 3, 4, 5, 6]] * 200
    ids = torch.tensor(prompts[0])
    with torch.no_grad():
        s = ranker.scores(ids[None], torch.ones(1, 6))[0]
    best = int(ids[s.argmax()])
    out = engine.generate(prompts, SamplingParams(max_new_tokens=3, top_p=1e-6))
    assert (out.response_ids[:, 0] == best).all()  # the nucleus of one item
    loose = engine.generate(prompts, SamplingParams(max_new_tokens=3, top_p=1.0))
    assert (loose.response_ids[:, 0] != best).any()
