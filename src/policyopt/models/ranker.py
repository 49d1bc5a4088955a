"""A Plackett–Luce ranking policy: an MLP scores each candidate item from its features.

The policy maps a prompt (a query's candidate item ids, left-padded) to log-probs of the
items it places at each position (the response), like a causal LM maps a prompt to token
log-probs: log π(L_t | L_<t) = z[L_t] − logsumexp of z over the candidates not yet placed,
z = s / T the scores at temperature T (`core.plackett_luce`).

Features: the item table [num_items + 1, F] (row 0 is padding) is the task's data, held as
a non-persistent buffer (like a frozen embedding table; checkpoints hold only what is
learned). Each feature is mapped by sign(x)·log1p(|x|) (heavy-tailed counts such as MSLR's)
and standardised with the mean and std fitted on the training items (`fit_normalizer`);
those statistics are saved with the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from policyopt.core.plackett_luce import plackett_luce_entropy, plackett_luce_logprobs
from policyopt.models.logprobs import LogProbOutput

# Name -> hidden layer widths of the scorer ([] = a linear scorer).
RANKERS: dict[str, list[int]] = {"pl-mlp": [64, 64], "pl-linear": []}
# A large negative score for padding candidates: finite, so that no NaN reaches a gradient.
PAD_SCORE = -1e9


def squash(x: Tensor) -> Tensor:
    """sign(x)·log1p(|x|): compresses heavy-tailed features, keeps sign and order."""
    return x.sign() * x.abs().log1p()


class PLRanker(nn.Module):
    """Scores s = MLP(standardise(squash(features))) of a query's candidate items."""

    def __init__(self, num_features: int, hidden: list[int], dropout: float = 0.0) -> None:
        super().__init__()
        self.config = {"num_features": num_features, "hidden": list(hidden), "dropout": dropout}
        layers: list[nn.Module] = []
        width = num_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        self.register_buffer("feature_mean", torch.zeros(num_features))
        self.register_buffer("feature_std", torch.ones(num_features))
        self.register_buffer("items", torch.zeros(1, num_features), persistent=False)

    # ------------------------------------------------------------------ data
    def set_items(self, features: Tensor) -> None:
        """The task's item table [num_items, F] (item id i is row i − 1)."""
        if features.dim() != 2 or features.shape[1] != self.config["num_features"]:
            raise ValueError(
                f"item features must be [num_items, {self.config['num_features']}], "
                f"got {tuple(features.shape)}"
            )
        pad = features.new_zeros(1, features.shape[1])
        self.items = torch.cat([pad, features.float()]).to(self.feature_mean.device)

    def fit_normalizer(self, item_ids: Tensor) -> None:
        """Mean and std of the squashed features of `item_ids` (the training items)."""
        x = squash(self.items[item_ids])
        self.feature_mean = x.mean(0)
        self.feature_std = x.std(0).clamp(min=1e-6)  # constant features stay 0

    # ------------------------------------------------------------------ policy
    def scores(self, item_ids: Tensor, mask: Tensor) -> Tensor:
        """s [B, P] of candidate ids [B, P]; padding (mask 0) gets PAD_SCORE."""
        x = (squash(self.items[item_ids]) - self.feature_mean) / self.feature_std
        s = self.mlp(x).squeeze(-1)
        return s.masked_fill(~mask.bool(), PAD_SCORE)

    def response_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        response_len: int,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        with_hidden: bool = False,
        **_: object,
    ) -> LogProbOutput:
        """Per-position log π(L_t | L_<t) [B, R] of the last `response_len` columns (the
        placed items) given the prompt columns (the candidates); 0 at padding positions."""
        if with_hidden:
            raise ValueError("a ranking policy has no hidden states per position")
        prompt, response = input_ids[:, :-response_len], input_ids[:, -response_len:]
        pmask = attention_mask[:, :-response_len].bool()
        rmask = attention_mask[:, -response_len:].bool()
        z = self.scores(prompt, pmask) / temperature
        # Position of each placed item among the candidates (padding positions -> 0).
        match = (response[:, :, None] == prompt[:, None, :]) & pmask[:, None, :]
        found = match.any(-1)
        if (rmask & ~found).any():
            row = int((rmask & ~found).any(1).nonzero()[0, 0])
            raise ValueError(f"row {row} places an item that is not among its candidates")
        local = match.float().argmax(-1)
        # Padding positions: place the remaining items in order so that rankings stay
        # distinct; their log-probs are masked to 0.
        local = torch.where(rmask, local, _fill_unplaced(local, rmask, pmask))
        logp = plackett_luce_logprobs(z, local).masked_fill(~rmask, 0.0)
        entropy = None
        if with_entropy:
            entropy = plackett_luce_entropy(z, local).masked_fill(~rmask, 0.0)
        return LogProbOutput(logp=logp, entropies=entropy)

    # ------------------------------------------------------------------ save / load
    def save_pretrained(self, folder: str | Path, safe_serialization: bool = True) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ranker_config.json").write_text(json.dumps(self.config))
        save_file(
            {k: v.contiguous() for k, v in self.state_dict().items()}, folder / "model.safetensors"
        )

    @staticmethod
    def is_checkpoint(folder: str | Path) -> bool:
        """Whether `folder` holds a saved ranking policy (`save_pretrained`)."""
        return (Path(folder) / "ranker_config.json").is_file()

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> PLRanker:
        folder = Path(folder)
        config = json.loads((folder / "ranker_config.json").read_text())
        model = cls(config["num_features"], config["hidden"], config.get("dropout", 0.0))
        model.load_state_dict(load_file(folder / "model.safetensors"))
        return model


def _fill_unplaced(local: Tensor, rmask: Tensor, pmask: Tensor) -> Tensor:
    """For padding response positions: candidate indices not placed by the real positions,
    in increasing order (any distinct fill works; those positions are masked)."""
    p = pmask.shape[1]
    used = torch.zeros(local.shape[0], p, dtype=torch.long, device=local.device)
    used.scatter_add_(1, local.masked_fill(~rmask, 0), rmask.long())
    # Unused candidate columns sorted first (stable: increasing index).
    order = (used > 0).long().argsort(dim=1, stable=True)
    slot = (~rmask).long().cumsum(1) - 1  # t-th padding position takes the t-th unused column
    return order.gather(1, slot.clamp(min=0, max=p - 1))
