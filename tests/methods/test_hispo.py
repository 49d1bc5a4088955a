"""HISPO: entropy segments (SPEC section 2 steps 2-5), the annotator, preset, recipe,
training through the trainer, and LoRA rank-1 training with merged checkpoints."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from policyopt.config.load import load_config
from policyopt.methods.hispo import build_segments, ema_forward, hispo_segments, row_quantile
from policyopt.models.loading import load_model
from policyopt.models.lora import disabled_adapter
from policyopt.recipes import recipe_dict
from policyopt.rollout.base import Rollouts
from policyopt.rollout.strategies import ROLLOUT_ANNOTATORS
from policyopt.train.trainer import Trainer
from run_configs import small_overrides

torch.set_num_threads(1)
F64 = torch.float64


def small_config(output_dir: Path, *extra: str, steps: int = 2):
    return load_config(overrides=[*small_overrides(output_dir, steps), *extra])


def reference_segments(h: list[float], alpha: float, q: float, window: int) -> list[int]:
    """Steps 2-5 in plain Python, 0-based j = t − 1 (see the module docstring)."""
    smooth = [h[0]] if h else []
    for x in h[1:]:
        smooth.append(alpha * x + (1 - alpha) * smooth[-1])  # H̃_j
    T = len(h)
    kept: list[int] = []
    if T >= 3:
        tau = torch.quantile(torch.tensor(smooth[1 : T - 1], dtype=F64), q).item()
        for j in range(1, T - 1):
            s = smooth[j]
            if not (s >= tau and s >= smooth[j - 1] and s > smooth[j + 1]):
                continue
            if s < max(smooth[max(0, j - window // 2) : j + window // 2 + 1]):
                continue
            if kept and j - kept[-1] < window:
                continue
            kept.append(j)
    return [sum(k <= j for k in kept) for j in range(T)]


def peaks(length: int, where: dict[int, float]) -> torch.Tensor:
    """Entropy 0 everywhere except isolated peaks."""
    h = torch.zeros(1, length)
    for j, v in where.items():
        h[0, j] = v
    return h


def boundaries(ids: torch.Tensor) -> list[int]:
    """Positions j where a new segment starts (row 0)."""
    return (ids[0, 1:] != ids[0, :-1]).nonzero()[:, 0].add(1).tolist()


# ------------------------------------------------------------------ building blocks
def test_ema_matches_the_recurrence_across_blocks():
    x = torch.rand(3, 150, dtype=F64)
    for alpha in (0.1, 0.35, 1.0):
        expected = x.clone()
        for j in range(1, 150):
            expected[:, j] = alpha * x[:, j] + (1 - alpha) * expected[:, j - 1]
        torch.testing.assert_close(ema_forward(x, alpha), expected, rtol=1e-12, atol=1e-14)


def test_row_quantile_matches_torch_quantile():
    x = torch.rand(4, 9, dtype=F64)
    valid = torch.arange(9)[None, :] < torch.tensor([[9], [5], [1], [0]])
    for q in (0.0, 0.3, 0.6, 1.0):
        tau = row_quantile(x, valid, q)
        for i in range(3):
            assert tau[i].item() == pytest.approx(torch.quantile(x[i][valid[i]], q).item())
        assert tau[3].item() == float("inf")


# ------------------------------------------------------------------ build_segments
def test_hand_worked_example():
    # α = 0.5, H = (0, 2, 0, 0, 4, 0): H̃ = (0, 1, 0.5, 0.25, 2.125, 1.0625).
    # τ = 0.6-quantile of H̃_1..4 = sorted (0.25, 0.5, 1, 2.125) at rank 1.8: 0.5 + 0.8 · 0.5
    # = 0.9. Candidates: j = 1 (1 ≥ 0.9, ≥ 0, > 0.5) and j = 4 (2.125 > 1.0625).
    h, mask = torch.tensor([[0.0, 2, 0, 0, 4, 0]]), torch.ones(1, 6)
    seg = lambda **kw: build_segments(h, mask, alpha=0.5, **kw)[0].tolist()  # noqa: E731
    # Δ = 2 (half 1): both are their window's max and 4 − 1 ≥ 2: two boundaries.
    assert seg(window=2) == [0, 1, 1, 1, 2, 2]
    # Δ = 4 (half 2): both window maxima, but 4 − 1 < 4 suppresses j = 4.
    assert seg(window=4) == [0, 1, 1, 1, 1, 1]
    # Δ = 8 (half 4): j = 1's window reaches H̃_4 = 2.125, so only j = 4 is kept.
    assert seg(window=8) == [0, 0, 0, 0, 1, 1]
    # q = 0.9: τ = 1 + 0.7 · 1.125 = 1.7875 > H̃_1, only j = 4 passes the cutoff.
    assert seg(window=2, quantile=0.9) == [0, 0, 0, 0, 1, 1]
    # Plateau, α = 1 (H̃ = H): H̃_j ≥ H̃_{j−1} and H̃_j > H̃_{j+1} pick its right end, j = 3.
    plateau = torch.tensor([[0.0, 1, 3, 3, 1, 0]])
    assert build_segments(plateau, mask, alpha=1.0, window=2)[0].tolist() == [0, 0, 0, 1, 1, 1]


def test_boundaries_on_isolated_peaks():
    ids = build_segments(peaks(160, {20: 5.0, 100: 5.0}), torch.ones(1, 160))
    assert boundaries(ids) == [20, 100]
    assert ids[0, :20].eq(0).all() and ids[0, 20:100].eq(1).all() and ids[0, 100:].eq(2).all()


def test_no_boundary_where_entropy_only_falls():
    mask = torch.ones(3, 120)
    falling = torch.stack(
        [
            torch.linspace(3.0, 0.1, 120),
            torch.rand(120).mul(0.1).cumsum(0).flip(0),  # random decreasing steps
            torch.cat([torch.full((1,), 4.0), torch.zeros(119)]),  # one early spike only
        ]
    )
    assert build_segments(falling, mask, window=4).eq(0).all()


def test_nms_window_is_respected():
    h, mask = peaks(200, {20: 5.0, 60: 5.0}), torch.ones(1, 200)
    # Both are maxima of their centred windows; 60 − 20 = 40 < Δ = 64 suppresses the later.
    assert boundaries(build_segments(h, mask, window=64)) == [20]
    assert boundaries(build_segments(h, mask, window=32)) == [20, 60]
    # A higher peak 20 tokens later is in the first one's window: only it is kept.
    higher = peaks(200, {20: 3.0, 40: 6.0, 150: 5.0})
    assert boundaries(build_segments(higher, mask, window=64)) == [40, 150]
    # without the window-max rule the greedy scan would keep 20, not 40
    assert boundaries(build_segments(higher, mask, window=2)) == [20, 40, 150]


@pytest.mark.parametrize("seed", range(4))
def test_random_entropies_match_a_direct_implementation(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = [200, 137, 64, 3, 2, 1, 0]
    h = torch.rand(len(lengths), 200, generator=g) * 4
    mask = torch.arange(200)[None, :] < torch.tensor(lengths)[:, None]
    n_boundaries = 0
    for alpha, q, window in ((0.1, 0.6, 64), (0.3, 0.6, 16), (0.5, 0.3, 8), (1.0, 0.8, 5)):
        ids = build_segments(h, mask, alpha=alpha, quantile=q, window=window)
        assert ids.dtype == torch.long
        for i, t in enumerate(lengths):
            expected = reference_segments(h[i, :t].double().tolist(), alpha, q, window)
            assert ids[i, :t].tolist() == expected, (i, alpha, q, window)
            n_boundaries += expected[-1] if expected else 0
    assert n_boundaries >= 40  # the case is not trivial


def test_masks_and_padding():
    g = torch.Generator().manual_seed(7)
    h = torch.rand(1, 112, generator=g) * 3
    full = build_segments(h, torch.ones(1, 112), window=8)[0]
    # Right padding with garbage entropies: same ids on the valid tokens.
    padded_h = torch.cat([h, torch.full((1, 30), float("nan"))], 1)
    padded_m = torch.cat([torch.ones(1, 112), torch.zeros(1, 30)], 1)
    padded = build_segments(padded_h, padded_m, window=8)[0]
    assert padded[:112].tolist() == full.tolist()
    assert padded[112:].eq(full[-1]).all()  # padding keeps the running index
    # Holes in the mask: the valid tokens in order are segmented as one response.
    holes_m = torch.ones(1, 120)
    gaps = torch.tensor([0, 5, 6, 40, 41, 42, 77, 119])
    holes_m[0, gaps] = 0
    holes_h = torch.full((1, 120), float("nan"))
    holes_h[holes_m.bool()] = h[0]
    holes = build_segments(holes_h, holes_m, window=8)[0]
    assert holes[holes_m[0].bool()].tolist() == full.tolist()
    assert full[-1] >= 3  # several segments
    # Very short responses and empty rows: one segment.
    short = build_segments(torch.rand(3, 4), torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0] * 4]))
    assert short.eq(0).all()


def test_argument_errors():
    h, m = torch.rand(2, 5), torch.ones(2, 5)
    with pytest.raises(ValueError, match="alpha"):
        build_segments(h, m, alpha=0.0)
    with pytest.raises(ValueError, match="quantile"):
        build_segments(h, m, quantile=1.5)
    with pytest.raises(ValueError, match="window"):
        build_segments(h, m, window=0)
    with pytest.raises(ValueError, match="one shape"):
        build_segments(h, m[:, :3])


# ------------------------------------------------------------------ annotator, preset, recipe
def test_annotator_segments_rollout_entropies():
    entropy = torch.cat([peaks(100, {30: 5.0}), peaks(100, {10: 5.0, 76: 5.0})])
    mask = torch.ones(2, 100)
    mask[1, 80:] = 0
    rollouts = Rollouts(
        prompt_ids=torch.zeros(2, 3, dtype=torch.long),
        prompt_mask=torch.ones(2, 3, dtype=torch.long),
        response_ids=torch.zeros(2, 100, dtype=torch.long),
        response_mask=mask,
        logp=torch.zeros(2, 100),
        entropies=entropy,
        truncated=torch.zeros(2, dtype=torch.bool),
        generated_tokens=180,
    )
    assert ROLLOUT_ANNOTATORS.get("hispo_segments") is hispo_segments
    out = hispo_segments(rollouts)
    assert set(out) == {"segment_ids"} and out["segment_ids"].shape == (2, 100)
    assert boundaries(out["segment_ids"][:1]) == [30]
    assert boundaries(out["segment_ids"][1:, :80]) == [10, 76]
    assert boundaries(hispo_segments(rollouts, window=128)["segment_ids"][1:, :80]) == [10]


def test_preset_and_recipe():
    cfg = load_config(overrides=["algorithm.name=hispo"])
    alg = cfg.algorithm
    from policyopt.config.check import loss_settings

    s = loss_settings(cfg)
    assert (alg.advantage, alg.loss, s["clip_low"], s["clip_high"]) == ("grpo", "hispo", 0.2, 0.2)
    assert [(a.name, a.options) for a in cfg.rollout.annotators] == [("hispo_segments", {})]
    recipe, grpo = load_config(base=recipe_dict("hispo")), load_config(base=recipe_dict("grpo"))
    assert recipe.algorithm.name == "hispo" and recipe.algorithm.loss == "hispo"
    for section in ("rollout", "train", "sft", "optim", "eval", "task", "model"):
        ours, theirs = getattr(recipe, section), getattr(grpo, section)
        if section == "rollout":
            ours, theirs = ours.model_copy(update={"annotators": []}), theirs
        assert ours == theirs, section  # the same budget as grpo


# ------------------------------------------------------------------ training
def test_two_steps_through_the_trainer(tmp_path):
    cfg = small_config(
        tmp_path,
        "algorithm.name=hispo",
        "rollout.annotators=[{name: hispo_segments, options: {window: 4}}]",
    )
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    trainer.close()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["segments_per_response"] >= 1
        assert 1 <= r["mean_segment_length"] <= 12
        assert r["segment_clipfrac"] == 0  # on-policy: every μ is 1
        assert r["ratio_mean"] == pytest.approx(1.0)


def test_lora_rank1_with_kl_and_merged_checkpoint(tmp_path):
    cfg = small_config(
        tmp_path,
        "algorithm.name=hispo",
        "algorithm.kl_coef=0.01",
        "model.lora.enabled=true",
        "model.lora.rank=1",
        "model.lora.alpha=32",
        "model.lora.save_merged=true",
    )
    trainer = Trainer(cfg)
    model = trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    metrics = trainer.train()
    trainer.close()
    assert "kl_ref" in metrics and "segments_per_response" in metrics
    after = dict(model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= trainable  # only adapters move
    assert any("lora_A" in n for n in changed) and any("lora_B" in n for n in changed)

    merged_dir = tmp_path / "checkpoints" / "step-00000002" / "merged"
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    ids = torch.tensor([trainer.tokenizer.encode("12+34=46")])
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with disabled_adapter(model):
            base = model(input_ids=ids).logits
        ours = merged(input_ids=ids).logits
    torch.testing.assert_close(ours, adapted, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(adapted, base, atol=1e-6)  # the adapter did change the policy
    # The merged folder is a whole model: `policyopt eval --model .../merged` loads it.
    reloaded, tok = load_model(str(merged_dir))
    assert tok.encode("12+34=46") == trainer.tokenizer.encode("12+34=46")
