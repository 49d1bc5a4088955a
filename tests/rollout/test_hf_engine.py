"""The KV-cache sampling loop: log-probs and entropies as a full forward computes them."""

import pytest
import torch

from policyopt.models.loading import load_model
from policyopt.models.logprobs import naive_response_logprobs
from policyopt.rollout.base import Rollouts, SamplingParams, concat_rollouts
from policyopt.rollout.hf_engine import HFEngine, PreallocatedLayer, left_pad
from policyopt.rollout.sampling import _top_p, sample_next


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


def prompts(tok) -> list[list[int]]:
    return [
        tok(t, add_special_tokens=False)["input_ids"]
        for t in ["Q:1+2=?\n", "Q:((7+12)-5)+9=?\n", "Q:3=?\n"]
    ]


def assert_matches_full_forward(model, r: Rollouts, temperature: float) -> None:
    """The rollouts' sampling log-probs and entropies are those a full forward computes."""
    ref = naive_response_logprobs(
        model,
        r.input_ids(),
        r.attention_mask(),
        r.response_ids.shape[1],
        temperature=temperature,
        with_entropy=True,
    )
    m = r.response_mask.bool()
    assert torch.allclose(r.logp[m], ref.logp[m], atol=1e-5)
    assert torch.allclose(r.entropies[m], ref.entropies[m], atol=1e-4)


def test_sampling_logp_and_entropy_match_full_forward(tiny) -> None:
    model, tok = tiny
    torch.manual_seed(0)
    r = HFEngine(model, tok).generate(
        prompts(tok) * 2, SamplingParams(max_new_tokens=10, temperature=0.7)
    )
    assert_matches_full_forward(model, r, temperature=0.7)
    assert r.generated_tokens == int(r.response_mask.sum())


def test_eos_ends_a_response_and_padding_follows(tiny) -> None:
    model, tok = tiny
    torch.manual_seed(1)
    r = HFEngine(model, tok).generate(prompts(tok) * 8, SamplingParams(max_new_tokens=40))
    for row, n, trunc in zip(r.response_ids, r.lengths, r.truncated, strict=True):
        eos = (row[:n] == tok.eos_token_id).nonzero()
        if trunc:
            assert n == 40 and len(eos) == 0
        else:
            assert len(eos) == 1 and int(eos[0]) == n - 1  # EOS is the last real token
        assert (row[n:] == tok.pad_token_id).all()


def test_on_finished_hears_each_ended_response_once_with_its_tokens(tiny) -> None:
    model, tok = tiny
    torch.manual_seed(1)
    heard: dict[int, list[int]] = {}

    def on_finished(row: int, ids: list[int]) -> None:
        assert row not in heard  # once per response
        heard[row] = ids

    # batch_size 5: rows of later chunks are numbered in the prompts given to generate.
    r = HFEngine(model, tok, batch_size=5).generate(
        prompts(tok) * 8, SamplingParams(max_new_tokens=40), on_finished
    )
    ended = [i for i in range(len(r)) if not r.truncated[i]]
    assert any(i >= 5 for i in ended)  # the chunk offset is exercised
    assert sorted(heard) == ended
    for i in ended:
        assert heard[i] == r.response_ids[i, : int(r.lengths[i])].tolist()
        assert heard[i][-1] == tok.eos_token_id


def test_greedy_is_deterministic_and_independent_of_batch(tiny) -> None:
    model, tok = tiny
    engine = HFEngine(model, tok)
    p = prompts(tok)
    together = engine.generate(p, SamplingParams(max_new_tokens=8, greedy=True))
    alone = engine.generate(p[1:2], SamplingParams(max_new_tokens=8, greedy=True))
    n = int(alone.lengths[0])
    assert torch.equal(together.response_ids[1, :n], alone.response_ids[0, :n])


def test_batches_are_split_and_concatenated(tiny) -> None:
    model, tok = tiny
    p = prompts(tok) * 3
    r = HFEngine(model, tok, batch_size=4).generate(
        p, SamplingParams(max_new_tokens=6, greedy=True)
    )
    assert r.response_ids.shape[0] == 9
    single = HFEngine(model, tok).generate(p, SamplingParams(max_new_tokens=6, greedy=True))
    assert torch.equal(r.response_ids, single.response_ids)


