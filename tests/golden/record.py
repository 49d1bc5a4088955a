"""Record the golden runs again: `python tests/golden/record.py [name ...]` rewrites
tests/golden/golden.json (all runs, or only those named)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runs import GOLDEN, RUNS, run  # noqa: E402


def main(names: list[str]) -> None:
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    for name in names or list(RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            golden[name] = run(name, Path(tmp))
        print(name, golden[name]["weights_sha256"], "moved" if golden[name]["moved"] else "STILL")
    GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
