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
    """(repairs that succeed, new replicas placed, -shards moved) one decision adds."""
    if option.mode == "skip":
        return (0, 0, 0)
    if item.repair:
        return (1, 0, -(len(item.missing) if option.mode == "repair" else item.shard_count))
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
                 key=lambda i: (items[i].shard_count * items[i].gpus, items[i].shard_count, items[i].gpus,
                                items[i].name))
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
    """Upper bounds on what the search can still add from a level on (see :func:`exact`)."""

    def __init__(self, items: Sequence[Item], stay: Sequence[int], feasible: Sequence[bool]):
        count = len(items)
        # Node levels: item i from index i on. Every remaining repair that has any option at all succeeds,
        # moving at least its missing ranks (when it may still stay, or stays) or all its shards (when it moves).
        self.repairs_from = [0] * (count + 1)
        for i in range(count - 1, -1, -1):
            self.repairs_from[i] = self.repairs_from[i + 1] + (1 if items[i].repair and feasible[i] else 0)
        # New items come last, in decreasing size; suffix[k] = GPUs of the feasible new items k.. (non-increasing
        # in k), fitting[k] how many they are.
        self.first_new = next((i for i, item in enumerate(items) if not item.repair), count)
        self.suffix = [0] * (count + 1)
        self.fitting = [0] * (count + 1)
        for i in range(count - 1, self.first_new - 1, -1):
            self.suffix[i] = self.suffix[i + 1] + (items[i].shard_count * items[i].gpus if feasible[i] else 0)
            self.fitting[i] = self.fitting[i + 1] + (1 if feasible[i] else 0)
        self.negated = [-s for s in self.suffix]  # non-decreasing, for bisect
        self.feasible = feasible
        self.count = count
        self.items = items
        # GPUs the stay-or-move levels from index m on could still free (each repair that may stay).
        self.freeable_from = [0] * (len(stay) + 1)
        for m in range(len(stay) - 1, -1, -1):
            item = items[stay[m]]
            self.freeable_from[m] = self.freeable_from[m + 1] + len(item.kept) * item.gpus

    def upper(self, i: int, partial: tuple, free_gpus: int, modes: Sequence[str], m: int = 0) -> tuple:
        """From node level ``i`` (with ``m`` stay-or-move levels still to decide, which may free GPUs)."""
        capacity = free_gpus + self.freeable_from[m]
        start = max(i, self.first_new)
        # The most new items that fit in the free GPUs: the smallest ones, i.e. a suffix of the list.
        k = bisect.bisect_left(self.negated, -capacity, start, self.count + 1)
        moved = 0
        for j in range(i, self.first_new):
            item = self.items[j]
            if self.feasible[j]:
                moved += item.shard_count if modes[j] == "move" else len(item.missing)
        return (partial[0] + self.repairs_from[i], partial[1] + self.fitting[k], partial[2] - moved)


def feasible(space: Space, items: Sequence[Item], stay: Sequence[int]) -> List[bool]:
    """Whether each item has any option at all in the roomiest state the search can reach (every repair that
    could stay moved instead, its GPUs free); items alike are looked at once."""
    released = [space.release(item) for item in items if item.repair]
    out, known = [], {}
    for item in items:
        key = (item.shard_count, item.gpus, item.fabric, item.avoid, item.gpu_type, item.kept_nodes,
               item.own_fabric if item.kept else None, len(item.missing), item.repair)
        if key not in known:
            modes = (["repair"] if space.can_stay(item) else []) + ["move" if item.repair else "place"]
            known[key] = any(space.best_in(item, mode) is not SKIP for mode in modes)
        out.append(known[key])
    for changes in reversed(released):
        space.undo(changes)
    return out


def upper_bound(space: Space, items: Sequence[Item]) -> tuple:
    """An upper bound on the value of any answer (what the exact search starts from), for the gap a heuristic
    answer reports."""
    stay = [i for i, item in enumerate(items) if space.can_stay(item)]
    modes = ["repair" if i in stay else ("move" if item.repair else "place") for i, item in enumerate(items)]
    return _Bound(items, stay, feasible(space, items, stay)).upper(0, (0, 0, 0), space.free_ready, modes, 0)


