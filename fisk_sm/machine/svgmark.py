"""A session's path marked on the shipped SVG of the machine, without Graphviz.

The machine is static, so its drawing is rendered once (`fisk_sm.machine.diagram`, with
pygraphviz) and shipped. Graphviz writes each state as `<g class="node" id="state_NAME">` and
each exit as `<g class="edge" id="SOURCE__TRIGGER__DEST">` (the ids come from the dot text);
`mark` parses that XML and adds classes, fills, strokes and count texts to the elements of the
states visited and the exits taken. The drawing records which table it was drawn from: the
SHA-256 of the table's plain dot text, in an XML comment (`stamp`, `drawn_from`), so a path is
never marked on the drawing of another table.

Pure text in, text out: the caller reads the file.
"""

from __future__ import annotations

import hashlib
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence

import attrs

__all__ = ["EdgeMark", "NodeMark", "SvgMarkError", "digest", "drawn_from", "mark", "stamp"]

_SVG = "http://www.w3.org/2000/svg"
_XLINK = "http://www.w3.org/1999/xlink"
_STAMP = re.compile(r"<!-- fisk-sm table sha256:([0-9a-f]{64}) -->")
_SHAPES = {f"{{{_SVG}}}{tag}" for tag in ("path", "polygon", "ellipse", "polyline")}
_TEXT = f"{{{_SVG}}}text"
_LINE = 16.0  # height of one legend line, in points


class SvgMarkError(ValueError):
    """The SVG could not be read or does not have the element a mark names."""


@attrs.frozen
class NodeMark:
    """How to mark one state: its classes, fill and border, and the note drawn under it."""

    classes: str
    fill: str | None = None
    stroke: str | None = None
    stroke_width: float | None = None
    note: str | None = None


@attrs.frozen
class EdgeMark:
    """How to mark one exit: its classes, colour and width, and the tally after its label."""

    classes: str
    colour: str
    width: float | None = None
    tally: str | None = None


def digest(dot_text: str) -> str:
    """The SHA-256 (hex) of a table's plain dot text: what a drawing of it is stamped with."""
    return hashlib.sha256(dot_text.encode("utf-8")).hexdigest()


def stamp(svg_text: str, table_digest: str) -> str:
    """`svg_text` with the comment naming the table it was drawn from, before `<svg`."""
    at = svg_text.index("<svg")
    return f"{svg_text[:at]}<!-- fisk-sm table sha256:{table_digest} -->\n{svg_text[at:]}"


def drawn_from(svg_text: str) -> str | None:
    """The digest a drawing is stamped with, or None (an unstamped drawing matches nothing)."""
    found = _STAMP.search(svg_text)
    return found.group(1) if found else None


def _parse(svg_text: str) -> ET.Element:
    try:
        return ET.fromstring(svg_text.encode("utf-8"))
    except ET.ParseError as exc:
        raise SvgMarkError(f"the diagram SVG is not well-formed XML: {exc}") from None


def _groups(root: ET.Element, kind: str) -> dict[str, ET.Element]:
    return {
        g.get("id", ""): g
        for g in root.iter(f"{{{_SVG}}}g")
        if g.get("class", "").split()[:1] == [kind]
    }


def _add_class(element: ET.Element, classes: str) -> None:
    element.set("class", f"{element.get('class', '')} {classes}".strip())


def _mark_node(group: ET.Element, how: NodeMark) -> None:
    _add_class(group, how.classes)
    shapes = [e for e in group.iter() if e.tag in _SHAPES]
    for n, shape in enumerate(shapes):
        if how.fill is not None and n == 0:  # the inner border of a double one
            shape.set("fill", how.fill)
        if how.stroke is not None:
            shape.set("stroke", how.stroke)
        if how.stroke_width is not None:
            shape.set("stroke-width", f"{how.stroke_width:g}")
    texts = [e for e in group.iter() if e.tag == _TEXT]
    if how.stroke is not None and how.fill is None:  # an unvisited state: greyed
        for text in texts:
            text.set("fill", how.stroke)
    if how.note and texts:
        name = texts[0]
        note = ET.SubElement(group, _TEXT, {"class": "note", "text-anchor": "middle"})
        note.set("x", name.get("x", "0"))
        note.set("y", f"{float(name.get('y', '0')) + 25:.2f}")
        note.set("font-family", "Helvetica,sans-Serif")
        note.set("font-size", "11.00")
        note.set("fill", how.stroke or "#1d4ed8")
        note.text = how.note


def _mark_edge(group: ET.Element, how: EdgeMark) -> None:
    _add_class(group, how.classes)
    for element in group.iter():
        if element.tag in _SHAPES:
            element.set("stroke", how.colour)
            if element.get("fill", "none") != "none":  # the arrowhead
                element.set("fill", how.colour)
            if how.width is not None and element.tag.endswith("path"):
                element.set("stroke-width", f"{how.width:g}")
        elif element.tag == _TEXT:
            element.set("fill", how.colour)
    texts = [e for e in group.iter() if e.tag == _TEXT]
    if how.tally and texts:
        texts[-1].text = f"{texts[-1].text or ''} {how.tally}"


def _add_legend(root: ET.Element, lines: Sequence[str]) -> None:
    """Lines of text under the drawing: the root's height and viewBox grow to hold them."""
    box = [float(v) for v in root.get("viewBox", "0 0 0 0").split()]
    if len(box) != 4:
        raise SvgMarkError("the diagram SVG has no viewBox")
    extra = _LINE * len(lines) + _LINE / 2
    old = box[3]
    box[3] += extra
    root.set("viewBox", " ".join(f"{v:.2f}" for v in box))
    height = root.get("height", "")
    if height.endswith("pt"):
        root.set("height", f"{float(height[:-2]) + extra:g}pt")
    for n, line in enumerate(lines, 1):
        text = ET.SubElement(root, _TEXT, {"class": "legend", "x": f"{box[0] + 8:.2f}"})
        text.set("y", f"{box[1] + old + _LINE * n:.2f}")
        text.set("font-family", "Helvetica,sans-Serif")
        text.set("font-size", "12.00")
        text.text = line


def mark(
    svg_text: str,
    nodes: Mapping[str, NodeMark],
    edges: Mapping[str, EdgeMark],
    legend: Sequence[str] = (),
) -> str:
    """The `<svg>` element of `svg_text` (its prolog dropped) with each group whose id is a key
    of `nodes` or `edges` marked as its value says, and `legend` as lines under it. A key with
    no element in the drawing is an error: the drawing is not of the table the marks are for."""
    ET.register_namespace("", _SVG)
    ET.register_namespace("xlink", _XLINK)
    root = _parse(svg_text)
    for kind, marks in (("node", nodes), ("edge", edges)):
        groups = _groups(root, kind)
        missing = sorted(set(marks) - set(groups))
        if missing:
            raise SvgMarkError(f"the diagram has no {kind} {', '.join(missing)}")
        for key, how in marks.items():
            if isinstance(how, NodeMark):
                _mark_node(groups[key], how)
            else:
                _mark_edge(groups[key], how)
    if legend:
        _add_legend(root, legend)
    return ET.tostring(root, encoding="unicode")
