"""Prompt encoding: plain, and through the tokenizer's chat template (instruct models)."""

from types import SimpleNamespace

import pytest

from policyopt.config.load import load_config
from policyopt.models.loading import load_tokenizer
from policyopt.tasks import get_task
from policyopt.train.prompts import check_positions, encode_prompts


def test_plain_and_chat_template_prompts() -> None:
    tok = load_tokenizer("tiny")
    task = get_task("arithmetic", train_size=5, eval_size=5)
    rows = [task.rows("train")[0]]
    texts, ids = encode_prompts(task, tok, rows, chat=False)
    assert tok.decode(ids[0]) == texts[0] == task.format_prompt(rows[0])
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    _, chat_ids = encode_prompts(task, tok, rows, chat=True)
    assert tok.decode(chat_ids[0]) == f"[user]{texts[0]}[assistant]"


# A template that lists the tools' schemas before the messages, as instruct models' do.
TOOLS_TEMPLATE = (
    "{% if tools %}[tools]{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


class ToolTask:
    """Text prompts and one tool whose JSON schema is about 300 characters."""

    tools = (
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "evaluates an arithmetic expression " + "x" * 100,
                "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
            },
        },
    )

    def prompt_messages(self, row):
        return None

    def format_prompt(self, row):
        return row["prompt"]


def test_a_prompt_the_tool_schemas_push_past_the_positions_is_refused() -> None:
    """`check_positions` measures the template's frame as the prompts are built, tools
    included: a prompt whose text and toolless frame fit, but whose encoding does not."""
    tok = load_tokenizer("tiny")
    tok.chat_template = TOOLS_TEMPLATE
    model = SimpleNamespace(
        config=SimpleNamespace(max_position_embeddings=512, _name_or_path="tiny")
    )
    config = load_config(overrides=["rollout.max_new_tokens=100", "model.chat_template=true"])
    task, rows = ToolTask(), [{"prompt": "1+1=" * 5}, {"prompt": "y" * 350}]
    n = len(encode_prompts(task, tok, rows[1:], chat=True)[1][0])
    assert n + 100 > 512  # the rollout needs more positions than the model has
    with pytest.raises(ValueError, match=rf"train row 1 .*its prompt is {n} tokens"):
        check_positions(model, tok, task, "train", rows, config)
    # The same prompt without the tools fits, and is not refused.
    ToolTask.tools, tools = (), ToolTask.tools
    try:
        check_positions(model, tok, task, "train", rows, config)
    finally:
        ToolTask.tools = tools
