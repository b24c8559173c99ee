"""SVG pictures for the documentation site, drawn by the project at build time.

Two kinds, both plain SVG with no script and nothing fetched:

- :func:`state_diagram_svg` draws a Mermaid ``stateDiagram-v2`` block of the subset that
  ``enginewire spec docs`` writes (``state "label" as sN``, ``[*] --> sN``,
  ``sA --> sB : label``; :func:`parse_state_diagram` reads it and raises ``ValueError`` naming
  the line it cannot read). States stand in one column in the order they are declared; a
  transition to the next state is a straight arrow, a transition to itself a loop on the right,
  any other transition an arc on the left, one lane per overlapping arc; an arc's label
  stands left of its lane in a gap between rows, clear of every other line and label
  (:func:`state_diagram_layout` gives the positions, which the tests check).
- :func:`ring_layout_svg` draws the byte layout of the spec's example ring: one row per level
  of nesting, one box per region, one column per byte.

Both return the SVG document as text; the same input always gives the same text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

#: Approximate width of one character of the 13 px sans-serif text, for sizing boxes.
CHAR_WIDTH = 7.2
FONT = "font-family='system-ui,sans-serif' font-size='13'"

_STATE = re.compile(r'^state\s+"(?P<label>[^"]*)"\s+as\s+(?P<name>\w+)$')
_EDGE = re.compile(r"^(?P<source>\[\*\]|\w+)\s*-->\s*(?P<target>\w+)(?:\s*:\s*(?P<label>.*))?$")


@dataclass(frozen=True)
class StateDiagram:
    """A parsed state diagram: states in declaration order, the initial state, transitions."""

    states: tuple[tuple[str, str], ...]  # (name, label)
    initial: str | None
    edges: tuple[tuple[str, str, str], ...]  # (source, target, label)


def parse_state_diagram(source: str) -> StateDiagram:
    """Read a ``stateDiagram-v2`` block of the subset the spec pages use."""
    lines = [line.strip() for line in source.strip().splitlines() if line.strip()]
    if not lines or lines[0] != "stateDiagram-v2":
        raise ValueError(f"expected a diagram starting with 'stateDiagram-v2', got {lines[:1]}")
    states: list[tuple[str, str]] = []
    initial: str | None = None
    edges: list[tuple[str, str, str]] = []
    for line in lines[1:]:
        if match := _STATE.match(line):
            states.append((match["name"], match["label"]))
        elif match := _EDGE.match(line):
            if match["source"] == "[*]":
                initial = match["target"]
            else:
                edges.append((match["source"], match["target"], (match["label"] or "").strip()))
        else:
            raise ValueError(f"state diagram line not understood: {line!r}")
    known = {name for name, _ in states}
    for source_name, target, _ in edges:
        for name in (source_name, target):
            if name not in known:
                known.add(name)
                states.append((name, name))
    return StateDiagram(tuple(states), initial, tuple(edges))


def _text_width(text: str) -> float:
    return len(text) * CHAR_WIDTH


@dataclass(frozen=True)
class Box:
    """An axis-aligned rectangle of the picture (a label's background, a state's box, or a
    line segment of zero width or height)."""

    x: float
    y: float
    width: float
    height: float

    def overlaps(self, other: Box) -> bool:
        """Whether the two share any point inside both (touching edges do not count)."""
        return (self.x < other.x + other.width and other.x < self.x + self.width
                and self.y < other.y + other.height and other.y < self.y + self.height)

    def crosses(self, other: Box) -> bool:
        """Whether ``other`` (a segment) passes through this box (edges included)."""
        return (self.x <= other.x + other.width and other.x <= self.x + self.width
                and self.y <= other.y + other.height and other.y <= self.y + self.height)


def _label_box(x: float, y: float, text: str, anchor: str = "start") -> Box:
    """The white background of :func:`_label` (the label's text box)."""
    width = _text_width(text) + 6
    left = {"start": x - 3, "middle": x - width / 2, "end": x - width + 3}[anchor]
    return Box(left, y - 11, width, 15)


def _label(x: float, y: float, text: str, anchor: str = "start") -> str:
    """A label with a white background so lines behind it stay readable."""
    box = _label_box(x, y, text, anchor)
    return (f"<rect x='{box.x:.1f}' y='{box.y:.1f}' width='{box.width:.1f}' height='15' "
            f"fill='white' fill-opacity='0.9'/>"
            f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' {FONT}>{escape(text)}</text>")


#: Clear space between a lane's labels and the next lane out, in pixels.
LANE_MARGIN = 12.0


@dataclass
class StateLayout:
    """Where :func:`state_diagram_svg` puts everything: the state boxes, every label (x, y,
    text, anchor) and the straight segments of the left arcs and the arrows between
    neighbours. The arcs' labels stand left of their own lane's line, in the gap between two
    rows inside the arc's span (never on the row where an arc leaves or enters a box), and the
    next lane out starts left of the widest label of the lane inside it, so no label sits on
    another arc's line or on another label."""

    diagram: StateDiagram
    width: float
    height: float
    box_x: float
    box_w: float
    box_h: float
    row_step: float
    top: float
    row: dict[str, int]
    arcs: list[tuple[str, str, str, float]]  # (source, target, label, lane x)
    labels: list[tuple[float, float, str, str]]  # (x, y, text, anchor)

    @property
    def cx(self) -> float:
        return self.box_x + self.box_w / 2

    def box_top(self, name: str) -> float:
        return self.top + self.row[name] * self.row_step

    def gap_middle(self, upper_row: int) -> float:
        """The y in the middle of the gap below row ``upper_row``."""
        return self.top + upper_row * self.row_step + self.box_h + (self.row_step
                                                                    - self.box_h) / 2

    def state_boxes(self) -> list[Box]:
        return [Box(self.box_x, self.box_top(name), self.box_w, self.box_h)
                for name, _ in self.diagram.states]

    def label_boxes(self) -> list[Box]:
        return [_label_box(x, y, text, anchor) for x, y, text, anchor in self.labels]

    def segments(self) -> list[Box]:
        """The straight parts of the arcs (horizontal to and from the boxes, the lane's
        vertical) and of the arrows between neighbouring rows, as zero-width boxes."""
        out = []
        for source, target, _, lane_x in self.arcs:
            y0 = self.box_top(source) + self.box_h / 2
            y1 = self.box_top(target) + self.box_h / 2
            for y in (y0, y1):
                out.append(Box(lane_x, y, self.box_x - lane_x, 0))
            out.append(Box(lane_x, min(y0, y1), 0, abs(y1 - y0)))
        for source, target, _ in self.diagram.edges:
            if self.row[target] == self.row[source] + 1:
                y0 = self.box_top(source) + self.box_h
                out.append(Box(self.cx, y0, 0, self.box_top(target) - y0))
        return out


def state_diagram_layout(source: str) -> StateLayout:
    """The positions of :func:`state_diagram_svg`'s picture of ``source``."""
    diagram = parse_state_diagram(source)
    names = [name for name, _ in diagram.states]
    row = {name: index for index, name in enumerate(names)}
    box_w = max(140.0, *(_text_width(label) * 1.25 + 24 for _, label in diagram.states))
    box_h, gap, top = 34.0, 56.0, 50.0
    arcs = [(s, t, label) for s, t, label in diagram.edges if row[t] not in (row[s], row[s] + 1)]
    # Lanes: arcs whose row spans overlap get different lanes; longer arcs further out.
    lanes: list[list[tuple[int, int]]] = []
    lane_of: dict[int, int] = {}
    for index in sorted(range(len(arcs)),
                        key=lambda i: abs(row[arcs[i][1]] - row[arcs[i][0]])):
        low, high = sorted((row[arcs[index][0]], row[arcs[index][1]]))
        for lane, spans in enumerate(lanes):
            if all(high <= a or b <= low for a, b in spans):
                spans.append((low, high))
                lane_of[index] = lane
                break
        else:
            lanes.append([(low, high)])
            lane_of[index] = len(lanes) - 1
    # Each lane's distance left of the boxes: the next lane out clears the widest label of
    # the lane inside it (a label ends 6 px left of its lane, its background 3 px further).
    widest = [max((_text_width(arcs[i][2]) for i, lane in lane_of.items() if lane == k),
                  default=0.0) for k in range(len(lanes))]
    offset = [30.0]
    for k in range(1, len(lanes)):
        offset.append(offset[-1] + max(40.0, 9 + widest[k - 1] + LANE_MARGIN))
    box_x = offset[-1] + 9 + widest[-1] + 10 if lanes else 40.0
    right_labels = [_text_width(label) for s, t, label in diagram.edges
                    if row[t] - row[s] in (0, 1)]
    width = box_x + box_w + 60 + max(right_labels, default=0) + 20
    height = top + len(names) * (box_h + gap) + 10
    layout = StateLayout(diagram, width, height, box_x, box_w, box_h, box_h + gap, top, row,
                         [(s, t, label, box_x - offset[lane_of[i]])
                          for i, (s, t, label) in enumerate(arcs)], [])
    cx = layout.cx
    for source_name, target, label in diagram.edges:
        if not label:
            continue
        if row[target] == row[source_name] + 1:
            layout.labels.append((cx + 8, layout.gap_middle(row[source_name]) + 4, label,
                                  "start"))
        elif row[target] == row[source_name]:
            layout.labels.append((box_x + box_w + 40,
                                  layout.box_top(source_name) + box_h / 2 + 4, label, "start"))
    for source_name, target, label, lane_x in layout.arcs:
        if label:
            low, high = sorted((row[source_name], row[target]))
            layout.labels.append((lane_x - 6, layout.gap_middle(low + (high - low - 1) // 2) + 4,
                                  label, "end"))
    return layout


def state_diagram_svg(source: str, title: str = "state diagram") -> str:
    """The SVG picture of a ``stateDiagram-v2`` block (see the module docstring), drawn at
    the positions of :func:`state_diagram_layout`."""
    layout = state_diagram_layout(source)
    diagram, box_x, box_w, box_h, cx = (layout.diagram, layout.box_x, layout.box_w,
                                        layout.box_h, layout.cx)
    row, box_top = layout.row, layout.box_top
    width, height = layout.width, layout.height
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}' role='img'>",
        f"<title>{escape(title)}</title>",
        "<defs><marker id='arrow' viewBox='0 0 10 10' refX='10' refY='5' markerWidth='8' "
        "markerHeight='8' orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' "
        "fill='#333'/></marker></defs>",
        "<rect width='100%' height='100%' fill='white'/>",
    ]
    line = "stroke='#333' stroke-width='1.4' fill='none' marker-end='url(#arrow)'"
    if diagram.initial is not None and diagram.initial in row:
        start_y = box_top(diagram.initial) - 30
        parts.append(f"<circle cx='{cx:.1f}' cy='{start_y:.1f}' r='7' fill='#333'/>")
        parts.append(f"<path d='M{cx:.1f},{start_y + 7:.1f} L{cx:.1f},"
                     f"{box_top(diagram.initial):.1f}' {line}/>")
    for name, label in diagram.states:
        y = box_top(name)
        parts.append(f"<rect x='{box_x:.1f}' y='{y:.1f}' width='{box_w:.1f}' height='{box_h}' "
                     f"rx='8' fill='#eef3fb' stroke='#335'/>")
        parts.append(f"<text x='{cx:.1f}' y='{y + box_h / 2 + 5:.1f}' text-anchor='middle' "
                     f"{FONT}>{escape(label)}</text>")
    for source_name, target, _ in diagram.edges:
        if row[target] == row[source_name] + 1:
            y0, y1 = box_top(source_name) + box_h, box_top(target)
            parts.append(f"<path d='M{cx:.1f},{y0:.1f} L{cx:.1f},{y1:.1f}' {line}/>")
        elif row[target] == row[source_name]:
            y = box_top(source_name)
            x = box_x + box_w
            parts.append(f"<path d='M{x:.1f},{y + 8:.1f} C{x + 45:.1f},{y - 10:.1f} "
                         f"{x + 45:.1f},{y + box_h + 10:.1f} {x:.1f},{y + box_h - 8:.1f}' "
                         f"{line}/>")
    for source_name, target, _, lane_x in layout.arcs:
        y0 = box_top(source_name) + box_h / 2
        y1 = box_top(target) + box_h / 2
        parts.append(f"<path d='M{box_x:.1f},{y0:.1f} L{lane_x + 10:.1f},{y0:.1f} "
                     f"Q{lane_x:.1f},{y0:.1f} {lane_x:.1f},{y0 + (10 if y1 > y0 else -10):.1f} "
                     f"L{lane_x:.1f},{y1 - (10 if y1 > y0 else -10):.1f} "
                     f"Q{lane_x:.1f},{y1:.1f} {lane_x + 10:.1f},{y1:.1f} "
                     f"L{box_x:.1f},{y1:.1f}' {line}/>")
    parts.extend(_label(x, y, text, anchor) for x, y, text, anchor in layout.labels)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class Region:
    """One region of the ring's example segment: its picture row, first byte, size, name."""

    row: int
    start: int
    size: int
    label: str


#: Fill colours of the ring picture, by region name (anything else is grey).
_RING_COLOURS = {"written_flag": "#f6c453", "read_flag": "#8fd19e", "chunk": "#dcecff",
                 "data": "#c9dcf5", "metadata": "#f3e3c3", "chunk_metadata": "#faeed6"}


def ring_layout_svg(regions: Sequence[Region], title: str = "ring layout") -> str:
    """The SVG picture of a segment's regions: one row per nesting level, one column per byte;
    a region too narrow for its name shows its index, a one-byte region (or one too narrow
    for its index) a letter, named in the legend below."""
    if not regions:
        raise ValueError("expected at least one region of the ring's example segment")
    total = max(region.start + region.size for region in regions)
    rows = max(region.row for region in regions) + 1
    cell, row_h, left, top = 18.0, 30.0, 10.0, 30.0
    width = left * 2 + total * cell
    texts: dict[Region, str] = {}
    legend: dict[str, str] = {}
    for region in regions:
        base, _, index = region.label.partition("[")
        room = region.size * cell - 6
        if region.size > 1 and _text_width(region.label) <= room:
            texts[region] = region.label
        elif region.size > 1 and index and _text_width(index.rstrip("]")) <= room:
            texts[region] = index.rstrip("]")
        else:
            if base not in legend:
                letters = [c.upper() for c in base if c.isalpha()] + list("XYZ#")
                legend[base] = next(c for c in letters if c not in legend.values())
            texts[region] = legend[base]
    height = top + rows * row_h + 20 + 18 * len(legend)
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}' role='img'>",
        f"<title>{escape(title)}</title>",
        "<rect width='100%' height='100%' fill='white'/>",
    ]
    for byte in range(0, total + 1, 8):
        x = left + byte * cell
        parts.append(f"<text x='{x:.1f}' y='{top - 10:.1f}' text-anchor='middle' "
                     f"font-family='monospace' font-size='11'>{byte}</text>")
        parts.append(f"<path d='M{x:.1f},{top - 6:.1f} L{x:.1f},{top:.1f}' stroke='#666'/>")
    for region in regions:
        base = region.label.partition("[")[0]
        x = left + region.start * cell
        y = top + region.row * row_h
        w = region.size * cell
        colour = _RING_COLOURS.get(base, "#e4e4e4")
        parts.append(f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{row_h - 4}' "
                     f"fill='{colour}' stroke='#333'><title>{escape(region.label)}: bytes "
                     f"{region.start}..{region.start + region.size - 1}</title></rect>")
        parts.append(f"<text x='{x + w / 2:.1f}' y='{y + row_h / 2 + 2:.1f}' "
                     f"text-anchor='middle' {FONT}>{escape(texts[region])}</text>")
    y = top + rows * row_h + 16
    for base, letter in sorted(legend.items()):
        parts.append(f"<text x='{left:.1f}' y='{y:.1f}' {FONT}>{escape(letter)} = "
                     f"{escape(base)}</text>")
        y += 18
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class FrameBox:
    """One frame of a message as drawn: its name, its content kind, whether it repeats, and
    what it holds (a payload type, literal text; shown under the name instead of the kind)."""

    name: str
    content: str
    repeated: bool = False
    detail: str = ""


