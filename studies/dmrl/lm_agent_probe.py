"""The LM lower agent against the rule agent on the same documents: parse rate, parameters.

    python -m studies.dmrl.lm_agent_probe [--model smollm2] [--documents 24]
        [--seed 0] [--free] [--out runs/dmrl_lm_agent.json]

Documents: the warm start's random documents (`scripted.random_document`, one rule per
parameter at a random level, each present with probability 0.8), whose intended
parameters the rule agent reads exactly. The LM agent (`lm_agent.LMAgent`, frozen, greedy)
reads each, its output constrained to one `name=value` line per parameter
(`lm_agent.params_ebnf`), or free text with `--free`; per document: whether it named all
14 parameters, how many it named, and per parameter the distance between its value and
the rule agent's as a fraction of the range. `agreement` is the share of (document, parameter) pairs within 0.125 of the range (half
the gap between two adjacent levels): the LM agent chose what the rules say.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policyopt.envs.ads.adsim.params import RANGES, AdParams
from policyopt.envs.ads.skilldoc.lm_agent import LM_AGENT_TOKENS, LMAgent
from policyopt.envs.ads.skilldoc.rule_agent import RuleAgent
from policyopt.envs.ads.skilldoc.scripted import random_document
from policyopt.models.loading import load_model

AGREE = 0.125  # half the gap between adjacent levels (0.25 of the range)


def range_distance(a: AdParams, b: AdParams) -> dict[str, float]:
    """|a − b| per parameter as a fraction of its range."""
    da, db = a.as_dict(), b.as_dict()
    return {n: abs(da[n] - db[n]) / (hi - lo) for n, (lo, hi) in RANGES.items()}


def compare(lm: Any, documents: list) -> dict[str, Any]:
    """The module docstring's measures for agent `lm` (a `LowerAgent` with `last_missing`)."""
    rule = RuleAgent()
    named, distances, parsed, outputs = [], [], 0, []
    start = time.perf_counter()
    for doc in documents:
        params = lm(doc)
        missing = list(lm.last_missing)
        parsed += not missing
        named.append(len(RANGES) - len(missing))
        dist = range_distance(params, rule(doc))
        # a parameter the LM did not name keeps its default: that is what it chose
        distances.append(dist)
        outputs.append(getattr(lm, "outputs", {}).get(doc.render(), ("",))[0])
    seconds = time.perf_counter() - start
    per_param = {n: float(np.mean([d[n] for d in distances])) for n in RANGES}
    pairs = [v for d in distances for v in d.values()]
    return {
        "documents": len(documents),
        "parse_rate": parsed / len(documents),
        "mean_named": float(np.mean(named)),
        "agreement": float(np.mean([v <= AGREE for v in pairs])),
        "mean_range_distance": float(np.mean(pairs)),
        "per_parameter_distance": per_param,
        "seconds_per_document": seconds / len(documents),
        "example_output": outputs[0] if outputs else "",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--documents", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--free", action="store_true", help="no output grammar")
    p.add_argument("--out", default="runs/dmrl_lm_agent.json")
    a = p.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(a.seed)
    documents = [random_document(rng) for _ in range(a.documents)]
    model, tok = load_model(a.model)
    agent = LMAgent(model, tok, max_new_tokens=LM_AGENT_TOKENS, grammar=not a.free)
    result = {"model": a.model, "seed": a.seed, "grammar": not a.free, **compare(agent, documents)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
