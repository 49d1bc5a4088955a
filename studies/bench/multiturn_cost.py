"""What a multi-turn step costs against a single-turn step with the same number of model
tokens.

    python -m studies.bench.multiturn_cost --turns 3 --turn-tokens 16 --rounds 10 \\
        --json-out studies/bench/multiturn_cost.json

Two arms of `policyopt bench`'s interleaved timing (ABBA rounds, each arm on its own RNG
state), GRPO on the embedded arithmetic task with the untrained embedded model (`tiny`,
which rarely samples EOS, so every turn runs to its cap):

- `single`: one completion of `turns x turn_tokens` tokens per sample (`parallel`);
- `multi`: an episode of `turns` model turns of `turn_tokens` tokens each, the environment
  replying to each with a fixed observation (`fixed_reply`, registered here), the replies in
  the sequence and masked out of the loss.

Both arms sample the same number of model tokens per leaf (the report checks it); the multi
arm adds the replies' tokens to the trainer's forward and one engine call per turn.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from typing import Any

from policyopt.cli.bench import time_policyopt
from policyopt.rollout.environment import ENVIRONMENTS, Environment, Episode, Reply

REPLY = "[ok, go on]\n"


class FixedReplyEpisode(Episode):
    def step(self, turn: str) -> Reply:
        return Reply(messages=({"role": "user", "content": REPLY},))


class FixedReply(Environment):
    """Replies `REPLY` to every turn; the strategy's max_turns ends the episode."""

    def start(self, prompt: str, row: Mapping[str, Any] | None = None) -> Episode:
        return FixedReplyEpisode()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if "fixed_reply" not in ENVIRONMENTS:
        ENVIRONMENTS.register("fixed_reply")(FixedReply)
    model_tokens = args.turns * args.turn_tokens
    # The episode's budget holds every turn and every reply (one character a token).
    episode_tokens = model_tokens + args.turns * len(REPLY)
    options = (
        "{environment: fixed_reply, "
        f"max_turns: {args.turns}, max_turn_tokens: {args.turn_tokens}}}"
    )
    arms = [
        "single",
        f"multi+rollout.strategy=multi_turn+rollout.strategy_options={options}"
        f"+rollout.max_new_tokens={episode_tokens}",
    ]
    settings = {
        "prompts_per_step": args.prompts,
        "group_size": args.group_size,
        "max_new_tokens": model_tokens,
        "lr": 1e-5,
        "model": "tiny",
        "temperature": 1.0,
    }
    load_start = os.getloadavg()
    # The arms' names are presets in bench; both are GRPO here.
    results = time_policyopt(
        [a.replace("single", "grpo", 1).replace("multi+", "grpo+", 1) for a in arms],
        settings,
        args.rounds,
        ["train.num_threads=1", *args.overrides],
    )
    single, multi = results.values()
    report = {
        "settings": {**settings, "turns": args.turns, "turn_tokens": args.turn_tokens},
        "model_tokens_per_leaf": {
            "single": single["generated_tokens_per_leaf"],
            "multi": multi["generated_tokens_per_leaf"],
        },
        "step_time_s": {"single": single["step_time_s"], "multi": multi["step_time_s"]},
        "cpu_time_s": {"single": single["cpu_time_s"], "multi": multi["cpu_time_s"]},
        "time_split_s": {"single": single["time_split"], "multi": multi["time_split"]},
        "multi_over_single": multi["step_time_s"] / single["step_time_s"],
        "multi_over_single_cpu": multi["cpu_time_s"] / single["cpu_time_s"],
        "load_average": {"start": load_start, "end": os.getloadavg()},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
