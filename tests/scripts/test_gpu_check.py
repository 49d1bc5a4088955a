"""scripts/gpu_check.py cannot rot unseen: its plan covers every method preset, its budget
skips what would not fit, and its dry run (`--device cpu --tiny`: the same cells on the tiny
model with the hf engine, 1 step each) writes the JSON a GPU run would."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from policyopt.methods import PRESETS

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu_check.py"
EXTRA_CELLS = ("fsdp2", "trl", "larger_model")


def load_script():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_preset_is_a_cell_or_skipped_with_its_reason() -> None:
    gc = load_script()
    args = gc.parse_args([])  # the GPU check's defaults
    cells = {c["name"]: c for c in gc.plan(args, "vllm")}
    assert set(cells) == {*PRESETS.names(), *EXTRA_CELLS}
    assert "Plackett" in cells["pg_rank"]["skipped"]
    for name in PRESETS.names():
        cell = cells[name]
        if cell["status"] == "skipped":
            continue
        assert "model.precision=bf16-mixed" in cell["overrides"]
        assert "rollout.engine=vllm" in cell["overrides"]
        assert "model.device=cuda" in cell["overrides"]
        options = next(o for o in cell["overrides"] if o.startswith("rollout.engine_options="))
        options = json.loads(options.split("=", 1)[1])
        assert options["dtype"] == "bfloat16"
        # vLLM returns no entropies: what HISPO's segments and DATPO's forks read
        assert (options.get("entropies") == "trainer") == (name in {"hispo", "datpo"})
    assert "model.name_or_path=smollm2" in cells["grpo"]["overrides"]
    assert cells["srpo"]["recipe"] == "rerank_srpo"  # SRPO's language-model scenario
    assert "algorithm.name=srpo" in cells["srpo"]["overrides"]
    assert "train.parallel=fsdp2" in cells["fsdp2"]["overrides"]
    order = list(cells)
    assert order[:3] == ["grpo", "fsdp2", "trl"]


def test_cells_past_the_budget_are_skipped_without_starting(tmp_path, monkeypatch) -> None:
    gc = load_script()
    args = gc.parse_args(["--device", "cpu", "--tiny", "--budget-s", "0"])
    cells = gc.plan(args, "hf")

    def no_child(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a cell past the budget was started")

    monkeypatch.setattr(gc, "run_child", no_child)
    gc.run_cells(args, cells, tmp_path, save=lambda: None)
    assert all(c["status"] == "skipped" for c in cells)
    assert all("over the budget" in c["skipped"] for c in cells if c["name"] != "pg_rank")


@pytest.mark.slow
def test_trl_goes_to_the_gpu_with_vllm_in_its_own_process(tmp_path, monkeypatch) -> None:
    trl = pytest.importorskip("trl")
    monkeypatch.setattr(trl, "GRPOConfig", trl.GRPOConfig)  # put back after the test
    load_script().trl_on_gpu(vllm=True)
    from trl import GRPOConfig  # as time_trl imports it

    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert not config.use_cpu
    assert config.use_vllm and config.vllm_mode == "colocate"


@pytest.mark.slow
def test_the_dry_run_writes_the_json_of_a_gpu_run(tmp_path) -> None:
    out = tmp_path / "dry.json"
    chosen = ["grpo", "fsdp2", "trl"]
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--only", ",".join(chosen)]
    done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "dry run" and report["ok"] is True
    assert report["device"].startswith("cpu")
    assert report["engine"] == "hf"
    assert {"torch", "vllm", "transformers", "trl"} <= set(report["versions"])
    budget = report["budget"]
    assert budget["within_budget"] and budget["total_s"] <= budget["budget_s"]
    assert budget["cells_run"] == len(chosen) and budget["cells_failed"] == 0
    cells = {c["name"]: c for c in report["cells"]}
    assert set(cells) == {*PRESETS.names(), *EXTRA_CELLS}
    for name, cell in cells.items():
        if name not in chosen:
            assert cell["status"] == "skipped" and cell["skipped"]
            continue
        assert cell["status"] == "ok", cell
        assert cell["step_time_s"] > 0 and cell["tokens_per_s"] > 0
        assert cell["timed_steps"] >= 1 and len(cell["step_times_s"]) >= 1
        assert cell["peak_gpu_memory_mib"] is None and cell["peak_rss_mib"] > 0
        assert cell["wall_s"] <= cell["limit_s"]
        assert Path(cell["log"]).is_file()
    for name in ("grpo", "fsdp2"):
        assert cells[name]["precision"] == "bf16-mixed"
        assert cells[name]["sampling_tokens_per_s"] > 0
        assert cells[name]["steps"][0]["generated_tokens"] > 0
