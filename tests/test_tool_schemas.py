"""The input schema `@tool` derives from a signature (pydantic's `TypeAdapter`, normalised) and
the check of the model's input against it, over a table of signatures.

Each row is one parameter `x` of a hint (and maybe a default): the schema the model is offered,
inputs that are accepted (and what the function then receives: an Enum member, a tuple, an
attrs instance) and inputs that are refused (with the field named). Simple types keep the
schema the hand-made mapping gave (the fingerprint hashes it: tests/test_compat_fixtures.py);
an Enum, a tuple, `X | None`, a TypedDict and attrs classes were mapped wrongly before.
A representative signature goes through the real SDK to the fake Messages API.
"""

from __future__ import annotations

import enum
import inspect
from typing import Annotated, Any, Literal, NamedTuple, NotRequired, Optional, TypedDict

import attrs
import pytest
from pydantic import Field

from fisk_sm import Run, RunOptions, tool
from fisk_sm.loop.harness import NoModel  # noqa: F401  (the core's import path stays valid)
from fisk_sm.testing import FakeMessagesAPI, Reply
from fisk_sm.tools.base import Tool, ToolBox
from fisk_sm.tools.schema import schema_for
from tests.conftest import make_config

EMPTY = inspect.Parameter.empty
ABSENT = object()  # the function's own default applies: the check leaves the key out


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(TypedDict):
    a: int
    b: str


class Partial(TypedDict, total=False):
    n: int


# The functional form: in a class body under `from __future__ import annotations`, Python
# 3.11's TypedDict cannot see NotRequired.
Loose = TypedDict("Loose", {"a": int, "b": NotRequired[list[str]]})  # noqa: UP013


class Opaque:
    """A class pydantic cannot map."""


@attrs.frozen
class Pos:
    x: int
    y: int


@attrs.frozen
class Line:
    start: Pos
    end: Pos
    label: str = "line"


class Row(NamedTuple):
    sigma: str
    hint: Any
    default: Any
    prop: dict[str, Any]
    defs: dict[str, Any]
    valid: list[tuple[Any, Any]]
    invalid: list[tuple[Any, str]]


POS = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
    "additionalProperties": False,
}
LINE = {
    "type": "object",
    "properties": {
        "start": {"$ref": "#/$defs/Pos"},
        "end": {"$ref": "#/$defs/Pos"},
        "label": {"type": "string", "default": "line"},
    },
    "required": ["start", "end"],
    "additionalProperties": False,
}
COLOR = {"Color": {"enum": ["red", "green"]}}
NULL = {"type": "null"}
CLOSED = {"additionalProperties": False}  # a TypedDict or attrs class takes no other keys

