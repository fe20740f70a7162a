# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a reconcile pass decides from what it saw: pure, the registry's records and the probes in, verdicts out.

A probe is ``{node, reachable, active_units}``: whether the controller reached the node over ssh, and which
shard units run there. From them:

- a reachable node is seen now; a node not reachable whose last sighting is older than ``lost_after`` seconds (or
  that was never seen) is lost; a node reconcile declared lost that is reachable again has recovered (ready again,
  or draining if it was draining); a lost node whose host key changed stays lost and says so;
- a shard unit on a reachable node that the registry does not place there (a replica moved away while the node was
  lost or partitioned, one removed while it was unreachable) is stale: stopped and its unit file removed, before
  anything is launched;
- a replica with a shard on a node that is not live (lost, pending or gone: ``placement.broken_reason``) is failed
  and goes to the solver (repair in place, move, or fail), its surviving shards reaped;
- a replica recorded ``ready`` whose nodes were all reached but which runs fewer shards than its shard count is
  failed too ("adoption": a crash, a reboot, a controller that lost track) and relaunched whole on its
  placement, its surviving shards stopped first. It is never left ``ready`` with a shard missing -- the bug where
  a restarted control plane adopted half of a two-node replica whose missing half was rank 0;
- a replica recorded ``ready``, every shard running, whose leader failed ``/health`` in ``unhealthy_after``
  reconcile runs in a row (a hung leader: its unit active, its port open, no answer) is failed and relaunched whole
  on its placement. The count is kept in the replica's reasons and cleared by the first answer.

Replicas still being launched (``placing``, ``starting``) and ``failed`` ones are left to whoever launches them.
"""

from __future__ import annotations

import datetime
import re
from typing import Dict, List, Mapping, Optional, Sequence

from ansible_collections.llmgw.fleet.plugins.module_utils import placement
from ansible_collections.llmgw.fleet.plugins.module_utils.placement import LIVE_NODE_STATES
from ansible_collections.llmgw.fleet.plugins.module_utils.replica_plan import UNIT_PREFIX, unit_name

DEFAULT_LOST_AFTER = 60
DEFAULT_UNHEALTHY_AFTER = 3
UNHEALTHY_PREFIX = "leader failed /health in "
_UNHEALTHY_RE = re.compile(r"^%s(\d+) reconcile run" % re.escape(UNHEALTHY_PREFIX))
# Only units this collection names (replica_plan.unit_name), never another unit that shares the prefix.
_SHARD_UNIT_RE = re.compile(r"^%s-[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?-\d+\.service$" % UNIT_PREFIX)
# The reasons reconcile gives a node it declares lost; a node lost for any other reason (set by hand) is not
# brought back by a probe.
LOST_BY_RECONCILE = ("unseen for ", "never seen")


def parse_time(value: Optional[str]) -> Optional[datetime.datetime]:
    if not value:
        return None
    parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)


def node_verdicts(nodes: Sequence[Mapping], probes: Mapping[str, Mapping], now: datetime.datetime,
                  lost_after: float = DEFAULT_LOST_AFTER) -> Dict[str, dict]:
    """Per probed node: ``seen``, ``recovered`` (a node reconcile declared lost, reached again), ``lost`` (with the
    reason) or ``unseen`` (not reached, not yet lost; a lost node whose host key changed gets that reason)."""
    verdicts = {}
    for node in nodes:
        probe = probes.get(node["name"])
        # A node in maintenance was drained on purpose and may well be off: it is never declared lost.
        if probe is None or node["state"] == "maintenance":
            continue
        if probe.get("reachable"):
            verdicts[node["name"]] = {"verdict": "recovered" if lost_by_reconcile(node) else "seen"}
            continue
        # A node registered but never seen yet is given node_lost_after from its registration, not declared lost at
        # the first reconcile that cannot reach it.
        since = node.get("last_seen") or node.get("registered_at")
        last = parse_time(since)
        unseen_for = None if last is None else (now - last).total_seconds()
        if node["state"] == "lost":
            verdicts[node["name"]] = {"verdict": "unseen", "unseen_for": unseen_for}
            if host_key_changed(probe.get("error")):
                verdicts[node["name"]]["reason"] = HOST_KEY_CHANGED
        elif unseen_for is None or unseen_for > lost_after:
            seen = "last seen" if node.get("last_seen") else "never seen, registered"
            why = ("never seen" if unseen_for is None else
                   "unseen for %.0f s (more than %s s; %s %s)" % (unseen_for, lost_after, seen, since))
            error = probe.get("error")
            verdicts[node["name"]] = {"verdict": "lost", "reason": why + (": %s" % error if error else "")}
        else:
            verdicts[node["name"]] = {"verdict": "unseen", "unseen_for": unseen_for}
    return verdicts


HOST_KEY_CHANGED = ("its host key changed: another machine answers at its address (a rebuilt VM, or a substituted "
                    "one); it stays lost. If it was rebuilt on purpose, remove it and add it again (add_node)")


def host_key_changed(error: Optional[str]) -> bool:
    return bool(error) and ("Host key verification failed" in error or "IDENTIFICATION HAS CHANGED" in error)


WAS_DRAINING = "it was draining"


def lost_reasons(node: Mapping, reason: str) -> List[str]:
    """The reasons a node declared lost gets; a draining node keeps that said, so it comes back draining."""
    return [reason] + ([WAS_DRAINING] if node["state"] == "draining" else [])


def state_after_recovery(node: Mapping) -> str:
    return "draining" if WAS_DRAINING in (node.get("reasons") or []) else "ready"


def lost_by_reconcile(node: Mapping) -> bool:
    """A lost node whose loss reconcile recorded (so a probe that reaches it may bring it back)."""
    reasons = node.get("reasons") or []
    return node["state"] == "lost" and bool(reasons) and str(reasons[0]).startswith(LOST_BY_RECONCILE)


def unhealthy_runs(replica: Mapping) -> int:
    """How many reconcile runs in a row the replica's leader failed ``/health`` (0 when it answered last)."""
    for reason in replica.get("reasons") or []:
        match = _UNHEALTHY_RE.match(str(reason))
        if match:
            return int(match.group(1))
    return 0


