"""Multi-turn rollouts: the layout by hand, the budgets, the masks every loss reads, and the
tiny model's log-probs across turns."""

from dataclasses import replace

import pytest
import torch

from episodes_for_tests import Scripted, ScriptedEngine, logp_of
from policyopt.config.load import ConfigError, load_config
from policyopt.core import POLICY_LOSSES, compute_policy_loss  # every loss registered
from policyopt.core.aggregation import global_normalisers
from policyopt.core.losses import LossInputs
from policyopt.core.structure import MissingStructureError
from policyopt.methods.hispo import build_segments
from policyopt.models.loading import load_model, load_tokenizer
from policyopt.models.logprobs import naive_response_logprobs, response_logprobs
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.hf_engine import HFEngine
from policyopt.rollout.multiturn import (
    ChatReplies,
    held_out_rollouts,
    multi_turn,
    run_episodes,
    turn_segments,
)
from policyopt.rollout.strategies import parallel
from policyopt.train.batch import trim
from policyopt.train.prompts import decode


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny")
    return model.eval(), tokenizer


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def two_episodes(tok, max_new_tokens: int = 8):
    """Episode 0: `ab</s>`, reply `=7\\n`, `c</s>`, done. Episode 1: `x</s>`, reply `=7\\n`,
    then `yzw</s>`, cut at the budget of 8 tokens after `yzw`."""
    engine = ScriptedEngine(tok, [["ab</s>", "x</s>"], ["c</s>", "yzw</s>"]])
    env = Scripted(["=7\n"])
    finished = []
    rollouts, turns = run_episodes(
        engine,
        env,
        [ids(tok, "Q:"), ids(tok, "Q:")],
        SamplingParams(max_new_tokens=max_new_tokens),
        max_turns=4,
        on_finished=lambda i, response: finished.append((i, response)),
    )
    return rollouts, turns, engine, env, finished


def test_episodes_are_laid_out_token_by_token(tok):
    r, turns, engine, env, finished = two_episodes(tok)
    eos = tok.eos_token_id
    a, b, c, x, y, z, w = (ids(tok, ch)[0] for ch in "abcxyzw")
    eq, seven, nl = ids(tok, "=7\n")
    assert r.response_ids.tolist() == [
        [a, b, eos, eq, seven, nl, c, eos],
        [x, eos, eq, seven, nl, y, z, w],
    ]
    assert r.response_mask.tolist() == [[1, 1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 1, 1, 1]]
    lp = [logp_of(t) for t in range(3)]
    expected = [
        [lp[0], lp[1], lp[2], 0, 0, 0, lp[0], lp[1]],
        [lp[0], lp[1], 0, 0, 0, lp[0], lp[1], lp[2]],
    ]
    torch.testing.assert_close(r.logp, torch.tensor(expected))
    assert r.entropies.tolist() == r.response_mask.tolist()  # the engine's 1, the reply's 0
    assert r.structure["turn_ids"].tolist() == [[1, 1, 1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 1, 2, 2, 2]]
    assert r.truncated.tolist() == [False, True]
    assert r.lengths.tolist() == [8, 8]
    assert r.attention_mask()[:, -8:].tolist() == [[1] * 8, [1] * 8]  # replies are read
    assert decode(tok, r) == ["ab=7\nc", "x=7\nyzw"]
    assert turns == [2, 2]
    # the environment read each finished turn's text; the cut turn never reached it
    assert env.seen == [["ab", "c"], ["x"]]
    # the second round continued each episode from its own tokens, never re-tokenized text
    assert engine.calls[1] == [
        ids(tok, "Q:") + [a, b, eos, eq, seven, nl],
        ids(tok, "Q:") + [x, eos, eq, seven, nl],
    ]
    assert finished == [(0, r.response_ids[0].tolist())]  # ended by the environment only
    # sampled: 3 + 2, then 2 and 3 (the round's largest room is 8 - 5 = 3: `yzw`, no EOS)
    assert r.generated_tokens == 3 + 2 + 2 + 3


def test_budgets_end_episodes_as_truncated(tok):
    prompt = ids(tok, "Q:")
    # max_turns: the environment wanted a second turn
    r, turns = run_episodes(
        ScriptedEngine(tok, [["ab</s>"]]),
        Scripted(["=7\n"]),
        [prompt],
        SamplingParams(max_new_tokens=20),
        max_turns=1,
    )
    assert r.truncated.tolist() == [True] and turns == [1]
    assert r.response_mask.tolist() == [[1, 1, 1]]  # the unread reply is not appended
    # no room for the reply and one more token: 3 + 3 = 6 = the budget
    r, _ = run_episodes(
        ScriptedEngine(tok, [["ab</s>"]]),
        Scripted(["=7\n"]),
        [prompt],
        SamplingParams(max_new_tokens=6),
        max_turns=4,
    )
    assert r.truncated.tolist() == [True] and r.lengths.tolist() == [3]
    # the environment ends the episode: not truncated
    r, _ = run_episodes(
        ScriptedEngine(tok, [["ab</s>"]]),
        Scripted([]),
        [prompt],
        SamplingParams(max_new_tokens=6),
        max_turns=4,
    )
    assert r.truncated.tolist() == [False]
    # a turn cut by max_turn_tokens is answered; one cut by the episode's budget is not
    r, turns = run_episodes(
        ScriptedEngine(tok, [["abcd</s>"], ["e</s>"]]),
        Scripted(["=1\n"]),
        [prompt],
        SamplingParams(max_new_tokens=20),
        max_turns=4,
        max_turn_tokens=2,
    )
    assert decode(tok, r) == ["ab=1\ne"] and r.truncated.tolist() == [False] and turns == [2]


