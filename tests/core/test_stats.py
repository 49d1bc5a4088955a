"""The one 95% Student-t interval: numbers from printed t tables and by hand."""

import math

import pytest

from policyopt.core.stats import mean_ci, t975


def test_t_quantiles_match_printed_tables():
    # Two-sided 95% critical values of Student's t (any statistics table, to 3 decimals).
    for df, value in [(1, 12.706), (2, 4.303), (3, 3.182), (10, 2.228), (30, 2.042)]:
        assert t975(df) == pytest.approx(value, abs=5e-4)
    assert t975(10_000) == pytest.approx(1.960, abs=5e-4)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)


def test_mean_ci_by_hand():
    # 0.012, -0.004, 0.020: mean 0.028 / 3 = 0.0093333; deviations 0.0026667, -0.0133333,
    # 0.0106667; sum of squares 0.00029867, / 2 -> s^2 = 0.00014933, s = 0.0122202;
    # half = 4.30265 * s / sqrt(3) = 0.0303567.
    mean, half = mean_ci([0.012, -0.004, 0.020])
    assert mean == pytest.approx(0.0093333, abs=1e-7)
    assert half == pytest.approx(0.0303567, abs=1e-6)


def test_one_value_has_no_interval_and_none_is_an_error():
    mean, half = mean_ci([0.1])
    assert mean == 0.1 and math.isnan(half)
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])


@pytest.mark.slow
def test_stats_import_without_torch_and_the_core_api_keeps_its_registries():
    # cli tables import core.stats at module level: `policyopt --help` must stay torch-free,
    # so the core package's own imports are lazy. Its public names still resolve, with the
    # "hispo" loss (registered by core.segment_loss) in the loss registry.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        import policyopt.core.stats
        print("torch" in sys.modules)
        from policyopt.core import POLICY_LOSSES, pass_at_k
        print("hispo" in POLICY_LOSSES, callable(pass_at_k))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]


def test_the_core_api_lists_every_lazy_name():
    import policyopt.core as core

    for name in core.__all__:
        assert getattr(core, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        core.nope  # noqa: B018
