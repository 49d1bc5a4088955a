"""Progress off a terminal (nohup, CI, Slurm): plain lines with elapsed time and time left."""

import io

from rich.console import Console

from policyopt.store.metrics_log import PlainProgress, progress_bar


def file_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()  # not a tty
    return Console(file=out, width=200), out


def test_a_file_gets_plain_lines_a_terminal_a_live_bar():
    console, _ = file_console()
    assert isinstance(progress_bar(console, True), PlainProgress)
    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert not isinstance(progress_bar(terminal, True), PlainProgress)
    assert isinstance(progress_bar(terminal, True, plain=True), PlainProgress)
    assert not isinstance(progress_bar(console, False), PlainProgress)  # disabled: silent


def test_lines_at_the_interval_with_the_estimate_by_hand():
    console, out = file_console()
    now = [100.0]
    bar = PlainProgress(console, interval=30, clock=lambda: now[0])
    with bar:
        task = bar.add_task("sft", total=1000, status="")
        for step in range(1, 1001):
            now[0] += 0.5  # half a second per step
            bar.update(task, completed=step, status=f"loss {1 / step:.3f}")
    lines = out.getvalue().splitlines()
    # first update, then every 30 s (60 steps), then the last: 1 + 16 + 1 lines
    assert lines[0] == "sft 1/1000 (0%), 0:00:00 elapsed, about 0:08:20 left; loss 1.000"
    # step 61: 30.5 s elapsed, 0.5 s per step x 939 steps = 469.5 s left
    assert lines[1] == "sft 61/1000 (6%), 0:00:30 elapsed, about 0:07:50 left; loss 0.016"
    assert lines[-1] == "sft 1000/1000 (100%), 0:08:20 elapsed; loss 0.001"
    assert len(lines) == 18


def test_a_resumed_run_estimates_from_its_own_steps():
    console, out = file_console()
    now = [0.0]
    bar = PlainProgress(console, interval=0, clock=lambda: now[0])
    task = bar.add_task("train", total=100, completed=90, status="")
    now[0] = 10.0
    bar.update(task, completed=95)  # 5 steps in 10 s: 2 s per step, 5 steps left
    assert out.getvalue().strip() == "train 95/100 (95%), 0:00:10 elapsed, about 0:00:10 left"


def test_sft_and_training_print_progress_to_a_file(tmp_path, small_config):
    """run_sft, Trainer.train and evaluation with a non-tty console: plain lines, not
    silence (progress on, as a user's run has it)."""
    from policyopt.config.load import SFTConfig
    from policyopt.tasks import get_task
    from policyopt.train.sft import run_sft
    from policyopt.train.trainer import Trainer

    console, out = file_console()
    trainer = Trainer(small_config(tmp_path, "train.progress=true", steps=2), console=console)
    try:
        run_sft(
            trainer.model,
            trainer.tokenizer,
            get_task("arithmetic", train_size=8, eval_size=4),
            SFTConfig(steps=2, batch_size=2),
            console=console,
        )
        trainer.train()
        trainer.evaluate()
    finally:
        trainer.close()
    text = out.getvalue()
    assert "sft 2/2 (100%)" in text
    assert "train 2/2 (100%)" in text
    assert "eval " in text and "(100%)" in text.split("eval ")[-1]