def test_environment_tokens_carry_no_gradient_and_count_in_no_normaliser(tok):
    """Every registered loss on the hand layout: normalisers count the 5 + 5 model tokens,
    the gradient at the 3 + 3 reply tokens is 0, and what sits there changes nothing."""
    r, *_ = two_episodes(tok)
    mask = r.response_mask
    assert global_normalisers(mask) == (10, 2)
    adv = torch.tensor([1.0, -2.0])
    segments = build_segments(r.entropies, mask, alpha=0.1, quantile=0.6, window=64)
    cases = [
        ("ppo_clip", {"agg": "token-mean"}, {}),
        ("ppo_clip", {"agg": "seq-mean-token-mean"}, {}),
        ("ppo_clip", {"agg": "seq-mean-token-sum-norm"}, {}),
        ("gspo", {}, {}),
        ("gspo", {"variant": "token"}, {}),
        ("hispo", {}, {"segment_ids": segments, "entropies": r.entropies}),
    ]
    assert {name for name, _, _ in cases} == set(POLICY_LOSSES.names())
    for name, options, structure in cases:
        logp = r.logp.clone().requires_grad_(True)
        inputs = LossInputs(
            logp=logp, old_logp=r.logp, advantages=adv, mask=mask, structure=structure
        )
        loss, _ = compute_policy_loss(name, inputs, **options)
        loss.backward()
        env = mask == 0
        assert logp.grad[env].abs().max() == 0, name
        # by hand, on-policy (ratio 1): token-mean gives -A_i / N_tok per model token
        if options.get("agg") == "token-mean":
            expected = torch.where(env, 0.0, -adv[:, None] / 10)
            torch.testing.assert_close(logp.grad, expected)
        garbage = torch.where(env, torch.full_like(r.logp, 5.0), r.logp)
        moved = LossInputs(
            logp=garbage, old_logp=garbage - 3 * env, advantages=adv, mask=mask, structure=structure
        )
        assert compute_policy_loss(name, moved, **options)[0] == loss.detach(), name


