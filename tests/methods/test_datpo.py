"""DATPO without a model: the adaptive budget, fork points, block advantages on a hand-built
tree, the sibling-diversity bonus by hand, the preset and the recipe."""

import math

import pytest
import torch

from policyopt.config.load import load_config
from policyopt.core import ADVANTAGES, compute_advantages
from policyopt.methods.datpo import adaptive_budget
from policyopt.methods.datpo.diversity import SiblingDiversity, diversity_coef, sibling_distance
from policyopt.methods.datpo.forks import candidate_scores, choose_forks, sentence_starts
from policyopt.methods.datpo.tree_blocks import siblings, tree_blocks
from policyopt.recipes import recipe_dict
from policyopt.rewards.shaping import SHAPERS, ShapingContext
from policyopt.rollout.base import Rollouts
from policyopt.train.batch import Batch

torch.set_num_threads(1)


# ------------------------------------------------------------------ budget
def test_adaptive_budget_by_hand():
    assert adaptive_budget(0.0, 2, 4) == (2, 4)
    assert adaptive_budget(1.0, 2, 4) == (0, 0)  # solved: no tree
    assert adaptive_budget(0.75, 2, 4) == (1, 1)  # ceil(0.5), ceil(1.0): no rounding up
    assert adaptive_budget(0.5, 2, 4) == (1, 2)
    assert adaptive_budget(0.25, 2, 4) == (2, 3)  # ceil(1.5), ceil(3)
    assert adaptive_budget(0.9, 3, 10) == (1, 1)  # ceil(0.3), ceil(1.0)
    assert adaptive_budget(0.99, 2, 4) == (1, 1)
    assert adaptive_budget(1.7, 2, 4) == (0, 0) and adaptive_budget(-1.0, 2, 4) == (2, 4)
    with pytest.raises(ValueError):
        adaptive_budget(float("nan"), 2, 4)


# ------------------------------------------------------------------ forks
def chars(text: str) -> list[str]:
    return list(text)


def test_sentence_starts_on_the_task_style_and_tricky_text():
    text = "7+12=19. 19-5=14. A:23"
    assert sentence_starts(chars(text)) == [0, 9, 18]
    assert sentence_starts(chars(" 3.5 is x. Why? Yes!\nok")) == [0, 11, 16, 21]
    # Word pieces: a sentence starts at the token holding its first character.
    assert sentence_starts(["Hi", ".", " The", " end", ".", "", ""]) == [0, 2]
    assert sentence_starts(chars("no end")) == [0]
    # pysbd: abbreviations and decimals do not end a sentence; a newline does.
    assert sentence_starts(chars("Dr. Smith adds 2.5 kg. He is done.\nOk")) == [0, 23, 35]


def test_fork_candidates_skip_the_first_sentence_and_rank_by_mean_entropy():
    text = "7+12=19. 19-5=14. A:23"
    entropy = torch.zeros(len(text) + 1)  # + EOS (piece "")
    entropy[:9] = 5.0  # the first sentence is the most uncertain, but starts at the root
    entropy[9:18] = torch.tensor([1.0, 3.0] * 4 + [1.0])  # mean 17/9
    entropy[18:] = 1.5
    cands = candidate_scores([*chars(text), ""], entropy)
    assert [c[0] for c in cands] == [9, 18]
    assert cands[0][1] == pytest.approx(17 / 9) and cands[1][1] == pytest.approx(1.5)
    assert choose_forks(cands, 1) == [9]
    assert choose_forks(cands, 2) == [9, 18] and choose_forks(cands, 5) == [9, 18]
    assert choose_forks(cands, 0) == []
    tokens = candidate_scores(["a", "b", "c"], torch.tensor([0.1, 0.9, 0.4]), "token")
    assert tokens == [(1, pytest.approx(0.9)), (2, pytest.approx(0.4))]
    assert choose_forks(tokens, 1) == [1]
    with pytest.raises(ValueError, match="fork_unit"):
        candidate_scores(["a"], torch.zeros(1), "word")


