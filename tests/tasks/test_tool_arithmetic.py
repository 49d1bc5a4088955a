"""The embedded tool task: its problems, its demonstrations and the episodes they imitate."""

import pytest

from episodes_for_tests import ScriptedEngine
from policyopt.models.loading import load_tokenizer
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.multiturn import environment_of, run_episodes
from policyopt.tasks import get_task
from policyopt.train.prompts import encode_prompts
from policyopt.train.sft import sft_examples


@pytest.fixture(scope="module")
def task():
    return get_task("tool_arithmetic", train_size=300, eval_size=60)


def test_problems_by_level_and_splits_apart(task):
    train, held_out = task.rows("train"), task.rows("eval")
    assert len(train) == 300 and len(held_out) == 60
    assert not set(train["prompt"]) & set(held_out["prompt"])
    assert len(set(held_out["prompt"])) == 60
    for row in held_out:
        a, rest = row["prompt"].split("*")
        b, _, c = rest.partition("+")
        value = int(a) * int(b) + (int(c) if c else 0)
        assert str(value) == row["answer"]
        assert {1: len(b) == 1 and not c, 2: len(b) == 2 and not c, 3: bool(c)}[row["level"]]
    assert held_out["level"][:6] == [1, 2, 3, 1, 2, 3]
    share = train["demo_style"].count("tool") / len(train)
    assert 0.22 < share < 0.38  # tool_fraction 0.3 of 300 rows


def test_a_demonstration_is_the_episode_it_imitates(task):
    """The SFT target of a tool row is token for token what a model writing the same two
    turns produces with the calculator environment (the reply written by the tool), and SFT
    trains on exactly the tokens RL trains on: the reply's are masked out of both."""
    tok = load_tokenizer("tiny")
    row = next(r for r in task.rows("train") if r["demo_style"] == "tool")
    assert task.sft_targets(row) == [
        f"calc({row['prompt']})</s>={row['answer']}\nA:{row['answer']}"
    ]
    assert task.sft_segments(row) == [
        [
            (f"calc({row['prompt']})</s>", True),
            (f"={row['answer']}\n", False),
            (f"A:{row['answer']}", True),
        ]
    ]
    (prompt, target, trained), *_ = sft_examples(task, tok, [row])
    engine = ScriptedEngine(tok, [[f"calc({row['prompt']})</s>"], [f"A:{row['answer']}</s>"]])
    r, _ = run_episodes(
        engine,
        environment_of("calculator", {}),
        [prompt],
        SamplingParams(max_new_tokens=64),
        max_turns=3,
    )
    assert r.response_ids[0].tolist() == target
    assert r.response_mask[0].tolist() == [float(t) for t in trained]
    assert 0 < trained.count(0) == len(f"={row['answer']}\n")  # the reply, one id a character
    assert task.verify(tok.decode(target, skip_special_tokens=True), row) == 1.0
    direct = next(r for r in task.rows("train") if r["demo_style"] == "direct")
    assert task.sft_targets(direct) == [f"A:{direct['answer']}"]
    assert task.sft_segments(direct) == [[(f"A:{direct['answer']}", True)]]
    (_, target, trained), *_ = sft_examples(task, tok, [direct])
    assert trained == [1] * len(target)


def test_verify_reads_the_last_answer(task):
    row = {"prompt": "47*36+18", "answer": "1710", "level": 3}
    assert task.format_prompt(row) == "Q:47*36+18=?\n"
    assert task.verify("calc(47*36+18)=1710\nA:1710", row) == 1.0
    assert task.verify("A:1700", row) == 0.0
    assert task.verify("A:1700 A: 1710", row) == 1.0
    assert task.verify("calc(47*36+18)=1710\n", row) is None
    assert task.output_style("calc(47*36+18)=1710\nA:1710", row) == "tool"
    assert task.output_style("A:1710", row) == "direct"


def test_options_are_checked():
    with pytest.raises(ValueError, match="levels must be a subset"):
        get_task("tool_arithmetic", levels=[4])
    with pytest.raises(ValueError, match="tool_fraction"):
        get_task("tool_arithmetic", tool_fraction=1.5)


def test_a_chat_template_lists_the_task_s_tools(task):
    tok = load_tokenizer("tiny")
    tok.chat_template = (
        "{% if tools %}[tools]{% for t in tools %}{{ t.function.name }}:"
        "{{ t.function.parameters.required | join(',') }};{% endfor %}</s>{% endif %}"
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}</s>{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    row = task.rows("eval")[0]
    _, ids = encode_prompts(task, tok, [row], chat=True)
    expected = f"[tools]calc:expression;</s>[user]Q:{row['prompt']}=?\n</s>[assistant]"
    assert ids[0] == tok(expected, add_special_tokens=False)["input_ids"]
    plain = get_task("arithmetic", train_size=4, eval_size=2)  # a task without tools
    _, ids = encode_prompts(plain, tok, [plain.rows("eval")[0]], chat=True)
    assert not tok.decode(ids[0]).startswith("[tools]")
