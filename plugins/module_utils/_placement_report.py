# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Words and tables for people: why a replica was refused, and the ``fleet status`` view. Pure: no I/O."""

from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence

NAMED_NODES = 8  # nodes named per fabric in a refusal before "and N more"
NAMED_FABRICS = 8  # fabrics described in a refusal before the rest are summed up
FREE_BY_NODE_UP_TO = 64  # ready nodes per fabric up to which a refusal lists each node's free GPUs


def capacity(space, item) -> Dict[str, Dict[str, object]]:
    """Per fabric: what it has against what ``item`` needs (ready nodes, nodes that fit, free GPUs)."""
    out: Dict[str, Dict[str, object]] = {}
    for fabric in sorted(space.fabric_members):
        names = space.fabric_members[fabric]
        ready = space.fabric_nodes.get(fabric, [])
        histogram: Dict[int, int] = {}
        for name in ready:
            histogram[space.free[name]] = histogram.get(space.free[name], 0) + 1
        out[fabric] = {
            "nodes": len(names),
            "ready_nodes": len(ready),
            "fitting_nodes": sum(1 for n in ready if space.eligible(item, n)),
            "free_gpus": sum(space.free[n] for n in ready),
            "largest_free": max(histogram, default=0),
            "ready_nodes_by_free_gpus": {k: histogram[k] for k in sorted(histogram, reverse=True)},
        }
        if len(ready) <= FREE_BY_NODE_UP_TO:
            out[fabric]["free_by_node"] = {n: space.free[n] for n in ready}
    return out


def _node_words(space, item, fabric: str) -> str:
    words = []
    for name in space.fabric_members[fabric]:
        if name not in space.ready:
            words.append("%s %s" % (name, space.state[name]))
        elif name in item.avoid:
            words.append("%s avoided" % name)
        elif item.gpu_type is not None and space.gpu_type[name] != item.gpu_type:
            words.append("%s has %s GPUs" % (name, space.gpu_type[name] or "untyped"))
        elif name in item.kept_nodes:
            words.append("%s holds a surviving shard" % name)
        else:
            words.append("%s %d free" % (name, space.free[name]))
    if len(words) > NAMED_NODES:
        words = words[:NAMED_NODES] + ["and %d more" % (len(words) - NAMED_NODES)]
    return ", ".join(words)


def _fabrics_words(space, item, fabrics: Sequence[str], need: int, cap: Mapping[str, Mapping[str, object]]) -> str:
    """Each fabric's capacity against the need, the fabrics that came closest first when there are many."""
    if len(fabrics) > NAMED_FABRICS:
        fabrics = sorted(fabrics, key=lambda f: (-int(cap[f]["fitting_nodes"]), -int(cap[f]["free_gpus"]), f))
    words = [_fabric_words(space, item, f, need, cap[f]) for f in fabrics[:NAMED_FABRICS]]
    rest = fabrics[NAMED_FABRICS:]
    if rest:
        words.append("and %d more fabrics with at most %d of the %d nodes it needs" % (
            len(rest), max(int(cap[f]["fitting_nodes"]) for f in rest), need))
    return "; ".join(words)


def _fabric_words(space, item, fabric: str, need: int, cap: Mapping[str, object]) -> str:
    return "%s has %d of the %d nodes it needs (%d free GPUs on %d ready node%s: %s)" % (
        fabric, cap["fitting_nodes"], need, cap["free_gpus"], cap["ready_nodes"],
        "" if cap["ready_nodes"] == 1 else "s", _node_words(space, item, fabric))


def needs_words(item) -> str:
    if item.shard_count == 1:
        return "1 ready node with %d free GPUs" % item.gpus
    return "%d distinct ready nodes of one fabric with %d free GPUs each (%d shards x %d GPUs = %d GPUs)" % (
        item.shard_count, item.gpus, item.shard_count, item.gpus, item.shard_count * item.gpus)


