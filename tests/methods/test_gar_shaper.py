"""The `gar` shaper on hand-made batches with the tiny model: rewards against an independent
computation (full-logit forward + autograd at the LM head), cost (one anchor pass per prompt,
no signal for wrong rollouts), engine-recorded vs teacher-forced hidden states, several and
auxiliary anchors, reasoning spans; composition with presets, the recipe, and a training step."""

import json
import math
import re
from dataclasses import replace

import pytest
import torch
from torch.nn import functional as F

import policyopt.methods.gar.shaper as shaper_mod
from policyopt.methods.gar import GARShaper
from policyopt.methods.gar.spans import token_spans
from policyopt.models.loading import load_model
from policyopt.models.logprobs import naive_response_logprobs, response_logprobs
from policyopt.rewards.shaping import SHAPERS, ShapingContext
from policyopt.rollout.base import ENGINES, Rollouts, SamplingParams
from policyopt.train.batch import Batch
from run_configs import small_overrides

torch.set_num_threads(1)


SOLUTION = {
    "Q:3+4=?\n": "3+4=7. A:7",
    "Q:(9-2)+5=?\n": "9-2=7. 7+5=12. A:12",
    "Q:8+8=?\n": "8+8=16. A:16",
}
# (prompt, completion, correct): group 0 has three correct, group 1 one, group 2 none.
BATCH = [
    ("Q:3+4=?\n", "3+4=7. A:7", True),  # the expert solution itself
    ("Q:3+4=?\n", "4+3=7. A:7", True),
    ("Q:3+4=?\n", "A:7", True),
    ("Q:3+4=?\n", "3+4=8. A:8", False),
    ("Q:(9-2)+5=?\n", "7+5=12. A:12", True),
    ("Q:(9-2)+5=?\n", "A:3", False),
    ("Q:8+8=?\n", "A:1", False),
    ("Q:8+8=?\n", "8+8=15. A:15", False),
]
GROUPS = [0, 0, 0, 0, 1, 1, 2, 2]


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model("tiny")
    torch.manual_seed(0)
    with torch.no_grad():  # the saved tiny model is untrained: spread its head a little
        model.lm_head.weight.mul_(3.0)
    return model.eval(), tokenizer


def encode(tok, text, eos=False):
    return tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])


def make_ctx(model, tok, batch=BATCH, groups=GROUPS, columns=None, step=0, with_hidden=False):
    prompts = [encode(tok, p) for p, _, _ in batch]
    answers = [encode(tok, c, eos=True) for _, c, _ in batch]
    p_width, r_width = max(map(len, prompts)), max(map(len, answers))
    n = len(batch)
    prompt_ids = torch.zeros(n, p_width, dtype=torch.long)
    prompt_mask = torch.zeros(n, p_width, dtype=torch.long)
    response_ids = torch.zeros(n, r_width, dtype=torch.long)
    response_mask = torch.zeros(n, r_width)
    for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        prompt_ids[i, p_width - len(p) :] = torch.tensor(p)
        prompt_mask[i, p_width - len(p) :] = 1
        response_ids[i, : len(a)] = torch.tensor(a)
        response_mask[i, : len(a)] = 1
    rollouts = Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logp=torch.zeros(n, r_width),
        entropies=torch.zeros(n, r_width),
        truncated=torch.zeros(n, dtype=torch.bool),
        generated_tokens=int(response_mask.sum()),
    )
    if with_hidden:  # as an engine would record them: teacher-forced, masked
        with torch.no_grad():
            out = naive_response_logprobs(
                model, rollouts.input_ids(), rollouts.attention_mask(), r_width, with_hidden=True
            )
        rollouts.hidden = out.hidden * response_mask[..., None]
    if columns is None:
        columns = {"solution": [SOLUTION[p] for p, _, _ in batch]}
    round_ = Batch(
        rollouts=rollouts,
        group_ids=torch.tensor(groups),
        prompts=[p for p, _, _ in batch],
        completions=[c for _, c, _ in batch],
        columns=columns,
        correct=torch.tensor([c for _, _, c in batch]),
    )
    return ShapingContext(
        round_,
        step=step,
        total_steps=10,
        model=model,
        tokenizer=tok,
        logit_chunk_size=5,
    )


def with_round(ctx, **fields):
    """`ctx` over a copy of its round with `fields` replaced."""
    return replace(ctx, batch=replace(ctx.batch, **fields))


