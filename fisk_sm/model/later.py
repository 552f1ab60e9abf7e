"""Messages whose wire form is read on first use: a resumed conversation's history.

A resumed conversation is mostly history that nothing reads until the next request is built,
and that request sends it as the journal's own bytes (`Message.raw`, `ModelRequest.body`). So
`fisk_sm.journal.checkpoint` makes the messages before a journal's checkpoint with `later_all`:
each holds where its JSON is; its wire form is read once, on first use, and kept; its blocks
are built from that once, on first use of `content`. Such a message is equal to, and writes
the same JSON as, the one built at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat

from fisk_sm.config.jsontypes import JSONObject
from fisk_sm.model.blocks import Block, Message, Pieces, message_of

__all__ = ["later_all"]


def later_all(
    load: Callable[[object], JSONObject],
    roles: Iterable[str],
    args: Iterable[object],
    raw: Callable[[object, str], Pieces | None] | None = None,
) -> list[Message]:
    """For each `role` of `roles` and `arg` of `args`, the message whose wire form
    (`{"role": role, "content": ...}`, as `to_json()` gives it) is `load(arg)`, called once,
    on first use; its content is built from that form when first read (`message_of`), once.
    Such a message is equal to, and writes the same JSON as, the one built at once. Until
    it is read, `raw(arg, role)` gives its JSON in pieces, if it can (`Message.raw`); they
    are kept, and `load` then decodes them (a tuple) instead of reading `arg`."""
    roles, args = list(roles), list(args)
    if len(roles) != len(args):
        raise ValueError(f"later_all: {len(roles)} roles for {len(args)} messages")
    # A resume makes thousands: each slot is set by a map in C, with no frame per message.
    messages: list[Message] = list(map(_new, repeat(_Later, len(roles))))
    consume = deque[object](maxlen=0).extend
    consume(map(_ROLE.__set__, messages, roles))
    consume(map(_SOURCE.__set__, messages, repeat((load, raw))))
    consume(map(_ARG.__set__, messages, args))
    return messages


_new = object.__new__
#: `Message`'s own slots, which `_Later` fills past the frozen class's guard.
_ROLE, _CONTENT = Message.__dict__["role"], Message.__dict__["content"]


class _Later(Message):
    """A message made by `later_all`: its wire form is read on first use and kept, and
    its content built from it on first read and kept. One object per message (a resume makes
    thousands), equal to the `Message` built at once, whose class it extends for `isinstance`
    and the converters."""

    __slots__ = ("_arg", "_source", "_wire")
    #: What to read the wire form from (`load`'s argument), or its pieces once made.
    _arg: object
    #: `later_all`'s `load` and `raw`, one pair for all the messages of a call.
    _source: tuple[Callable[[object], JSONObject], Callable[[object, str], Pieces | None] | None]
    _wire: JSONObject

    @property
    def content(self) -> str | tuple[Block, ...]:
        try:
            content: str | tuple[Block, ...] = _CONTENT.__get__(self, Message)
        except AttributeError:  # not built yet
            content = message_of(self._wire_form()).content
            _CONTENT.__set__(self, content)
        return content

    @content.setter
    def content(self, value: str | tuple[Block, ...]) -> None:  # the class's `__init__` and copy
        _CONTENT.__set__(self, value)

    def raw(self) -> Pieces | None:
        try:
            arg = self._arg
        except AttributeError:  # read already
            return None
        if type(arg) is tuple:
            return arg  # pieces, as `raw` made them
        make = self._source[1]
        pieces = None if make is None else make(arg, self.role)
        if pieces is not None:
            _ARG.__set__(self, pieces)
        return pieces

    def _wire_form(self) -> JSONObject:
        """The wire form, read on the first call and kept; a loader of anything but the bytes
        themselves is then dropped, and with it what it held (a journal's bytes). Two threads
        may both read it: the same form."""
        try:
            wire: JSONObject = self._wire
        except AttributeError:
            try:
                arg = self._arg
            except AttributeError:  # another thread read it meanwhile
                return self._wire
            wire = self._source[0](arg)
            _WIRE.__set__(self, wire)
            if type(arg) is not tuple:
                _ARG.__delete__(self)
        return wire

    def to_json(self) -> JSONObject:
        try:
            _CONTENT.__get__(self, Message)
        except AttributeError:  # no blocks built: none needed
            wire = self._wire_form()["content"]
            if type(wire) is list:
                wire = list(wire)  # a list of its own, as a built message gives
            return {"role": self.role, "content": wire}
        return super().to_json()

    def __eq__(self, other: object) -> bool:
        # Python asks a subclass first, from either side: so `Message(...) == later` lands here.
        if not isinstance(other, Message):
            return NotImplemented
        return (self.role, self.content) == (other.role, other.content)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = Message.__hash__

    def __repr__(self) -> str:
        return f"Message(role={self.role!r}, content={self.content!r})"


_ARG, _SOURCE, _WIRE = (_Later.__dict__[name] for name in ("_arg", "_source", "_wire"))
