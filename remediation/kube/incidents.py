"""Incidents as GpuIncident custom resources: the shared ledger of cluster mode (docs/design/ha.md).

One object per incident (`incident-<id>`; `<instance>-incident-<id>` for a named instance), its spec
fixed at creation (what `kubectl get` prints: target, signature), its status rewritten by each
decision that touches it (the full ledger row, the newest entries, handled dedup keys, alert states)
through the status subresource with the resourceVersion last seen; decisions with no effects are
coalesced (status_interval_seconds). The status is bounded: annotations cut, the newest alert
states and firing fingerprints kept (the rest counted in status.omitted), and one refused for its
size is written bare; it goes only onto an object whose spec names the same incident. The operator
switches live in one GpuRemediationState, `controller` (`<instance>`).

Instances: two releases in one namespace keep apart by `--kube.instance` (the chart sets the release's
name). A named instance labels its objects `gpupulse.io/instance=<instance>` and lists only those; the
unnamed one (today's names) lists only objects with no such label. A named instance whose switches
object does not exist yet adopts the unlabelled objects once: it copies them under its own names
(the switches object last, as the mark that adoption finished; an adoption cut short is redone, each
copy an idempotent create-or-rewrite) and leaves the originals in place, unread.

Every status carries `writer` (holder, lease term). A 409 re-reads the object: written under a newer
term means we were deposed (Fenced); otherwise the write is retried on the new version. API server
errors are retried with backoff until the write deadline (the renew deadline), then ReplicationLost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupulse.clock import Clock, SystemClock
from remediation.errors import (
    Fenced,
    KubeConflict,
    KubeError,
    KubeInvalid,
    KubeNotFound,
    KubeTooManyRequests,
    KubeUnavailable,
    ReplicationLost,
)
from remediation.kube.client import JSON, KubeClient
from remediation.replication import IncidentSnapshot, Snapshot

log = logging.getLogger(__name__)

GROUP = "remediation.gpupulse.io"
VERSION = "v1"
INCIDENTS = "gpuincidents"
SWITCHES = "gpuremediationstates"
SWITCHES_NAME = "controller"  # the unnamed instance's; a named instance's is its name
INSTANCE_LABEL = "gpupulse.io/instance"
# the layout of spec and status; readers accept older and newer objects (see restore's column rule)
SCHEMA_VERSION = 1
LABELS = {"app.kubernetes.io/managed-by": "gpupulse-remediation"}
CLOSED_STATES = ("closed", "ignored")
# etcd refuses a request past 1.5 MiB (its default --max-request-bytes) and kube-apiserver answers 500,
# the same for every later write: a status is kept below this, leaving room for metadata and spec
MAX_STATUS_BYTES = 1_048_576
# an alert's annotations are cut before storage (Alertmanager passes them on unbounded; one alert's
# 1.7 MB of escaped text was refused by etcd on every write): each value, then the whole alert's
ANNOTATION_VALUE_MAX_BYTES = 1024
ANNOTATIONS_MAX_BYTES = 4096
CUT_KEY = "gpupulse.io/cut"  # set on annotations that were cut: how many bytes were left out
# alert states and firing fingerprints kept per incident, the newest; the rest are counted in
# status.omitted, so a status's size is bounded whatever the alert count (one storm wrote 1,500)
MAX_ALERTS_KEPT = 100


def incident_name(incident_id: int, instance: str = "") -> str:
    """The object name of an incident."""
    return f"{instance}-incident-{incident_id}" if instance else f"incident-{incident_id}"


def switches_name(instance: str = "") -> str:
    """The object name of an instance's switches (GpuRemediationState)."""
    return instance or SWITCHES_NAME


def instance_selector(instance: str = "") -> str:
    """The label selector of an instance's objects: its label, or for the unnamed one no label."""
    return f"{INSTANCE_LABEL}={instance}" if instance else f"!{INSTANCE_LABEL}"


