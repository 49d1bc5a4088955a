"""Saving and loading a trained LRP with its memory bank (safetensors + a JSON config)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from policyopt.envs.ads.lrp.features import MemoryBank
from policyopt.envs.ads.lrp.model import LRP


def save_lrp(path: str | Path, model: LRP, bank: MemoryBank) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path / "lrp.safetensors")
    save_file(
        {"keys": bank.keys, "values": bank.values, "matured_day": bank.matured_day},
        path / "bank.safetensors",
    )
    (path / "lrp_config.json").write_text(
        json.dumps({"hidden": model.hidden, "fusion": model.fusion})
    )
    return path


def load_lrp(path: str | Path) -> tuple[LRP, MemoryBank]:
    path = Path(path)
    if not (path / "lrp.safetensors").is_file():
        raise FileNotFoundError(f"no trained LRP at {path} (lrp.safetensors missing)")
    cfg = json.loads((path / "lrp_config.json").read_text())
    model = LRP(cfg["hidden"], cfg.get("fusion", "gated"))  # older saves: gated
    model.load_state_dict(load_file(path / "lrp.safetensors"))
    b = load_file(path / "bank.safetensors")
    return model.eval().requires_grad_(False), MemoryBank(b["keys"], b["values"], b["matured_day"])
