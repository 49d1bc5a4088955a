"""A run folder is recognisable, never made of the user's files, and held by one live run
(policyopt.store.run_folder): the rules, and that `RUN_FILES` names everything a run writes."""

import subprocess
import sys

import pytest

from policyopt.cli.main import main
from policyopt.store import run_folder
from policyopt.store.run_folder import MARKER, RUN_FILES, RunFolderError, claim, release
from run_configs import small_overrides


def test_a_new_or_empty_folder_becomes_a_run_folder(tmp_path) -> None:
    for folder in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        if folder.name == "empty":
            folder.mkdir()
        claim(folder)
        release(folder)
        assert (folder / MARKER).is_file()


def test_files_a_run_never_writes_may_be_beside_it(tmp_path) -> None:
    (tmp_path / "data.jsonl").write_text("{}\n")
    (tmp_path / "my_rewards.py").write_text("")
    claim(tmp_path)
    release(tmp_path)
    assert run_folder.is_run_folder(tmp_path)


@pytest.mark.parametrize("name", sorted(RUN_FILES))
def test_any_file_a_run_writes_makes_an_unmarked_folder_the_users(tmp_path, name) -> None:
    (tmp_path / name).write_text("mine")
    with pytest.raises(RunFolderError, match=f"holds {name}, which a run would overwrite"):
        claim(tmp_path)
    assert not (tmp_path / MARKER).exists()


@pytest.mark.slow
def test_a_run_folder_from_before_the_marker_is_adopted(tmp_path, small_config) -> None:
    from policyopt.train.trainer import Trainer

    trainer = Trainer(small_config(tmp_path, steps=1))
    trainer.train()
    trainer.close()
    (tmp_path / MARKER).unlink()  # as an older policyopt left it
    claim(tmp_path)
    release(tmp_path)


def test_claims_in_one_process_nest_and_the_last_release_unlocks(tmp_path) -> None:
    claim(tmp_path)
    claim(tmp_path)  # a second trainer object in this process
    release(tmp_path)
    assert other_process_claims(tmp_path) == "refused"
    release(tmp_path)
    assert other_process_claims(tmp_path) == "claimed"


def test_abandon_removes_only_a_folder_the_claim_created(tmp_path) -> None:
    made = tmp_path / "made"
    claim(made)
    (made / "config.yaml").write_text("written by the run")
    release(made, abandon=True)
    assert not made.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    claim(kept)
    release(kept, abandon=True)
    assert kept.is_dir()


def other_process_claims(folder) -> str:
    code = (
        "from policyopt.store import run_folder\n"
        "try:\n"
        f"    run_folder.claim({str(folder)!r}); print('claimed')\n"
        "except run_folder.RunFolderError as err:\n"
        "    print('refused' if 'in use by another' in str(err) else err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


# ----------------------------------------------------------------- RUN_FILES is complete
def written(folder) -> set[str]:
    return {p.name for p in folder.iterdir()} - {MARKER}


@pytest.mark.slow
def test_a_training_run_writes_only_run_files(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # nothing lands beside the folder either
    overrides = [
        *small_overrides(tmp_path / "run", steps=2),
        "train.loggers=[jsonl, tensorboard]",
        "train.plot=true",
        "train.save_every=1",
    ]
    assert main(["train", *overrides]) == 0
    assert written(tmp_path / "run") <= RUN_FILES
    assert written(tmp_path) == {"run"}


@pytest.mark.slow
def test_sft_and_quickstart_write_only_run_files(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    small = ["sft.steps=1", "sft.batch_size=4", "train.progress=false"]
    assert main(["sft", "--output-dir", "sft", *small]) == 0
    assert written(tmp_path / "sft") <= RUN_FILES
    quick = [o for o in small_overrides(tmp_path / "q", steps=1) if "output_dir" not in o]
    assert main(["quickstart", "--output-dir", "q", *quick, *small]) == 0
    assert written(tmp_path / "q") <= RUN_FILES
    assert written(tmp_path) == {"sft", "q", "cache"}