def _target(row: Mapping[str, Any]) -> str:
    pod = "/".join(p for p in (row.get("target_namespace"), row.get("target_pod")) if p)
    where = pod if row.get("target_kind") == "pod" else row.get("target_uuid") or pod
    return f"{row.get('target_kind', '')}:{row.get('target_node', '')}" + (f"/{where}" if where else "")


@dataclass(frozen=True)
class IncidentStoreSettings:
    """Where the incidents live and how long a write may keep trying."""

    namespace: str
    identity: str
    term: int = 0  # the Lease's leaseTransitions when this replica became leader
    write_deadline_seconds: float = 10.0  # the renew deadline: past it the lease may be someone else's
    retry_initial_seconds: float = 0.05
    retry_max_seconds: float = 1.0
    max_status_bytes: int = MAX_STATUS_BYTES  # past it the oldest history goes (bounded_status)
    instance: str = ""  # the release this controller belongs to; "" = the unnamed one (module doc)
    # a decision with no effects is coalesced: at most one status write per incident per interval
    status_interval_seconds: float = 0.0


@dataclass
class StoreCounts:
    """API calls this store made (for the proofs' writes-per-incident figure)."""

    creates: int = 0
    status_writes: int = 0
    conflicts: int = 0
    retries: int = 0
    deletes: int = 0
    trimmed: int = 0  # status writes that left out old history to stay below max_status_bytes
    bare: int = 0  # statuses the server refused as too large, written again as row and counts only
    foreign: int = 0  # status writes refused: the object of that name is another incident's (spec)
    deferred: int = 0  # incident snapshots coalesced into a later write (status_interval_seconds)

    @property
    def writes(self) -> int:
        return self.creates + self.status_writes + self.deletes


