"""GAR as its authors run it (SPEC §3 step 7; github.com/LQgdwind/GAR): anchor aggregation
modes, the strict format, the think-length penalty, the format terms and gate, the think span,
and the `gar_authors` preset. Expected values are worked by hand in the comments."""

import math

import pytest
import torch
from torch.nn import functional as F

from policyopt.methods.gar import (
    GARShaper,
    aggregate_anchors,
    anchor_think_text,
    parse_strict,
    think_length_penalty,
    think_thresholds,
)
from policyopt.methods.gar.think_format import trailing_end
from policyopt.models.loading import load_model
from policyopt.models.logprobs import naive_response_logprobs
from policyopt.rewards.shaping import ShapingContext
from policyopt.rollout.base import Rollouts
from policyopt.train.batch import Batch
from run_configs import small_overrides

torch.set_num_threads(1)

NAN = math.nan
TAGS = ("<|think|>", "<|/think|>", "<answer>", "</answer>")  # the authors' strict tags


# ----------------------------------------------------------------------------- anchors
def test_anchor_aggregation_modes_by_hand():
    main = torch.tensor([0.2, 0.6, NAN, 0.3, -0.4])
    aux = torch.tensor([0.6, 0.2, 0.3, NAN, 0.0])
    # aux_residual, w = 0.5: 0.2 + 0.5·(0.6 − 0.2) = 0.4; aux below main: 0.6; no main: aux 0.3;
    #   no aux: main 0.3; −0.4 + 0.5·(0.0 + 0.4) = −0.2
    torch.testing.assert_close(
        aggregate_anchors(main, aux, 0.5, "aux_residual"),
        torch.tensor([0.4, 0.6, 0.3, 0.3, -0.2]),
    )
    # aux_max, w = 0.5: max(0.2, 0.3) = 0.3; max(0.6, 0.1) = 0.6; no main: aux 0.3 (not
    #   weighted); no aux: 0.3; max(−0.4, 0.0) = 0.0
    torch.testing.assert_close(
        aggregate_anchors(main, aux, 0.5, "aux_max"), torch.tensor([0.3, 0.6, 0.3, 0.3, 0.0])
    )
    # real_only: main, and aux only where there is no main anchor
    torch.testing.assert_close(
        aggregate_anchors(main, aux, 0.5, "real_only"), torch.tensor([0.2, 0.6, 0.3, 0.3, -0.4])
    )
    # aux_max, w = 1: max(0.2, 0.6) = 0.6
    assert float(aggregate_anchors(main, aux, 1.0, "aux_max")[0]) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="anchor_aggregation"):
        aggregate_anchors(main, aux, 0.5, "aux_mean")
    with pytest.raises(ValueError, match="anchor_aggregation"):
        GARShaper(anchor_aggregation="aux_mean")


# ----------------------------------------------------------------------------- strict format
def test_trailing_special_tokens_by_hand():
    # "abc" then two special tokens and spaces: the text ends after "abc" (index 3)
    assert trailing_end("abc<|im_end|><|endoftext|>  ") == 3
    # "<|x|y|>" has a '|' inside: not a special token, nothing dropped (length 8)
    assert trailing_end("a<|x|y|>") == 8
    # a kept tag stays: "a" + "<|think|>" = 10 characters
    assert trailing_end("a<|think|>\n", keep=TAGS) == 10
    assert trailing_end("<||>") == 4  # empty inside: kept