def refusal_reason(space, item, cap: Mapping[str, Mapping[str, object]]) -> str:
    """A sentence naming each fabric's free capacity against what the replica needs."""
    constraints = []
    if item.fabric is not None:
        constraints.append("only fabric %s" % item.fabric)
    if item.gpu_type is not None:
        constraints.append("only %s GPUs" % item.gpu_type)
    if item.avoid:
        constraints.append("avoiding %s" % ", ".join(sorted(item.avoid)))
    constrained = " (%s)" % "; ".join(constraints) if constraints else ""
    if item.repair:
        head = "replica %s cannot be repaired" % item.name
        parts = []
        if item.own_fabric is not None:
            missing = len(item.missing)
            kept = ", ".join(sorted(item.kept_nodes)) or "no survivors"
            parts.append("its own fabric %s cannot hold all of it again: it needs %d more node%s besides %s with "
                         "%d free GPUs, and %s" % (
                             item.own_fabric, missing, "" if missing == 1 else "s", kept, item.gpus,
                             _fabric_words(space, item, item.own_fabric, missing, cap[item.own_fabric])
                             if item.own_fabric in cap else "that fabric has no nodes left"))
        others = [f for f in sorted(cap) if f != item.own_fabric and (item.fabric is None or f == item.fabric)]
        if others:
            parts.append("no other fabric can hold all of it, %s: %s" % (
                needs_words(item), _fabrics_words(space, item, others, item.shard_count, cap)))
        else:
            parts.append("there is no other fabric it may move to")
        return "%s%s: %s" % (head, constrained, "; ".join(parts))
    fabrics = [f for f in sorted(cap) if item.fabric is None or f == item.fabric]
    head = "cannot place %s%s: it needs %s" % (item.name, constrained, needs_words(item))
    if not fabrics:
        known = ", ".join(sorted(cap)) or "none"
        return "%s, and fabric %s has no nodes (fabrics: %s)" % (head, item.fabric, known)
    return "%s; %s" % (head, _fabrics_words(space, item, fabrics, item.shard_count, cap))


def crowded_out_reason(item, placed: int, total: int, by: Sequence[str] = ()) -> str:
    what = "repaired" if item.repair else "placed"
    crowd = "; crowded out by %s in this batch, whose shards take the GPUs it could use" % ", ".join(by) if by else ""
    return ("%s was not %s: it would fit on its own, but this batch places the most replicas (%d of %d) without "
            "it%s" % (item.name, what, placed, total, crowd))


# -- what would make a refused replica fit, from the solver's own state -----------------------------------------

FIX_KINDS = ("drop_constraint", "free_gpus", "add_node", "crowded_out")


def fixes(space, item, holders: Mapping[str, Sequence[str]]) -> List[Dict[str, object]]:
    """Changes that would let ``item`` fit on its own, cheapest first, each ``{kind, text, ...}``:

    * ``drop_constraint``: a ``fabric``, ``gpu_type`` or ``avoid_nodes`` without which it fits now;
    * ``free_gpus``: on the fabric where the fewest GPUs are short, which nodes lack how many and which replicas
      hold GPUs there (``holders``: node -> replicas);
    * ``add_node``: how many ready nodes with at least its GPUs per shard the closest fabric lacks.
    """
    out: List[Dict[str, object]] = []
    out.extend(_drop_fixes(space, item))
    modes = (["repair"] if space.can_stay(item) else []) + ["move" if item.repair else "place"]
    best_free = best_add = None
    for mode in modes:
        need = space.need(item, mode)
        for fabric in space.fabrics_for(item, mode) or ([item.fabric] if item.fabric else []):
            usable = [n for n in space.fabric_members.get(fabric, ()) if n in space.ready and _allowed(space, item, n)]
            fitting = [n for n in usable if space.free[n] >= item.gpus]
            add = (need - len(fitting), fabric, mode)
            if best_add is None or add < best_add:
                best_add = add
            able = [n for n in usable if space.total[n] - _pinned(space, n, holders) >= item.gpus]
            if len(able) >= need and need:
                chosen = sorted(able, key=lambda n: (-space.free[n], n))[:need]
                short = {n: item.gpus - space.free[n] for n in chosen if space.free[n] < item.gpus}
                free = (sum(short.values()), fabric, mode, short)
                if short and (best_free is None or free[:2] < best_free[:2]):
                    best_free = free
    if best_free is not None:
        gpus, fabric, _mode, short = best_free
        by = sorted({r for n in short for r in holders.get(n, ())})
        out.append({"kind": "free_gpus", "fabric": fabric, "gpus": gpus, "nodes": dict(sorted(short.items())),
                    "replicas": by, "text": "free %d GPU%s on %s (%s): replica%s %s hold%s them" % (
                        gpus, "" if gpus == 1 else "s", fabric,
                        ", ".join("%s needs %d more" % (n, k) for n, k in sorted(short.items())),
                        "" if len(by) == 1 else "s", ", ".join(by), "s" if len(by) == 1 else "")})
    if best_add is not None and best_add[0] > 0:
        count, fabric, _mode = best_add
        wants = ["%d GPUs" % item.gpus] if item.gpus else []
        if item.gpu_type:
            wants.append("of type %s" % item.gpu_type)
        out.append({"kind": "add_node", "fabric": fabric, "nodes": count, "gpus": item.gpus,
                    "text": "add %s ready node%s with >= %s free to %s" % (
                        "a" if count == 1 else str(count), "" if count == 1 else "s",
                        " ".join(wants) or "0 GPUs", fabric)})
    return out