# fmt: off
ROWS = [
    Row("str", str, EMPTY, {"type": "string"}, {}, [("a", "a")], [(5, "x")]),
    Row("int", int, EMPTY, {"type": "integer"}, {}, [(3, 3), ("4", 4)], [("four", "x")]),
    Row("float", float, EMPTY, {"type": "number"}, {}, [(2, 2), (2.5, 2.5)], [("x", "x")]),
    Row("bool", bool, EMPTY, {"type": "boolean"}, {}, [(True, True)], [("maybe", "x")]),
    Row("list[str]", list[str], EMPTY, {"type": "array", "items": {"type": "string"}}, {},
        [(["a"], ["a"])], [([1], "x.0"), ("a", "x")]),
    Row("list", list, EMPTY, {"type": "array"}, {}, [([1, "a"], [1, "a"])], [("no", "x")]),
    Row("dict", dict, EMPTY, {"type": "object"}, {}, [({"a": 1}, {"a": 1})], [([1], "x")]),
    Row("dict[str, int]", dict[str, int], EMPTY,
        {"type": "object", "additionalProperties": {"type": "integer"}}, {},
        [({"a": 1}, {"a": 1})], [({"a": "one"}, "x.a")]),
    Row("Any", Any, EMPTY, {}, {}, [(None, None), ([1], [1])], []),
    Row("Literal str", Literal["a", "b"], EMPTY, {"enum": ["a", "b"]}, {},
        [("a", "a")], [("c", "x")]),
    Row("Literal int", Literal[1, 2], EMPTY, {"enum": [1, 2]}, {}, [(2, 2)], [(3, "x")]),
    Row("Enum", Color, EMPTY, {"$ref": "#/$defs/Color"}, COLOR,
        [("red", Color.RED)], [("blue", "x")]),
    Row("IntEnum", Level, EMPTY, {"$ref": "#/$defs/Level"}, {"Level": {"enum": [1, 2]}},
        [(2, Level.HIGH)], [(3, "x")]),
    Row("Enum = default", Color, Color.GREEN, {"$ref": "#/$defs/Color", "default": "green"},
        COLOR, [(ABSENT, ABSENT), ("red", Color.RED)], [("blue", "x")]),
    Row("tuple[int, str]", tuple[int, str], EMPTY,
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
         "minItems": 2, "maxItems": 2}, {},
        [([1, "a"], (1, "a"))], [([1], "x"), (["a", "a"], "x.0")]),
    Row("tuple[int, ...]", tuple[int, ...], EMPTY, {"type": "array", "items": {"type": "integer"}},
        {}, [([1, 2], (1, 2)), ([], ())], [(["a"], "x.0")]),
    Row("tuple", tuple, EMPTY, {"type": "array"}, {}, [([1, "a"], (1, "a"))], [(3, "x")]),
    Row("tuple default", tuple[str, ...], ("a",),
        {"type": "array", "items": {"type": "string"}, "default": ["a"]}, {},
        [(ABSENT, ABSENT)], [([1], "x.0")]),
    Row("int | None", int | None, EMPTY, {"anyOf": [{"type": "integer"}, NULL]}, {},
        [(None, None), (1, 1)], [("one", "x")]),
    Row("bool | None = None", bool | None, None,
        {"anyOf": [{"type": "boolean"}, NULL], "default": None}, {},
        [(ABSENT, ABSENT), (None, None), (False, False)], [("maybe", "x")]),
    Row("Optional[str] = None", Optional[str], None,  # noqa: UP045
        {"anyOf": [{"type": "string"}, NULL], "default": None}, {},
        [(None, None), ("s", "s")], [(1, "x")]),
    Row("str = default", str, "hi", {"type": "string", "default": "hi"}, {},
        [(ABSENT, ABSENT), ("yo", "yo")], [(1, "x")]),
    Row("int = default", int, 10, {"type": "integer", "default": 10}, {},
        [(ABSENT, ABSENT)], [("ten", "x")]),
    Row("int | str", int | str, EMPTY, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, {},
        [(1, 1), ("a", "a")], [(None, "x")]),
    Row("list[list[int]]", list[list[int]], EMPTY,
        {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}, {},
        [([[1], []], [[1], []])], [([[1, "a"]], "x.0.1")]),
    Row("list[dict[str, int]]", list[dict[str, int]], EMPTY,
        {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "integer"}}},
        {}, [([{"a": 1}], [{"a": 1}])], [([{"a": "b"}], "x.0.a")]),
    Row("dict[str, list[str]]", dict[str, list[str]], EMPTY,
        {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
        {}, [({"k": ["v"]}, {"k": ["v"]})], [({"k": "v"}, "x.k")]),
    Row("list[Enum]", list[Color], EMPTY, {"type": "array", "items": {"$ref": "#/$defs/Color"}},
        COLOR, [(["green"], [Color.GREEN])], [(["blue"], "x.0")]),
    Row("set[str]", set[str], EMPTY,
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True}, {},
        [(["a", "a"], {"a"})], [([1], "x.0")]),
    Row("TypedDict", Point, EMPTY, {"$ref": "#/$defs/Point"},
        {"Point": {"type": "object", "properties": {"a": {"type": "integer"},
                   "b": {"type": "string"}}, "required": ["a", "b"], **CLOSED}},
        [({"a": 1, "b": "s"}, {"a": 1, "b": "s"})],
        [({"a": 1}, "x.b"), ({"a": "z", "b": ""}, "x.a")]),
    Row("TypedDict total=False", Partial, EMPTY, {"$ref": "#/$defs/Partial"},
        {"Partial": {"type": "object", "properties": {"n": {"type": "integer"}}, **CLOSED}},
        [({}, {}), ({"n": 2}, {"n": 2})], [({"n": "two"}, "x.n")]),
    Row("TypedDict NotRequired", Loose, EMPTY, {"$ref": "#/$defs/Loose"},
        {"Loose": {"type": "object", "properties": {"a": {"type": "integer"},
                   "b": {"type": "array", "items": {"type": "string"}}},
                   "required": ["a"], **CLOSED}},
        [({"a": 1}, {"a": 1})], [({"b": []}, "x.a")]),
    Row("attrs", Pos, EMPTY, {"$ref": "#/$defs/Pos"}, {"Pos": POS},
        [({"x": 1, "y": 2}, Pos(1, 2))], [({"x": 1}, "x.y"), ({"x": 1, "y": 2, "z": 3}, "x.z")]),
    Row("attrs nested, default", Line, EMPTY, {"$ref": "#/$defs/Line"},
        {"Line": LINE, "Pos": POS},
        [({"start": {"x": 0, "y": 0}, "end": {"x": 1, "y": 1}}, Line(Pos(0, 0), Pos(1, 1)))],
        [({"start": {"x": 0, "y": 0}, "end": {"x": "far", "y": 1}}, "x.end.x")]),
    Row("list[attrs]", list[Pos], EMPTY, {"type": "array", "items": {"$ref": "#/$defs/Pos"}},
        {"Pos": POS}, [([{"x": 1, "y": 2}], [Pos(1, 2)])], [([{"y": 2}], "x.0.x")]),
    Row("attrs | None = None", Pos | None, None,
        {"anyOf": [{"$ref": "#/$defs/Pos"}, NULL], "default": None}, {"Pos": POS},
        [(None, None), ({"x": 1, "y": 2}, Pos(1, 2))], [({"x": 1}, "x")]),
    Row("Annotated Field", Annotated[int, Field(ge=0)], EMPTY, {"type": "integer", "minimum": 0},
        {}, [(0, 0)], [(-1, "x")]),
]
# fmt: on


