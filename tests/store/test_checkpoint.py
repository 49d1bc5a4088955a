"""Checkpoints are complete (marker written last) or ignored and reported; saving a step again
never loses its only complete copy; a torn metrics line does not stop a resume; a state file
cannot run code (issue 13, items 10 and 13)."""

import io
import json
import os
import re
from pathlib import Path

import pytest
import torch
from rich.console import Console

from policyopt.cli.main import main
from policyopt.store import checkpoint as ckpt
from policyopt.store.metrics_log import read_metrics
from policyopt.train.trainer import Trainer
from run_configs import small_overrides

SRC = Path(__file__).resolve().parents[2] / "src"


def quiet(config) -> Trainer:
    """A Trainer whose console output is kept for the test to read (`printed`)."""
    return Trainer(config, console=Console(file=io.StringIO(), width=300))


def printed(trainer: Trainer) -> str:
    return trainer.console.file.getvalue()


def run(config) -> Trainer:
    trainer = quiet(config)
    trainer.train()
    trainer.close()
    return trainer


def steps_logged(output_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(output_dir / "metrics.jsonl")]


def test_checkpoint_without_marker_is_ignored_and_reported(tmp_path, small_config) -> None:
    run(small_config(tmp_path, "train.save_every=1", "train.keep_last=3", steps=2))
    newest = tmp_path / "checkpoints" / "step-00000002"
    (newest / "COMPLETE").unlink()  # as a save whose marker was never written
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001"]
    assert ckpt.incomplete_checkpoints(tmp_path) == [newest]
    resumed = quiet(small_config(tmp_path, steps=2))
    assert resumed.step == 1
    report = printed(resumed)
    assert "step-00000002" in report and "incomplete" in report
    assert newest.exists()  # reported, never deleted: it may be someone's only copy


def test_only_incomplete_checkpoints_stop_an_auto_resume(tmp_path, small_config) -> None:
    """Not a silent restart from step 0 that would overwrite them."""
    run(small_config(tmp_path, steps=1))
    (ckpt.latest_checkpoint(tmp_path) / "COMPLETE").unlink()
    with pytest.raises(ValueError, match="only incomplete checkpoints.*step-00000001"):
        quiet(small_config(tmp_path, steps=2))
    assert quiet(small_config(tmp_path, "train.resume=null", steps=2)).step == 0


def test_checkpoint_with_a_truncated_file_is_incomplete(tmp_path, small_config) -> None:
    run(small_config(tmp_path, "train.save_every=1", "train.keep_last=3", steps=2))
    weights = tmp_path / "checkpoints" / "step-00000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a full disk, a bad copy
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001"]
    assert quiet(small_config(tmp_path, steps=2)).step == 1


def test_marker_lists_every_file_with_its_size(tmp_path, small_config) -> None:
    run(small_config(tmp_path, steps=1))
    folder = ckpt.latest_checkpoint(tmp_path)
    marker = json.loads((folder / "COMPLETE").read_text())
    on_disk = {
        str(f.relative_to(folder)): f.stat().st_size
        for f in folder.rglob("*")
        if f.is_file() and f.name != "COMPLETE"
    }
    assert marker["step"] == 1
    assert marker["files"] == on_disk  # written after every other file
    assert {"model.safetensors", "trainer_state.pt", "run_config.yaml"} <= set(on_disk)


def test_failed_save_leaves_the_previous_checkpoint(tmp_path, small_config, monkeypatch) -> None:
    trainer = run(small_config(tmp_path, steps=1))

    def disk_full(*args, **kwargs) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    trainer.step = 2
    with pytest.raises(OSError):
        trainer.save()
    monkeypatch.undo()
    # The half-written folder is gone at once (it would hold the space the disk lacks).
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000001"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001"]
    resumed = quiet(small_config(tmp_path, steps=1))
    assert resumed.step == 1
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000001"]


def test_saving_a_step_again_never_loses_its_only_copy(tmp_path, small_config, monkeypatch) -> None:
    config = small_config(tmp_path, "train.keep_last=1", steps=1)
    trainer = run(config)
    real_rename = os.rename

    def killed_while_publishing(src, dst, *args, **kwargs):
        # The new copy is complete, the old one moved or removed: the process dies here.
        if Path(src).name.startswith(".tmp-") and Path(dst).name.startswith("step-"):
            raise KeyboardInterrupt("killed")
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", killed_while_publishing)
    with pytest.raises(KeyboardInterrupt):
        trainer.save()  # the same step again, as a rerun of a finished run does
    monkeypatch.undo()
    resumed = quiet(config)
    assert resumed.step == 1
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001"]


def test_partial_last_metrics_line_does_not_break_resume(tmp_path, small_config) -> None:
    run(small_config(tmp_path, steps=2))
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 3, "reward/mean": 0.2, "lo')  # killed (or disk full) mid-append
    assert steps_logged(tmp_path) == [1, 2]  # readers skip the torn line
    resumed = run(small_config(tmp_path, steps=3))
    assert resumed.step == 3
    assert steps_logged(tmp_path) == [1, 2, 3]
    assert all(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())


def test_restart_before_the_first_checkpoint_logs_each_step_once(tmp_path, small_config) -> None:
    run(small_config(tmp_path, steps=2))
    for folder in ckpt.list_checkpoints(tmp_path):  # as if killed before its first save
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    run(small_config(tmp_path, steps=2))
    assert steps_logged(tmp_path) == [1, 2]