def test_hidden_states_are_those_entering_the_head(tiny) -> None:
    model, tok = tiny
    r = HFEngine(model, tok).generate(
        prompts(tok), SamplingParams(max_new_tokens=5, greedy=True, with_hidden=True)
    )
    ref = naive_response_logprobs(
        model, r.input_ids(), r.attention_mask(), r.response_ids.shape[1], with_hidden=True
    )
    m = r.response_mask.bool()
    assert torch.allclose(r.hidden[m], ref.hidden[m], atol=1e-5)


def test_copies_of_a_prompt_share_one_prefill(tiny) -> None:
    """G copies of a prompt are prefilled once; each copy samples on its own, and greedy
    copies decode exactly what the prompt alone decodes."""
    model, tok = tiny
    p = prompts(tok)
    rows: list[torch.Size] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: rows.append(kw["input_ids"].shape), with_kwargs=True
    )
    try:
        r = HFEngine(model, tok).generate(
            [p[0], p[1], p[0], p[1]], SamplingParams(max_new_tokens=4)
        )
    finally:
        hook.remove()
    assert rows[0] == (2, len(p[1])) and all(s == (4, 1) for s in rows[1:])
    assert r.prompt_ids.shape == (4, len(p[1])) and torch.equal(r.prompt_ids[0], r.prompt_ids[2])
    greedy = SamplingParams(max_new_tokens=6, greedy=True, with_hidden=True)
    copies = HFEngine(model, tok).generate([p[1]] * 3, greedy)
    alone = HFEngine(model, tok).generate([p[1]], greedy)
    for row in range(3):
        assert torch.equal(copies.response_ids[row], alone.response_ids[0])
        torch.testing.assert_close(copies.logp[row], alone.logp[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(copies.hidden[row], alone.hidden[0], atol=1e-5, rtol=0)


def test_preallocated_layer_returns_what_concatenation_gives() -> None:
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 2, 4, 5, generator=gen), torch.randn(3, 2, 4, 5, generator=gen)
    layer = PreallocatedLayer(k, v, extra=2)
    for _ in range(3):  # the third update goes past the room and grows the buffers
        nk, nv = torch.randn(3, 2, 1, 5, generator=gen), torch.randn(3, 2, 1, 5, generator=gen)
        k, v = torch.cat([k, nk], -2), torch.cat([v, nv], -2)
        got_k, got_v = layer.update(nk, nv)
        assert torch.equal(got_k, k) and torch.equal(got_v, v)
        assert layer.get_seq_length() == k.shape[-2] == layer.get_mask_sizes(1)[0] - 1
    layer.crop(-2)
    kept = torch.tensor([2, 0])
    layer.batch_select_indices(kept)
    assert torch.equal(layer.keys, k[kept, :, :-2]) and torch.equal(layer.values, v[kept, :, :-2])
    nk = torch.randn(2, 2, 1, 5, generator=gen)
    got_k, _ = layer.update(nk, nk)
    assert torch.equal(got_k, torch.cat([k[kept, :, :-2], nk], -2))


def test_top_p_keeps_the_smallest_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # mass before each token (sorted): 0, .5, .8, .95 -> top_p=.7 keeps the first two.
    assert torch.equal(_top_p(probs, 0.7) > 0, torch.tensor([[True, True, False, False]]))
    assert torch.equal(_top_p(probs, 0.5) > 0, torch.tensor([[True, False, False, False]]))
    tok, lp, ent = sample_next(torch.log(probs), temperature=1.0, top_p=0.45, greedy=False)
    assert int(tok) == 0 and torch.isclose(lp, torch.log(torch.tensor(0.5)))
    # H = -sum p log p of the untruncated distribution.
    assert torch.isclose(ent, -(probs * probs.log()).sum(-1)).all()


def test_left_pad_and_concat() -> None:
    ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    a = Rollouts(
        ids,
        mask,
        torch.tensor([[9, 2], [9, 0]]),
        torch.tensor([[1.0, 1], [1, 0]]),
        torch.zeros(2, 2),
        torch.zeros(2, 2),
        torch.tensor([False, True]),
        3,
    )
    b = Rollouts(
        ids[:1, 1:],
        mask[:1, 1:],
        torch.tensor([[4, 4, 2]]),
        torch.ones(1, 3),
        torch.zeros(1, 3),
        torch.zeros(1, 3),
        torch.tensor([False]),
        3,
    )
    c = concat_rollouts([a, b], pad_id=0)
    assert c.prompt_ids.tolist() == [[5, 6], [0, 7], [0, 6]]
    assert c.response_ids.tolist() == [[9, 2, 0], [9, 0, 0], [4, 4, 2]]
    assert c.generated_tokens == 6 and c.lengths.tolist() == [2, 1, 3]


def _spread_token(r: Rollouts) -> int:
    """The token whose first occurrence falls at the most different steps across rows: taken
    as EOS, it ends rows at different steps (the untrained model rarely samples its own)."""
    firsts: dict[int, set[int]] = {}
    for row in r.response_ids.tolist():
        seen: set[int] = set()
        for t, token in enumerate(row):
            if token not in seen:
                seen.add(token)
                firsts.setdefault(token, set()).add(t)
    return max(firsts, key=lambda token: (len(firsts[token]), -token))


def _batch_sizes(model) -> tuple[list[int], object]:
    sizes: list[int] = []
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda _m, args: sizes.append(args[0].shape[0])
    )
    return sizes, hook