def made(row: Row) -> Tool:
    """A tool of one parameter `x` typed and defaulted as the row says."""

    def fn(**kwargs: Any) -> Any:
        return kwargs.get("x", ABSENT)

    param = inspect.Parameter("x", inspect.Parameter.KEYWORD_ONLY, default=row.default)
    fn.__signature__ = inspect.Signature([param])  # type: ignore[attr-defined]
    fn.__annotations__ = {"x": row.hint}
    fn.__doc__ = "One parameter.\n\nArgs:\n    x: the value\n"
    made_tool: Tool = tool(fn, name="f")
    return made_tool


def expected_schema(row: Row) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"x": {**row.prop, "description": "the value"}},
    }
    if row.default is EMPTY:
        schema["required"] = ["x"]
    if row.defs:
        schema["$defs"] = row.defs
    return schema


def test_the_table_has_at_least_30_signatures() -> None:
    assert len({row.sigma for row in ROWS}) == len(ROWS) >= 30


@pytest.mark.parametrize("row", ROWS, ids=[row.sigma for row in ROWS])
def test_the_schema_of_each_signature(row: Row) -> None:
    assert made(row).input_schema == expected_schema(row)


@pytest.mark.parametrize("row", ROWS, ids=[row.sigma for row in ROWS])
async def test_valid_input_is_accepted_and_converted(row: Row) -> None:
    t = made(row)
    box = ToolBox.of([t])
    for given, wanted in row.valid:
        arguments = {} if given is ABSENT else {"x": given}
        assert box.rejection("f", arguments) is None
        converted = t.check(arguments) if t.check else None
        assert converted == ({} if wanted is ABSENT else {"x": wanted})
        got = converted.get("x", ABSENT) if converted is not None else None
        assert type(got) is type(wanted)  # an Enum member, a tuple, an attrs instance
        outcome = await box.invoke("f", arguments)
        assert not outcome.is_error, outcome.content


@pytest.mark.parametrize("row", [r for r in ROWS if r.invalid], ids=lambda r: r.sigma)
async def test_invalid_input_is_refused_naming_the_field(row: Row) -> None:
    box = ToolBox.of([made(row)])
    for given, field in row.invalid:
        outcome = box.rejection("f", {"x": given})
        assert outcome is not None and outcome.is_error, given
        assert outcome.warning == "bad_input"
        assert "\n" not in outcome.content
        assert outcome.content.startswith("tool 'f' input is invalid: ")
        # A field's path: `x`, or inside it (`x.0`, a union's member `x.int`, a key `x.a`).
        paths = [part.split(":")[0] for part in outcome.content.split(": ", 1)[1].split("; ")]
        assert any(p == field or p.startswith(f"{field}.") for p in paths), outcome.content


def test_an_unknown_parameter_is_refused_unless_the_function_takes_kwargs() -> None:
    @tool
    def strict(a: int) -> int:
        """Strict."""
        return a

    @tool
    def loose(a: int, **more: Any) -> dict[str, Any]:
        """Loose."""
        return {"a": a, **more}

    refused = ToolBox.of([strict]).rejection("strict", {"a": 1, "b": 2})
    assert refused is not None and "b: Extra inputs are not permitted" in refused.content
    assert ToolBox.of([loose]).rejection("loose", {"a": 1, "b": 2}) is None
    assert loose.check is not None and loose.check({"a": "1", "b": 2}) == {"a": 1, "b": 2}
    assert loose.input_schema == strict.input_schema | {}  # **more adds nothing to the schema


def test_an_explicit_schema_is_not_checked_against_the_signature() -> None:
    @tool(input_schema={"type": "object", "properties": {"a": {"type": "string"}}})
    def given(a: int) -> int:
        """Given."""
        return a

    assert given.check is None
    assert ToolBox.of([given]).rejection("given", {"a": "not an int"}) is None


def test_a_class_pydantic_cannot_map_is_left_unconstrained() -> None:
    def fn(thing: Opaque, n: int = 1) -> str:
        """Opaque."""
        return "ok"

    assert schema_for(fn)[1] == {
        "type": "object",
        "properties": {"thing": {}, "n": {"type": "integer", "default": 1}},
        "required": ["thing"],
    }