class IncidentStore:
    """The LedgerMirror over the API server (remediation/replication.py)."""

    def __init__(
        self,
        client: KubeClient,
        settings: IncidentStoreSettings,
        may_act: Callable[[], bool],
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._s = settings
        self._may_act = may_act
        self._clock = clock or SystemClock()
        self._rv: dict[tuple[str, str], str] = {}
        # the spec of each object whose version we hold: a status goes only onto its own incident's
        self._specs: dict[tuple[str, str], JSON] = {}
        # objects seen without a status: a create whose first status write never landed (no decision)
        self._statusless: set[tuple[str, str]] = set()
        self.counts = StoreCounts()
        # the failure that ended this store's writes (the serving loop steps down on it)
        self.lost: ReplicationLost | None = None
        self.lost_event = asyncio.Event()
        self.adopted = 0  # unlabelled incidents copied into this instance by load()
        # coalescing: the newest unwritten snapshot per incident, when each was last written and in
        # which (state, rung, resolution): a change of those is a decision and goes out at once
        self._deferred: dict[int, IncidentSnapshot] = {}
        self._written_at: dict[int, float] = {}
        self._written_as: dict[int, tuple[Any, ...]] = {}

    def may_act(self) -> bool:
        """The fencing rule: effects and writes only while the lease is renewed within its deadline."""
        return self._may_act()

    # -- reading back -----------------------------------------------------------------------------

    async def load(self) -> Snapshot:
        """Every incident and the switches of this instance, as the cluster holds them (a new leader's
        starting point); a named instance without a switches object adopts the unlabelled ones first.

        A 429 or 5xx is retried for as long as this replica leads (a server still initializing the
        CRD's storage answers 429 "storage is (re)initializing"; a throttled or restarting API server
        must not take the leader down): backoff doubling to retry_max_seconds with jitter, the
        server's Retry-After as a floor. Fenced once the lease is lost."""
        delay = self._s.retry_initial_seconds
        while True:
            if not self._may_act():
                raise Fenced(f"{self._s.identity}: lease not renewed in time; not loading incidents")
            try:
                return await self._load_once()
            except (KubeUnavailable, KubeTooManyRequests) as exc:
                floor = exc.retry_after_seconds if isinstance(exc, KubeTooManyRequests) else 0.0
                wait = max(floor, delay * random.uniform(0.5, 1.0))
                log.warning("loading incidents: %s; retrying in %.2f s", exc, wait)
                self.counts.retries += 1
                await self._clock.sleep(wait)
                delay = min(delay * 2, self._s.retry_max_seconds)

    async def _load_once(self) -> Snapshot:
        instance = self._s.instance
        if instance:
            try:
                await self._client.get_custom_object(
                    GROUP, VERSION, self._s.namespace, SWITCHES, switches_name(instance)
                )
            except KubeNotFound:
                await self._adopt_unlabelled()
        return await self._read(instance)

    async def _adopt_unlabelled(self) -> None:
        legacy = await self._read("")
        # the switches go last: their object is the mark that adoption is done
        await self.write(Snapshot(legacy.incidents, None))
        await self.write(Snapshot((), legacy.switches))
        self.adopted = len(legacy.incidents)
        log.info(
            "instance %s adopted %d unlabelled GpuIncident object(s) and the switches of %s",
            self._s.instance,
            self.adopted,
            SWITCHES_NAME,
        )

    async def _read(self, instance: str) -> Snapshot:
        """The objects of `instance` (this store's, or the unnamed one's when adopting)."""
        own = instance == self._s.instance
        objs = await self._client.list_custom_objects(
            GROUP, VERSION, self._s.namespace, INCIDENTS, label_selector=instance_selector(instance)
        )
        incidents: list[IncidentSnapshot] = []
        for obj in objs:
            name = str(obj["metadata"]["name"])
            if own:
                self._rv[(INCIDENTS, name)] = str(obj["metadata"]["resourceVersion"])
                self._specs[(INCIDENTS, name)] = dict(obj.get("spec") or {})
            snap = _snapshot_of(obj)
            if snap is None and own:
                self._statusless.add((INCIDENTS, name))
            if snap is None:  # created, but its first status write never landed: no decision behind it
                log.info("incident object %s has no status yet; skipped", name)
                continue
            incidents.append(snap)
        state: dict[str, Any] = {}
        try:
            name = switches_name(instance)
            obj = await self._client.get_custom_object(GROUP, VERSION, self._s.namespace, SWITCHES, name)
            # read by name, so check the label as the lists do: an object of that name may be another's
            if ((obj.get("metadata") or {}).get("labels") or {}).get(INSTANCE_LABEL, "") == instance:
                if own:
                    self._rv[(SWITCHES, name)] = str(obj["metadata"]["resourceVersion"])
                state = dict((obj.get("status") or {}).get("switches") or {})
        except KubeNotFound:
            pass
        return Snapshot(tuple(sorted(incidents, key=lambda i: i.id)), state)

    # -- writing through --------------------------------------------------------------------------

    async def write(self, snapshot: Snapshot, defer: bool = False) -> None:
        """Write each changed incident, then the switches; Fenced / ReplicationLost when it cannot.

        `defer` (a decision with no effects): an incident written less than status_interval_seconds
        ago in the same state, rung and resolution is kept for flush(); a decision with effects
        writes everything through at once, the deferred snapshots of its incidents included."""
        if self.lost is not None:
            raise self.lost
        now = self._clock.monotonic()
        due: list[IncidentSnapshot] = []
        for inc in snapshot.incidents:
            last = self._written_at.get(inc.id)
            if (
                defer
                and last is not None
                and now - last < self._s.status_interval_seconds
                and self._written_as.get(inc.id) == _decision_of(inc)
            ):
                self._deferred[inc.id] = inc
                self.counts.deferred += 1
            else:
                self._deferred.pop(inc.id, None)
                due.append(inc)
        if not defer:
            due.extend(self._deferred.values())
            self._deferred.clear()
        if due or snapshot.switches is not None:
            await self._write_through(Snapshot(tuple(due), snapshot.switches))

    async def flush(self, now: float | None = None) -> None:
        """Write the deferred snapshots whose interval is over (all of them when `now` is None)."""
        if self.lost is not None or not self._deferred:
            return
        due = [
            inc
            for inc in self._deferred.values()
            if now is None or now - self._written_at.get(inc.id, 0.0) >= self._s.status_interval_seconds
        ]
        for inc in due:
            del self._deferred[inc.id]
        if due:
            await self._write_through(Snapshot(tuple(due), None))

    async def run_flusher(self) -> None:
        """Flush deferred snapshots as their interval ends, until cancelled or the store is lost."""
        period = max(self._s.status_interval_seconds / 4, 0.05)
        while self.lost is None:
            await self._clock.sleep(period)
            with contextlib.suppress(ReplicationLost):  # recorded in self.lost; the loop steps down
                await self.flush(self._clock.monotonic())

    async def _write_through(self, snapshot: Snapshot) -> None:
        try:
            await self._write_all(snapshot)
        except ReplicationLost as exc:
            self.lost = exc
            self.lost_event.set()
            raise
        now = self._clock.monotonic()
        for inc in snapshot.incidents:
            self._written_at[inc.id] = now
            self._written_as[inc.id] = _decision_of(inc)

    async def _write_all(self, snapshot: Snapshot) -> None:
        for inc in snapshot.incidents:
            row = inc.row
            spec = {
                "schemaVersion": SCHEMA_VERSION,
                "id": inc.id,
                "key": row.get("key", ""),
                "signature": row.get("signature", ""),
                "alertname": row.get("alertname", ""),
                "target": _target(row),
            }
            status = {
                "state": row.get("state", ""),
                "rung": row.get("rung", ""),
                "resolution": row.get("resolution", ""),
                "row": dict(row),
                "entries": [dict(e) for e in inc.entries],
                "handled": [dict(h) for h in inc.handled],
                "alerts": [dict(a) for a in inc.alerts],
                "diagnoses": [dict(d) for d in inc.diagnoses],
            }
            status, omitted = capped_alerts(status)
            status["row"], cut = cut_annotations(status["row"])
            if cut:
                omitted["annotationBytes"] = cut
            if omitted:
                status["omitted"] = omitted
            status, dropped = bounded_status(status, self._s.max_status_bytes)
            if dropped:
                self.counts.trimmed += 1
                log.warning(
                    "incident %d: its status is over %d bytes; left out the oldest %s",
                    inc.id,
                    self._s.max_status_bytes,
                    ", ".join(f"{n} {what}" for what, n in dropped.items()),
                )
            await self._write(INCIDENTS, "GpuIncident", incident_name(inc.id, self._s.instance), spec, status)
        if snapshot.switches is not None:
            await self._write(
                SWITCHES,
                "GpuRemediationState",
                switches_name(self._s.instance),
                {"schemaVersion": SCHEMA_VERSION},
                {"switches": {k: dict(v) for k, v in snapshot.switches.items()}},
            )

    async def _write(self, plural: str, kind: str, name: str, spec: JSON, status: JSON) -> None:
        deadline = self._clock.monotonic() + self._s.write_deadline_seconds
        delay = self._s.retry_initial_seconds
        writer = {"holder": self._s.identity, "term": self._s.term}
        while True:
            if not self._may_act():
                raise Fenced(f"{self._s.identity}: lease not renewed in time; not writing {name}")
            try:
                rv = self._rv.get((plural, name)) or await self._create(plural, kind, name, spec)
                held = self._specs.get((plural, name))
                if plural == INCIDENTS and held is not None and not same_incident(held, spec):
                    if (plural, name) in self._statusless:
                        # a failed create's leftover whose id our ledger reused: no decision behind
                        # it, so it is replaced by this incident's own object
                        log.warning("%s/%s: replacing a status-less object of spec %s", plural, name, held)
                        with contextlib.suppress(KubeNotFound):
                            await self._client.delete_custom_object(
                                GROUP, VERSION, self._s.namespace, plural, name
                            )
                        self.counts.deletes += 1
                        self._forget(plural, name)
                        continue
                    # another incident's decisions (or a person's object): never write onto it; the
                    # incident goes unreplicated until the name is freed
                    self.counts.foreign += 1
                    log.error(
                        "%s/%s is another incident's (spec %s, ours %s); not writing its status",
                        plural,
                        name,
                        {k: held.get(k) for k in IDENTITY},
                        {k: spec.get(k) for k in IDENTITY},
                    )
                    return
                body = {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": kind,
                    "metadata": {"name": name, "namespace": self._s.namespace, "resourceVersion": rv},
                    "status": {**status, "writer": writer},
                }
                out = await self._client.replace_custom_object_status(
                    GROUP, VERSION, self._s.namespace, plural, name, body
                )
                self.counts.status_writes += 1
                self._rv[(plural, name)] = str(out["metadata"]["resourceVersion"])
                self._statusless.discard((plural, name))
                return
            except KubeConflict:
                self.counts.conflicts += 1
                await self._adopt(plural, name)
                continue  # a fresh version to write on: no wait
            except KubeNotFound:  # deleted behind our back (a person, a prune): create it again
                self._rv.pop((plural, name), None)
                self._specs.pop((plural, name), None)
                wait = delay
            except (KubeUnavailable, KubeTooManyRequests) as exc:
                # the server's Retry-After is a floor (APF's 429 says it only in the header): re-sending
                # sooner only spends the seats it is rationing
                wait = max(exc.retry_after_seconds, delay * random.uniform(0.5, 1.0))
                log.warning("writing %s/%s: %s; retrying in %.2f s", plural, name, exc, wait)
            except KubeInvalid as exc:
                if not _too_large(exc) or "row" not in status or status.get("omitted", {}).get("bare"):
                    raise ReplicationLost(f"cannot write {plural}/{name}: {exc}") from exc
                # refused for its size whatever the retry: store the row and counts, never step
                # down (the inbox would replay the same alert into the same refusal: a crash loop)
                status = bare_status(status)
                self.counts.bare += 1
                log.error("writing %s/%s: %s; wrote the row and counts only (no history)", plural, name, exc)
                continue
            except KubeError as exc:
                raise ReplicationLost(f"cannot write {plural}/{name}: {exc}") from exc
            self.counts.retries += 1
            if self._clock.monotonic() + wait > deadline:
                raise ReplicationLost(
                    f"cannot write {plural}/{name} within {self._s.write_deadline_seconds} s"
                )
            await self._clock.sleep(wait)
            delay = min(delay * 2, self._s.retry_max_seconds)

    async def _create(self, plural: str, kind: str, name: str, spec: JSON) -> str:
        labels = dict(LABELS)
        if self._s.instance:
            labels[INSTANCE_LABEL] = self._s.instance
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": kind,
            "metadata": {"name": name, "namespace": self._s.namespace, "labels": labels},
            "spec": spec,
        }
        try:
            out = await self._client.create_custom_object(GROUP, VERSION, self._s.namespace, plural, body)
        except KubeConflict:  # AlreadyExists: our own create whose answer was lost, or another writer's
            return await self._adopt(plural, name)
        self.counts.creates += 1
        rv = str(out["metadata"]["resourceVersion"])
        self._rv[(plural, name)] = rv
        self._specs[(plural, name)] = dict(spec)
        self._statusless.add((plural, name))
        return rv

    async def _adopt(self, plural: str, name: str) -> str:
        """Take the current version of an object we conflicted on, unless a newer term wrote it."""
        current = await self._client.get_custom_object(GROUP, VERSION, self._s.namespace, plural, name)
        writer = (current.get("status") or {}).get("writer") or {}
        term = int(writer.get("term", -1))
        if term > self._s.term:
            raise Fenced(
                f"{self._s.identity} (term {self._s.term}): {plural}/{name} was written by "
                f"{writer.get('holder')} in term {term}; stepping down"
            )
        rv = str(current["metadata"]["resourceVersion"])
        self._rv[(plural, name)] = rv
        self._specs[(plural, name)] = dict(current.get("spec") or {})
        if not current.get("status"):
            self._statusless.add((plural, name))
        return rv

    def _forget(self, plural: str, name: str) -> None:
        self._rv.pop((plural, name), None)
        self._specs.pop((plural, name), None)
        self._statusless.discard((plural, name))

    # -- pruning ----------------------------------------------------------------------------------

    async def prune(self, now: float, retention_seconds: float, keep: int) -> int:
        """Delete closed incidents closed longer ago than retention_seconds or beyond the newest
        `keep` closed ones; open incidents are never pruned. Returns how many were deleted."""
        objs = await self._client.list_custom_objects(
            GROUP, VERSION, self._s.namespace, INCIDENTS, label_selector=instance_selector(self._s.instance)
        )
        closed: list[tuple[int, float, str]] = []
        for obj in objs:
            row = ((obj.get("status") or {}).get("row")) or {}
            if row.get("state") in CLOSED_STATES:
                closed_at = float(row.get("closed_at") or row.get("updated_at") or 0.0)
                closed.append((int(row.get("id", 0)), closed_at, str(obj["metadata"]["name"])))
        closed.sort(reverse=True)  # newest id first
        doomed = [name for i, (_, at, name) in enumerate(closed) if i >= keep or at < now - retention_seconds]
        deleted = 0
        for name in doomed:
            if not self._may_act():
                break
            try:
                await self._client.delete_custom_object(GROUP, VERSION, self._s.namespace, INCIDENTS, name)
            except KubeNotFound:
                pass
            self.counts.deletes += 1
            self._rv.pop((INCIDENTS, name), None)
            self._specs.pop((INCIDENTS, name), None)
            deleted += 1
        return deleted