def reference_signal(model, tok, prompt, answer, span=None):
    """v by the long way: full-logit forward, LM-head input by hook, autograd at the head."""
    p, a = encode(tok, prompt), encode(tok, answer, eos=True)
    ids = torch.tensor([p + a])
    with torch.no_grad():
        out = naive_response_logprobs(model, ids, torch.ones_like(ids), len(a), with_hidden=True)
    h, y = out.hidden[0], torch.tensor(a)
    if span is not None:
        h, y = h[span[0] : span[1]], y[span[0] : span[1]]
    h = h.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(model.lm_head(h), y), h)
    s_bar = (grad * h).mean(0)
    return (s_bar / s_bar.norm()).detach()


def reference_rewards(cosines, correct, groups, r_base=1.0, beta=0.5):
    """SPEC §3 steps 5-6 by a plain loop."""
    out = []
    for i, ok in enumerate(correct):
        if not ok:
            out.append(0.0)
            continue
        mates = [cosines[j] for j in range(len(correct)) if correct[j] and groups[j] == groups[i]]
        centred = cosines[i] - (sum(mates) / len(mates) if len(mates) > 1 else 0.0)
        out.append(r_base + beta * max(0.0, centred))
    return torch.tensor(out)


@pytest.mark.parametrize("with_hidden", [True, False])
def test_rewards_match_an_independent_computation(tiny, with_hidden):
    model, tok = tiny
    ctx = make_ctx(model, tok, with_hidden=with_hidden)
    rewards, metrics = SHAPERS.get("gar")()(torch.zeros(len(BATCH)), ctx)
    correct = [c for _, _, c in BATCH]
    cosines = [
        float(reference_signal(model, tok, p, c) @ reference_signal(model, tok, p, SOLUTION[p]))
        if ok
        else math.nan
        for p, c, ok in BATCH
    ]
    assert cosines[0] == pytest.approx(1.0, abs=1e-5)  # the expert's own text aligns exactly
    assert len({round(c, 3) for c in cosines[:3]}) == 3  # the three correct ones differ
    expected = reference_rewards(cosines, correct, GROUPS)
    torch.testing.assert_close(rewards, expected, rtol=1e-4, atol=1e-5)
    assert rewards[4] == pytest.approx(1.0 + 0.5 * max(0.0, cosines[4]), abs=1e-5)  # alone
    known = [c for c in cosines if not math.isnan(c)]
    assert metrics["gar/cosine_correct_mean"] == pytest.approx(sum(known) / 4, abs=1e-5)
    bonus = (expected - 1.0)[torch.tensor(correct)]
    assert metrics["gar/bonus_mean"] == pytest.approx(float(bonus.mean()), abs=1e-5)
    assert metrics["gar/fraction_rewarded"] == float((bonus > 1e-6).float().mean())
    assert metrics["gar/anchor_sequences"] == 2.0


def test_cost_one_anchor_pass_per_prompt_and_no_signal_for_wrong_rollouts(tiny, monkeypatch):
    model, tok = tiny
    forwarded, signals = [], []
    forward, signal = shaper_mod.teacher_forced_hidden, shaper_mod.batched_gradient_signal

    def count_forward(model, ids, *args, **kwargs):
        forwarded.append(len(ids))
        return forward(model, ids, *args, **kwargs)

    def count_signals(hidden, *args):
        signals.append(len(hidden))
        return signal(hidden, *args)

    monkeypatch.setattr(shaper_mod, "teacher_forced_hidden", count_forward)
    monkeypatch.setattr(shaper_mod, "batched_gradient_signal", count_signals)
    shaper = GARShaper()
    ctx = make_ctx(model, tok, with_hidden=True)
    shaper(torch.zeros(len(BATCH)), ctx)
    # prompts with a correct rollout: 2 (group 2 has none), so 2 anchors; the first prompt's
    # expert solution was sampled (BATCH[0]) and takes that rollout's v: one teacher-forced
    # row, and signals for the 4 correct rollouts and that 1 anchor only.
    assert forwarded == [1]
    assert signals == [4, 1]
    # same step again: anchors come from the cache
    _, metrics = shaper(torch.zeros(len(BATCH)), ctx)
    assert forwarded == [1] and metrics["gar/anchor_sequences"] == 0.0
    # next step: the policy moved, anchors are recomputed
    _, metrics = shaper(torch.zeros(len(BATCH)), replace(ctx, step=1))
    assert forwarded == [1, 1] and metrics["gar/anchor_sequences"] == 2.0
    assert metrics["gar/anchors_sampled"] == 1.0
    # nothing correct: no pass at all, everyone gets 0
    none = replace(
        ctx, step=2, batch=replace(ctx.batch, correct=torch.zeros(len(BATCH), dtype=torch.bool))
    )
    rewards, metrics = shaper(torch.ones(len(BATCH)), none)
    assert forwarded == [1, 1] and torch.equal(rewards, torch.zeros(len(BATCH)))
    assert metrics["gar/bonus_mean"] == 0.0 and metrics["gar/fraction_rewarded"] == 0.0


