"""`model.chat_template: true` with a tokenizer that has none is one line before any work."""

import pytest

from policyopt.config.load import ConfigError


def test_a_chat_template_the_tokenizer_lacks_is_refused_before_the_first_step(
    tmp_path, small_config
):
    from policyopt.train.trainer import Trainer

    with pytest.raises(ConfigError, match=r"model.chat_template.*has no chat template") as info:
        Trainer(small_config(tmp_path / "run", "model.chat_template=true", steps=1))
    assert len(str(info.value).splitlines()) == 1


def test_sft_without_solutions_names_the_option_that_gives_them(tmp_path):
    import json

    from policyopt.config.load import load_config
    from policyopt.models.loading import load_model
    from policyopt.tasks import get_task
    from policyopt.train.sft import run_sft

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{a}+1=", "answer": str(a + 1)}) + "\n" for a in range(4))
    )
    task = get_task("hf_dataset", path=str(data), eval_fraction=0.5)
    model, tok = load_model("tiny")
    cfg = load_config(overrides=["sft.steps=2"]).sft
    with pytest.raises(ValueError, match=r"task.options.solution_column"):
        run_sft(model, tok, task, cfg, progress=False)
