"""Structure parsed YAML into the config's frozen attrs classes, strictly, with cattrs.

The converter is strict where cattrs is lenient: an integer is not a boolean or a string, a
list is not a scalar, and an unknown key is an error. A field that is read in its own way (a
duration, a timeout, an argv) is named by the caller in a :data:`FieldHooks` table, and a type
that needs the converter for what it holds (the tools, of several kinds) by a
:data:`ConverterHook`: this module knows no config class, so `fisk_sm.config.agent` (which
defines them and calls this) is imported by nothing here.

The first problem found becomes one :class:`ConfigError` naming the field's full path
(:func:`translate`). cattrs is imported, and the converter built, by the first
:meth:`Structurer.structure`, not at import: `from fisk_sm import Run` may never read a config.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeAlias, TypeVar, get_args, get_origin

import attrs

from fisk_sm.config.errors import ConfigError, parse_duration, show
from fisk_sm.config.limits import parse_timeout

if TYPE_CHECKING:
    import cattrs

__all__ = [
    "ConverterHook",
    "FieldHooks",
    "Hook",
    "Located",
    "Problem",
    "Structurer",
    "structure_duration",
    "structure_errors",
    "structure_timeout",
    "translate",
]

T = TypeVar("T")
#: A cattrs structure hook: the value, and the type it is structured as.
Hook: TypeAlias = Callable[[object, object], object]
#: Per attrs class, the fields read in their own way: by a hook, or left out (``None``: not
#: a YAML key, such as `AgentConfig.path`).
FieldHooks: TypeAlias = Mapping[type, Mapping[str, Hook | None]]
#: A hook for a type whose values the converter structures part by part: the converter, the
#: value.
ConverterHook: TypeAlias = "Callable[[cattrs.Converter, object], object]"


class Problem(Exception):
    """Raised by structure hooks; the field path is added when translating."""


class Located(Exception):
    """A ConfigError whose field is already the full path from the top of the file."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


def _strict(kind: type, what: str) -> Hook:
    def structure(value: object, _t: object) -> object:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise Problem(f"expected {what}, got {show(value)}")
        return value

    return structure


def structure_duration(value: object, _t: object) -> float:
    """Seconds from a non-negative number or a Go-style duration string (``1m30s``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return float(value)
    elif isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise Problem(str(exc)) from None
    raise Problem(f"invalid duration {show(value)}")


def structure_timeout(value: object, _t: object) -> float:
    """A tool call's timeout in seconds (`fisk_sm.config.limits.parse_timeout`)."""
    try:
        return parse_timeout(value)
    except ValueError as exc:
        raise Problem(str(exc)) from None


def _make_converter(fields: FieldHooks, hooks: Mapping[object, ConverterHook]) -> cattrs.Converter:
    import cattrs

    conv = cattrs.Converter(forbid_extra_keys=True)
    for kind, what in ((int, "an integer"), (str, "a string"), (bool, "a boolean")):
        conv.register_structure_hook(kind, _strict(kind, what))

    def class_hook(cl: type) -> Hook:
        inner = _fields_hook(cl, conv, fields.get(cl, {}))

        def structure(value: object, t: object) -> object:
            if not isinstance(value, Mapping):
                raise Problem(f"expected a mapping, got {show(value)}")
            return inner(value, cl)

        return structure

    def is_list_field(t: object) -> bool:
        return get_origin(t) is tuple and get_args(t)[-1:] == (Ellipsis,)

    def list_hook(t: object) -> Hook:
        item_type: type = get_args(t)[0]

        def structure(value: object, _t: object) -> object:
            # A YAML scalar where a list belongs must not be iterated: 'ai:confirm' would
            # become the tags 'a', 'i', ':', ... and the tool would escape the gate.
            if not isinstance(value, list):
                raise Problem(f"expected a list, got {show(value)}")
            return tuple(_structure_item(conv, i, item, item_type) for i, item in enumerate(value))

        return structure

    # Registered before the type hooks below, which then take precedence (for `tools`).
    conv.register_structure_hook_factory(is_list_field, list_hook)
    conv.register_structure_hook_factory(attrs.has, class_hook)
    for exact, hook in hooks.items():
        conv.register_structure_hook_func(_equals(exact), _with_converter(conv, hook))
    return conv