# ------------------------------------------------------------------ the hand-built tree
# Group 0 (prompt 0): base A forks twice; branch A1 leaves it after block a0, branch A2 after
# a1; base B has no fork. Group 1 reuses block ids 0 and 1 for two one-block rows.
#   row  path            R      ids: a0=0 a1=1 a2=2 c=3 d=4 b0=5
#   A    a0 a1 a2        1
#   A1   a0 c            0
#   A2   a0 a1 d         1
#   B    b0              0
#   G1a  (0)             1
#   G1b  (1)             0.3
BLOCKS = torch.tensor(
    [
        [0, 0, 1, 1, 2, 2],
        [0, 0, 3, 3, 3, -1],
        [0, 0, 1, 1, 4, -1],
        [5, 5, 5, -1, -1, -1],
        [0, 0, -1, -1, -1, -1],
        [1, 1, 1, 1, -1, -1],
    ]
)
MASK = (BLOCKS >= 0).float()
GROUPS = torch.tensor([7, 7, 7, 7, 9, 9])
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.3])
# V(root_0) = 1/2; V(after a0) = mean(A, A1, A2) = 2/3; V(after a1) = mean(A, A2) = 1.
# A(a0) = 2/3 - 1/2 = 1/6; A(a1) = 1 - 2/3 = 1/3; A(a2) = 1 - 1 = 0; A(c) = 0 - 2/3;
# A(d) = 1 - 1 = 0; A(b0) = 0 - 1/2. Group 1: V(root_1) = 0.65, A = +0.35, -0.35.
BY_BLOCK = {"a0": 1 / 6, "a1": 1 / 3, "a2": 0.0, "c": -2 / 3, "d": 0.0, "b0": -0.5}
EXPECTED = torch.tensor(
    [
        [1 / 6, 1 / 6, 1 / 3, 1 / 3, 0.0, 0.0],
        [1 / 6, 1 / 6, -2 / 3, -2 / 3, -2 / 3, 0.0],
        [1 / 6, 1 / 6, 1 / 3, 1 / 3, 0.0, 0.0],
        [-0.5, -0.5, -0.5, 0.0, 0.0, 0.0],
        [0.35, 0.35, 0.0, 0.0, 0.0, 0.0],
        [-0.35, -0.35, -0.35, -0.35, 0.0, 0.0],
    ]
)


def test_block_advantages_by_hand():
    adv = compute_advantages("datpo", REWARDS, GROUPS, block_ids=BLOCKS, response_mask=MASK)
    assert adv.shape == BLOCKS.shape
    torch.testing.assert_close(adv, EXPECTED)


def test_path_sums_telescope_to_reward_minus_root_value():
    adv = compute_advantages("datpo", REWARDS, GROUPS, block_ids=BLOCKS, response_mask=MASK)
    root = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.65, 0.65])
    for row in range(len(REWARDS)):
        ids = BLOCKS[row][MASK[row] > 0]
        firsts = [int((ids == b).nonzero()[0]) for b in torch.unique_consecutive(ids)]
        path_sum = float(adv[row][firsts].sum())  # one token per block on the path
        assert path_sum == pytest.approx(float(REWARDS[row] - root[row]), abs=1e-6)


def test_no_fork_is_reward_minus_group_mean_and_equal_rewards_give_exact_zeros():
    blocks = torch.tensor([[0, 0], [1, 1], [2, -1]])
    mask = (blocks >= 0).float()
    groups = torch.zeros(3, dtype=torch.long)
    rewards = torch.tensor([1.0, 0.0, 0.5])
    adv = compute_advantages("datpo", rewards, groups, block_ids=blocks, response_mask=mask)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0]]))
    flat = compute_advantages(
        "datpo", torch.full((3,), 0.1), groups, block_ids=blocks, response_mask=mask
    )
    assert torch.equal(flat, torch.zeros(3, 2))


def test_tree_structure_siblings_and_errors():
    tree = tree_blocks(BLOCKS, MASK, GROUPS)
    # Dense block order: (group 0: ids 0..5), then (group 1: ids 0, 1).
    assert tree.parent.tolist() == [-1, 0, 1, 0, 1, -1, -1, -1]
    sib = siblings(tree)
    pairs = {(i, j) for i, j in sib.nonzero().tolist()}
    # Siblings are the branches of one fork: a1 ~ c (after a0), a2 ~ d (after a1). The
    # blocks that start at a root (a0, b0; group 1's two) are base rollouts: not siblings.
    assert pairs == {(1, 3), (3, 1), (2, 4), (4, 2)}
    with pytest.raises(ValueError, match="two parents"):
        bad = torch.tensor([[0, 1], [2, 1]])
        tree_blocks(bad, torch.ones(2, 2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="block_ids"):
        ADVANTAGES.get("datpo")(REWARDS, GROUPS)


# ------------------------------------------------------------------ diversity bonus
def test_sibling_distance_by_hand():
    emb = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [3.0, 4.0]])
    sib = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    c = 1 - 1 / math.sqrt(2)  # 1 - cos 45°
    expected = torch.tensor([(1 + c) / 2, (1 + c) / 2, c, 0.0])
    torch.testing.assert_close(sibling_distance(emb, sib), expected)


def test_diversity_coef_anneals_linearly_from_0_2_to_0():
    assert diversity_coef(0, 5, 0.2, 0.0) == pytest.approx(0.2)
    assert diversity_coef(2, 5, 0.2, 0.0) == pytest.approx(0.1)
    assert diversity_coef(4, 5, 0.2, 0.0) == pytest.approx(0.0)
    assert diversity_coef(0, 1, 0.2, 0.0) == pytest.approx(0.2)


