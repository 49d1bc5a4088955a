"""Reward functions: registry and loading, task adaptation, the weighted pipeline and its
errors."""

import math

import pytest
import torch

from policyopt.rewards import (
    REWARD_FUNCTIONS,
    RewardFunctionError,
    RewardPipeline,
    build_reward_pipeline,
    load_reward_function,
    task_reward_function,
)
from policyopt.tasks import ArithmeticTask
from policyopt.tasks.arithmetic import arithmetic_format_reward

NOT_CALLABLE = 3


def only_kwargs(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("1+2=3. A:3", 1.0),
        ("A:-12\n", 1.0),
        ("A:3.", 0.0),
        ("A:3 and more", 0.0),
        ("3", 0.0),
        ("A:", 0.0),
    ],
)
def test_arithmetic_format_reward_by_hand(completion, reward):
    assert arithmetic_format_reward(["p"], [completion]) == [reward]


def test_load_registered_and_module_function():
    assert "arithmetic_format" in REWARD_FUNCTIONS.names()
    assert load_reward_function("arithmetic_format") is arithmetic_format_reward
    assert load_reward_function(f"{__name__}:only_kwargs") is only_kwargs


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "arithmetic_formt",
            r"unknown reward function 'arithmetic_formt'; did you mean 'arithmetic_format'\?"
            r".*arithmetic_format.*module\.path:function",
        ),
        (
            "no_such_module_xyz:f",
            r"cannot import module 'no_such_module_xyz'.*registered names: .*arithmetic_format",
        ),
        (
            f"{__name__}:only_kwarg",
            # the module's own functions, nearest first: not the built-in names
            rf"module '{__name__}' has no function 'only_kwarg'; did you mean 'only_kwargs'\?"
            r" its functions: .*only_kwargs",
        ),
        (f"{__name__}:NOT_CALLABLE", r"is not callable \(it is a int\)"),
    ],
)
def test_load_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        load_reward_function(spec)


def test_task_reward_function_adapts_verify():
    task = ArithmeticTask(train_size=1, eval_size=1)
    fn = task_reward_function(task)
    assert fn.__name__ == "arithmetic_verify"
    values = fn(
        ["Q:1+2=?\n"] * 3,
        ["1+2=3. A:3", "A:4", "no answer"],
        answer=["3", "3", "3"],
        level=[1, 1, 1],
    )
    assert values == [1.0, 0.0, None]
    with pytest.raises(ValueError, match="column 'answer' has 2 values for 3 completions"):
        fn(["p"] * 3, ["a", "b", "c"], answer=["1", "2"])


def constant(value):
    return lambda prompts, completions, **columns: [value(i) for i in range(len(completions))]


def test_pipeline_weighted_total_raw_values_and_unparseable_by_hand():
    f1 = constant(lambda i: [1.0, None, 0.0][i])
    f2 = constant(lambda i: [0.5, 1.0, True][i])
    pipeline = RewardPipeline([("a", f1, 1.0), ("b", f2, -2.0)])
    result = pipeline(["p"] * 3, ["x", "y", "z"], {"answer": [1, 2, 3]})
    # total_i = 1.0 * a_i + (-2.0) * b_i with None -> 0
    torch.testing.assert_close(result.total, torch.tensor([0.0, -2.0, -2.0]))
    assert result.raw == {"a": [1.0, None, 0.0], "b": [0.5, 1.0, 1.0]}
    assert result.unparseable == {"a": 1, "b": 0}


def test_pipeline_passes_columns_as_keyword_lists():
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions, **columns)
        return [0.0] * len(completions)

    pipeline = RewardPipeline([("spy", spy, 1.0)])
    pipeline(["p1", "p2"], ["c1", "c2"], {"answer": ["1", "2"], "level": [1, 3]})
    assert seen == {
        "prompts": ["p1", "p2"],
        "completions": ["c1", "c2"],
        "answer": ["1", "2"],
        "level": [1, 3],
        "trainer_state": pipeline.trainer_state,  # as TRL passes it
    }