def test_strict_format_by_hand():
    # <|think|> is 9 characters, <|/think|> 10, <answer> 8, </answer> 9:
    # "<|think|>ab<|/think|><answer>7</answer>": THINK [9, 11), ANSWER [29, 30)
    text = "<|think|>ab<|/think|><answer>7</answer>"
    parsed = parse_strict(text, TAGS)
    assert parsed is not None and (parsed.think, parsed.answer) == ((9, 11), (29, 30))
    # leading whitespace, a newline between the parts, a trailing special token: still valid;
    # THINK starts at 2 + 9 = 11 and is one character
    parsed = parse_strict("  <|think|>x<|/think|>\n<answer>1</answer> <|im_end|>\n", TAGS)
    assert parsed is not None and parsed.think == (11, 12)
    # empty THINK and ANSWER are valid: tags at 0-9, 9-19, 19-27, 27-36
    parsed = parse_strict("<|think|><|/think|><answer></answer>", TAGS)
    assert parsed is not None and (parsed.think, parsed.answer) == ((9, 9), (27, 27))
    for bad in (
        "<|think|>ab<|/think|><answer>7</answer> A:7",  # text after the answer
        "so <|think|>ab<|/think|><answer>7</answer>",  # text before the think part
        "<|think|>ab<|/think|>x<answer>7</answer>",  # text between the parts
        "<|think|>a<|think|>b<|/think|><answer>7</answer>",  # think-open twice
        "<|think|>ab<|/think|><answer>7</answer><|think|>",  # a kept tag is not dropped
        "<|think|>ab<|/think|>",  # no answer
        "<answer>7</answer><|think|>ab<|/think|>",  # wrong order
        "3+4=7. A:7",  # no tags at all
        "",
    ):
        assert parse_strict(bad, TAGS) is None, bad
    # other tags (Qwen3's think tags): "<think>" is 7 characters, THINK = [7, 9)
    qwen = ("<think>", "</think>", "<answer>", "</answer>")
    parsed = parse_strict("<think>ab</think><answer>7</answer>", qwen)
    assert parsed is not None and parsed.think == (7, 9)


def test_anchor_think_text_by_hand():
    assert anchor_think_text("<|think|> 3+4=7 <|/think|><answer>7</answer>", *TAGS[:2]) == "3+4=7"
    # untagged: all of it, trailing special tokens and whitespace dropped
    assert anchor_think_text(" 3+4=7. A:7<|endoftext|>\n", *TAGS[:2]) == "3+4=7. A:7"
    # two think parts: not one pair, so all of it
    two = "<|think|>a<|/think|><|think|>b<|/think|>"
    assert anchor_think_text(two, *TAGS[:2]) == two


# ----------------------------------------------------------------------------- think length
def test_think_thresholds_by_hand():
    # a = 300: target = round(0.5·300) = 150 in [96, 512]; hard = round(0.5·150) = 75
    assert think_thresholds(300) == (75, 150)
    # a = 100: round(50) = 50 -> clamped up to 96; hard = round(48) = 48
    assert think_thresholds(100) == (48, 96)
    # a = 2000: 1000 -> clamped down to 512; hard = 256
    assert think_thresholds(2000) == (256, 512)
    # a = 250: target 125; hard = round(62.5) = 62 (half to even, as the authors' round)
    assert think_thresholds(250) == (62, 125)
    # a = 301: target = round(150.5) = 150 (half to even); hard 75
    assert think_thresholds(301) == (75, 150)
    # no anchor length, or not relative: the fallback (64, 256)
    assert think_thresholds(0) == (64, 256)
    assert think_thresholds(300, relative=False) == (64, 256)
    # hard is at least 1 and at most target: a = 2, range [1, 512] -> target 1, hard
    #   max(1, round(0.5)) = 1
    assert think_thresholds(2, target_range=(1, 512)) == (1, 1)
    # other ratios: a = 400, ratio 0.25 -> 100; hard ratio 0.8 -> 80
    assert think_thresholds(400, target_ratio=0.25, hard_ratio=0.8) == (80, 100)


def test_think_length_penalty_by_hand():
    # hard 75, target 150, P = −0.5: P at n <= 75, 0 at n >= 150, P·(150 − n)/75 between
    expected = {
        0: -0.5,
        75: -0.5,
        76: -0.5 * 74 / 75,  # −0.49333
        100: -0.5 * 50 / 75,  # −0.33333
        149: -0.5 * 1 / 75,  # −0.00667
        150: 0.0,
        400: 0.0,
    }
    for n, value in expected.items():
        assert think_length_penalty(n, 75, 150) == pytest.approx(value), n
    assert think_length_penalty(100, 75, 150, max_penalty=-1.0) == pytest.approx(-2 / 3)
    assert think_length_penalty(5, 5, 5) == -0.5  # hard = target: a step at target


