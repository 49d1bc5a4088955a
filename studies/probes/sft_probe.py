"""SFT probe: a recipe's SFT warm start alone, then one held-out greedy evaluation.

    python studies/probes/sft_probe.py countdown [KEY=VALUE ...]

Prints one JSON line: SFT steps, seconds, final loss, greedy accuracy (overall and per
level), median response tokens and HISPO segments. Used to size the Countdown recipe
(studies/record.md, issue 19); nothing is cached or written besides the run folder.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from rich.console import Console

from policyopt.pipelines.quickstart import fine_tune
from policyopt.recipes import recipe_config
from policyopt.train.trainer import Trainer


def main(argv: list[str]) -> None:
    recipe, overrides = argv[0], argv[1:]
    out = tempfile.mkdtemp(prefix="sft-probe-")
    config = recipe_config(recipe, [*overrides, "train.progress=false"], out, None)
    console = Console(quiet=True)
    start, load = time.perf_counter(), os.getloadavg()
    model, tok, sft = fine_tune(config, console)
    trainer = Trainer(config, model=model, tokenizer=tok, console=console)
    t0 = time.perf_counter()
    result = trainer.evaluate()
    trainer.close()
    report = {
        "overrides": overrides,
        "params": sum(p.numel() for p in model.parameters()),
        **sft,
        "eval_seconds": time.perf_counter() - t0,
        "wall_seconds": time.perf_counter() - start,
        "load_at_start": load,
        **{k: v for k, v in result.items() if "accuracy" in k or "median" in k},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
