# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Choosing an option for every item of a batch: sequential (greedy, first-fit) and exact branch and bound.

Private to placement.py. The value of a batch, maximised lexicographically, is
(repairs that succeed, new replicas placed, -shards moved); among equal values the search keeps the first it
meets, and it meets options best-first, so ties go to the answer closest to placing each item at its best.
"""

from __future__ import annotations

import bisect
from typing import Callable, List, Sequence, Tuple

from ansible_collections.llmgw.fleet.plugins.module_utils._placement_space import SKIP, Item, Option, Space

MEMO_LIMIT = 50000


def gain(item: Item, option: Option) -> Tuple[int, int, int]:
    if option.mode == "skip":
        return (0, 0, 0)
    if item.repair:
        return (1, 0, -(len(item.missing) if option.mode == "repair" else item.shards))
    return (0, 1, 0)


def value(items: Sequence[Item], choice: Sequence[Option]) -> Tuple[int, int, int]:
    total = (0, 0, 0)
    for item, option in zip(items, choice):
        total = _add(total, gain(item, option))
    return total


def _add(a: tuple, b: tuple) -> tuple:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def sequential(space: Space, items: Sequence[Item], chooser: Callable[[Item], Option],
               order: Sequence[int] = ()) -> List[Option]:
    """Decide the items one after the other (in ``order``, indices into ``items``, default as given), each with
    ``chooser`` on the state the earlier ones left. The choice is returned in the order of ``items``; new
    replicas only take GPUs, so the same choice is valid in any order that keeps the repairs first."""
    order = order or range(len(items))
    choice: List[Option] = [SKIP] * len(items)
    undo = []
    for index in order:
        choice[index] = chooser(items[index])
        undo.append(space.apply(items[index], choice[index]))
    for changes in reversed(undo):
        space.undo(changes)
    return choice


def smallest_first(items: Sequence[Item]) -> List[int]:
    """Repairs first (as given), then new replicas smallest first: the order that fits the most of them."""
    repairs = [i for i, item in enumerate(items) if item.repair]
    new = sorted((i for i, item in enumerate(items) if not item.repair),
                 key=lambda i: (items[i].shards * items[i].gpus, items[i].shards, items[i].gpus, items[i].name))
    return repairs + new


def seeds(space: Space, items: Sequence[Item]) -> List[List[Option]]:
    """Best-fit decreasing (the search's own first path), first-fit decreasing, best-fit smallest first."""
    return [sequential(space, items, space.best_option), sequential(space, items, space.first_fit_option),
            sequential(space, items, space.best_option, smallest_first(items))]


def heuristic(space: Space, items: Sequence[Item]) -> List[Option]:
    """The best of the seeds by value; on a tie the earlier one (best-fit decreasing first)."""
    best = None
    for choice in seeds(space, items):
        if best is None or value(items, choice) > value(items, best):
            best = choice
    return best


class _Bound:
    """Upper bounds on what the items from index i on can still add."""

    def __init__(self, items: Sequence[Item]):
        self.repairs_from = [0] * (len(items) + 1)
        self.freed_from = [0] * (len(items) + 1)
        for i in range(len(items) - 1, -1, -1):
            item = items[i]
            self.repairs_from[i] = self.repairs_from[i + 1] + (1 if item.repair else 0)
            self.freed_from[i] = self.freed_from[i + 1] + (len(item.kept) * item.gpus if item.repair else 0)
        # New items come last, in decreasing size; suffix[k] = GPUs of new items k.. (non-increasing in k).
        self.first_new = next((i for i, item in enumerate(items) if not item.repair), len(items))
        self.suffix = [0] * (len(items) + 1)
        for i in range(len(items) - 1, self.first_new - 1, -1):
            self.suffix[i] = self.suffix[i + 1] + items[i].shards * items[i].gpus
        self.negated = [-s for s in self.suffix]  # non-decreasing, for bisect
        self.count = len(items)

    def upper(self, i: int, partial: tuple, free_gpus: int) -> tuple:
        capacity = free_gpus + self.freed_from[i]
        start = max(i, self.first_new)
        # The most new items that fit in the free GPUs: the smallest ones, i.e. a suffix of the list.
        k = bisect.bisect_left(self.negated, -capacity, start, self.count + 1)
        return (partial[0] + self.repairs_from[i], partial[1] + (self.count - k), partial[2])


def exact(space: Space, items: Sequence[Item], budget: int) -> Tuple[List[Option], bool, int]:
    """Branch and bound over every option up to symmetry, seeded with :func:`seeds`.

    Returns (choice, proven optimal, search nodes expanded). Past ``budget`` expansions it returns the best
    answer found, which is never worse than either seed.
    """
    greedy, *others = seeds(space, items)
    best, best_value = greedy, value(items, greedy)
    # Equal values keep the earlier answer in best-first order; the other seeds are not in that order, so a
    # search leaf that only ties with them may still replace them ("strict" is False until that happens).
    strict = True
    for seed in others:
        if value(items, seed) > best_value:
            best, best_value, strict = seed, value(items, seed), False
    if not items:
        return best, True, 0
    bound = _Bound(items)
    if _prune(bound.upper(0, (0, 0, 0), space.free_ready), best_value, strict):
        return best, True, 0

    choice: List[Option] = [SKIP] * len(items)
    memo = {}
    expansions = 0
    frames = [[space.options(items[0]), None, (0, 0, 0)]]  # [option iterator, applied changes, value before]
    while frames:
        frame = frames[-1]
        i = len(frames) - 1
        if frame[1] is not None:
            space.undo(frame[1])
            frame[1] = None
        option = next(frame[0], None)
        if option is None:
            frames.pop()
            continue
        expansions += 1
        if expansions > budget:
            for open_frame in reversed(frames):
                if open_frame[1] is not None:
                    space.undo(open_frame[1])
            return best, False, expansions - 1
        frame[1] = space.apply(items[i], option)
        choice[i] = option
        partial = _add(frame[2], gain(items[i], option))
        if i + 1 == len(items):
            if partial > best_value or (not strict and partial == best_value):
                best, best_value, strict = list(choice), partial, True
            continue
        if _prune(bound.upper(i + 1, partial, space.free_ready), best_value, strict):
            continue
        key = (i + 1, space.canonical())
        seen = memo.get(key)
        if seen is not None and seen >= partial:
            continue
        if len(memo) < MEMO_LIMIT:
            memo[key] = partial
        frames.append([space.options(items[i + 1]), None, partial])
    return best, True, expansions


def _prune(upper: tuple, best_value: tuple, strict: bool) -> bool:
    return upper < best_value or (strict and upper == best_value)