# ----------------------------------------------------------------------------- the shaper
@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model("tiny")
    torch.manual_seed(0)
    with torch.no_grad():  # the saved tiny model is untrained: spread its head a little
        model.lm_head.weight.mul_(3.0)
    return model.eval(), tokenizer


def encode(tok, text, eos=False):
    return tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])


def make_ctx(model, tok, rows, solutions, groups):
    """A shaping context over hand-made rollouts: `rows` = [(prompt, completion, correct)]
    (completion + EOS as the response), `solutions` the solution column."""
    prompts = [encode(tok, p) for p, _, _ in rows]
    answers = [encode(tok, c, eos=True) for _, c, _ in rows]
    p_width, r_width, n = max(map(len, prompts)), max(map(len, answers)), len(rows)
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
    batch = Batch(
        rollouts=rollouts,
        group_ids=torch.tensor(groups),
        prompts=[p for p, _, _ in rows],
        completions=[c for _, c, _ in rows],
        columns={"solution": solutions},
        correct=torch.tensor([c for _, _, c in rows]),
    )
    return ShapingContext(batch, step=0, total_steps=1, model=model, tokenizer=tok)


def test_format_gate_bonus_and_penalty_by_hand(tiny):
    model, tok = tiny
    good = "<|think|>3+4=7<|/think|><answer>7</answer>"
    rows = [
        ("Q:3+4=?\n", good, True),  # valid, correct, no anchor: r_base
        ("Q:3+4=?\n", "3+4=7. A:7", True),  # malformed, correct: gated
        ("Q:3+4=?\n", good.replace("7<", "8<"), False),  # valid, wrong
        ("Q:3+4=?\n", "A:8", False),  # malformed, wrong
    ]
    solutions = [None] * 4  # no anchor: a passing rollout gets exactly r_base = 1
    shaper = GARShaper(
        format_tags=list(TAGS), format_gate=True, format_bonus=0.05, invalid_format_penalty=-0.6
    )
    ctx = make_ctx(model, tok, rows, solutions, [0, 0, 0, 0])
    m_shaped, metrics = shaper(torch.zeros(4), ctx)
    # M': 1 (passes), 0 (gated), 0, 0; bonus +0.05 on the valid ones, −0.6 on the others;
    # R = M' + terms = 1.05, −0.6, 0.05, −0.6
    torch.testing.assert_close(m_shaped, torch.tensor([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(ctx.terms["gar_format_bonus"], torch.tensor([0.05, 0, 0.05, 0]))
    torch.testing.assert_close(ctx.terms["gar_invalid_format"], torch.tensor([0, -0.6, 0, -0.6]))
    total = m_shaped + sum(ctx.terms.values())
    torch.testing.assert_close(total, torch.tensor([1.05, -0.6, 0.05, -0.6]))
    assert metrics["gar/format_valid_fraction"] == 0.5
    assert metrics["gar/gated_fraction"] == 0.25  # 1 of 4 is correct but malformed
    # without the gate the malformed correct rollout passes: 1 − 0.6 = 0.4
    ctx = make_ctx(model, tok, rows, solutions, [0, 0, 0, 0])
    shaper = GARShaper(format_tags=list(TAGS), format_bonus=0.05, invalid_format_penalty=-0.6)
    m_shaped, metrics = shaper(torch.zeros(4), ctx)
    total = m_shaped + sum(ctx.terms.values())
    torch.testing.assert_close(total, torch.tensor([1.05, 0.4, 0.05, -0.6]))
    assert "gar/gated_fraction" not in metrics
    # a term that is 0 is not added; the strict format alone adds none
    ctx = make_ctx(model, tok, rows, solutions, [0, 0, 0, 0])
    GARShaper(format_tags=list(TAGS))(torch.zeros(4), ctx)
    assert ctx.terms == {}


def test_think_length_term_by_hand(tiny):
    """Characters are tokens for the tiny tokenizer, so token counts are lengths."""
    model, tok = tiny

    def tagged(think):
        return f"<|think|>{think}<|/think|><answer>1</answer>"

    # group 0's anchor thinks 16 tokens: target = round(0.5·16) = 8 in [4, 512], hard =
    # round(0.5·8) = 4; group 1 has no anchor: the fallback (hard 2, target 6)
    anchor = tagged("abcdefghijklmnop")
    rows = [
        ("Q:1\n", tagged("ab"), False),  # n = 2 <= 4: −0.5
        ("Q:1\n", tagged("abcdef"), False),  # n = 6: −0.5·(8 − 6)/(8 − 4) = −0.25
        ("Q:1\n", tagged("abcdefghij"), False),  # n = 10 >= 8: 0
        ("Q:1\n", tagged(" abcde "), False),  # n = 7 (spaces count): −0.5·1/4 = −0.125
        ("Q:1\n", "abc", False),  # malformed: no think penalty
        ("Q:2\n", tagged("abc"), True),  # passes, no anchor: n = 3: −0.5·(6 − 3)/(6 − 2)
        ("Q:2\n", tagged("abcdefg"), False),  # n = 7 >= 6: 0
    ]
    solutions = [anchor] * 5 + [None] * 2
    shaper = GARShaper(
        format_tags=list(TAGS),
        think_penalty=-0.5,
        think_target_range=(4, 512),
        think_fallback=(2, 6),
    )
    ctx = make_ctx(model, tok, rows, solutions, [0, 0, 0, 0, 0, 1, 1])
    m_shaped, metrics = shaper(torch.zeros(7), ctx)
    expected = torch.tensor([-0.5, -0.25, 0.0, -0.125, 0.0, -0.375, 0.0])
    torch.testing.assert_close(ctx.terms["gar_think_length"], expected)
    # the passing rollout: r_base (no anchor) + its penalty = 1 − 0.375 = 0.625
    assert float(m_shaped[5] + ctx.terms["gar_think_length"][5]) == pytest.approx(0.625)
    assert metrics["gar/think_penalty_mean"] == pytest.approx(-1.25 / 7)
    # an untagged anchor counts all of it: "abcdefghijklmnopqrst" is 20 tokens, target 10,
    # hard 5: n = 6 -> −0.5·(10 − 6)/(10 − 5) = −0.4
    ctx = make_ctx(model, tok, rows[1:2], ["abcdefghijklmnopqrst"], [0])
    shaper(torch.zeros(1), ctx)
    torch.testing.assert_close(ctx.terms["gar_think_length"], torch.tensor([-0.4]))
    # not relative: the fallback (2, 6) everywhere: n = 6 -> 0
    ctx = make_ctx(model, tok, rows[1:2], [anchor], [0])
    fixed = GARShaper(
        format_tags=list(TAGS), think_penalty=-0.5, think_relative=False, think_fallback=(2, 6)
    )
    fixed(torch.zeros(1), ctx)
    torch.testing.assert_close(ctx.terms["gar_think_length"], torch.tensor([0.0]))


def test_options_that_need_the_strict_format():
    for option in (
        {"format_gate": True},
        {"format_bonus": 0.05},
        {"invalid_format_penalty": -0.6},
        {"think_span": True},
        {"think_penalty": -0.5},
    ):
        with pytest.raises(ValueError, match="need format_tags"):
            GARShaper(**option)
    with pytest.raises(ValueError, match="4 non-empty"):
        GARShaper(format_tags=["<think>", "</think>"])
    with pytest.raises(ValueError, match="set one"):
        GARShaper(format_tags=list(TAGS), think_span=True, span_regex="(.*)")
    with pytest.raises(ValueError, match="think_penalty"):
        GARShaper(format_tags=list(TAGS), think_penalty=0.5)
    with pytest.raises(ValueError, match="think_target_range"):
        GARShaper(format_tags=list(TAGS), think_target_range=(512, 96))
    with pytest.raises(ValueError, match="think_fallback"):
        GARShaper(format_tags=list(TAGS), think_fallback=(256, 64))
    with pytest.raises(ValueError, match="ratio"):
        GARShaper(format_tags=list(TAGS), think_hard_ratio=0.0)


def test_think_span_tokens_and_anchors_by_hand(tiny):
    model, tok = tiny
    shaper = GARShaper(format_tags=list(TAGS), think_span=True)
    ctx = make_ctx(model, tok, [("Q:\n", "x", True)], [None], [0])
    texts = [
        "<|think|>3+4=7<|/think|><answer>7</answer>",  # THINK = characters [9, 14)
        "3+4=7. A:7",  # malformed: all 10 tokens + EOS
        "<|think|><|/think|><answer>7</answer>",  # empty THINK: all 9+10+8+1+9 = 37 + EOS
    ]
    ids = [encode(tok, t, eos=True) for t in texts]
    spans, fallbacks = shaper._spans(lambda: ids, [len(i) for i in ids], ctx)
    assert (spans, fallbacks) == ([(9, 14), (0, 11), (0, 38)], 2)
    capped = GARShaper(format_tags=list(TAGS), think_span=True, max_span_tokens=3)
    assert capped._spans(lambda: ids, [len(i) for i in ids], ctx)[0] == [
        (11, 14),
        (8, 11),
        (35, 38),
    ]
    # anchors: their think part (or all of it), without EOS
    ctx = make_ctx(
        model,
        tok,
        [("Q:\n", "x", True)] * 2,
        [["<|think|> 3+4=7 <|/think|><answer>7</answer>", "3+4=7. A:7"], "<|think|> <|/think|>"],
        [0, 1],
    )
    assert shaper._anchors(ctx, "solution") == [["3+4=7", "3+4=7. A:7"], []]
    key = ((1,), "3+4=7")
    assert shaper._answer_ids([key], ctx) == [encode(tok, "3+4=7")]  # 5 ids, no EOS


def reference_signal(model, tok, prompt, answer_ids, span):
    """v the long way: full-logit forward, autograd at the LM head, over `span` of the
    answer tokens."""
    ids = torch.tensor([encode(tok, prompt) + answer_ids])
    with torch.no_grad():
        out = naive_response_logprobs(
            model, ids, torch.ones_like(ids), len(answer_ids), with_hidden=True
        )
    h = out.hidden[0, span[0] : span[1]].detach().clone().requires_grad_(True)
    y = torch.tensor(answer_ids[span[0] : span[1]])
    (grad,) = torch.autograd.grad(F.cross_entropy(model.lm_head(h), y), h)
    s_bar = (grad * h).mean(0)
    return (s_bar / s_bar.norm()).detach()


def test_think_span_rewards_match_an_independent_computation(tiny):
    """Two passing rollouts of one prompt: b_i = cosine of v over each rollout's THINK tokens
    with v_a over the anchor's think part teacher-forced after the prompt without EOS; then
    b̂ = ±(b_0 − b_1)/2 and R = 1 + 0.5·max(0, b̂)."""
    model, tok = tiny
    prompt = "Q:3+4=?\n"
    rows = [
        (prompt, "<|think|>3+4=7<|/think|><answer>7</answer>", True),
        (prompt, "<|think|>4+3=7. so 7<|/think|><answer>7</answer>", True),
    ]
    anchor = "<|think|>3+4=7, 7<|/think|><answer>7</answer>"
    ctx = make_ctx(model, tok, rows, [anchor, anchor], [0, 0])
    rewards, _ = GARShaper(format_tags=list(TAGS), think_span=True)(torch.zeros(2), ctx)
    va = reference_signal(model, tok, prompt, encode(tok, "3+4=7, 7"), (0, 8))
    b = [
        float(
            va @ reference_signal(model, tok, prompt, encode(tok, rows[0][1], eos=True), (9, 14))
        ),
        float(
            va @ reference_signal(model, tok, prompt, encode(tok, rows[1][1], eos=True), (9, 20))
        ),
    ]
    half = (b[0] - b[1]) / 2
    expected = torch.tensor([1 + 0.5 * max(0.0, half), 1 + 0.5 * max(0.0, -half)])
    torch.testing.assert_close(rewards, expected, rtol=1e-4, atol=1e-5)
    assert abs(half) > 1e-3  # the two differ


# ----------------------------------------------------------------------------- the preset
def test_gar_authors_preset_loads_with_the_authors_values():
    from policyopt.config.load import load_config
    from policyopt.methods import PRESETS
    from policyopt.train.parts import needs_hidden

    config = load_config(overrides=["algorithm.name=gar_authors"])
    grpo = {k: v for k, v in PRESETS.get("grpo")["algorithm"].items() if k != "name"}
    assert {k: getattr(config.algorithm, k) for k in grpo} == grpo
    assert needs_hidden(config)
    (shaper,) = config.reward.shapers
    assert shaper.name == "gar"
    assert shaper.options == {  # the authors' values, written out
        "r_base": 1.0,
        "beta": 0.5,
        "aux_weight": 0.5,
        "anchor_aggregation": "aux_residual",
        "max_anchors": 4,
        "max_span_tokens": 16384,
        "format_tags": ["<|think|>", "<|/think|>", "<answer>", "</answer>"],
        "format_gate": True,
        "format_bonus": 0.0,  # their online GAR reward drops the post-processing's 0.05
        "invalid_format_penalty": -0.6,
        "think_span": True,
        "think_penalty": -0.5,
        "think_relative": True,
        "think_target_ratio": 0.5,
        "think_target_range": [96, 512],
        "think_hard_ratio": 0.5,
        "think_fallback": [64, 256],
    }
    GARShaper(**shaper.options)  # every option is one the shaper takes
    # one option changed by its index; the others stay
    config = load_config(
        overrides=[
            "algorithm.name=gar_authors",
            "reward.shapers.0.options.format_bonus=0.05",
            "reward.shapers.0.options.aux_column=teacher",
        ]
    )
    options = config.reward.shapers[0].options
    assert options["format_bonus"] == 0.05 and options["aux_column"] == "teacher"
    assert options["invalid_format_penalty"] == -0.6


def test_gar_authors_training_step(tmp_path):
    """The untrained tiny model writes no think tags: every rollout is malformed, gated and
    scores −0.6 (M' = 0, no think penalty), so the step runs with R = −0.6 everywhere."""
    import json

    from policyopt.config.load import load_config
    from policyopt.train.trainer import Trainer

    config = load_config(
        overrides=[
            *small_overrides(tmp_path, 1),
            "algorithm.name=gar_authors",
            "reward.correct_threshold=0.1",
        ]
    )
    trainer = Trainer(config)
    metrics = trainer.train()
    trainer.close()
    assert metrics["gar/format_valid_fraction"] == 0.0
    assert metrics["gar/think_penalty_mean"] == 0.0
    assert metrics["reward/shaped_mean"] == pytest.approx(-0.6)
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["gar/gated_fraction"] == metrics["gar/gated_fraction"]


def test_the_documented_example_config_loads(tmp_path):
    """docs/methods/gar_authors.md's YAML block, as a user's config file, loads for the
    preset with the shaper options it shows."""
    from pathlib import Path

    from policyopt.config.load import load_config

    doc = Path(__file__).resolve().parents[2] / "docs" / "methods" / "gar_authors.md"
    block = doc.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "gar_authors.yaml").write_text(block)
    config = load_config(tmp_path / "gar_authors.yaml")
    assert config.algorithm.name == "gar_authors"
    (shaper,) = config.reward.shapers
    built = GARShaper(**shaper.options)
    assert built.think_span and built.format_gate and built.aux_column == "teacher_rollouts"
    assert config.task.options["prompt_template"].endswith("<answer>\\boxed{...}</answer>.")
