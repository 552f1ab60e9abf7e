"""The description, input schema and input check of a Python tool, from its signature and
docstring.

`@tool` (`fisk_sm.tools.base`) offers a function to the model under them unless it is given
its own schema. pydantic (imported here only when a schema is built: `import fisk_sm` and the
core never load it) makes both the JSON Schema and the check from the type hints: the
signature becomes a TypedDict (a parameter without a default is required) and a `TypeAdapter`
over it gives the schema and validates the model's input, converting it to what the function
expects (an Enum member, a tuple, an attrs instance). What pydantic does not take is mapped first:
an attrs class through its fields (recursively) and a `typing.TypedDict` (pydantic wants the
`typing_extensions` one before Python 3.12) through its keys; a hint it still cannot map is
left unconstrained, as before. An `Args:` section of the docstring describes the parameters.

The schema is part of the agent's fingerprint, so pydantic's output is normalised to what the
hand-made mapping produced where that was right (a session written before resumes without
`--force`): no `title` keys; no `type` beside an `enum` (a `Literal` stays `{"enum": [...]}`); a
bare `list` or `dict` stays `{"type": "array"}` or `{"type": "object"}` (no `items: {}` nor
`additionalProperties: true`); the top object carries only `type`, `properties`, `required`
(and `$defs` when a parameter needs them); a default is its JSON value.
"""

from __future__ import annotations

import copy
import inspect
import re
import types
import typing
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Union, get_args, get_origin, get_type_hints

import attrs

__all__ = ["InputError", "derive", "schema_for"]

#: Keywords whose value is a schema, a list of schemas, or a mapping of names to schemas.
_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_MANY = ("anyOf", "allOf", "oneOf", "prefixItems")
_NAMED = ("properties", "$defs", "patternProperties")


class InputError(ValueError):
    """The model's input does not fit the tool's signature; the message names the field(s)."""


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and its `Args:` entries."""
    text = inspect.cleandoc(doc)
    head, _, args = text.partition("\nArgs:\n")
    described: dict[str, str] = {}
    current = ""
    for line in args.splitlines():
        match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if match and (not current or len(line) - len(line.lstrip()) <= 4):
            current = match.group(1)
            described[current] = match.group(2).strip()
        elif current and line.strip():
            described[current] = f"{described[current]} {line.strip()}".strip()
    return head.strip(), described


def _hints(obj: Any) -> dict[str, Any]:
    return get_type_hints(obj, include_extras=True)


def _attrs_model(cls: type, seen: dict[type, Any]) -> Any:
    """A pydantic model of an attrs class's init fields that validates into an instance."""
    from pydantic import AfterValidator, ConfigDict, Field, create_model

    hints = _hints(cls)
    fields: dict[str, Any] = {}
    for f in attrs.fields(cls):
        if not f.init:
            continue
        hint = _translate(hints.get(f.name, f.type if f.type is not None else Any), seen)
        if f.default is attrs.NOTHING:
            fields[f.alias] = (hint, ...)
        elif isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
            # The class makes the value itself: the model only marks the field optional.
            fields[f.alias] = (hint, Field(default=None, json_schema_extra=_no_default))
        else:
            fields[f.alias] = (hint, f.default)
    model = create_model(cls.__name__, __config__=ConfigDict(extra="forbid"), **fields)

    def build(value: Any) -> Any:
        return cls(**{name: getattr(value, name) for name in value.model_fields_set})

    return typing.Annotated[model, AfterValidator(build)]


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _typed_dict(td: Any, seen: dict[type, Any]) -> Any:
    """`td` as a typing_extensions TypedDict (the one pydantic takes), its hints mapped."""
    import typing_extensions as te

    required: frozenset[str] = getattr(td, "__required_keys__", frozenset())
    keys = {
        key: (te.Required if key in required else te.NotRequired)[_translate(hint, seen)]
        for key, hint in get_type_hints(td).items()
    }
    make: Any = te.TypedDict  # its functional form, with a name known only at run time
    return make(td.__name__, keys)


def _translate(hint: Any, seen: dict[type, Any]) -> Any:
    """`hint` with every attrs class and stdlib TypedDict in it replaced by what pydantic takes."""
    if isinstance(hint, type) and attrs.has(hint):
        if hint not in seen:
            seen[hint] = Any  # a class that contains itself is unconstrained where it recurs
            seen[hint] = _attrs_model(hint, seen)
        return seen[hint]
    if typing.is_typeddict(hint):
        return _typed_dict(hint, seen)
    if hint is float:
        return _float()
    origin, args = get_origin(hint), get_args(hint)
    if origin is None or not args or origin is typing.Literal:
        return hint
    if origin is typing.Annotated:
        return typing.Annotated[(_translate(args[0], seen), *hint.__metadata__)]
    mapped = tuple(a if a is Ellipsis else _translate(a, seen) for a in args)
    if mapped == args:
        return hint
    if origin in (Union, types.UnionType):
        return Union.__getitem__(mapped)
    return hint.copy_with(mapped) if hasattr(hint, "copy_with") else origin[mapped]


