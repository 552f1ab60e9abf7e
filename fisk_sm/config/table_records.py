"""The loop table's records: the frozen classes `states/agent_loop.yaml` is read into.

`fisk_sm.config.table` reads the file into them (and is their public name, with
`fisk_sm.machine.table`); `fisk_sm.config.table_check` checks that what they hold is well formed.
They hold data only: reading and checking are done elsewhere, so both can import them.
"""

from __future__ import annotations

import attrs

__all__ = [
    "GuardSpec",
    "JournalSpec",
    "Replay",
    "StateSpec",
    "Table",
    "TableError",
    "TransitionSpec",
]


class TableError(ValueError):
    """The state table is malformed; the message names the file and the entry."""


@attrs.frozen
class Replay:
    """How a replay of a journal decides a guard: `kind` is `turn` (the real guard, on the
    replayed turn), `terminal` (it holds when the next record is the terminal record of
    `terminal`; with `cut` set, one that does or does not say a suspend-now cut a call),
    `at_prompt` or `stopped_at_prompt` (a chat's next records show it at its prompt)."""

    kind: str
    terminal: str | None = None
    cut: bool | None = None


@attrs.frozen
class GuardSpec:
    """One guard: what it says, the facts it reads, and how a journal replay decides it."""

    name: str
    doc: str
    reads: tuple[str, ...]
    replay: Replay


@attrs.frozen
class JournalSpec:
    """A record a state's action journals (read there by a replay); `runs` limits it to a
    chat's or a one-shot run's journal (None: either)."""

    record: str
    runs: str | None = None

    def read_in(self, chat: bool) -> bool:
        """Whether a replay of a chat's (`chat`) or a one-shot run's journal reads it here."""
        return self.runs is None or self.runs == ("chat" if chat else "one_shot")


@attrs.frozen
class StateSpec:
    """One state: the action run when stepped in it, and the hooks run on entering it.

    `changes` are the facts the action may change; `preview` the facts it certainly changes
    in a way known beforehand (fact, how); `journals` the records it appends, in order;
    `resume` whether a fold may leave a run here, unless `resume_unless` holds on the turn.
    """

    name: str
    action: str | None = None
    on_enter: tuple[str, ...] = ()
    terminal: bool = False
    doc: str = ""
    changes: tuple[str, ...] = ()
    preview: tuple[tuple[str, str], ...] = ()
    journals: tuple[JournalSpec, ...] = ()
    resume: bool = False
    resume_unless: str | None = None


@attrs.frozen
class TransitionSpec:
    """One guarded exit. `guard` must hold and `unless` must not; neither means "else"."""

    trigger: str
    source: str
    dest: str
    guard: str | None = None
    unless: str | None = None

    @property
    def condition(self) -> str | None:
        """The exit's guard as written on the diagram (`g`, `not u`, `g and not u`); None
        for the unguarded "else" exit."""
        parts = [self.guard] if self.guard else []
        if self.unless:
            parts.append(f"not {self.unless}")
        return " and ".join(parts) or None

    @property
    def label(self) -> str:
        """The edge label used by the diagrams: `trigger [guard]`."""
        condition = self.condition
        return f"{self.trigger} [{condition}]" if condition else self.trigger


@attrs.frozen
class Table:
    """The whole machine as data."""

    name: str
    initial: str
    states: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    guards: tuple[GuardSpec, ...] = ()
    facts: tuple[tuple[str, str], ...] = ()

    def exits(self, source: str) -> tuple[TransitionSpec, ...]:
        """The exits of `source`, in the order they are tried."""
        return tuple(t for t in self.transitions if t.source == source)

    def trigger_of(self, source: str) -> str:
        """The one trigger fired after the action of `source` has run."""
        return self.exits(source)[0].trigger

    def state(self, name: str) -> StateSpec:
        """The state named `name` (KeyError if there is none)."""
        for spec in self.states:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def guard(self, name: str) -> GuardSpec:
        """The declaration of guard `name` (KeyError if there is none)."""
        for spec in self.guards:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def terminal_states(self) -> tuple[str, ...]:
        """The names of the states a run ends in."""
        return tuple(s.name for s in self.states if s.terminal)

    @property
    def guard_names(self) -> frozenset[str]:
        """Every guard the table declares (each transition's guards are among them)."""
        return frozenset(g.name for g in self.guards)

    @property
    def action_names(self) -> frozenset[str]:
        """Every action the table names."""
        return frozenset(s.action for s in self.states if s.action)

    @property
    def hook_names(self) -> frozenset[str]:
        """Every entry hook the table names."""
        return frozenset(h for s in self.states for h in s.on_enter)