def _cut(text: str, max_bytes: int) -> str:
    raw = text.encode()
    return text if len(raw) <= max_bytes else raw[:max_bytes].decode(errors="ignore")


def cut_annotations(row: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """`row` with its annotations (a JSON object, as the ledger keeps it in text) cut: each value to
    ANNOTATION_VALUE_MAX_BYTES, then whole values left out (last keys first) until the alert's fit in
    ANNOTATIONS_MAX_BYTES; cut ones carry CUT_KEY. Returns the row and how many bytes were left out."""
    out = dict(row)
    raw = out.get("annotations")
    if raw is None:
        return out, 0
    text = raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"))
    if len(text.encode()) <= ANNOTATIONS_MAX_BYTES:
        return out, 0
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    values = parsed if isinstance(parsed, dict) else {"text": text}
    kept: dict[str, str] = {}
    total = 0
    for key, value in values.items():
        value = _cut(value if isinstance(value, str) else json.dumps(value), ANNOTATION_VALUE_MAX_BYTES)
        size = _json_bytes({str(key): value})
        if total + size > ANNOTATIONS_MAX_BYTES - 64:  # room for CUT_KEY
            continue
        kept[str(key)] = value
        total += size
    cut = len(text.encode()) - _json_bytes(kept)
    kept[CUT_KEY] = f"{cut} bytes"
    out["annotations"] = kept if isinstance(raw, dict) else json.dumps(kept, separators=(",", ":"))
    return out, cut


IDENTITY = ("id", "key", "target")  # the spec fields that name an incident's object as its own


def same_incident(spec: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """Whether an object's spec names the incident `ours` describes."""
    return all(spec.get(k) == ours.get(k) for k in IDENTITY)


def capped_alerts(status: JSON, keep: int = MAX_ALERTS_KEPT) -> tuple[JSON, dict[str, int]]:
    """`status` with its newest `keep` alert states (by `at`) and `keep` firing fingerprints of its
    row (those of the kept alerts first): a new leader restoring it waits on those only. Returns the
    status and how many of each were left out."""
    out = dict(status)
    omitted: dict[str, int] = {}
    alerts = sorted(out.get("alerts") or [], key=lambda a: float(a.get("at") or 0.0), reverse=True)
    if len(alerts) > keep:
        omitted["alerts"] = len(alerts) - keep
        out["alerts"] = alerts[:keep]
    row = dict(out.get("row") or {})
    raw = row.get("firing_fps")
    fps = json.loads(raw) if isinstance(raw, str) else list(raw or [])
    if len(fps) > keep:
        newest = {str(a.get("fingerprint")): i for i, a in enumerate(alerts)}
        fps.sort(key=lambda fp: newest.get(fp, len(newest)))
        omitted["firingFingerprints"] = len(fps) - keep
        kept = sorted(fps[:keep])
        row["firing_fps"] = json.dumps(kept) if isinstance(raw, str) else kept
        out["row"] = row
    return out, omitted


def _too_large(exc: KubeInvalid) -> bool:
    """The server refused the body for its size (413, etcd's 500, a 422 'Too long'), not its content."""
    message = exc.message.lower()
    return exc.status == 413 or "too large" in message or "too long" in message


def bare_status(status: JSON) -> JSON:
    """The status without history: state, row and how many of each list were left out (the write of
    last resort when the server refuses the status for its size)."""
    omitted = dict(status.get("omitted") or {})
    for name in ("entries", "handled", "alerts", "diagnoses"):
        omitted[name] = omitted.get(name, 0) + len(status.get(name) or [])
    omitted["bare"] = True
    keep = ("state", "rung", "resolution", "row")
    return {**{k: status[k] for k in keep if k in status}, "omitted": omitted}


def _decision_of(inc: IncidentSnapshot) -> tuple[Any, ...]:
    """What makes a write a decision rather than an alert-state update (write-through, not coalesced)."""
    row = inc.row
    return (row.get("state"), row.get("rung"), row.get("attempt"), row.get("resolution"), row.get("paged"))


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str).encode())


