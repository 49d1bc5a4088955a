"""The quickstart's table says where RL started: after SFT, or from the model as loaded."""

from policyopt.pipelines.quickstart import summary_table


def header(sft: dict) -> str:
    summary = {
        "recipe": "grpo",
        "seed": 0,
        "sft": sft,
        "initial_eval": {"eval/accuracy": 0.1},
        "final_eval": {"eval/accuracy": 0.2},
        "wall_seconds": 1.0,
    }
    return str(summary_table(summary).columns[1].header)


def test_the_before_column_names_sft_only_when_sft_ran():
    assert header({"sft/loss": 0.3}) == "before RL (SFT)"
    assert header({}) == "before RL"