def test_engine_hidden_states_match_a_teacher_forced_pass(tiny):
    model, tok = tiny
    engine = ENGINES.get("hf")(model, tok, generator=torch.Generator().manual_seed(0))
    prompts = [encode(tok, "Q:3+4=?\n")] * 3 + [encode(tok, "Q:(9-2)+5=?\n")] * 3
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=10, with_hidden=True))
    assert rollouts.hidden is not None
    ctx = make_ctx(model, tok)
    texts = tok.batch_decode(rollouts.response_ids.tolist(), skip_special_tokens=True)
    ctx = with_round(
        ctx,
        rollouts=rollouts,
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
        correct=torch.tensor([True, True, False, True, True, True]),
        completions=texts,
        prompts=["Q:3+4=?\n"] * 3 + ["Q:(9-2)+5=?\n"] * 3,
        columns={"solution": [SOLUTION["Q:3+4=?\n"]] * 3 + [SOLUTION["Q:(9-2)+5=?\n"]] * 3},
    )
    shaper = GARShaper()
    recorded = shaper._cosines(torch.tensor([0, 1, 3, 4, 5]), ctx)[0]
    forced = shaper._cosines(
        torch.tensor([0, 1, 3, 4, 5]), with_round(ctx, rollouts=replace(rollouts, hidden=None))
    )[0]
    torch.testing.assert_close(recorded, forced, rtol=1e-4, atol=1e-4)
    assert recorded.std() > 1e-3  # not trivially equal


@pytest.mark.parametrize("with_hidden", [True, False])
def test_an_anchor_sampled_verbatim_takes_the_rollout_s_signal(tiny, with_hidden):
    """A correct rollout that is the expert solution + EOS token for token gives v_a without
    a pass, equal to the teacher-forced v_a up to rounding; the same text cut before EOS (a
    truncated rollout) or under another prompt does not count."""
    model, tok = tiny
    batch = [
        ("Q:3+4=?\n", "3+4=7. A:7", True),  # verbatim: reused
        ("Q:(9-2)+5=?\n", "7+5=12. A:12", True),
        ("Q:8+8=?\n", "9-2=7. 7+5=12. A:12", True),  # prompt 2's solution under prompt 3
    ]
    ctx = make_ctx(model, tok, batch=batch, groups=[0, 1, 2], with_hidden=with_hidden)
    shaper = GARShaper()
    _, metrics = shaper(torch.zeros(3), ctx)
    assert metrics["gar/anchor_sequences"] == 3.0 and metrics["gar/anchors_sampled"] == 1.0
    key = (tuple(encode(tok, "Q:3+4=?\n")), SOLUTION["Q:3+4=?\n"])
    weight, bias = shaper_mod.output_layer(model)
    with torch.no_grad():
        forced = shaper._anchor_signals([key], shaper._answer_ids([key], ctx), ctx, weight, bias)[
            key
        ]
    torch.testing.assert_close(shaper._cache[key], forced, rtol=1e-5, atol=1e-6)
    # cut before EOS (as truncated at max_new_tokens): a teacher-forced pass after all
    cut = replace(ctx.rollouts, response_mask=ctx.rollouts.response_mask.clone())
    cut.response_mask[0, len(encode(tok, batch[0][1])) :] = 0
    _, metrics = GARShaper()(torch.zeros(3), with_round(ctx, rollouts=cut))
    assert metrics["gar/anchors_sampled"] == 0.0


