"""Perfetto's tracks for one group of spans (a sample, or a process's spans outside samples): each span an
:class:`Item` with integer-µs times, placed by :func:`layout` on a lane and at a depth so that every lane's
complete events nest strictly and follow the span tree (see :mod:`._perfetto`)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from ...metrics._records import SpanRecord
from ...metrics._summary import OK

SampleKey = tuple[int, int]

SKEW_US = 1000
"""A child span that starts before or ends after its parent by at most this many µs is drawn inside the parent
(its ``args.skew_us`` says by how much it was moved); a larger difference puts it on a lane. Spans of one sample
can disagree by that much: the library's phase spans are timed on the sample's monotonic timeline, a user's own
spans and a remote process's spans on their wall clock."""


@dataclass(slots=True)
class Item:
    """One span of the step as an event: its place (track group, lane) and its integer-µs times."""

    rec: SpanRecord
    start: int
    end: int
    instant: bool = False
    primary: bool = False
    name: str = ""
    lane: int = 0
    depth: int = 0
    skew: tuple[int, int] | None = None
    """µs the span's start and end were moved by to fit in its parent (see :data:`SKEW_US`)."""
    children: list[Item] = field(default_factory=list)


@dataclass(slots=True)
class Group:
    """The spans drawn on one track and its lanes: a sample's, or a process's spans outside any sample."""

    worker: str
    key: SampleKey | None
    items: list[Item] = field(default_factory=list)
    verdict: str = OK
    lanes: int = 1


def _overlaps(lane: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether [start, end) overlaps an interval of ``lane`` (sorted, pairwise disjoint); a zero-length event
    overlaps an interval it lies strictly inside."""
    i = bisect.bisect_right(lane, (start, math.inf))
    if i and lane[i - 1][1] > start:
        return True
    return i < len(lane) and lane[i][0] < end


def _order(it: Item) -> tuple[int, int, int]:
    return (it.start, -it.end, it.rec.span_id)


def _tree(group: Group) -> tuple[list[Item], list[Item]]:
    """The group's complete events with their children filled in, and the roots. Spans whose parent is not here
    hang under the group's primary event (the sample span, or the snapshot standing in for a sample span that
    never ended)."""
    items = [it for it in group.items if not it.instant]
    by_id = {(it.rec.trace_id, it.rec.span_id): it for it in items}
    primary = next((it for it in items if it.primary), None)
    roots: list[Item] = []
    for it in items:
        parent = by_id.get((it.rec.trace_id, it.rec.parent_id)) if it.rec.parent_id else None
        if parent is None and it is not primary:
            parent = primary
        if parent is None or parent is it:
            roots.append(it)
        else:
            parent.children.append(it)
    return items, roots


class _Lanes:
    """The lanes of one group as they fill: each a sorted list of disjoint top-level intervals."""

    def __init__(self) -> None:
        self.lanes: list[list[tuple[int, int]]] = [[]]
        self.placed: set[int] = set()
        self.overflow: list[Item] = []

    def descend(self, top: Item, lane: int) -> None:
        placed, overflow = self.placed, self.overflow
        stack = [(top, 0)]
        while stack:
            item, depth = stack.pop()
            if id(item) in placed:  # a cycle of parent ids in untrusted input
                continue
            placed.add(id(item))
            item.lane, item.depth = lane, depth
            last_end = item.start
            for child in sorted(item.children, key=_order):
                # a child sticking out of its parent by less than SKEW_US is drawn inside it (clock skew)
                start = max(child.start, item.start) if child.start >= item.start - SKEW_US else child.start
                end = min(child.end, item.end) if child.end <= item.end + SKEW_US else child.end
                if item.start <= start < item.end and end <= item.end and start >= last_end and start <= end:
                    if (start, end) != (child.start, child.end):
                        child.skew = (child.start - start, child.end - end)
                        child.start, child.end = start, end
                    last_end = end
                    stack.append((child, depth + 1))
                else:
                    overflow.append(child)

    def place_top(self, item: Item, first_lane: int) -> None:
        lanes = self.lanes
        lane = first_lane
        while lane < len(lanes) and _overlaps(lanes[lane], item.start, item.end):
            lane += 1
        if lane == len(lanes):
            lanes.append([])
        bisect.insort(lanes[lane], (item.start, item.end))
        self.descend(item, lane)

    def place(self, item: Item, first_lane: int) -> None:
        if id(item) in self.placed:
            return
        self.place_top(item, first_lane)
        while self.overflow:  # children that could not nest, in start order, each with its own subtree
            pending = sorted(self.overflow, key=_order)
            self.overflow.clear()
            for child in pending:
                if id(child) not in self.placed:
                    self.place_top(child, 1)


def layout(group: Group) -> None:
    """Give every item a lane and a depth so that each lane's complete events nest strictly and follow the
    span tree. A child shares its parent's lane when it lies inside the parent (starting before the parent's
    end: a slice that starts where another ends is its sibling) and after its previous sibling there;
    otherwise it starts a subtree at the top of the first lane (>= 1) where it overlaps nothing. Spans whose
    parent is not here hang under the group's primary event (the sample span, or the snapshot standing in for
    a sample span that never ended)."""
    items, roots = _tree(group)
    lanes = _Lanes()
    for root in sorted(roots, key=_order):
        lanes.place(root, 0)
    for item in sorted(items, key=_order):  # only members of a parent-id cycle are left
        lanes.place(item, 1)
    group.lanes = len(lanes.lanes)