def test_bonus_only_on_positive_blocks_by_hand():
    # Per-block bonus values: a0 .1, a1 .2, a2 .3, c .4, d .5, b0 .6; group 1: .7, .8.
    values = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 4: 0.5, 5: 0.6}
    bonus = torch.zeros(BLOCKS.shape)
    for row in range(4):
        for t, b in enumerate(BLOCKS[row].tolist()):
            bonus[row, t] = values.get(b, 0.0) if b >= 0 else 0.0
    bonus[4, :2], bonus[5, :4] = 0.7, 0.8
    adv = compute_advantages(
        "datpo", REWARDS, GROUPS, block_ids=BLOCKS, response_mask=MASK, diversity_bonus=bonus
    )
    expected = EXPECTED.clone()
    expected[[0, 1, 2], :2] += 0.1  # a0: 1/6 > 0
    expected[[0, 2], 2:4] += 0.2  # a1: 1/3 > 0
    expected[4, :2] += 0.7  # group 1's winner; a2, d (0) and the negatives get nothing
    torch.testing.assert_close(adv, expected)


def shaping_context(step: int, total: int) -> ShapingContext:
    n, width = BLOCKS.shape
    rollouts = Rollouts(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        response_ids=torch.ones(n, width, dtype=torch.long),
        response_mask=MASK,
        logp=torch.zeros(n, width),
        entropies=torch.zeros(n, width),
        truncated=torch.zeros(n, dtype=torch.bool),
        generated_tokens=0,
        structure={"block_ids": BLOCKS},
    )
    round_ = Batch(rollouts, GROUPS, [""] * n, [""] * n, {}, correct=REWARDS > 0.5)
    return ShapingContext(round_, step=step, total_steps=total)


def test_shaper_writes_coef_times_sibling_distance_per_token(monkeypatch):
    shaper = SHAPERS.get("datpo_diversity")(embedder="policy")
    assert isinstance(shaper, SiblingDiversity)
    # Given embeddings per dense block (a0 a1 a2 c d b0 | g1 g1'): a1 ⟂ c, a2 at 45° from
    # d; the base rollouts' first blocks (a0, b0; group 1's two, opposite) have no siblings.
    emb = torch.tensor([[1.0, 0], [1, 0], [1, 1], [0, 1], [0, 1], [2, 0], [1, 0], [-1, 0]])
    monkeypatch.setattr(shaper, "embed", lambda tree, ctx: emb)
    ctx = shaping_context(step=1, total=3)  # λ = 0.2 · (1 − 1/2) = 0.1
    rewards, metrics = shaper(REWARDS, ctx)
    assert torch.equal(rewards, REWARDS)
    assert metrics["datpo/diversity_coef"] == pytest.approx(0.1)
    c = 1 - 1 / math.sqrt(2)
    per_block = {0: 0.0, 1: 1.0, 2: c, 3: 1.0, 4: c, 5: 0.0}  # by the block ids of group 0
    got = ctx.rollouts.structure["diversity_bonus"]
    for row in range(4):
        for t, b in enumerate(BLOCKS[row].tolist()):
            want = 0.1 * per_block[b] if b >= 0 else 0.0
            assert float(got[row, t]) == pytest.approx(want, abs=1e-6)
    assert float(got[4, 0]) == 0.0 and float(got[5, 3]) == 0.0
    with pytest.raises(ValueError, match="embedder"):
        SHAPERS.get("datpo_diversity")(embedder="bert")


# ------------------------------------------------------------------ preset and recipe
def test_preset_and_recipe(tmp_path):
    cfg = load_config(overrides=["algorithm.name=datpo"])
    assert cfg.algorithm.advantage == "datpo" and cfg.algorithm.loss == "ppo_clip"
    from policyopt.config.check import loss_settings

    assert loss_settings(cfg)["agg"] == "seq-mean-token-mean"
    assert cfg.rollout.strategy == "datpo_tree"
    assert cfg.rollout.strategy_options == {
        "n_base": 4,
        "k_max": 2,
        "b_max": 4,
        "fork_unit": "sentence",
    }
    assert [s.name for s in cfg.reward.shapers] == ["datpo_diversity"]
    recipe = load_config(base=recipe_dict("datpo"))
    grpo = load_config(base=recipe_dict("grpo"))
    assert recipe.algorithm.name == "datpo" and recipe.rollout.strategy == "datpo_tree"
    for section in ("train", "optim", "task", "model", "sft", "eval"):
        assert getattr(recipe, section) == getattr(grpo, section), section
    keys = ("group_size", "prompts_per_step", "max_new_tokens", "temperature")
    assert all(getattr(recipe.rollout, k) == getattr(grpo.rollout, k) for k in keys)