def bounded_status(status: JSON, max_bytes: int) -> tuple[JSON, dict[str, int]]:
    """`status` with its oldest history left out until it encodes to at most `max_bytes`: ledger
    entries first (oldest first), then diagnoses but the newest, then the oldest handled keys. The row
    and the alert states always stay (a status still too large is refused as before). Returns the
    status and how many of each were left out."""
    size = _json_bytes(status)
    if size <= max_bytes:
        return status, {}
    out = dict(status)
    dropped: dict[str, int] = {}
    # (field, index of the item to drop next: entries and diagnoses are oldest first, handled newest
    # first, as replication.collect reads them; how many must stay)
    for name, at, keep in (("entries", 0, 0), ("diagnoses", 0, 1), ("handled", -1, 0)):
        items = list(out.get(name) or [])
        while size > max_bytes and len(items) > keep:
            size -= _json_bytes(items.pop(at)) + (1 if items else 0)  # the item and its comma
            dropped[name] = dropped.get(name, 0) + 1
        out[name] = items
        if size <= max_bytes:
            break
    return out, dropped


def _snapshot_of(obj: JSON) -> IncidentSnapshot | None:
    status = obj.get("status") or {}
    row = status.get("row")
    if not isinstance(row, dict) or "id" not in row:
        return None
    return IncidentSnapshot(
        id=int(row["id"]),
        row=row,
        entries=list(status.get("entries") or []),
        handled=list(status.get("handled") or []),
        alerts=list(status.get("alerts") or []),
        diagnoses=list(status.get("diagnoses") or []),
    )