def _allowed(space, item, name: str) -> bool:
    return (name not in item.avoid and name not in item.kept_nodes
            and (item.gpu_type is None or space.gpu_type[name] == item.gpu_type))


def _pinned(space, name: str, holders: Mapping[str, Sequence[str]]) -> int:
    """GPUs of a node that no replica holds and that are still not free (reserved outside the fleet)."""
    return 0 if holders.get(name) else space.total[name] - space.free[name]


def _drop_fixes(space, item) -> List[Dict[str, object]]:
    out: List[Dict[str, object]] = []
    ready = sorted(space.ready)
    drops = []
    if item.gpu_type is not None:
        typed = [n for n in ready if space.gpu_type[n] == item.gpu_type]
        why = ("no ready node has it" if not typed else "%d ready node%s have it, with at most %d free GPUs" % (
            len(typed), "" if len(typed) == 1 else "s", max(space.free[n] for n in typed)))
        drops.append(("gpu_type", item.gpu_type, why, dataclasses.replace(item, gpu_type=None)))
    if item.fabric is not None:
        members = [n for n in ready if space.fabric[n] == item.fabric]
        why = ("it has no ready node" if not members else "its %d ready node%s have %d free GPUs" % (
            len(members), "" if len(members) == 1 else "s", sum(space.free[n] for n in members)))
        drops.append(("fabric", item.fabric, why, dataclasses.replace(item, fabric=None)))
    if item.avoid:
        drops.append(("avoid_nodes", ",".join(sorted(item.avoid)), "those nodes could take it",
                      dataclasses.replace(item, avoid=frozenset())))
    for key, value, why, relaxed in drops:
        if space.has_option(relaxed):
            out.append({"kind": "drop_constraint", "constraint": key, "value": value,
                        "text": "drop %s=%s (%s)" % (key, value, why)})
    return out


def fixes_words(found: Sequence[Mapping[str, object]]) -> str:
    if not found:
        return ""
    return "; to make it fit: " + "; or ".join(str(f["text"]) for f in found)


# -- fleet status -------------------------------------------------------------------------------------------

