"""Diagrams generated from the loop table, so they cannot drift from the code.

`mermaid` and `dot` are plain text built from `states/agent_loop.yaml`; `png` and
`graphviz_svg` render the dot text with Graphviz through `pygraphviz` (whose wheels bundle
Graphviz). The output is deterministic: the same table gives the same bytes, which a test checks
against `diagrams/`. The machine is static, so its SVG is rendered once and shipped (the wheel
holds `diagrams/agent_loop.svg` as `fisk_sm/_diagrams/`), stamped with the digest of the table's
dot text: `svg` marks a session's path on that drawing (`fisk_sm.machine.svgmark`) and needs no
Graphviz; only a table that differs from the shipped one (an extended copy) is drawn by
Graphviz, or, without it, refused (`svg`) or shown as mermaid text (`path_drawing`).

Each exit is labelled with its place in the order its state tries them and its guard, the
unguarded fallback as `else`: `1. boundary [iteration_cap_reached]` ... `3. boundary [else]`
(a state with a single exit shows only its trigger).

Given the paths of one or two sessions (`fisk_sm.machine.path.session_path`), the diagram shows
them on the machine: the visited states are filled and show how often they were entered, each
fired exit shows how often it fired (`×3`; `2/1` for two sessions, the first's count first),
the state each session is in is marked (`end` for a terminal state, else `current`, where it
resumes), and `resume` steps are drawn as dashed edges. With two sessions, a state visited by
only one of them is coloured for that one (`A only`, `B only`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import attrs

from fisk_sm.machine.path import SessionPath
from fisk_sm.machine.svgmark import EdgeMark, NodeMark, digest, drawn_from, mark, stamp
from fisk_sm.machine.table import StateSpec, Table, TransitionSpec

__all__ = [
    "FORMATS",
    "DiagramError",
    "Drawing",
    "draw",
    "exit_label",
    "graphviz_svg",
    "path_drawing",
    "render",
    "shipped_svg_path",
]

FORMATS = ("mermaid", "dot", "svg", "png")
_TEXT = ("mermaid", "dot", "svg")

Edge = tuple[str, str, str]

# Fill colours: visited by every session drawn, by the first only, by the second only.
_VISITED, _ONLY = "#dbeafe", ("#dcfce7", "#fee2e2")
_FIRED, _FIRED_ONLY = "#1d4ed8", ("#15803d", "#b91c1c")
_CURRENT = "#b45309"
_UNUSED = "gray55"
_UNUSED_SVG = "#8c8c8c"  # gray55, for the marks written into the SVG itself

_PACKAGE = Path(__file__).resolve().parent.parent
# Installed wheel: force-included as fisk_sm/_diagrams; checkout or editable: ../diagrams.
_SHIPPED = (
    _PACKAGE / "_diagrams" / "agent_loop.svg",
    _PACKAGE.parent / "diagrams" / "agent_loop.svg",
)
_MERMAID_CLASSES = (
    "    classDef terminal font-weight:bold,stroke-width:3px",
    f"    classDef visited fill:{_VISITED},stroke:{_FIRED}",
    f"    classDef only_a fill:{_ONLY[0]},stroke:{_FIRED_ONLY[0]}",
    f"    classDef only_b fill:{_ONLY[1]},stroke:{_FIRED_ONLY[1]}",
    f"    classDef current stroke:{_CURRENT},stroke-width:4px",
)


class DiagramError(RuntimeError):
    """A diagram could not be rendered (for example, Graphviz is missing)."""


def exit_label(table: Table, spec: TransitionSpec) -> str:
    """The exit's label: `2. trigger [guard]` numbered in the order its state tries its exits,
    the unguarded one as `[else]`; just the trigger for a state's only exit."""
    exits = table.exits(spec.source)
    if len(exits) == 1:
        return spec.trigger
    return f"{exits.index(spec) + 1}. {spec.trigger} [{spec.condition or 'else'}]"