def test_exception_names_function_sample_and_completion():
    def fragile(prompts, completions, **columns):
        return [1.0 / (0 if "boom" in c else 1) for c in completions]

    long = "boom" + "x" * 200
    pipeline = RewardPipeline([("fragile", fragile, 1.0)])
    with pytest.raises(RewardFunctionError) as caught:
        pipeline(["p"] * 3, ["ok", "fine", long], {})
    message = str(caught.value)
    assert "'fragile'" in message and "sample 2" in message
    assert repr(long[:80]) in message and long[:81] not in message
    raised_at = fragile.__code__.co_firstlineno + 1  # the line of the division
    assert f"at {__file__} line {raised_at}" in message  # where the function raised
    assert isinstance(caught.value.__cause__, ZeroDivisionError)


def test_a_wrapped_exception_is_located_where_the_users_code_raised():
    """A library that wraps the user's exception (`raise TaskError(...) from err`, as
    verifiers does around a `@vf.reward`) is not where the fault is: the message names the
    line of the original exception."""

    def user_reward(completion):
        return int(completion)  # ValueError on "x"

    def library_wrapper(prompts, completions, **columns):
        try:
            return [float(user_reward(c)) for c in completions]
        except ValueError as err:
            raise RuntimeError("task scoring failed") from err

    pipeline = RewardPipeline([("wrapped", library_wrapper, 1.0)])
    with pytest.raises(RewardFunctionError) as caught:
        pipeline(["p"], ["x"], {})
    raised_at = user_reward.__code__.co_firstlineno + 1
    assert f"at {__file__} line {raised_at}" in str(caught.value)


def test_batch_only_failure_is_reported_as_such():
    def batch_hater(prompts, completions, **columns):
        if len(completions) > 1:
            raise RuntimeError("batched")
        return [1.0]

    with pytest.raises(
        RewardFunctionError, match="failed on the batch of 2 .*no single sample"
    ) as caught:
        RewardPipeline([("bh", batch_hater, 1.0)])(["p", "q"], ["a", "b"], {})
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0], "returned 1 values for 2 completions"),
        ([1.0, "yes"], r"returned 'yes' for sample 1: a string, not a number or None"),
        ([1.0, [0.5]], r"returned \[0.5\] for sample 1: not a number or None"),
        # A number written as a string is a bug in the function, not a reward: refused.
        ([1.0, "0.5"], r"returned '0.5' for sample 1: a string, not a number or None"),
        ([math.inf, 1.0], "returned inf for sample 0"),
        ((1.0 for _ in range(2)), "returned a generator, not a list"),
        (None, "returned None, not a list"),
    ],
)
def test_bad_return_values(values, message):
    pipeline = RewardPipeline([("bad", lambda p, c, **k: values, 1.0)])
    with pytest.raises(RewardFunctionError, match=message):
        pipeline(["p", "q"], ["a", "b"], {})


def test_pipeline_input_errors():
    pipeline = RewardPipeline([("fmt", arithmetic_format_reward, 1.0)])
    with pytest.raises(ValueError, match="1 prompts for 2 completions"):
        pipeline(["p"], ["a", "b"], {})
    with pytest.raises(ValueError, match="column 'answer' has 1 values for 2 completions"):
        pipeline(["p", "q"], ["a", "b"], {"answer": ["1"]})
    with pytest.raises(ValueError, match="clashes"):
        pipeline(["p", "q"], ["a", "b"], {"completions": ["1", "2"]})
    with pytest.raises(ValueError, match="at least one"):
        RewardPipeline([])
    with pytest.raises(ValueError, match=r"repeated: \['fmt'\]"):
        RewardPipeline(
            [("fmt", arithmetic_format_reward, 1.0), ("fmt", arithmetic_format_reward, 2.0)]
        )
    with pytest.raises(ValueError, match="non-finite weight"):
        RewardPipeline([("fmt", arithmetic_format_reward, math.inf)])
    with pytest.raises(ValueError, match="not callable"):
        RewardPipeline([("x", 3, 1.0)])


