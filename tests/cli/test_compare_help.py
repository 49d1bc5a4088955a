"""compare: its help says what it does and shows defaults; JSON without NaN; 80 columns."""

import io
import json
import math

from rich.console import Console

from policyopt.cli.compare import finite, rich_table
from policyopt.cli.main import build_parser


def test_help_says_each_entry_runs_the_pipeline_and_shows_defaults():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = " ".join(sub.choices["compare"].format_help().split())
    assert "SFT warm start" in text and "RL" in text and "held-out evaluation" in text
    assert "(default: 3)" in text  # --seeds
    assert "reused, not rerun" in text


def test_compare_json_has_no_bare_nan():
    report = {"rows": [{"accuracy": (0.5, math.nan)}], "runs": {"grpo": [{"x": math.inf}]}}
    text = json.dumps(finite(report), allow_nan=False)
    assert json.loads(text) == {
        "rows": [{"accuracy": [0.5, None]}],
        "runs": {"grpo": [{"x": None}]},
    }


def test_table_fits_80_columns_for_four_methods():
    cols = {
        "accuracy": (0.523, 0.041),
        "pass@8": (0.91, 0.02),
        "level_3/accuracy": (0.3, 0.1),
        "initial accuracy": (0.48, 0.05),
        "accuracy gain": (0.04, 0.03),
        "RL wall time (s)": (123.4, 10.2),
    }
    rows = [{"method": m, "seeds": 3, **cols} for m in ("grpo", "hispo", "gar", "dapo")]
    out = io.StringIO()
    Console(file=out, width=80).print(rich_table(rows, 3))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any("0.523 ± 0.041" in line for line in lines)  # not folded away
