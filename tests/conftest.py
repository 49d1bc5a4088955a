import sys
from pathlib import Path

import pytest

# Test helpers (run_configs, rewards_for_tests) import by module name from this folder.
TESTS_DIR = Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from policyopt.config.load import Config, load_config  # noqa: E402
from run_configs import small_overrides  # noqa: E402


@pytest.fixture
def small_config():
    """`small_config(output_dir, *overrides, steps=4)` -> a Config of a few-second run."""

    def make(output_dir: Path, *extra: str, steps: int = 4) -> Config:
        return load_config(overrides=[*small_overrides(output_dir, steps), *extra])

    return make