def test_build_reward_pipeline_with_task_and_registered_names():
    task = ArithmeticTask(train_size=1, eval_size=1)
    pipeline = build_reward_pipeline(
        [("task", 1.0), ("arithmetic_format", 0.5), (f"{__name__}:only_kwargs", 0.0)], task
    )
    result = pipeline(["Q"] * 3, ["A:3", "A:3 ", "oops A:2."], {"answer": ["3", "4", "2"]})
    # task: 1, 0, 1; format: 1, 1, 0 -> 1.5, 0.5, 1.0
    torch.testing.assert_close(result.total, torch.tensor([1.5, 0.5, 1.0]))
    with pytest.raises(ValueError, match="needs a task"):
        build_reward_pipeline([("task", 1.0)])


def test_task_reward_function_ignores_trl_extra_arguments() -> None:
    """TRL's GRPOTrainer also passes non-column keywords (trainer_state, log_metric, ...)."""
    from policyopt.rewards.functions import task_reward_function
    from policyopt.tasks import get_task

    task = get_task("arithmetic", train_size=10, eval_size=10)
    verify = task_reward_function(task)
    out = verify(
        ["Q:1+2=?\n"], ["1+2=3. A:3"], answer=["3"], trainer_state=object(), log_metric=print
    )
    assert out == [1.0]


def test_pipeline_prefetch_reaches_only_functions_that_have_it_and_never_raises():
    calls = []

    def plain(prompts, completions, **columns):
        return [1.0] * len(completions)

    def early(prompts, completions, **columns):
        return [0.5] * len(completions)

    def broken(prompts, completions, **columns):
        return [0.0] * len(completions)

    early.prefetch = lambda prompts, completions, **columns: calls.append((completions, columns))
    broken.prefetch = lambda prompts, completions, **columns: 1 / 0
    assert not RewardPipeline([("plain", plain, 1.0)]).can_prefetch
    pipeline = RewardPipeline(
        [("plain", plain, 1.0), ("broken", broken, 1.0), ("early", early, 1.0)]
    )
    assert pipeline.can_prefetch
    pipeline.prefetch(["q"], ["a"], {"answer": ["7"]})  # broken's error is not raised here
    assert calls == [(["a"], {"answer": ["7"]})]


def test_reward_output_structure_joins_the_result_plain_lists_still_work():
    from policyopt.core.structure import produces
    from policyopt.rewards.functions import RewardOutput

    @produces("lengths", "same")
    def with_structure(prompts, completions, **columns):
        n = [len(c) for c in completions]
        same = [[float(a == b) for b in n] for a in n]
        return RewardOutput([1.0, None, 0.5], {"lengths": n, "same": torch.tensor(same)})

    result = RewardPipeline([("s", with_structure, 2.0), ("plain", only_kwargs, 1.0)])(
        ["p"] * 3, ["ab", "c", "de"], {}
    )
    assert result.total.tolist() == [4.0, 1.0, 3.0]  # 2·(1, 0, 0.5) + (2, 1, 2)
    assert result.unparseable == {"s": 1, "plain": 0}
    assert result.structure["lengths"].tolist() == [2, 1, 2]
    assert result.structure["same"].tolist() == [[1, 0, 1], [0, 1, 0], [1, 0, 1]]
    assert result.pairwise == {"same"}