#: Fill colours of the frame picture, by content kind (anything else is grey).
_FRAME_COLOURS = {"identity": "#e4e4e4", "type_byte": "#f6c453", "literal": "#f6c453",
                  "msgpack": "#dcecff", "oob": "#8fd19e"}


def frames_layout_svg(messages: Sequence[tuple[str, bool, Sequence[FrameBox]]],
                      title: str = "frames of every message") -> str:
    """The SVG picture of each message's frames, one row per message ``(kind, routed,
    frames)``: a routed message starts with the identity frame that only the ROUTER end
    sees (dashed), a repeated frame is drawn as a stack marked "0 or more"."""
    if not messages:
        raise ValueError("expected at least one message to draw")
    label_w = max(_text_width(kind) for kind, _, _ in messages) + 20
    box_w, box_h, gap, row_h, top, left = 180.0, 40.0, 8.0, 58.0, 20.0, 10.0
    most = max(len(frames) + routed for _, routed, frames in messages)
    width = left + label_w + most * (box_w + gap) + 20
    height = top + len(messages) * row_h + 10
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}' role='img'>",
        f"<title>{escape(title)}</title>",
        "<rect width='100%' height='100%' fill='white'/>",
    ]
    for row, (kind, routed, frames) in enumerate(messages):
        y = top + row * row_h
        parts.append(f"<text x='{left:.1f}' y='{y + box_h / 2 + 5:.1f}' {FONT} "
                     f"font-weight='bold'>{escape(kind)}</text>")
        boxes = ([FrameBox("identity", "identity")] if routed else []) + list(frames)
        for column, frame in enumerate(boxes):
            x = left + label_w + column * (box_w + gap)
            colour = _FRAME_COLOURS.get(frame.content, "#e4e4e4")
            dashed = " stroke-dasharray='5,3'" if routed and column == 0 else ""
            if frame.repeated:
                for offset in (6.0, 3.0):
                    parts.append(f"<rect x='{x + offset:.1f}' y='{y - offset:.1f}' "
                                 f"width='{box_w:.1f}' height='{box_h}' rx='4' "
                                 f"fill='{colour}' stroke='#333'/>")
            parts.append(f"<rect x='{x:.1f}' y='{y:.1f}' width='{box_w:.1f}' height='{box_h}' "
                         f"rx='4' fill='{colour}' stroke='#333'{dashed}/>")
            name = frame.name if _text_width(frame.name) < box_w - 8 else frame.name[:18] + "…"
            detail = (frame.detail or frame.content) + (", 0 or more" if frame.repeated else "")
            if _text_width(detail) * 0.85 > box_w - 8:
                detail = detail[:int((box_w - 8) / (CHAR_WIDTH * 0.85)) - 1] + "…"
            if routed and column == 0:
                detail = "ROUTER end only"
            parts.append(f"<text x='{x + box_w / 2:.1f}' y='{y + 17:.1f}' text-anchor='middle' "
                         f"{FONT}>{escape(name)}</text>")
            parts.append(f"<text x='{x + box_w / 2:.1f}' y='{y + 33:.1f}' text-anchor='middle' "
                         f"font-family='system-ui,sans-serif' font-size='11' fill='#444'>"
                         f"{escape(detail)}</text>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
