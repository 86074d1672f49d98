"""An index of waiting demand classes by size: the earliest waiter among the sizes that fit.

The ``easy`` walk offers capacity behind the head in queue order, one waiter per demand
class (rule 4e). For a fractional demand without an enforced limit on GPUs of one size,
whether it fits during a walk depends on its units alone (it fits iff its units are at most
what the walk can give such a demand, a bound that only falls as the walk grants), so the
walk asks this index for the class whose earliest waiter came first among those of at most
that many units, and never looks at the classes that cannot fit. With a class per waiter (a
million distinct sizes) a walk then costs O(log n) per waiter it grants, not O(classes).

The index is a segment tree of minimum tickets over *slots* of sizes (``units >> shift``);
each slot keeps its classes in a dict and the smallest ticket among them. A query takes the
slots wholly below its bound from the tree and scans the one slot it falls in. Slots start
wide (a tree of 1024 leaves) and split sixteen-fold, rebuilding, while a slot holds more than
``CROWDED`` classes, up to ``MAX_LEAVES`` leaves; an empty index starts over small. Pure.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable

__all__ = ["CROWDED", "MAX_LEAVES", "SizeIndex"]

CROWDED = 16
"""Classes in one slot above which the slots split (while the tree may grow)."""

MAX_BITS = 20
MAX_LEAVES = 1 << MAX_BITS
"""The most leaves the tree grows to (a list of two million minima: 16 MiB)."""

_START_BITS = 10
_NONE = sys.maxsize  # an empty slot's minimum ticket (tickets are far below it)


class SizeIndex:
    """Classes (any hashable) with a size (units, >= 1, at most ``largest``) and a ticket
    each: ``set`` one, ``earliest(bound)`` for the smallest ticket among sizes <= bound."""

    __slots__ = ("_bits", "_largest", "_shift", "_size_of", "_slots", "_tree")

    def __init__(self, largest: int) -> None:
        self._largest = largest
        self._size_of: dict[Hashable, int] = {}
        self._start(_START_BITS)

    def _start(self, bits: int) -> None:
        """An empty tree of ``2 ** bits`` leaves, the slots as narrow as that allows."""
        self._bits = bits
        self._shift = max(0, self._largest.bit_length() - bits)
        self._slots: dict[int, dict[Hashable, int]] = {}
        self._tree = [_NONE] * (2 << bits)

    def __len__(self) -> int:
        return len(self._size_of)

    def set(self, size: int, cls: Hashable, ticket: int | None) -> None:
        """Give ``cls`` (of ``size`` units) the ticket ``ticket``; None takes it out."""
        slot = size >> self._shift
        entries = self._slots.get(slot)
        if ticket is None:
            if entries is None or cls not in entries:
                return
            del entries[cls], self._size_of[cls]
            if not entries:
                del self._slots[slot]
                if not self._slots and self._bits > _START_BITS:
                    self._start(_START_BITS)  # empty: start over small
                    return
        else:
            if entries is None:
                entries = self._slots[slot] = {}
            entries[cls] = ticket
            self._size_of[cls] = size
            if len(entries) > CROWDED and self._bits < MAX_BITS and self._shift > 0:
                self._split()
                return
        self._update(slot, min(entries.values()) if entries else _NONE)

    def _update(self, slot: int, value: int) -> None:
        """Set a leaf and the minima above it (stopping where nothing changes)."""
        tree = self._tree
        i = (1 << self._bits) + slot
        if tree[i] == value:
            return
        tree[i] = value
        i >>= 1
        while i:
            least = min(tree[2 * i], tree[2 * i + 1])
            if tree[i] == least:
                return
            tree[i] = least
            i >>= 1

    def _split(self) -> None:
        """Sixteen times the leaves (narrower slots), rebuilt from every class: O(n)."""
        entries = [
            (cls, self._size_of[cls], ticket)
            for slot in self._slots.values()
            for cls, ticket in slot.items()
        ]
        bits = min(self._bits + 4, MAX_BITS)
        self._start(bits)
        for cls, size, ticket in entries:
            self._slots.setdefault(size >> self._shift, {})[cls] = ticket
        tree, leaves = self._tree, 1 << bits
        for slot, slot_entries in self._slots.items():
            tree[leaves + slot] = min(slot_entries.values())
        for i in range(leaves - 1, 0, -1):
            tree[i] = min(tree[2 * i], tree[2 * i + 1])

    def earliest(self, bound: int) -> int | None:
        """The smallest ticket among classes of at most ``bound`` units, or None."""
        if bound < 1 or not self._size_of:
            return None
        tree, leaves = self._tree, 1 << self._bits
        slot = bound >> self._shift
        best = _NONE
        if slot >= leaves:
            best = tree[1]
        else:
            partial = self._slots.get(slot)
            if partial is not None:
                size_of = self._size_of
                for cls, ticket in partial.items():
                    if ticket < best and size_of[cls] <= bound:
                        best = ticket
            lo, hi = leaves, leaves + slot  # the slots wholly below the bound
            while lo < hi:
                if lo & 1:
                    best = min(best, tree[lo])
                    lo += 1
                if hi & 1:
                    hi -= 1
                    best = min(best, tree[hi])
                lo >>= 1
                hi >>= 1
        return None if best == _NONE else best
