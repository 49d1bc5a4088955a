"""The single-method environments stay out of the library: importing it loads none of their
packages, and naming one of their tasks without its extra is one line naming the extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from policyopt.core.registry import _ALL, MissingExtraError, Registry
from policyopt.core.structure import registered_producers

ENV_PACKAGES = [
    "lxml",
    "apted",
    "rapidfuzz",
    "pysbd",
    "latex2sympy2_extended",
    "math_verify",
    "lightgbm",
    "xgrammar",
]

# Makes the named top-level packages unimportable, as if their extra were not installed.
BLOCKER = """
import sys
BLOCKED = {blocked!r}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Block())
"""


def run(code: str, tmp_path: Path, blocked: list[str] = ()) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(blocked)))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )


def test_importing_the_library_loads_no_environment_package(tmp_path):
    code = (
        "import sys\n"
        "import policyopt.tasks, policyopt.methods, policyopt.train.trainer\n"
        "import policyopt.cli.main, policyopt.pipelines.quickstart\n"
        f"print(sorted(m for m in {ENV_PACKAGES!r} if m in sys.modules))\n"
    )
    out = run(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_task_without_its_extra_is_one_line_naming_it(tmp_path):
    code = (
        "import sys\n"
        "from policyopt.cli.main import main\n"
        "sys.exit(main(['train', 'task.name=docparse', 'train.steps=1', "
        "'train.output_dir=out']))\n"
    )
    out = run(code, tmp_path, blocked=["rapidfuzz", "lxml"])
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "pip install 'policyopt[docpo]'" in lines[0] and "'docparse'" in lines[0]
    assert not (tmp_path / "out").exists()  # refused before the run folder is made


@pytest.fixture
def registry():
    reg: Registry[object] = Registry("thing")
    yield reg
    _ALL.remove(reg)  # registries live for the process: leave none behind for other tests


def test_lazy_registry_entry(registry):
    registry.lazy("json_thing", "json", "jsonx")  # importing json registers nothing
    assert "json_thing" in registry and registry.names() == ["json_thing"]
    assert registry.loaded() == []
    with pytest.raises(KeyError, match="did not register it"):
        registry.get("json_thing")
    registry.lazy("gone", "policyopt_no_such_module_xyz", "gone")
    with pytest.raises(MissingExtraError, match=r"pip install 'policyopt\[gone\]'"):
        registry.get("gone")
    assert registered_producers("anything") == []  # never imports a lazy entry to answer