def _other_reasons(replica: Mapping) -> List[str]:
    return [r for r in replica.get("reasons") or [] if not _UNHEALTHY_RE.match(str(r))]


def health_verdicts(replicas: Sequence[Mapping], health: Mapping[str, Mapping],
                    unhealthy_after: int = DEFAULT_UNHEALTHY_AFTER) -> Dict[str, dict]:
    """Per ready replica whose leader was asked this run (``health``: ``{replica: {ok, error}}``):
    ``{runs, reasons, relaunch}``. ``runs`` counts the failed runs in a row, this one included (0 after an
    answer); ``reasons`` is what to record while it stays ready (the count first, the replica's other reasons
    kept); ``relaunch`` is true once ``runs`` reaches ``unhealthy_after``. A replica whose count does not change
    is left out."""
    out = {}
    for replica in replicas:
        asked = health.get(replica["name"])
        if asked is None or replica.get("state") != "ready":
            continue
        before = unhealthy_runs(replica)
        if asked.get("ok"):
            if before:
                out[replica["name"]] = {"runs": 0, "reasons": _other_reasons(replica), "relaunch": False}
            continue
        runs = before + 1
        error = str(asked.get("error") or "no answer")[:200]
        reason = "%s%d reconcile run%s in a row (relaunched at %d): %s" % (
            UNHEALTHY_PREFIX, runs, "" if runs == 1 else "s", unhealthy_after, error)
        out[replica["name"]] = {"runs": runs, "reasons": [reason] + _other_reasons(replica),
                                "relaunch": runs >= unhealthy_after}
    return out


def replica_verdicts(replicas: Sequence[Mapping], node_states: Mapping[str, str],
                     probes: Mapping[str, Mapping], unhealthy: Sequence[str] = ()) -> List[dict]:
    """Replicas to fail: ``{name, kind: lost|short|unhealthy, reason, running, missing}``.

    ``node_states`` are the nodes' states after :func:`node_verdicts` was applied; ``unhealthy`` names the
    replicas :func:`health_verdicts` says to relaunch (failed only when nothing else is wrong with them).
    """
    reasons = {r["name"]: next((str(x) for x in r.get("reasons") or [] if _UNHEALTHY_RE.match(str(x))), "")
               for r in replicas}
    out = []
    for replica in replicas:
        shards = replica.get("shards") or []
        if not shards:
            continue
        # A shard on a node that is not live (placement.broken_reason, the one definition): lost, pending, gone.
        lost = sorted({s["node"] for s in shards if node_states.get(s["node"]) not in LIVE_NODE_STATES})
        if lost:
            states = sorted({node_states.get(n, "gone") for n in lost})
            reason = ("lost node%s %s" % ("s" if len(lost) > 1 else "", ", ".join(lost)) if states == ["lost"]
                      else placement.broken_reason(replica["shard_count"], [(s["rank"], s["node"]) for s in shards],
                                                   node_states, replica.get("state")))
            out.append({"name": replica["name"], "kind": "lost", "reason": reason})
            continue
        if replica.get("state") != "ready":
            continue
        if not all((probes.get(s["node"]) or {}).get("reachable") for s in shards):
            continue  # a node not reached yet not lost: nothing is known about its shard
        running, missing = [], []
        for shard in shards:
            unit = unit_name(replica["name"], shard["rank"])
            (running if unit in (probes[shard["node"]].get("active_units") or ()) else missing).append(shard)
        if len(running) < replica["shard_count"]:
            out.append({"name": replica["name"], "kind": "short",
                        "reason": "runs %d of its %d shards (%s not running)" % (
                            len(running), replica["shard_count"],
                            ", ".join("rank %d on %s" % (s["rank"], s["node"]) for s in missing)),
                        "running": [s["rank"] for s in running], "missing": [s["rank"] for s in missing]})
        elif replica["name"] in unhealthy:
            out.append({"name": replica["name"], "kind": "unhealthy", "reason": reasons[replica["name"]],
                        "running": [s["rank"] for s in running], "missing": []})
    return out


def stale_units(node: str, units: Sequence[str], replicas: Sequence[Mapping]) -> List[str]:
    """The shard units on ``node`` (running, or only a unit file) that no recorded shard places there, whatever
    the replica's state: a failed replica's recorded shards are left to whoever relaunches it."""
    wanted = {unit_name(r["name"], s["rank"]) for r in replicas for s in r.get("shards") or [] if s["node"] == node}
    return sorted({u for u in units if _SHARD_UNIT_RE.match(u)} - wanted)


def parse_active_units(text: str) -> List[str]:
    """The unit names in ``systemctl list-units --plain --no-legend`` (or ``list-unit-files --no-legend``) output."""
    units = []
    for line in (text or "").splitlines():
        fields = line.split()
        if fields and fields[0].endswith(".service"):
            units.append(fields[0])
    return units
