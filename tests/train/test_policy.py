"""The policy kind of a run is declared by its task (`Task.policy`), not guessed from the
model's name: `trainer.policy.load_policy` builds the kind the task declares and reads
`model.name_or_path` within that kind's names."""

from __future__ import annotations

import pytest

from policyopt.config.load import ModelConfig
from policyopt.models.item_tokenizer import ItemTokenizer
from policyopt.models.ranker import PLRanker
from policyopt.tasks import TASKS
from policyopt.tasks.base import task_class
from policyopt.train.policy import POLICY_LOADERS, load_policy


def ltr_task():
    return TASKS.get("ltr_synthetic")(train_size=4, eval_size=2, docs_per_query=5)


def test_every_task_declares_a_known_policy_kind():
    kinds = {name: task_class(name).policy for name in TASKS.names()}
    assert set(kinds.values()) <= set(POLICY_LOADERS)
    ranking = {n for n, k in kinds.items() if k == "ranking"}
    assert ranking == {"ltr_synthetic", "ltr_clicks", "ltr_diversity", "letor", "mslr"}
    # An LM reranker reads the same queries as text: a language model.
    assert kinds["rerank"] == "lm" and kinds["arithmetic"] == "lm"


def test_a_ranking_task_builds_the_named_ranker():
    task = ltr_task()
    model, tok = load_policy(ModelConfig(name_or_path="pl-linear"), task)
    assert isinstance(model, PLRanker) and model.config["hidden"] == []
    assert model.items.shape == (task.item_features.shape[0] + 1, task.num_features)
    assert isinstance(tok, ItemTokenizer)


def test_a_ranking_task_loads_a_ranking_checkpoint(tmp_path):
    task = ltr_task()
    PLRanker(task.num_features, [8]).save_pretrained(tmp_path / "ranker")
    model, _ = load_policy(ModelConfig(name_or_path=str(tmp_path / "ranker")), task)
    assert isinstance(model, PLRanker) and model.config["hidden"] == [8]


def test_a_ranking_task_refuses_a_language_model():
    with pytest.raises(ValueError, match="learning-to-rank task for a ranking policy"):
        load_policy(ModelConfig(name_or_path="tiny"), ltr_task())


def test_a_language_model_task_refuses_a_ranker():
    task = TASKS.get("arithmetic")(train_size=4, eval_size=2)
    with pytest.raises(ValueError, match="task 'arithmetic' trains a language model"):
        load_policy(ModelConfig(name_or_path="pl-mlp"), task)