def test_teacher_forced_hidden_is_response_logprobs_hidden(tiny):
    """The anchor pass runs the trunk alone: the hidden states `response_logprobs` returns
    for the same [left-padded prompt | right-padded answer] rows, without its log-probs."""
    model, tok = tiny
    ids, mask, width = shaper_mod._pack(
        [encode(tok, "Q:3+4=?\n"), encode(tok, "Q:(9-2)+5=?\n")],
        [encode(tok, "3+4=7. A:7", eos=True), encode(tok, "A:12", eos=True)],
        tok.pad_token_id,
    )
    with torch.no_grad():
        expected = response_logprobs(model, ids, mask, width, with_hidden=True).hidden
    got = shaper_mod.teacher_forced_hidden(model, ids, mask, width)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)  # (equal bits today)


def test_best_cosine_equals_a_loop_over_rollouts():
    """`_best` (one product over the distinct anchors, masked max) against the per-rollout
    loop: several anchors, shared anchors, a rollout without any (NaN)."""
    torch.manual_seed(0)
    shaper = GARShaper()

    def unit(n):
        return F.normalize(torch.randn(n, 16), dim=-1)

    keys = [((1,), "a"), ((1,), "b"), ((2,), "a"), ((3,), "c")]  # (prompt ids, solution)
    shaper._cache = dict(zip(keys, unit(4), strict=True))
    prompts = [(1,), (1,), (2,), (4,), (3,), (2,)]
    texts = [["a", "b"], ["b"], ["a"], [], ["c"], ["a"]]
    v = unit(len(prompts))
    best = shaper._best(v, prompts, texts)
    for i, (p, ts) in enumerate(zip(prompts, texts, strict=True)):
        if not ts:
            assert math.isnan(best[i])
            continue
        loop = max(float(shaper._cache[(p, t)] @ v[i]) for t in ts)
        assert float(best[i]) == pytest.approx(loop, abs=1e-6)


def test_spans_without_a_pattern_read_no_token_ids():
    """No span_regex: spans come from lengths alone (nothing decoded), as token_spans'."""
    shaper = GARShaper(max_span_tokens=3)

    def ids():
        raise AssertionError("token ids read without a span_regex")

    lengths = [5, 2, 0, 3]
    spans, fallbacks = shaper._spans(ids, lengths, ctx=None)
    expected = token_spans([[0] * n for n in lengths], lambda _: "", None, 3)
    assert (spans, fallbacks) == expected == ([(2, 5), (0, 2), (0, 0), (0, 3)], 0)


def test_several_and_auxiliary_anchors(tiny):
    model, tok = tiny
    second = {"Q:3+4=?\n": "4+3=7. A:7", "Q:(9-2)+5=?\n": "9-2=7. 5+7=12. A:12"}
    second["Q:8+8=?\n"] = "8*2=16. A:16"
    teacher = {p: "A:" + s.split("A:")[1] for p, s in SOLUTION.items()}
    columns = {
        # a third entry repeats the first up to whitespace: dropped
        "solution": [[SOLUTION[p], second[p], SOLUTION[p].replace(" ", "  ")] for p, _, _ in BATCH],
        "teacher": [teacher[p] for p, _, _ in BATCH],
    }
    ctx = make_ctx(model, tok, columns=columns)
    rewards, metrics = GARShaper(aux_column="teacher", aux_weight=0.5)(torch.zeros(len(BATCH)), ctx)
    assert metrics["gar/anchor_sequences"] == 6.0  # 2 prompts x (2 distinct main + 1 aux)
    cosines = []
    for p, c, ok in BATCH:
        if not ok:
            cosines.append(math.nan)
            continue
        v = reference_signal(model, tok, p, c)
        main = max(float(v @ reference_signal(model, tok, p, s)) for s in (SOLUTION[p], second[p]))
        aux = float(v @ reference_signal(model, tok, p, teacher[p]))
        cosines.append(main + 0.5 * max(0.0, aux - main))
    expected = reference_rewards(cosines, [c for _, _, c in BATCH], GROUPS)
    torch.testing.assert_close(rewards, expected, rtol=1e-4, atol=1e-5)
    # max_anchors=1 keeps the first solution only
    _, metrics = GARShaper(max_anchors=1)(
        torch.zeros(len(BATCH)), make_ctx(model, tok, columns=columns)
    )
    assert metrics["gar/anchor_sequences"] == 2.0