def test_reward_output_structure_must_be_declared_and_shaped():
    from policyopt.core.structure import produces
    from policyopt.rewards.functions import RewardOutput

    def undeclared(prompts, completions, **columns):
        return RewardOutput([0.0] * len(completions), {"x": [0] * len(completions)})

    @produces("x")
    def wrong_shape(prompts, completions, **columns):
        return RewardOutput([0.0] * len(completions), {"x": [[0, 0]] * len(completions)})

    @produces("x")
    def declared_not_made(prompts, completions, **columns):
        return [0.0] * len(completions)

    cases = [
        (undeclared, r"'undeclared' produced \['x'\] without declaring"),
        (wrong_shape, r"'wrong_shape': structure 'x' of shape \(3, 2\)"),
        (declared_not_made, r"declares it produces \['x'\] but did not"),
    ]
    for fn, message in cases:
        with pytest.raises(RewardFunctionError, match=message):
            RewardPipeline([(fn.__name__, fn, 1.0)])(["p"] * 3, ["a", "b", "c"], {})

    @produces("x")
    def makes_x(prompts, completions, **columns):
        return RewardOutput([0.0] * len(completions), {"x": [1] * len(completions)})

    with pytest.raises(RewardFunctionError, match="'b' produces \\['x'\\].*already produced"):
        RewardPipeline([("a", makes_x, 1.0), ("b", makes_x, 1.0)])(["p"], ["a"], {})


def reward_len(completions, **kwargs):
    """TRL's documented example: completions by keyword, everything else in kwargs."""
    return [-abs(20 - len(c)) for c in completions]


def test_trl_reward_function_gets_keywords_ids_and_trainer_state():
    """TRL calls reward_func(prompts=..., completions=..., completion_ids=..., trainer_state=...,
    **columns): a TRL function, by keyword, and one that reads every argument, both work."""
    seen = {}

    def reads_all(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
        seen.update(
            prompts=prompts, ids=completion_ids, step=trainer_state.global_step, answer=answer
        )
        return [float(len(i)) for i in completion_ids]

    pipeline = RewardPipeline([("len", reward_len, 1.0), ("all", reads_all, 0.5)])
    pipeline.trainer_state.global_step = 7
    result = pipeline(
        ["P1", "P2"], ["a" * 18, "b" * 25], {"answer": ["1", "2"]}, completion_ids=[[5, 6], [7]]
    )
    # len: -2, -5; all: 2, 1 -> -2 + 1 = -1, -5 + 0.5 = -4.5
    torch.testing.assert_close(result.total, torch.tensor([-1.0, -4.5]))
    assert seen == {"prompts": ["P1", "P2"], "ids": [[5, 6], [7]], "step": 7, "answer": ["1", "2"]}


def test_positional_reward_function_with_other_names_still_works():
    pipeline = RewardPipeline([("pos", lambda p, c, **k: [float(len(x)) for x in c], 1.0)])
    torch.testing.assert_close(pipeline(["p"], ["abc"], {}).total, torch.tensor([3.0]))


def test_nan_is_skipped_like_none():
    """TRL turns None into NaN and sums with nansum: NaN and None are both 'no reward',
    scored 0 in the total and counted as unparseable."""
    pipeline = RewardPipeline(
        [
            ("f", lambda p, c, **k: [math.nan, None, 1.0], 1.0),
            ("g", lambda p, c, **k: [1, 1, 1], 2.0),
        ]
    )
    result = pipeline(["p"] * 3, ["a", "b", "c"], {})
    torch.testing.assert_close(result.total, torch.tensor([2.0, 2.0, 3.0]))
    assert result.unparseable == {"f": 2, "g": 0}
    assert result.raw["f"] == [None, None, 1.0]


def test_task_reward_function_does_not_take_completion_ids_for_a_column():
    task = ArithmeticTask(train_size=1, eval_size=1)
    verify = task_reward_function(task)
    assert verify(["Q"], ["A:3"], answer=["3"], completion_ids=[[1, 2]]) == [1.0]


def test_hf_dataset_reward_function_option_takes_a_trl_function(tmp_path):
    from policyopt.tasks import get_task

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "Say hi", "answer": "hi"}\n')
    task = get_task("hf_dataset", path=str(data), reward_function=f"{__name__}:reward_len")
    row = task.rows("train")[0]
    assert task.verify("x" * 18, row) == -2.0
