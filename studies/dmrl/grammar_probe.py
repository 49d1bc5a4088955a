"""The editor's samples without and with each edit grammar, on the same model and prompts.

    python -m studies.dmrl.grammar_probe --model DIR [--samples 256]
        [--max-new-tokens 57] [--seed 0]

DIR is an editor (e.g. the SFT warm start the `dmrl` pipeline caches under
`$POLICYOPT_CACHE/sft/KEY`). Prompts: random documents with recent outcomes, as the warm
start's demonstrations (`dmrl_skill`, mode "demonstrations"). Decodings: none, `skill_edit`
(free rule text), `skill_rule` (rules from the agent's vocabulary). For each it prints the
share of ok / malformed / truncated edits (`read_edit`), the share of ok edits that set a
parameter (a delete, or a rule the rule agent reads: `rule_setting`), the generation time,
and for the constrained ones the mean probability mass per token the grammar removed (1 − Z(s), under
the model's own distribution: how much of what it would have written the grammar forbids).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch

from policyopt.envs.ads.skilldoc.document import Edit, read_edit
from policyopt.envs.ads.skilldoc.rule_agent import rule_setting
from policyopt.envs.ads.skilldoc.task import SkillDocTask
from policyopt.models.loading import load_model
from policyopt.models.logprobs import response_logprobs
from policyopt.rollout.base import SamplingParams
from policyopt.rollout.hf_engine import HFEngine


def sets_a_parameter(edit: Edit) -> bool:
    """A delete, or a rule the rule agent reads (a parameter and a level it knows)."""
    return edit.action == "delete" or rule_setting(edit.content, edit.section) is not None


def probe(model_dir: str, samples: int, max_new_tokens: int, seed: int) -> dict[str, dict]:
    torch.set_num_threads(1)
    model, tok = load_model(model_dir)
    task = SkillDocTask(
        mode="demonstrations", seed=seed, eval_size=samples, history=0, eval_users=10
    )
    rows = list(task.rows("eval"))
    prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    out = {}
    for grammar in (None, "skill_edit", "skill_rule"):
        engine = HFEngine(
            model,
            tok,
            batch_size=16,
            grammar=grammar,
            generator=torch.Generator().manual_seed(seed),
        )
        start = time.perf_counter()
        r = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens))
        seconds = time.perf_counter() - start
        counts: Counter[str] = Counter()
        for i, row in enumerate(rows):
            text = tok.decode(r.response_ids[i, : int(r.lengths[i])], skip_special_tokens=True)
            edit, status = read_edit(text, task.document_of(row))
            counts[status] += 1
            if status == "ok" and sets_a_parameter(edit):
                counts["sets_a_parameter"] += 1
        result = {s: counts[s] / len(rows) for s in ("ok", "malformed", "truncated")}
        result["sets_a_parameter_of_ok"] = counts["sets_a_parameter"] / max(counts["ok"], 1)
        result["generation_seconds"] = seconds
        result["ms_per_token"] = 1000 * seconds / max(r.generated_tokens, 1)
        if r.allowed_bits is not None:
            width = r.response_ids.shape[1]
            args = (model, r.input_ids(), r.attention_mask(), width)
            with torch.no_grad():
                neg_log_z = r.logp - response_logprobs(*args).logp  # log π_c − log π
            m = r.response_mask.bool()
            result["removed_mass_per_token"] = float((1 - torch.exp(-neg_log_z[m])).mean())
        out[grammar or "none"] = result
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=57)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    print(json.dumps(probe(a.model, a.samples, a.max_new_tokens, a.seed), indent=1))


if __name__ == "__main__":
    main()