def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> List[str]:
    cells = [[str(c) for c in headers]] + [["-" if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def _gpu_ranges(gpus: Sequence[int]) -> str:
    gpus = sorted(gpus)
    if not gpus:
        return "-"
    runs, start, prev = [], gpus[0], gpus[0]
    for g in gpus[1:] + [None]:
        if g is not None and g == prev + 1:
            prev = g
            continue
        runs.append(str(start) if start == prev else "%d-%d" % (start, prev))
        if g is not None:
            start = prev = g
    return ",".join(runs)


def status_lines(nodes: Sequence[Mapping], replicas: Sequence[Mapping]) -> List[str]:
    """The ``fleet status`` view: nodes by fabric with free GPUs, then replicas with shards and state.

    ``nodes``/``replicas`` are the registry's dicts (name, fabric, state, gpu_count, free_gpus, ... and
    shards of rank, node, gpus).
    """
    lines: List[str] = []
    held: Dict[str, List[str]] = {}
    for replica in replicas:
        for shard in replica.get("shards", []):
            held.setdefault(shard["node"], []).append("%s/%d" % (replica["name"], shard["rank"]))
    by_fabric: Dict[str, List[Mapping]] = {}
    for node in nodes:
        by_fabric.setdefault(node["fabric"], []).append(node)
    lines.append("NODES")
    if not nodes:
        lines.append("  (none registered)")
    versions = collections.Counter(n.get("engine_version") or "unknown" for n in nodes if n["state"] == "ready")
    if len(versions) > 1:
        lines.append("engine versions on ready nodes: %s (each replica's shards stay on one version)" % ", ".join(
            "%s on %d" % (v, versions[v]) for v in sorted(versions)))
    for fabric in sorted(by_fabric):
        members = sorted(by_fabric[fabric], key=lambda n: n["name"])
        ready = [n for n in members if n["state"] == "ready"]
        lines.append("fabric %s: %d nodes, %d ready, %d of %d GPUs free on ready nodes" % (
            fabric, len(members), len(ready), sum(n["free_gpus"] for n in ready),
            sum(n["gpu_count"] for n in ready)))
        rows = [[
            n["name"], n["state"], "%d/%d" % (n["free_gpus"], n["gpu_count"]), n.get("gpu_type"),
            n.get("engine_version"), n.get("address"), n.get("last_seen"), speed_words(n.get("speed")),
            " ".join(sorted(held.get(n["name"], []))),
        ] for n in members]
        lines.extend("  " + line for line in _table(
            ["NODE", "STATE", "FREE/GPUS", "GPU TYPE", "ENGINE", "ADDRESS", "LAST SEEN", "SPEED", "SHARDS"], rows))
        lines.extend(_reason_lines(members))
        lines.extend("  %s: every llama-server there runs with %s (found at onboarding)"
                     % (n["name"], " ".join(n["engine_args"])) for n in members if n.get("engine_args"))
    lines.append("")
    lines.append("REPLICAS")
    if not replicas:
        lines.append("  (none)")
        return lines
    node_fabric = {n["name"]: n["fabric"] for n in nodes}
    rows = []
    for replica in sorted(replicas, key=lambda r: r["name"]):
        shards = sorted(replica.get("shards", []), key=lambda s: s["rank"])
        fabrics = sorted({node_fabric.get(s["node"], "?") for s in shards})
        placed = " ".join("%d:%s[%s]" % (s["rank"], s["node"], _gpu_ranges(s["gpus"])) for s in shards)
        rows.append([
            replica["name"], replica["state"], replica.get("model"), replica.get("engine"),
            "%d/%d x %d GPUs" % (len(shards), replica["shard_count"], replica["gpus_per_shard"]),
            ",".join(fabrics), placed,
        ])
    lines.extend("  " + line for line in _table(
        ["REPLICA", "STATE", "MODEL", "ENGINE", "SHARDS", "FABRIC", "RANK:NODE[GPUS]"], rows))
    lines.extend(_reason_lines(sorted(replicas, key=lambda r: r["name"])))
    return lines


def speed_words(speed: Optional[Mapping]) -> str:
    """A node's measured speed in one cell: its CPU backend, prompt and generation tokens/s, and how many times
    its own scalar baseline it runs prompts at ('-' when onboarding did not measure it)."""
    if not speed:
        return "-"
    values = (speed["variant"], speed["pp"], speed["tg"], speed["pp_ratio"], speed["threads"])
    return "%s pp %.0f tg %.0f t/s %.1fx x64 %dt" % values


def _reason_lines(records: Sequence[Mapping]) -> List[str]:
    return ["  %s: %s" % (r["name"], "; ".join(r["reasons"])) for r in records if r.get("reasons")]
