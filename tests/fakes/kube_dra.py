"""The DRA objects of the fake API server beyond ResourceSlices: ResourceClaims (list in all
namespaces) and DeviceTaintRules (cluster-scoped create, get, merge patch, delete), resource.k8s.io/v1.

A DeviceTaintRule is checked the way kube-apiserver 1.37 validates it (tests/kube/test_real_device_taint.py
holds the same bodies against the real server): a DNS-subdomain name, a taint with a qualified-name
key, a label-value value and an effect of None, NoSchedule or NoExecute; `timeAdded` is set on create
and whenever the effect changes; `generation` counts spec changes. Errors are the server's own
error type, which it turns into Status bodies.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

JSON = dict[str, Any]
API_VERSION = "resource.k8s.io/v1"
EFFECTS = ("None", "NoSchedule", "NoExecute")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    ok_prefix = not prefix or (len(prefix) <= 253 and _SUBDOMAIN.match(prefix) is not None)
    return ok_prefix and 0 < len(name) <= 63 and _NAME_PART.match(name) is not None


def invalid_rule_fields(rule: JSON) -> list[str]:
    """What kube-apiserver would refuse in this DeviceTaintRule ([] when it is valid)."""
    problems = []
    name = str((rule.get("metadata") or {}).get("name") or "")
    if not name or len(name) > 253 or not _SUBDOMAIN.match(name):
        problems.append(f"metadata.name: Invalid value: {name!r}")
    taint = (rule.get("spec") or {}).get("taint") or {}
    if not _qualified_name(str(taint.get("key") or "")):
        problems.append(f"spec.taint.key: Invalid value: {taint.get('key')!r}")
    value = str(taint.get("value") or "")
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        problems.append(f"spec.taint.value: Invalid value: {value!r}")
    if taint.get("effect") not in EFFECTS:
        problems.append(f"spec.taint.effect: Unsupported value: {taint.get('effect')!r}")
    return problems


@dataclass
class DraObjects:
    """ResourceClaims and DeviceTaintRules; `meta`, `next_rv` and `error` (its Status error type) come
    from the server holding them."""

    meta: Callable[..., JSON]
    next_rv: Callable[[], str]
    error: Callable[..., Exception]
    claims: dict[tuple[str, str], JSON] = field(default_factory=dict)
    rules: dict[str, JSON] = field(default_factory=dict)

    def add_claim(
        self,
        namespace: str,
        name: str,
        device: tuple[str, str, str],
        pod: JSON | None = None,
        tolerations: list[JSON] | None = None,
    ) -> JSON:
        """An allocated claim of `device` (driver, pool, name), reserved for `pod` when given."""
        driver, pool, dev = device
        result: JSON = {"request": "gpu", "driver": driver, "pool": pool, "device": dev}
        if tolerations:
            result["tolerations"] = copy.deepcopy(tolerations)
        reserved = []
        if pod is not None:
            meta = pod["metadata"]
            reserved.append({"resource": "pods", "name": meta["name"], "uid": meta["uid"]})
        claim = {
            "apiVersion": API_VERSION,
            "kind": "ResourceClaim",
            "metadata": self.meta(name, namespace),
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {"allocation": {"devices": {"results": [result]}}, "reservedFor": reserved},
        }
        self.claims[(namespace, name)] = claim
        return claim

    def list_claims(self) -> list[JSON]:
        return [copy.deepcopy(c) for _, c in sorted(self.claims.items())]

    def create_rule(self, body: JSON) -> JSON:
        """POST devicetaintrules: 422 when invalid, 409 when the name is taken."""
        if body.get("apiVersion") != API_VERSION or body.get("kind") != "DeviceTaintRule":
            raise self.error(400, "BadRequest", f"the body is not a {API_VERSION} DeviceTaintRule")
        problems = invalid_rule_fields(body)
        name = str((body.get("metadata") or {}).get("name") or "")
        if problems:
            raise self.error(
                422, "Invalid", f'DeviceTaintRule.resource.k8s.io "{name}" is invalid: {problems}'
            )
        if name in self.rules:
            raise self.error(
                409,
                "AlreadyExists",
                f'devicetaintrules.resource.k8s.io "{name}" already exists',
                {"name": name},
            )
        rule = copy.deepcopy(body)
        rule["metadata"] = {**(body.get("metadata") or {}), **self.meta(name, None), "generation": 1}
        rule["spec"]["taint"].setdefault("timeAdded", _now())
        rule.pop("status", None)
        self.rules[name] = rule
        return copy.deepcopy(rule)

    def rule(self, name: str) -> JSON:
        if name not in self.rules:
            raise self.error(
                404, "NotFound", f'devicetaintrules.resource.k8s.io "{name}" not found', {"name": name}
            )
        return self.rules[name]

    def patch_rule(self, name: str, patch: JSON, merge: Callable[[Any, Any], Any]) -> JSON:
        """A merge patch (conditional on metadata.resourceVersion when it carries one)."""
        current = self.rule(name)
        patch = copy.deepcopy(patch)
        wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise self.error(409, "Conflict", f'Operation cannot be fulfilled on devicetaintrules "{name}"')
        new = merge(copy.deepcopy(current), patch)
        problems = invalid_rule_fields(new)
        if problems:
            raise self.error(
                422, "Invalid", f'DeviceTaintRule.resource.k8s.io "{name}" is invalid: {problems}'
            )
        if new.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        if new["spec"]["taint"].get("effect") != current["spec"]["taint"].get("effect"):
            new["spec"]["taint"]["timeAdded"] = _now()
        new["metadata"]["resourceVersion"] = self.next_rv()
        self.rules[name] = new
        return copy.deepcopy(new)

    def delete_rule(self, name: str, options: JSON | None) -> JSON:
        current = self.rule(name)
        uid = ((options or {}).get("preconditions") or {}).get("uid")
        if uid and uid != current["metadata"]["uid"]:
            raise self.error(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
        return self.rules.pop(name)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
