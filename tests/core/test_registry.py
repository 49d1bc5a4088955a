"""Registry lookups: a mistyped name gets the nearest valid one."""

from policyopt.core.registry import unknown_name_message

PRESETS = ["dapo", "datpo", "dmrl", "docpo", "dr_grpo", "gar", "grpo", "gspo", "hispo", "srpo"]


def test_a_transposition_is_suggested_before_a_closer_looking_name():
    # difflib ranks gspo (3 of 4 letters in order) above grpo for "gpro"; the same letters
    # swapped are the likelier typo.
    assert "did you mean 'grpo'?" in unknown_name_message("algorithm", "gpro", PRESETS)
    assert "did you mean 'gspo'?" in unknown_name_message("algorithm", "gsop", PRESETS)
    assert "did you mean 'dapo'?" in unknown_name_message("algorithm", "dapoo", PRESETS)
    assert "did you mean" not in unknown_name_message("algorithm", "zzzz", PRESETS)