def test_reasoning_span_and_cap(tiny):
    model, tok = tiny
    # the span is what comes before " A:"; "A:7" has none (falls back to the whole answer)
    shaper = GARShaper(span_regex=r"^(.*?) A:", max_span_tokens=4)
    ctx = make_ctx(model, tok)
    rewards, metrics = shaper(torch.zeros(len(BATCH)), ctx)
    assert metrics["gar/span_fallback_fraction"] == pytest.approx(1 / 4)

    def span(text):  # character tokenizer: characters are tokens; keep the last 4
        match = re.match(r"^(.*?) A:", text)
        end = match.end(1) if match else len(text) + 1  # fallback: all tokens incl. EOS
        return max(0, end - 4), end

    cosines = []
    for p, c, ok in BATCH:
        v = reference_signal(model, tok, p, c, span(c))
        va = reference_signal(model, tok, p, SOLUTION[p], span(SOLUTION[p]))
        cosines.append(float(v @ va) if ok else math.nan)
    expected = reference_rewards(cosines, [c for _, _, c in BATCH], GROUPS)
    torch.testing.assert_close(rewards, expected, rtol=1e-4, atol=1e-5)


def test_missing_solutions(tiny):
    model, tok = tiny
    columns = {"solution": [None if p == "Q:3+4=?\n" else SOLUTION[p] for p, _, _ in BATCH]}
    rewards, _ = GARShaper()(torch.zeros(len(BATCH)), make_ctx(model, tok, columns=columns))
    assert rewards[:3].tolist() == [1.0, 1.0, 1.0]  # correct, no anchor: r_base
    assert rewards[3] == 0.0
    with pytest.raises(KeyError, match="solution_text"):
        GARShaper(solution_column="solution_text")(torch.zeros(len(BATCH)), make_ctx(model, tok))
    with pytest.raises(TypeError):
        SHAPERS.get("gar")(betta=1.0)
    with pytest.raises(ValueError, match="beta"):
        GARShaper(beta=-1.0)


def test_preset_recipe_and_composition():
    from policyopt.config.load import load_config
    from policyopt.methods import PRESETS
    from policyopt.recipes import recipe_dict
    from policyopt.train.parts import needs_hidden

    grpo = {k: v for k, v in PRESETS.get("grpo")["algorithm"].items() if k != "name"}
    gar = load_config(overrides=["algorithm.name=gar"])
    assert {k: getattr(gar.algorithm, k) for k in grpo} == grpo
    assert [s.name for s in gar.reward.shapers] == ["gar"] and needs_hidden(gar)
    for preset in ("grpo", "reinforce_pp", "dapo", "hispo"):  # one key turns it on
        config = load_config(overrides=[f"algorithm.name={preset}", "reward.shapers=[{name: gar}]"])
        assert needs_hidden(config) and config.algorithm.name == preset
    assert not needs_hidden(load_config(overrides=["algorithm.name=grpo"]))
    recipe, base = recipe_dict("gar"), recipe_dict("grpo")
    config = load_config(None, [], base=recipe)
    assert config.algorithm.name == "gar" and [s.name for s in config.reward.shapers] == ["gar"]
    for section in ("train", "rollout", "sft", "eval", "optim", "task", "model"):
        assert recipe[section] == base[section]


def _records(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def small_config(output_dir, *extra, steps):
    from policyopt.config.load import load_config

    return load_config(overrides=[*small_overrides(output_dir, steps), *extra])


def test_training_steps_end_to_end(tmp_path):
    from policyopt.train.trainer import Trainer

    # The task's verifier: the untrained model is never correct, so no anchor is formed.
    trainer = Trainer(
        small_config(
            tmp_path / "task",
            "algorithm.name=gar",
            "reward.functions=[{name: task}]",
            "reward.correct_threshold=1.0",
            steps=1,
        )
    )
    metrics = trainer.train()
    trainer.close()
    assert metrics["accuracy"] == 0.0 and metrics["gar/anchor_sequences"] == 0.0
    assert metrics["reward/shaped_mean"] == 0.0
    # digit-fraction reward with a low threshold: some rollouts count as correct, so anchors
    # are formed and the shaped rewards (r_base + bonus) train the policy.
    trainer = Trainer(
        small_config(
            tmp_path / "digits", "algorithm.name=gar", "reward.correct_threshold=0.1", steps=2
        )
    )
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    trainer.close()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    records = _records(tmp_path / "digits")
    assert sum(r["gar/anchor_sequences"] for r in records) > 0
    for r in records:
        for key in ("gar/cosine_correct_mean", "gar/bonus_mean", "gar/fraction_rewarded"):
            assert key in r
        assert 1.0 * r["accuracy"] <= r["reward/shaped_mean"] <= 1.5 * r["accuracy"] + 1e-6
