"""Every code and YAML block of the README and the guides runs here, so the docs cannot rot.

Blocks are read from the Markdown files in `DOCS`. A directive in an HTML comment on the line
just above a block says how to run it (none: the default for its language):

- `<!-- doctest: file PATH -->`: write the block to PATH in the document's work folder (a
  YAML file is then also loaded with `load_config`, so a stale key fails here);
- `<!-- doctest: small KEY=VALUE ... -->`: append these overrides to every `policyopt`
  command of a bash block (the slow ones, on small settings);
- `<!-- doctest: skip REASON -->`: not run here (hardware this machine lacks); the reason
  is required.

Defaults: `python` blocks run in order in one namespace per document; `bash` blocks run
each line with `policyopt` as the console script runs it (`policyopt.cli.main:main`, the
working folder not on `sys.path`, the repository's `src` standing in for the installed
package and nothing else on `PYTHONPATH`, output to a file, not a terminal), as a user
runs it; `pip
install` lines are skipped (CI runs the install itself); a `yaml` block without a `file`
directive must load as a config. Each document runs in its own temporary folder holding a
link to the repository's `examples/`, in document order (a block may use what an earlier
one wrote).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from policyopt.config.load import load_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*doctest:\s*(\w+)\s*(.*?)\s*-->\s*$")
RUN_LANGS = {"bash", "sh", "yaml", "python"}


@dataclass
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    directive: str = ""
    argument: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def read_blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start = i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        block = Block(doc, start + 1, match.group(1), "\n".join(lines[start + 1 : end]) + "\n")
        directive = DIRECTIVE.match(lines[start - 1]) if start else None
        if directive:
            block.directive, block.argument = directive.group(1), directive.group(2)
        if block.lang in RUN_LANGS:
            blocks.append(block)
        i = end + 1
    return blocks


ALL = [b for doc in DOCS for b in read_blocks(doc)]


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, tuple[Path, dict]]:
    """One work folder and one Python namespace per document, shared by its blocks."""
    return {}


def workdir_for(block: Block, workdirs: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if block.doc not in workdirs:
        work = tmp_path_factory.mktemp(block.doc.stem)
        (work / "examples").symlink_to(ROOT / "examples")
        workdirs[block.doc] = (work, {"__name__": "__doc__"})
    return workdirs[block.doc][0]


def run_bash(block: Block, work: Path, env: dict[str, str]) -> None:
    small = shlex.split(block.argument) if block.directive == "small" else []
    for raw in _logical_lines(block.text):
        words = shlex.split(raw, comments=True)
        if not words or words[:2] == ["pip", "install"] or "pip install" in raw:
            continue
        if words[0] == "policyopt":
            words = [sys.executable, "-c", CONSOLE_SCRIPT, *words[1:], *small]
        elif words[0] == "python":
            words[0] = sys.executable
        log = work / "output.log"
        with log.open("w") as fh:
            done = subprocess.run(words, cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT)
        assert done.returncode == 0, (
            f"{block.id}: `{raw}` exited {done.returncode}\n{log.read_text()[-6000:]}"
        )


# What the `policyopt` console script does: `main()` with sys.path as an installed entry
# point has it (no working folder; `python -c` would put it first).
CONSOLE_SCRIPT = (
    "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "from policyopt.cli.main import main; sys.exit(main())"
)


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined; `&&` chains split into commands."""
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        out += [part.strip() for part in line.split("&&") if part.strip()]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_doc_block_runs(
    block: Block,
    workdirs: dict,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if block.directive == "skip":
        assert block.argument, f"{block.id}: a skipped block must say why"
        pytest.skip(f"{block.id}: {block.argument}")
    work = workdir_for(block, workdirs, tmp_path_factory)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}  # the package, not the folder
    # One model cache for all documents, as one user has: the embedded model is built and
    # SmolLM2's GGUF converted by the first block that needs them (each took 5-20 s per
    # document when every document had its own).
    shared = tmp_path_factory.getbasetemp() / "policyopt-cache"
    env["POLICYOPT_CACHE"] = os.environ.get("POLICYOPT_CACHE", str(shared))
    if block.directive == "file":
        path = work / block.argument
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.text)
        if block.lang == "yaml":
            monkeypatch.chdir(work)
            monkeypatch.syspath_prepend(str(work))  # reward functions written by earlier blocks
            load_config(path)
        return
    if block.lang == "yaml":
        load_config(None, base=yaml.safe_load(block.text))
    elif block.lang == "python":
        monkeypatch.chdir(work)
        monkeypatch.syspath_prepend(str(work))
        exec(compile(block.text, block.id, "exec"), workdirs[block.doc][1])  # noqa: S102
    else:
        run_bash(block, work, env)


def test_every_document_has_blocks_and_directives_are_known() -> None:
    known = {"", "file", "small", "skip"}
    for doc in DOCS:
        for block in read_blocks(doc):
            assert block.directive in known, f"{block.id}: unknown directive {block.directive!r}"
    assert any(b.doc.name == "README.md" for b in ALL), "the README has no runnable block"