class _Overlay:
    """The paths of up to two sessions, as counts per state and per edge."""

    def __init__(self, paths: Sequence[SessionPath]) -> None:
        if len(paths) > 2:
            raise DiagramError(f"at most two sessions can be drawn at once, not {len(paths)}")
        self.paths = tuple(paths)
        self.states = [p.state_counts() for p in paths]
        self.edges = [p.transition_counts() for p in paths]

    def __bool__(self) -> bool:
        return bool(self.paths)

    def tally(self, counts: Sequence[int]) -> str:
        """`×3` for one session, `2/1` for two."""
        return f"×{counts[0]}" if len(counts) == 1 else "/".join(map(str, counts))

    def edge_counts(self, edge: Edge) -> tuple[int, ...]:
        return tuple(c[edge] for c in self.edges)

    def state_counts(self, state: str) -> tuple[int, ...]:
        return tuple(c[state] for c in self.states)

    def extra_edges(self, table: Table) -> list[Edge]:
        """Steps no exit of the table takes (`resume`), in order of first appearance."""
        known = {(t.source, t.trigger, t.dest) for t in table.transitions}
        seen = dict.fromkeys(e for p in self.paths for e in p.edges if e not in known)
        return list(seen)

    def who(self, counts: Sequence[int]) -> int | None:
        """For two sessions: 0 or 1 if only that one has a nonzero count, else None."""
        hits = [i for i, n in enumerate(counts) if n]
        return hits[0] if len(self.paths) == 2 and len(hits) == 1 else None

    def marks(self, table: Table, state: str) -> str:
        """`(end)`/`(current)` for the sessions now in `state` (`(A end, B current)`)."""
        found = []
        for i, path in enumerate(self.paths):
            if path.current == state:
                kind = "end" if state in table.terminal_states else "current"
                found.append(kind if len(self.paths) == 1 else f"{'AB'[i]} {kind}")
        return f" ({', '.join(found)})" if found else ""

    def state_note(self, table: Table, state: str) -> str | None:
        """What the diagram writes under a visited state: its entries and marks."""
        counts = self.state_counts(state)
        if not any(counts):
            return None
        note = self.tally(counts) + self.marks(table, state)
        only = self.who(counts)
        return note if only is None else f"{note} {'AB'[only]} only"

    def legend(self) -> str:
        """One line naming the sessions drawn."""
        if len(self.paths) == 1:
            path = self.paths[0]
            return f"session {path.run_id}: {len(path.steps)} states entered, now {path.current}"
        a, b = self.paths
        return f"A = {a.run_id} (now {a.current}), B = {b.run_id} (now {b.current}), counts A/B"


def mermaid(table: Table, paths: Sequence[SessionPath] = ()) -> str:
    """A mermaid `stateDiagram-v2` of the table, with the sessions' paths if given."""
    overlay = _Overlay(paths)
    lines = ["stateDiagram-v2", f"    [*] --> {table.initial}"]
    for t in table.transitions:
        label = exit_label(table, t)
        counts = overlay.edge_counts((t.source, t.trigger, t.dest))
        if any(counts):
            label = f"{label} {overlay.tally(counts)}"
        lines.append(f"    {t.source} --> {t.dest} : {label}")
    for source, trigger, dest in overlay.extra_edges(table):
        counts = overlay.edge_counts((source, trigger, dest))
        lines.append(f"    {source} --> {dest} : {trigger} {overlay.tally(counts)}")
    lines += [f"    {name} --> [*]" for name in table.terminal_states]
    lines += [f"    class {','.join(table.terminal_states)} terminal"]
    if overlay:
        lines += _mermaid_overlay(table, overlay)
        lines += _MERMAID_CLASSES
    else:
        lines += _MERMAID_CLASSES[:1]
    return "\n".join(lines) + "\n"


def _mermaid_overlay(table: Table, overlay: _Overlay) -> list[str]:
    lines = [f"    note left of {table.initial} : {overlay.legend()}"]
    groups: dict[str, list[str]] = {"visited": [], "only_a": [], "only_b": [], "current": []}
    for spec in table.states:
        note = overlay.state_note(table, spec.name)
        if note is None:
            continue
        lines.append(f"    {spec.name} : {note}")
        only = overlay.who(overlay.state_counts(spec.name))
        groups["visited" if only is None else ("only_a", "only_b")[only]].append(spec.name)
        if overlay.marks(table, spec.name):
            groups["current"].append(spec.name)
    lines += [f"    class {','.join(names)} {name}" for name, names in groups.items() if names]
    return lines


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', "'").replace("\n", "\\n")
    return f'"{escaped}"'


def _attrs(**values: str | int) -> str:
    return ", ".join(f"{k}={_quote(v) if isinstance(v, str) else v}" for k, v in values.items())


