"""Declared structure: decorators, gathering a consumer's inputs, checking a producer's output."""

import pytest
import torch

from policyopt.core.registry import Registry
from policyopt.core.structure import (
    MissingStructureError,
    check_declared_made,
    check_produced,
    gather,
    needs,
    produces,
    registered_producers,
)

PARTS = Registry("test part")


@PARTS.register("makes_widgets")
@produces("widget_ids", "widget_sizes")
def makes_widgets():
    return None


@needs("widget_ids", "response_mask", optional=("bonus",))
def uses_widgets(rewards, group_ids, *, widget_ids, response_mask, bonus=None):
    return widget_ids, response_mask, bonus


def test_decorators_set_tuples_on_functions_and_classes():
    assert makes_widgets.produces == ("widget_ids", "widget_sizes")
    assert uses_widgets.needs == ("widget_ids", "response_mask")
    assert uses_widgets.optional_needs == ("bonus",)

    @needs("a")
    @produces("b")
    class Part:
        pass

    assert Part.needs == ("a",) and Part.produces == ("b",)
    with pytest.raises(ValueError, match="identifier"):
        needs("not a name")


def test_gather_passes_needed_values_and_optional_ones_only_when_present():
    ids, mask, bonus, other = (torch.tensor([i]) for i in range(4))
    got = gather("c", uses_widgets, {"widget_ids": ids, "response_mask": mask, "other": other})
    assert set(got) == {"widget_ids", "response_mask"} and got["widget_ids"] is ids
    got = gather("c", uses_widgets, {"widget_ids": ids, "response_mask": mask, "bonus": bonus})
    assert got["bonus"] is bonus
    assert gather("c", lambda r, g: r, {"widget_ids": ids}) == {}  # declares nothing


def test_missing_input_names_consumer_name_and_registered_producers():
    assert "test part 'makes_widgets'" in registered_producers("widget_ids")
    with pytest.raises(MissingStructureError) as err:
        gather("advantage estimator 'uses'", uses_widgets, {"response_mask": torch.ones(1)})
    message = str(err.value)
    assert "advantage estimator 'uses'" in message and "'widget_ids'" in message
    assert "test part 'makes_widgets'" in message
    assert isinstance(err.value, ValueError)
    with pytest.raises(MissingStructureError, match="no registered part declares"):
        gather("x", needs("nobody_makes_this")(lambda: None), {})


def test_producer_output_is_checked_against_its_declaration():
    n = 3
    check_produced("p", makes_widgets, {"widget_ids": torch.zeros(n, 5)}, n)
    check_produced("p", makes_widgets, {"widget_sizes": torch.zeros(n, n)}, n)
    with pytest.raises(ValueError, match=r"produced \['extra'\] without declaring"):
        check_produced("p", makes_widgets, {"extra": torch.zeros(n)}, n)
    with pytest.raises(ValueError, match=r"'widget_ids' of shape \(2,\).*N = 3"):
        check_produced("p", makes_widgets, {"widget_ids": torch.zeros(2)}, n)
    with pytest.raises(ValueError, match="shape"):
        check_produced("p", makes_widgets, {"widget_ids": [0, 1, 2]}, n)
    with pytest.raises(ValueError, match=r"declares it produces \['widget_sizes'\]"):
        check_declared_made("p", makes_widgets, {"widget_ids": torch.zeros(n)})