def _equals(kind: object) -> Callable[[object], bool]:
    return lambda t: t == kind


def _with_converter(conv: cattrs.Converter, hook: ConverterHook) -> Hook:
    return lambda value, _t: hook(conv, value)


def _fields_hook(
    cl: type, conv: cattrs.Converter, hooks: Mapping[str, Hook | None]
) -> Callable[[Mapping[str, object], type], object]:
    """cattrs' hook for the attrs class `cl`, with the fields in `hooks` read by their own hook
    (or left out, for ``None``)."""
    from cattrs.gen import make_dict_structure_fn as make
    from cattrs.gen import override

    overrides = {
        name: override(omit=True) if hook is None else override(struct_hook=hook)
        for name, hook in hooks.items()
    }
    # cattrs' options are spelled out (as its defaults), else mypy reads the overrides as
    # possibly filling them: a `**` of a dict may name any keyword.
    return make(
        cl,
        conv,
        _cattrs_forbid_extra_keys="from_converter",
        _cattrs_use_linecache=True,
        _cattrs_prefer_attrib_converters="from_converter",
        _cattrs_detailed_validation="from_converter",
        _cattrs_use_alias="from_converter",
        _cattrs_include_init_false=False,
        **overrides,
    )


def _structure_item(conv: cattrs.Converter, index: int, item: object, item_type: type) -> object:
    try:
        return conv.structure(item, item_type)
    except structure_errors() as exc:
        raise translate(exc, f"[{index}]", "") from None


def structure_errors() -> tuple[type[BaseException], ...]:
    """What bad input raises while structuring; anything else is a bug and is not dressed up
    as one. (A function: cattrs is imported when a config is first parsed, not at import.)"""
    import cattrs

    return (cattrs.BaseValidationError, ValueError, TypeError, KeyError, Problem, Located)


def _join(prefix: str, name: str) -> str:
    if not prefix or name.startswith("["):
        return prefix + name
    return f"{prefix}.{name}" if name else prefix


def translate(exc: BaseException, path: str, source: str) -> ConfigError:
    """Turn the first problem in a (nested) cattrs exception into a ConfigError."""
    from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

    if isinstance(exc, Located):
        return ConfigError(source, exc.error.field, exc.error.problem)
    if isinstance(exc, ConfigError):
        return ConfigError(source, _join(path, exc.field), exc.problem)
    if isinstance(exc, Problem):
        return ConfigError(source, path or "(top level)", str(exc))
    if isinstance(exc, ForbiddenExtraKeysError):
        key = sorted(exc.extra_fields, key=str)[0]
        return ConfigError(source, _join(path, str(key)), "unknown key")
    if isinstance(exc, ClassValidationError):
        with_notes, others = exc.group_exceptions()
        for sub in others:  # unknown keys and constructor validators come first
            return translate(sub, path, source)
        for sub, note in with_notes:
            if isinstance(sub, KeyError):
                return ConfigError(source, _join(path, note.name), "required")
            return translate(sub, _join(path, note.name), source)
    if isinstance(exc, IterableValidationError):
        for sub, inote in exc.group_exceptions()[0]:
            return translate(sub, f"{path}[{inote.index}]", source)
    if not isinstance(exc, ValueError | TypeError):
        raise exc  # a bug in fisk-sm, found while structuring: not the input's fault
    return ConfigError(source, path or "(top level)", f"invalid value ({exc})")


class Structurer:
    """The strict converter for one set of config classes, built on first use: building it
    (and importing cattrs) cost some 10 ms of every `from fisk_sm import Run`, which may never
    parse a config."""

    def __init__(self, fields: FieldHooks, hooks: Mapping[object, ConverterHook]) -> None:
        self._fields = fields
        self._hooks = hooks
        self._converter: cattrs.Converter | None = None

    @property
    def converter(self) -> cattrs.Converter:
        """The converter, built once, by the first use."""
        if self._converter is None:
            self._converter = _make_converter(self._fields, self._hooks)
        return self._converter

    def structure(self, data: object, cl: type[T], source: str) -> T:
        """``data`` as a `cl`; bad input raises the first problem as a ConfigError from
        ``source``, and anything else (a bug) propagates as it is."""
        try:
            return self.converter.structure(data, cl)
        except structure_errors() as exc:
            raise translate(exc, "", source) from exc