def exact(space: Space, items: Sequence[Item], budget: int) -> Tuple[List[Option], bool, int, tuple]:
    """Branch and bound over every answer up to symmetry, seeded with :func:`seeds`.

    The search has two kinds of levels. First, one per repair that could stay in place: stay, or move (which
    frees its live shards' GPUs at once, so that every other item, earlier or later, may use them). Then one per
    item, repairs first and new requests by decreasing size, branching on every option in the mode chosen for
    it (the nodes of a repair in place; any fabric for a move or a new replica; or leave it out). Once the
    stay-or-move levels are done every option only takes GPUs, so the order of the items changes nothing but
    the time: every assignment of the batch is reached, and the value (repairs, placed, -shards moved) found
    is the optimum.

    Returns (choice, proven optimal, search nodes expanded, upper bound on the value). Past ``budget``
    expansions it returns the best answer found, which is never worse than any seed, and the root bound.
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
        return best, True, 0, best_value
    stay = [i for i, item in enumerate(items) if space.can_stay(item)]
    modes = ["repair" if i in stay else ("move" if item.repair else "place") for i, item in enumerate(items)]
    bound = _Bound(items, stay, feasible(space, items, stay))
    # A repair that cannot stay frees its live shards' GPUs whatever it gets: at once, for every item.
    freed = [space.release(item) for i, item in enumerate(items) if item.repair and i not in stay]
    try:
        return _search(space, items, budget, stay, modes, bound, best, best_value, strict)
    finally:
        for changes in reversed(freed):
            space.undo(changes)


def _search(space, items, budget, stay, modes, bound, best, best_value, strict):
    root = bound.upper(0, (0, 0, 0), space.free_ready, modes, 0)
    if _prune(root, best_value, strict):
        return best, True, 0, root
    levels = len(stay) + len(items)

    def level_options(level: int):
        if level < len(stay):
            return iter(("repair", "move"))  # stay first: it moves fewer shards
        i = level - len(stay)
        return space.options(items[i], modes[i])

    choice: List[Option] = [SKIP] * len(items)
    memo = {}
    expansions = 0
    frames = [[level_options(0), None, (0, 0, 0)]]  # [option iterator, applied changes, value before]
    while frames:
        frame = frames[-1]
        level = len(frames) - 1
        if frame[1] is not None:
            space.undo(frame[1])
            frame[1] = None
        option = next(frame[0], None)
        if option is None:
            frames.pop()
            if level < len(stay):
                modes[stay[level]] = "repair"  # undecided again: the bound counts it as staying
            continue
        expansions += 1
        if expansions > budget:
            for open_frame in reversed(frames):
                if open_frame[1] is not None:
                    space.undo(open_frame[1])
            return best, False, expansions - 1, root
        if level < len(stay):
            index = stay[level]
            modes[index] = option
            frame[1] = space.release(items[index]) if option == "move" else []  # nothing else releases
            partial = frame[2]
            i, remaining = 0, len(stay) - level - 1
        else:
            index = level - len(stay)
            frame[1] = space.take(items[index], option)
            choice[index] = option
            partial = _add(frame[2], gain(items[index], option))
            i, remaining = index + 1, 0
        if level + 1 == levels:
            if partial > best_value or (not strict and partial == best_value):
                best, best_value, strict = list(choice), partial, True
            continue
        if _prune(bound.upper(i, partial, space.free_ready, modes, len(stay) - remaining), best_value, strict):
            continue
        key = (level + 1, tuple(modes[j] for j in stay), space.canonical())
        seen = memo.get(key)
        if seen is not None and seen >= partial:
            continue
        if len(memo) < MEMO_LIMIT:
            memo[key] = partial
        frames.append([level_options(level + 1), None, partial])
    return best, True, expansions, best_value


def _prune(upper: tuple, best_value: tuple, strict: bool) -> bool:
    return upper < best_value or (strict and upper == best_value)