def dot(table: Table, paths: Sequence[SessionPath] = ()) -> str:
    """A Graphviz digraph of the table; terminal states have a double border. Exit labels
    are placed as edge labels (laid out as nodes, so they never overlap) with room between."""
    overlay = _Overlay(paths)
    lines = [
        f"digraph {table.name} {{",
        "  rankdir=TB; nodesep=0.7; ranksep=0.55;",
        '  node [shape=box, style="rounded", fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
        '  __start [shape=point, label=""];',
        f"  __start -> {table.initial};",
    ]
    if overlay:
        legend = _quote(overlay.legend())
        lines.insert(2, f'  labelloc="b"; fontname="Helvetica"; fontsize=11; label={legend};')
    for spec in table.states:
        lines.append(f"  {spec.name} [{_node(table, overlay, spec.name)}];")
    for t in table.transitions:
        # a leading space keeps the label's text off its own edge line
        lines.append(f"  {t.source} -> {t.dest} [{_edge(overlay, t, ' ' + exit_label(table, t))}];")
    for source, trigger, dest in overlay.extra_edges(table):
        edge = (source, trigger, dest)
        label = f" {trigger} {overlay.tally(overlay.edge_counts(edge))}"
        fired = _attrs(label=label, style="dashed", color=_FIRED, fontcolor=_FIRED)
        lines.append(f'  {source} -> {dest} [{fired}, id="{"__".join(edge)}", class="resume"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _meaning(spec: StateSpec) -> str:
    """A state's hover text: its doc, and what its action may change and journals (as the
    table declares them)."""
    parts = [spec.doc]
    if spec.changes:
        parts.append("changes: " + ", ".join(spec.changes))
    if spec.journals:
        kinds = (j.record + (f" ({j.runs})" if j.runs else "") for j in spec.journals)
        parts.append("journals: " + ", ".join(kinds))
    return "\n".join(parts)


def _node(table: Table, overlay: _Overlay, name: str) -> str:
    spec = next(s for s in table.states if s.name == name)
    base: dict[str, str | int] = {"label": name, "peripheries": 2 if spec.terminal else 1}
    base["tooltip"] = _meaning(spec)
    base["id"] = f"state_{name}"  # always: the shipped SVG is marked through these ids
    if not overlay:
        return _attrs(**base)
    note = overlay.state_note(table, name)
    if note is None:
        return _attrs(**base, color=_UNUSED, fontcolor=_UNUSED, **{"class": "unvisited"})
    only = overlay.who(overlay.state_counts(name))
    fill = _VISITED if only is None else _ONLY[only]
    classes = "visited" if only is None else ("only_a", "only_b")[only]
    extra: dict[str, str | int] = {}
    if overlay.marks(table, name):
        classes += " current"
        extra = {"color": _CURRENT, "penwidth": 3}
    base["label"] = f"{name}\n{note}"
    style = "rounded,filled"
    return _attrs(**base, style=style, fillcolor=fill, **extra, **{"class": classes})


def _edge(overlay: _Overlay, spec: TransitionSpec, label: str) -> str:
    edge_id = f"{spec.source}__{spec.trigger}__{spec.dest}"
    if not overlay:
        return _attrs(label=label, id=edge_id)
    counts = overlay.edge_counts((spec.source, spec.trigger, spec.dest))
    if not any(counts):
        grey = {"color": _UNUSED, "fontcolor": _UNUSED, "class": "unfired"}
        return _attrs(label=label, id=edge_id, **grey)
    only = overlay.who(counts)
    colour = _FIRED if only is None else _FIRED_ONLY[only]
    label = f"{label} {overlay.tally(counts)}"
    fired: dict[str, str | int] = {"color": colour, "fontcolor": colour, "penwidth": 2}
    fired["class"] = "fired"
    return _attrs(label=label, id=edge_id, **fired)


def _graphviz(table: Table, paths: Sequence[SessionPath], fmt: str) -> bytes:
    try:
        import pygraphviz
    except ImportError:
        raise DiagramError(
            f"{fmt} needs pygraphviz (pip install 'fisk-sm[svg]'); mermaid and dot need nothing"
        ) from None
    graph = pygraphviz.AGraph(string=dot(table, paths))
    data: bytes = graph.draw(format=fmt, prog="dot")
    return data


def graphviz_svg(table: Table, paths: Sequence[SessionPath] = ()) -> str:
    """The dot diagram rendered to SVG by Graphviz (its version comment dropped), stamped with
    the digest of the table's plain dot text; needs pygraphviz."""
    text = _graphviz(table, paths, "svg").decode("utf-8")
    text = re.sub(r"<!-- Generated by graphviz[^>]*-->\n", "", text)
    return stamp(text, digest(dot(table)))


def shipped_svg_path() -> Path | None:
    """The shipped drawing of the loop table: the installed copy, else the checkout's."""
    return next((p for p in _SHIPPED if p.is_file()), None)


def _shipped_for(table: Table) -> str | None:
    """The shipped SVG if it was drawn from `table` (same plain dot text), else None."""
    where = shipped_svg_path()
    if where is None:
        return None
    text = where.read_text(encoding="utf-8")
    return text if drawn_from(text) == digest(dot(table)) else None


def _has_graphviz() -> bool:
    try:
        import pygraphviz  # noqa: F401
    except ImportError:
        return False
    return True


def _node_marks(table: Table, overlay: _Overlay) -> dict[str, NodeMark]:
    marks = {}
    for spec in table.states:
        note = overlay.state_note(table, spec.name)
        if note is None:
            marks[f"state_{spec.name}"] = NodeMark("unvisited", stroke=_UNUSED_SVG)
            continue
        only = overlay.who(overlay.state_counts(spec.name))
        fill = _VISITED if only is None else _ONLY[only]
        classes = "visited" if only is None else ("only_a", "only_b")[only]
        current = bool(overlay.marks(table, spec.name))
        marks[f"state_{spec.name}"] = NodeMark(
            classes + (" current" if current else ""),
            fill=fill,
            stroke=_CURRENT if current else None,
            stroke_width=3 if current else None,
            note=note,
        )
    return marks


def _edge_marks(table: Table, overlay: _Overlay) -> dict[str, EdgeMark]:
    marks = {}
    for t in table.transitions:
        edge_id = f"{t.source}__{t.trigger}__{t.dest}"
        counts = overlay.edge_counts((t.source, t.trigger, t.dest))
        if not any(counts):
            marks[edge_id] = EdgeMark("unfired", _UNUSED_SVG)
            continue
        only = overlay.who(counts)
        colour = _FIRED if only is None else _FIRED_ONLY[only]
        marks[edge_id] = EdgeMark("fired", colour, width=2, tally=overlay.tally(counts))
    return marks


def _marked(shipped: str, table: Table, overlay: _Overlay) -> str:
    """The paths marked on the shipped drawing; steps no exit takes (`resume`) are listed
    under it, since the drawing has no edge for them."""
    legend = [overlay.legend()]
    for source, trigger, dest in overlay.extra_edges(table):
        tally = overlay.tally(overlay.edge_counts((source, trigger, dest)))
        legend.append(f"{trigger} {source} → {dest} {tally} (not an exit of the table)")
    return mark(shipped, _node_marks(table, overlay), _edge_marks(table, overlay), legend)


def svg(table: Table, paths: Sequence[SessionPath] = ()) -> str:
    """The diagram as SVG, with the sessions' paths marked: on the shipped drawing when it was
    drawn from `table`, else drawn by Graphviz; with neither, a `DiagramError` that says so."""
    overlay = _Overlay(paths)
    shipped = _shipped_for(table)
    if shipped is not None:
        return _marked(shipped, table, overlay) if overlay else shipped
    if _has_graphviz():
        return graphviz_svg(table, paths)
    raise DiagramError(
        "this table differs from the one the shipped SVG was drawn from, and drawing it"
        " needs pygraphviz (pip install 'fisk-sm[svg]'); --format mermaid needs nothing"
    )


@attrs.frozen
class Drawing:
    """A diagram for a page: `svg` or, without a drawing of the table, `mermaid` text; `note`
    says why it is not the shipped drawing (None when it is)."""

    kind: str
    text: str
    note: str | None = None


def path_drawing(table: Table, paths: Sequence[SessionPath] = ()) -> Drawing:
    """The sessions' paths on the best drawing there is: the shipped SVG marked, else an SVG
    by Graphviz, else the mermaid text; never a path on the drawing of another table."""
    overlay = _Overlay(paths)
    shipped = _shipped_for(table)
    if shipped is not None:
        return Drawing("svg", _marked(shipped, table, overlay) if overlay else shipped)
    differs = "the table in use differs from the one the shipped SVG was drawn from"
    if _has_graphviz():
        return Drawing("svg", graphviz_svg(table, paths), f"{differs}: drawn by Graphviz")
    note = f"{differs}, and pygraphviz is not installed: the path is shown as mermaid text"
    return Drawing("mermaid", mermaid(table, paths), note)


def render(table: Table, fmt: str, paths: Sequence[SessionPath] = ()) -> str:
    """The table (with the sessions' `paths`, if any) as a text diagram: mermaid, dot or svg."""
    if fmt == "mermaid":
        return mermaid(table, paths)
    if fmt == "dot":
        return dot(table, paths)
    if fmt == "svg":
        return svg(table, paths)
    if fmt in FORMATS:
        raise DiagramError(f"{fmt} is not a text format: use draw()")
    raise DiagramError(f"unknown diagram format {fmt!r}; choose one of {', '.join(FORMATS)}")


def draw(table: Table, fmt: str, paths: Sequence[SessionPath] = ()) -> bytes:
    """The diagram in any of FORMATS, as the bytes of a file (text as UTF-8)."""
    if fmt == "png":
        return _graphviz(table, paths, "png")
    return render(table, fmt, paths).encode("utf-8")