@pytest.mark.parametrize("lean", [True, False])
def test_ended_rows_leave_the_decode_batch_and_change_nothing(tiny, lean) -> None:
    """Rows that sampled EOS are dropped from the model's batch (and their KV cache rows),
    and every row decodes what it decodes when all rows stay to the end."""
    model, tok = tiny
    p = [
        tok(f"Q:{a}+{b}=?\n", add_special_tokens=False)["input_ids"]
        for a in range(4)
        for b in (1, 22, 333)
    ]
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    full = HFEngine(model, tok, lean_decode=lean, compact_decode=False)
    eos = _spread_token(full.generate(p, greedy))
    compact = HFEngine(model, tok, lean_decode=lean)
    full.eos_id = compact.eos_id = eos
    sizes, hook = _batch_sizes(model)
    try:
        kept = full.generate(p, greedy)
        every = list(sizes)
        sizes.clear()
        dropped = compact.generate(p, greedy)
    finally:
        hook.remove()
    assert set(every) == {len(p)}
    assert sizes[0] == len(p) and min(sizes) < 0.75 * len(p)  # the batch shrank
    assert sizes == sorted(sizes, reverse=True)
    assert len(set(dropped.lengths.tolist())) > 1  # rows ended at different steps
    assert torch.equal(dropped.response_ids, kept.response_ids)
    assert torch.equal(dropped.response_mask, kept.response_mask)
    assert torch.equal(dropped.truncated, kept.truncated)
    torch.testing.assert_close(dropped.logp, kept.logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(dropped.entropies, kept.entropies, atol=1e-5, rtol=0)


def test_sampled_logprobs_after_rows_leave_match_the_full_forward(tiny) -> None:
    """Sampling with a shrinking batch: each row's recorded log-probs are still its own
    (its KV cache rows stayed aligned), as a full forward over the finished rows computes."""
    model, tok = tiny
    p = prompts(tok) * 6
    params = SamplingParams(max_new_tokens=16, temperature=0.8)
    probe = HFEngine(model, tok, compact_decode=False, generator=torch.Generator().manual_seed(0))
    engine = HFEngine(model, tok, generator=torch.Generator().manual_seed(0))
    engine.eos_id = _spread_token(probe.generate(p, params))
    sizes, hook = _batch_sizes(model)
    try:
        r = engine.generate(p, params)
    finally:
        hook.remove()
    assert min(sizes) < len(p)
    assert_matches_full_forward(model, r, temperature=0.8)
    pad = ~r.response_mask.bool()
    assert (r.logp[pad] == 0).all() and (r.response_ids[pad] == tok.pad_token_id).all()


def test_kept_caches_and_hidden_states_keep_every_row(tiny) -> None:
    """Where the caller reads the cache afterwards (tree forks) or one hidden state per row
    and step (GAR), no row leaves the batch."""
    model, tok = tiny
    p = prompts(tok) * 4
    greedy = SamplingParams(max_new_tokens=10, greedy=True)
    engine = HFEngine(model, tok)
    engine.eos_id = _spread_token(HFEngine(model, tok).generate(p, greedy))
    sizes, hook = _batch_sizes(model)
    try:
        r, kept = engine.generate_with_cache(p, greedy)
        # (the prefill runs once per distinct prompt: 3 rows)
        assert set(sizes[1:]) == {len(p)} and len(set(r.lengths.tolist())) > 1
        assert kept.caches[0].layers[0].keys.shape[0] == len(p)
        sizes.clear()
        engine.generate(p, SamplingParams(max_new_tokens=10, greedy=True, with_hidden=True))
        assert set(sizes[1:]) == {len(p)}
    finally:
        hook.remove()