# ----------------------------------------------------------------- safe loading (item 13)
class RunsCode:
    """Unpickling this calls exec: what a malicious checkpoint would do."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (exec, (f"open({str(self.target)!r}, 'w').close()",))


def test_malicious_pickle_in_a_checkpoint_is_refused(tmp_path, small_config, capsys) -> None:
    out = tmp_path / "run"
    run(small_config(out, steps=1))
    folder = ckpt.latest_checkpoint(out)
    pwned = tmp_path / "pwned"
    state = ckpt.load_state(folder)
    state["shapers"] = [RunsCode(pwned)]
    torch.save(state, folder / "trainer_state.pt")
    ckpt.mark_complete(folder, 1)  # a complete checkpoint, as downloaded
    assert ckpt.list_checkpoints(out) == [folder]

    with pytest.raises(ckpt.UnsafeCheckpointError, match="refusing to load .*trainer_state.pt"):
        Trainer(small_config(out, steps=1))
    assert not pwned.exists()

    # From the command line: a one-line error, no traceback, no code run.
    assert main(["train", *small_overrides(out, 1)]) == 2
    err = capsys.readouterr().err
    assert "refusing to load" in err and "could run code" in err and "Traceback" not in err
    assert not pwned.exists()


def test_stateful_shaper_state_loads_with_weights_only(tmp_path) -> None:
    """DocPO's dispersion controller (the stateful shaper) is plain data: it survives the
    safe loader and resumes identically."""
    import policyopt.methods  # noqa: F401  (registers the shapers)
    from policyopt.rewards.shaping import SHAPERS

    a = SHAPERS.get("step_aware_annealing")(min_samples=2, window=4)
    a.controller.observe("table", [0.9, 0.8, 0.3])
    a.controller.update("table")
    ckpt.save_state(tmp_path, {"shapers": [a.state_dict()]})
    b = SHAPERS.get("step_aware_annealing")(min_samples=2, window=4)
    b.load_state_dict(ckpt.load_state(tmp_path)["shapers"][0])
    assert b.state_dict() == a.state_dict()
    for c in (a, b):
        c.controller.observe("table", [0.1])
    assert b.controller.update("table") == a.controller.update("table")


def closing_paren(text: str, start: int) -> int:
    """Index of the parenthesis that closes the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text)


def test_no_unsafe_torch_load_in_the_package() -> None:
    """Every torch.load in src/ passes weights_only=True (a user may download the file)."""
    unsafe = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"torch\.load\(", text):
            call = text[match.start() : closing_paren(text, match.end() - 1) + 1]
            if "weights_only=True" not in call:
                unsafe.append(f"{path.relative_to(SRC)}: {call}")
    assert not unsafe, unsafe


def test_resume_to_a_folder_that_is_not_a_complete_checkpoint_is_an_error(
    tmp_path, small_config
) -> None:
    run(small_config(tmp_path / "a", steps=1))
    folder = ckpt.latest_checkpoint(tmp_path / "a")
    (folder / "COMPLETE").unlink()
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        quiet(small_config(tmp_path / "b", f"train.resume={folder}", steps=2))


def test_tensorboard_forgets_steps_past_the_checkpoint(tmp_path, small_config) -> None:
    """Steps logged after the last checkpoint by a killed run are not shown twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = ["train.loggers=[jsonl, tensorboard]", "train.save_every=1", "train.keep_last=3"]
    run(small_config(tmp_path, *tb, steps=3))
    newest = ckpt.latest_checkpoint(tmp_path)
    (newest / "COMPLETE").unlink()  # as if killed while saving step 3 (after logging it)
    newest.rename(newest.with_name(".tmp-" + newest.name))
    run(small_config(tmp_path, *tb, steps=3))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3]


SMALL_LLAMA = {
    "hidden_size": 32,
    "num_attention_heads": 1,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
}


@pytest.mark.parametrize(
    ("other", "named"),
    [
        ({"hidden_size": 64, "num_attention_heads": 2}, r"model\.embed_tokens\.weight is "),
        ({"intermediate_size": 96}, r"model\.layers\.0\.mlp\.gate_proj\.weight is \(64, 32\)"),
        ({"num_hidden_layers": 2}, r"lacks \['model\.layers\.1\."),
    ],
    ids=["wider", "another mlp", "deeper"],
)
def test_weights_of_another_model_are_one_named_error(tmp_path, other, named) -> None:
    """A checkpoint of another model shape (a resume with `train.resume_anyway=true` after
    changing `model.name_or_path`) is a ValueError, one line from the command, naming the
    checkpoint, the first tensor that differs (both shapes) and what to do; the model is
    left as it was."""
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    from policyopt.models.tiny import tiny_config

    saved = LlamaForCausalLM(tiny_config(40, **SMALL_LLAMA))
    save_file(saved.state_dict(), str(tmp_path / "model.safetensors"))
    model = LlamaForCausalLM(tiny_config(40, **{**SMALL_LLAMA, **other}))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=named) as raised:
        ckpt.load_weights(model, tmp_path)
    message = str(raised.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "another model" in message and "train.output_dir" in message
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_adapter_of_another_rank_is_one_named_error(tmp_path) -> None:
    """The same for a LoRA checkpoint (`adapter_model.safetensors`) of another rank."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    from policyopt.models.tiny import tiny_config

    def adapted(rank: int) -> torch.nn.Module:
        base = LlamaForCausalLM(tiny_config(40, **SMALL_LLAMA))
        return get_peft_model(base, LoraConfig(r=rank, target_modules=["q_proj"]))

    save_file(get_peft_model_state_dict(adapted(1)), str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match=r"another model: size mismatch for .*lora_A") as raised:
        ckpt.load_weights(adapted(2), tmp_path)
    assert "\n" not in str(raised.value) and "train.output_dir" in str(raised.value)
