"""Principles the trainer keeps wherever a run starts (issue 41):

- a run trains on what it says it trains on: data read by content, and a resume after the
  data changed is refused like one after the config changed;
- a prompt that leaves its response no positions is refused at load, naming the row;
- Ctrl-C ends a run at a step boundary with that step saved, in one line, and the same
  command resumes it saying so; a start-over says what it drops.
"""

import json
import os
import signal

import pytest

from policyopt.cli.main import main
from policyopt.config.load import Config, load_config
from policyopt.config.resume_check import ConfigMismatchError, data_fingerprint
from policyopt.store import checkpoint as ckpt
from policyopt.tasks.hf_dataset import load_rows
from policyopt.train.interrupt import RunInterrupted
from policyopt.train.prompts import check_positions
from policyopt.train.trainer import Trainer
from run_configs import small_overrides


def rows_file(path, answers: list[str], prompt: str = "1+1=") -> None:
    path.write_text("".join(json.dumps({"prompt": prompt, "answer": a}) + "\n" for a in answers))


def data_overrides(data) -> list[str]:
    return [
        "task.name=hf_dataset",
        f"task.options={{path: {data}, eval_fraction: 0.5}}",
        "reward.functions=[{name: task}]",
    ]


def steps_logged(folder) -> list[int]:
    return [
        json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()
    ]


# ----------------------------------------------------------------- data by content
def test_a_data_file_replaced_with_the_same_time_is_read_again(tmp_path) -> None:
    data = tmp_path / "rows.jsonl"
    rows_file(data, ["2", "3"])
    assert load_rows(str(data))["answer"] == ["2", "3"]
    stat = data.stat()
    rows_file(data, ["4", "5"])  # the same size and, restored below, the same mtime
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_rows(str(data))["answer"] == ["4", "5"]


def test_every_file_or_folder_a_task_option_names_is_fingerprinted(tmp_path) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "0.parquet").write_bytes(b"x")
    options = {
        "path": str(tmp_path / "a.jsonl"),
        "nested": {"eval": [str(tmp_path / "shards")]},
        "name": "not-a-file",
    }
    config = Config(task={"name": "hf_dataset", "options": options})  # any task's options
    found = data_fingerprint(config)
    assert set(found) == {"task.options.path", "task.options.nested.eval.0"}
    before = found["task.options.nested.eval.0"]["sha256"]
    (tmp_path / "shards" / "0.parquet").write_bytes(b"y")  # a file inside a named folder
    assert data_fingerprint(config)["task.options.nested.eval.0"]["sha256"] != before


@pytest.mark.slow
def test_a_resume_after_the_data_changed_is_refused_naming_the_file(tmp_path) -> None:
    data = tmp_path / "rows.jsonl"
    rows_file(data, [str(i) for i in range(8)])
    run = tmp_path / "run"

    def config(steps, *extra):
        overrides = [*small_overrides(run, steps=steps), *data_overrides(data), *extra]
        return load_config(overrides=overrides)

    trainer = Trainer(config(1))
    trainer.train()
    trainer.close()
    assert (ckpt.latest_checkpoint(run) / ckpt.DATA_FILE).is_file()
    stat = data.stat()
    rows_file(data, [str(i + 1) for i in range(8)])
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ConfigMismatchError, match=f"data file {data} .*has changed"):
        Trainer(config(2))
    resumed = Trainer(config(2, "train.resume_anyway=true"))
    assert resumed.step == 1
    resumed.close()


# ----------------------------------------------------------------- positions
class CharTask:
    """Rows whose prompt is their text; one token per character (as the embedded model).
    Its demonstration has `demo` characters; its one tool's schema is `TOOL` as JSON."""

    name = "chars"
    tools = ()
    demo = 0

    def prompt_messages(self, row):
        return None

    def format_prompt(self, row):
        return row["prompt"]

    def sft_segments(self, row):
        return [[("d" * self.demo, True)]]


TOOL = {"name": "calc"}  # 16 characters as JSON


class CharTokenizer:
    eos_token_id = 0
    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, tools, add_generation_prompt, tokenize):
        listed = "".join(json.dumps(t) for t in tools or ())
        return self(listed + messages[-1]["content"])["input_ids"]


class ChatTokenizer(CharTokenizer):
    """A chat template that writes the tools' schemas and the message's text, nothing else."""

    chat_template = "tools, then the message"


class Model:
    class config:  # noqa: N801 - the attribute name transformers models have
        max_position_embeddings = 64
        _name_or_path = "little"