def _float() -> Any:
    """`float` that keeps an int an int (PEP 484's numeric tower: an int is a float argument),
    as the tool got it before; its schema stays `{"type": "number"}`."""
    from pydantic import WrapValidator

    def keep_int(value: Any, handler: Callable[[Any], Any]) -> Any:
        is_int = isinstance(value, int) and not isinstance(value, bool)
        return value if is_int else handler(value)

    return typing.Annotated[float, WrapValidator(keep_int)]


def _mappable(hint: Any) -> bool:
    """Whether pydantic can build a check and a JSON Schema of `hint`."""
    from pydantic import PydanticUserError, TypeAdapter

    try:
        TypeAdapter(hint).json_schema()
    except PydanticUserError:  # an arbitrary class: no constraint, as before
        return False
    return True


def _normalised(schema: Any) -> Any:
    """pydantic's schema in the shape the hand-made mapping gave (see the module docstring)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _NAMED and isinstance(value, dict):
            out[key] = {name: _normalised(v) for name, v in value.items()}
        elif key in _MANY and isinstance(value, list):
            out[key] = [_normalised(v) for v in value]
        elif key in _ONE:
            out[key] = _normalised(value)
        else:
            out[key] = value
    if "enum" in out:
        out.pop("type", None)
    if out.get("items") == {}:
        del out["items"]
    if out.get("additionalProperties") is True:
        del out["additionalProperties"]
    return out


def _jsonable(value: Any) -> tuple[bool, Any]:
    """A default as JSON (an Enum member as its value, a tuple as a list), if it has one."""
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    if attrs.has(type(value)):
        value = attrs.asdict(value)
    try:
        return True, to_jsonable_python(value)
    except PydanticSerializationError:
        return False, None


Derived = tuple[str, dict[str, Any], Callable[[Mapping[str, Any]], dict[str, Any]]]
#: What `derive` made of each function: a supervisor loads a config's tools for every run it
#: starts, and pydantic's schema of one signature costs about a millisecond.
_DERIVED: weakref.WeakKeyDictionary[Callable[..., Any], Derived] = weakref.WeakKeyDictionary()


def derive(fn: Callable[..., Any]) -> Derived:
    """The description, input schema and input check of `fn`, made once per function (each
    caller gets its own copy of the schema, which it may change).

    The check returns the keyword arguments to call `fn` with (converted to its types; a
    parameter the model left out is left to `fn`'s default) or raises `InputError`."""
    try:
        made = _DERIVED.get(fn)
    except TypeError:  # not weakly referable: made every time
        return _derive(fn)
    if made is None:
        made = _DERIVED[fn] = _derive(fn)
    description, schema, check = made
    return description, copy.deepcopy(schema), check


def _derive(fn: Callable[..., Any]) -> Derived:
    """`derive`, made anew."""
    import warnings

    import typing_extensions as te
    from pydantic import ConfigDict, PydanticDeprecationWarning, TypeAdapter, ValidationError
    from pydantic.json_schema import PydanticJsonSchemaWarning

    description, described = _docstring_parts(fn.__doc__ or "")
    hints = _hints(fn)
    seen: dict[type, Any] = {}
    keys: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    loose = False
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind is param.VAR_KEYWORD:
            loose = True
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = _translate(hints.get(name, Any), seen)
        hint = hint if _mappable(hint) else Any
        if param.default is param.empty:
            keys[name] = te.Required[hint]
        else:
            keys[name] = te.NotRequired[hint]
            defaults[name] = param.default
    make: Any = te.TypedDict  # its functional form, with a name known only at run time
    shape = make(f"{fn.__name__}_input", keys)
    shape.__pydantic_config__ = ConfigDict(extra="allow" if loose else "forbid")
    adapter = TypeAdapter(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        warnings.simplefilter("ignore", PydanticDeprecationWarning)
        made = _normalised(adapter.json_schema())
    properties: dict[str, Any] = made.get("properties", {})
    for name, prop in properties.items():
        if name in described:
            prop["description"] = described[name]
        if name in defaults:
            ok, value = _jsonable(defaults[name])
            if ok:
                prop["default"] = value
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if made.get("required"):
        schema["required"] = made["required"]
    if made.get("$defs"):
        schema["$defs"] = made["$defs"]

    def check(arguments: Mapping[str, Any]) -> dict[str, Any]:
        try:
            value: dict[str, Any] = adapter.validate_python(dict(arguments))
        except ValidationError as exc:
            raise InputError(_explained(exc)) from None
        return value

    return description, schema, check


def _explained(exc: Any) -> str:
    """One line per refused field: `field.sub: what is wrong`."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "input"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def schema_for(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """The description and input schema of `fn`, from its signature and docstring."""
    description, schema, _ = derive(fn)
    return description, schema
