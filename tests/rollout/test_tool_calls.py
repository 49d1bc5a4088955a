"""Reading the tool calls of a model's turn: good calls, none, and malformed ones."""

import pytest

from policyopt.rollout.tool_calls import TOOL_CALL_FORMATS, MalformedToolCall, ToolCall

HERMES = TOOL_CALL_FORMATS.get("hermes")
CALL = TOOL_CALL_FORMATS.get("call")


def test_hermes_reads_every_call_of_a_turn():
    turn = (
        'Let me compute.<tool_call>\n{"name": "calc", "arguments": {"expression": "2+3"}}\n'
        '</tool_call> and <tool_call>{"name": "clock", "arguments": "{\\"tz\\": \\"UTC\\"}"}'
        "</tool_call>"
    )
    assert HERMES.parse(turn) == [
        ToolCall("calc", {"expression": "2+3"}),
        ToolCall("clock", {"tz": "UTC"}),  # arguments written as a JSON string
    ]
    assert HERMES.parse("The answer is 5.") == []
    assert HERMES.parse('<tool_call>{"name": "now"}</tool_call>') == [ToolCall("now", {})]


@pytest.mark.parametrize(
    ("turn", "says"),
    [
        ('<tool_call>{"name": "calc", "arguments": {}}', "without a closing </tool_call>"),
        ('{"name": "calc"}</tool_call>', "without an opening <tool_call>"),
        ("<tool_call>{name: calc}</tool_call>", "tool call 1 is not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'needs a "name" string'),
        ('<tool_call>["calc"]</tool_call>', 'needs a "name" string'),
        ('<tool_call>{"name": "c", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "c", "arguments": "x"}</tool_call>', "are not a JSON object"),
        (
            '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": 3}</tool_call>',
            "tool call 2 needs",
        ),
    ],
)
def test_hermes_says_what_is_wrong_with_a_malformed_call(turn, says):
    with pytest.raises(MalformedToolCall, match=says):
        HERMES.parse(turn)


def test_hermes_writes_what_it_reads():
    call = ToolCall("calc", {"expression": "47*36"})
    assert HERMES.parse(HERMES.call_text(call)) == [call]
    assert HERMES.result_text("1692") == "<tool_response>\n1692\n</tool_response>\n"


def test_the_call_format_is_the_whole_turn():
    assert CALL.parse("calc(47*36+18)") == [ToolCall("calc", "47*36+18")]
    assert CALL.parse(" calc((2+3)*4) \n") == [ToolCall("calc", "(2+3)*4")]
    assert CALL.parse("A:1710") == []
    assert CALL.parse("") == []
    with pytest.raises(MalformedToolCall, match=r"a call is calc\(argument\), ending with '\)'"):
        CALL.parse("calc(47*36")
    with pytest.raises(MalformedToolCall):
        CALL.parse("calc(4)A:4")
    assert CALL.call_text(ToolCall("calc", "47*36")) == "calc(47*36)"
    assert CALL.result_text("1692") == "=1692\n"