def test_the_simple_schemas_are_those_of_the_hand_made_mapping() -> None:
    """Byte for byte what the old mapping gave (the fingerprint hashes it)."""

    def fn(
        s: str, i: int, f: float, b: bool, names: list[str], anything: Any,
        mode: Literal["fast", "exact"] = "fast", n: int = 10, ratio: float = 0.5,
        on: bool = False, tags: list[str] = [], meta: dict = {},  # noqa: B006
    ) -> None:  # fmt: skip
        """Doc.

        Args:
            s: the text,
                on two lines
        """

    assert schema_for(fn) == ("Doc.", {
        "type": "object",
        "properties": {
            "s": {"type": "string", "description": "the text, on two lines"},
            "i": {"type": "integer"}, "f": {"type": "number"}, "b": {"type": "boolean"},
            "names": {"type": "array", "items": {"type": "string"}}, "anything": {},
            "mode": {"enum": ["fast", "exact"], "default": "fast"},
            "n": {"type": "integer", "default": 10}, "ratio": {"type": "number", "default": 0.5},
            "on": {"type": "boolean", "default": False},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
            "meta": {"type": "object", "default": {}},
        },
        "required": ["s", "i", "f", "b", "names", "anything"],
    })  # fmt: skip


@tool
def paint(
    color: Color,
    at: tuple[int, int],
    shape: Line,
    where: Point,
    glossy: bool | None = None,
) -> str:
    """Paint a line.

    Args:
        color: which paint
    """
    return f"{color!r} {at!r} {shape!r} {where!r} {glossy!r}"


async def test_the_model_gets_the_schema_and_its_input_is_checked_over_the_sdk(
    api: FakeMessagesAPI,
) -> None:
    """Through the real SDK: the request's `tools` carries the derived schema; a bad input comes
    back as an is_error tool_result naming the field, a good one reaches the function converted."""
    shape = {"start": {"x": 0, "y": 0}, "end": {"x": 2, "y": 3}}
    good = {"color": "red", "at": [1, 2], "shape": shape, "where": {"a": 1, "b": "b"}}
    api.add(
        Reply.tool_use("paint", {**good, "color": "blue"}, id="tu_1"),
        Reply.tool_use("paint", good, id="tu_2"),
        Reply.text("done"),
    )
    run = Run.create(make_config(api), "paint", RunOptions(tools=[paint]))
    async with run:
        assert await run.run() == "completed"
    sent = api.requests[0]["tools"][0]["input_schema"]
    assert sent == paint.input_schema
    assert sent["properties"]["color"] == {"$ref": "#/$defs/Color", "description": "which paint"}
    assert sent["properties"]["glossy"] == {"anyOf": [{"type": "boolean"}, NULL], "default": None}
    assert sent["properties"]["at"]["prefixItems"] == [{"type": "integer"}] * 2
    assert sent["$defs"] == {"Color": COLOR["Color"], "Line": LINE, "Pos": POS, "Point": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["a", "b"], **CLOSED}}  # fmt: skip
    assert sent["required"] == ["color", "at", "shape", "where"]
    refused = api.requests[1]["messages"][-1]["content"][0]
    assert refused["is_error"] is True
    assert refused["content"].startswith("tool 'paint' input is invalid: color: Input should be")
    ran = api.requests[2]["messages"][-1]["content"][0]
    assert not ran.get("is_error")
    assert ran["content"] == (
        "<Color.RED: 'red'> (1, 2) Line(start=Pos(x=0, y=0), end=Pos(x=2, y=3), label='line')"
        " {'a': 1, 'b': 'b'} None"
    )


def test_a_config_tool_is_derived_once_and_each_load_gets_its_own_schema(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor loads agent.yaml's tools for every run it starts: the schema of one
    function is made once (pydantic's costs about a millisecond), and a load that changes its
    copy changes no other load's."""
    from fisk_sm.tools import schema
    from fisk_sm.tools.base import load_tool

    (tmp_path / "counted_tools.py").write_text(
        "def count(n: int, step: int = 1) -> int:\n    '''Count.'''\n    return n + step\n"
    )
    made: list[str] = []
    derive = schema._derive
    monkeypatch.setattr(schema, "_derive", lambda fn: made.append(fn.__name__) or derive(fn))
    first, second = (load_tool("counted_tools:count", tmp_path) for _ in range(2))
    assert made == ["count"]
    assert first.input_schema == second.input_schema
    first.input_schema["properties"]["n"]["type"] = "string"
    third = load_tool("counted_tools:count", tmp_path)
    assert third.input_schema["properties"]["n"] == {"type": "integer"}
    assert second.input_schema["properties"]["n"] == {"type": "integer"}
    assert third.check({"n": "3"}) == {"n": 3}