def test_the_trainer_reads_the_replies_it_does_not_train_on(tok):
    r, *_ = two_episodes(tok)
    ids_, attention, width = trim(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    assert width == 8
    assert attention.tolist() == [[1, 1] + [1] * 8, [1, 1] + [1] * 8]
    assert torch.equal(ids_[:, -8:], r.response_ids)


def test_one_turn_episodes_are_parallel_rollouts_bit_for_bit(tiny):
    model, tok = tiny
    prompts = [ids(tok, "Q:1+2=?\n"), ids(tok, "Q:((7+12)-5)+9=?\n")]
    params = SamplingParams(max_new_tokens=12)
    engine = HFEngine(model, tok)
    torch.manual_seed(3)
    ref, ref_index = parallel(engine, prompts, params, group_size=3)
    torch.manual_seed(3)
    # an environment that ends every episode at its first turn
    got, index = multi_turn(engine, prompts, params, group_size=3, environment="calculator")
    mixed = [t for t in decode(tok, got) if t.lstrip().startswith("calc(")]
    assert not mixed  # the untrained model calls no tool: every episode is one turn
    assert torch.equal(index, ref_index)
    for field in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logp"):
        assert torch.equal(getattr(got, field), getattr(ref, field)), field
    assert torch.equal(got.entropies, ref.entropies) and torch.equal(got.truncated, ref.truncated)
    assert got.generated_tokens == ref.generated_tokens
    assert got.structure["turn_ids"].tolist() == got.response_mask.long().tolist()
    # the same loss, through the trainer's forward
    losses = []
    for r in (ref, got):
        x, m, w = trim(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
        logp = response_logprobs(model, x, m, w).logp
        inputs = LossInputs(
            logp=logp,
            old_logp=r.logp[:, :w],
            advantages=torch.linspace(-1, 1, len(r)),
            mask=r.response_mask[:, :w],
        )
        losses.append(compute_policy_loss("ppo_clip", inputs)[0])
    assert torch.equal(losses[0], losses[1])


def test_trainer_logprobs_equal_the_samplers_across_turns(tiny):
    """Episodes of 2-4 turns of the untrained model with replies in between: the log-probs
    of the whole episode recomputed by the trainer's forward equal the sampler's on every
    model token (to 1e-4); without reading the replies they would not."""
    model, tok = tiny
    prompts = [ids(tok, "Q:1+2=?\n"), ids(tok, "Q:3*4=?\n")]
    torch.manual_seed(0)
    r, turns = run_episodes(
        HFEngine(model, tok),
        Scripted(["=5\n", "=12\n", "=1\n"]),
        [p for p in prompts for _ in range(4)],
        SamplingParams(max_new_tokens=40, temperature=0.8),
        max_turns=4,
        max_turn_tokens=5,
    )
    width = r.response_ids.shape[1]
    replies = (r.response_mask == 0) & (r.attention_mask()[:, -width:] == 1)
    assert min(turns) >= 2 and replies.any()
    x, m, w = trim(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    trainer = response_logprobs(model, x, m, w, temperature=0.8).logp.detach()
    model_tokens = r.response_mask[:, :w].bool()
    assert (trainer - r.logp[:, :w])[model_tokens].abs().max() < 1e-4
    full = naive_response_logprobs(
        model, r.input_ids(), r.attention_mask(), r.response_ids.shape[1], temperature=0.8
    ).logp
    assert (full - r.logp)[r.response_mask.bool()].abs().max() < 1e-4
    # the replies matter: a forward that skips them gets other log-probs after the first turn
    skipping = torch.cat([r.prompt_mask, r.response_mask.long()], 1)
    blind = naive_response_logprobs(
        model, r.input_ids(), skipping, r.response_ids.shape[1], temperature=0.8
    ).logp
    later = r.response_mask.bool() & (r.structure["turn_ids"] >= 2)
    assert (blind - r.logp)[later].abs().max() > 1e-2


def test_chat_replies_are_the_template_text_after_the_end_of_turn(tok):
    chat = load_tokenizer("tiny")
    chat.chat_template = (
        "{% if tools %}[tools:{{ tools | length }}]</s>{% endif %}"
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}</s>{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    tools = ({"type": "function", "function": {"name": "calc"}},)
    replies = ChatReplies(chat, tools)
    got = replies(({"role": "tool", "content": "391"}, {"role": "tool", "content": "2"}))
    assert got == ids(chat, "[tool]391</s>[tool]2</s>[assistant]")
    assert got.count(chat.eos_token_id) == 2
    chat.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    with pytest.raises(ValueError, match="does not end an assistant turn with the EOS"):
        ChatReplies(chat, ())
    with pytest.raises(ValueError, match="no chat template"):
        ChatReplies(load_tokenizer("tiny"), ())


def test_what_multi_turn_cannot_carry_is_refused_by_name(tok):
    engine = ScriptedEngine(tok, [["a</s>"]])
    with pytest.raises(ValueError, match="reward shaper 'gar'"):
        run_episodes(
            engine, Scripted([]), [ids(tok, "Q:")], SamplingParams(with_hidden=True), max_turns=2
        )
    constrained = ScriptedEngine(tok, [["a</s>"]])
    plain = constrained.generate
    constrained.generate = lambda p, params, on_finished=None: replace(
        plain(p, params), allowed_bits=torch.zeros(len(p), 2, 4, dtype=torch.int32)
    )
    with pytest.raises(ValueError, match="cannot use a grammar-constrained engine"):
        run_episodes(constrained, Scripted([]), [ids(tok, "Q:")], SamplingParams(), max_turns=2)
    engine.tokenizer = None
    with pytest.raises(ValueError, match="needs an engine with a tokenizer"):
        run_episodes(engine, Scripted([]), [ids(tok, "Q:")], SamplingParams(), max_turns=2)


def test_held_out_episodes_are_one_per_prompt(tok):
    engine = ScriptedEngine(tok, [["calc(2*3)</s>", "A:7</s>"], ["A:6</s>", "x</s>"]])
    r = held_out_rollouts(
        engine,
        [ids(tok, "Q:2*3=?\n"), ids(tok, "Q:3+4=?\n")],
        SamplingParams(max_new_tokens=30, greedy=True),
        environment="calculator",
        max_turns=3,
    )
    assert decode(tok, r) == ["calc(2*3)=6\nA:6", "A:7"]
    assert r.truncated.tolist() == [False, False]


def test_turn_segments_are_the_model_s_turns_and_need_turn_ids(tok, tmp_path):
    r, *_ = two_episodes(tok)
    segments = turn_segments(r)["segment_ids"]
    assert segments.tolist() == [[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1]]
    # a config that names it without the strategy that makes turn_ids is refused at load
    overrides = ["rollout.annotators=[{name: turn_segments}]", "algorithm.loss=hispo"]
    with pytest.raises(MissingStructureError, match="rollout strategy 'multi_turn'"):
        load_config(overrides=[f"train.output_dir={tmp_path}", *overrides])
    config = load_config(
        overrides=[
            f"train.output_dir={tmp_path}",
            *overrides,
            "rollout.strategy=multi_turn",
            "rollout.strategy_options={environment: calculator}",
        ]
    )
    assert config.rollout.annotators[0].name == "turn_segments"


def test_an_unknown_environment_is_refused_at_load(tmp_path):
    with pytest.raises(
        ConfigError, match="unknown environment 'calcualtor'; did you mean 'calculator'"
    ):
        load_config(
            overrides=[
                f"train.output_dir={tmp_path}",
                "rollout.strategy=multi_turn",
                "rollout.strategy_options={environment: calcualtor}",
            ]
        )
