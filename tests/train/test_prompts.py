"""Prompt encoding: plain, and through the tokenizer's chat template (instruct models)."""

from policyopt.models.loading import load_tokenizer
from policyopt.tasks import get_task
from policyopt.train.prompts import encode_prompts


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