@pytest.mark.parametrize("tools", [False, True], ids=["plain", "chat template with tools"])
@pytest.mark.parametrize("split", ["train", "eval", "sft"])
def test_the_first_row_past_the_positions_is_named(split, tools) -> None:
    """A prompt plus what follows it (a rollout's budget, or SFT's demonstration and EOS) at
    the model's positions fits, one more is refused, naming the row; the prompt as the
    trainer encodes it, the chat template's tool schemas included."""
    from policyopt.train.sft import check_sft_positions

    overrides = ["rollout.max_new_tokens=16", "eval.max_new_tokens=32"]
    config = load_config(overrides=[*overrides, f"model.chat_template={tools}"])
    budget = {"train": 16, "eval": 32, "sft": 24}[split]
    task, tok = CharTask(), ChatTokenizer() if tools else CharTokenizer()
    task.demo, task.tools = budget - 1, (TOOL,) if tools else ()  # the demo, then EOS
    frame = len(json.dumps(TOOL)) if tools else 0
    # Row 0 fits exactly (its 2-byte characters are one token each); row 1 is one over.
    fits, over = "é" * (64 - budget - frame), "x" * (65 - budget - frame)
    rows = [{"prompt": fits}, {"prompt": over}, {"prompt": "y" * 100}]

    def check(rows):
        if split == "sft":
            check_sft_positions(Model(), tok, task, rows, chat=tools)
        else:
            check_positions(Model(), tok, task, split, rows, config)

    check(rows[:1])
    with pytest.raises(ValueError) as err:
        check(rows)
    message = str(err.value)
    assert f"{'train' if split == 'sft' else split} row 1 " in message and "\n" not in message
    assert "65 positions, more than the 64 of little" in message
    if split != "sft":
        assert f"max_new_tokens={budget}" in message
    else:
        assert f"of task 'chars', prompt '{over[:40]}" in message  # its start, to find it


def test_a_run_whose_prompts_leave_no_room_is_refused_before_the_first_step(tmp_path) -> None:
    config = load_config(overrides=[*small_overrides(tmp_path), "rollout.max_new_tokens=510"])
    with pytest.raises(ValueError, match=r"train row 0 .*more than the 512 "):
        Trainer(config)


# ----------------------------------------------------------------- Ctrl-C
def interrupt_in_step(monkeypatch, step: int, times: int = 1) -> None:
    """SIGINT to this process `times` times during step `step` (as Ctrl-C would)."""
    real = Trainer.run_step

    def run_step(self):
        if self.step + 1 == step:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
        return real(self)

    monkeypatch.setattr(Trainer, "run_step", run_step)


def test_ctrl_c_saves_the_step_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    argv = ["train", *small_overrides(tmp_path, steps=4)]
    interrupt_in_step(monkeypatch, 2)
    assert main(argv) == 130
    err = capsys.readouterr().err
    last = err[err.index("policyopt train: ") :].strip()
    assert last.startswith("policyopt train: interrupted at step 2, saved as ")
    assert "the same command resumes" in last and "\n" not in last and "Traceback" not in err
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(tmp_path)] == [2]
    monkeypatch.undo()
    assert main(argv) == 0
    assert "resuming from step 2" in capsys.readouterr().out
    assert steps_logged(tmp_path) == [1, 2, 3, 4]


def test_a_second_ctrl_c_stops_at_once_and_says_what_is_kept(tmp_path, monkeypatch) -> None:
    config = load_config(overrides=[*small_overrides(tmp_path, steps=4), "train.save_every=1"])
    interrupt_in_step(monkeypatch, 3, times=2)
    # what the process had before (SIG_IGN under `nohup ... &`, the default otherwise)
    before = signal.getsignal(signal.SIGINT)
    trainer = Trainer(config)
    with pytest.raises(RunInterrupted, match="in step 3, before it was complete; the latest "):
        trainer.train()
    trainer.close()
    assert signal.getsignal(signal.SIGINT) is before  # handler restored
    assert ckpt.step_of(ckpt.latest_checkpoint(tmp_path)) == 2


def test_starting_over_says_what_it_drops(tmp_path, capsys) -> None:
    config = load_config(overrides=small_overrides(tmp_path, steps=2))
    trainer = Trainer(config)
    trainer.train()
    trainer.close()
    for folder in ckpt.list_checkpoints(tmp_path):  # as if killed before its first save
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    capsys.readouterr()
    Trainer(config).close()
    out = capsys.readouterr().out
    assert "starting at step 1 (no complete checkpoint in" in out
    assert "dropped the 2 logged step(s)" in out
