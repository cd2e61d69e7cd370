"""The --kube.* flags: where the exporter reaches the API server and which node it is, for every
plug-in at once; and the plug-ins' old per-plug-in flags, kept as deprecated aliases for one release.

Until now every plug-in that watched this node's pods had its own flags (--attribution.kube-api-url,
--engines.node-name, --progress.kube-token-file, ...) and its own watch. One pod store now serves
them all (exporter/kube/pods.py), so one set of flags says where it watches. An old flag still works:
its value is taken for the --kube.* one (which wins when both are given), a warning names the new
flag (once: the CLI asks for warnings at start only), and two old flags that disagree are refused
(one store cannot watch two API servers). An old node-name flag set to "" keeps meaning what it
meant: that plug-in's part is off (`turned_off`).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the API client is imported when settings are made, not by --help
    from exporter.kube.client import ApiSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alias:
    """A deprecated per-plug-in flag and the --kube.* flag that replaces it."""

    flag: str
    replacement: str

    @property
    def dest(self) -> str:
        return _dest(self.flag)

    @property
    def plugin(self) -> str:
        return self.flag.removeprefix("--").split(".", 1)[0]


API_URL, TOKEN_FILE = "--kube.api-url", "--kube.token-file"
CA_FILE, NODE_NAME = "--kube.ca-file", "--kube.node-name"
# Every old flag, once: the plug-ins register theirs (`add_aliases`), so a switched-off plug-in's flags
# stay unknown, as they were.
ALIASES: tuple[Alias, ...] = (
    Alias("--attribution.kube-api-url", API_URL),
    Alias("--attribution.kube-token-file", TOKEN_FILE),
    Alias("--attribution.node-name", NODE_NAME),
    Alias("--attribution.dra-node-name", NODE_NAME),
    Alias("--engines.kube-api-url", API_URL),
    Alias("--engines.node-name", NODE_NAME),
    Alias("--progress.kube-api-url", API_URL),
    Alias("--progress.kube-token-file", TOKEN_FILE),
    Alias("--progress.node-name", NODE_NAME),
)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace(".", "_").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the --kube.* flags (the exporter's core does, whichever plug-ins are on)."""
    g = parser.add_argument_group("Kubernetes API (one pod watch of this node, shared by every plug-in)")
    # defaults are None so that an old alias can tell it was not overridden; `api_settings` fills them
    g.add_argument(
        API_URL,
        dest=_dest(API_URL),
        default=None,
        help="API server base URL (default: the in-cluster service, from $KUBERNETES_SERVICE_HOST/PORT)",
    )
    g.add_argument(
        TOKEN_FILE,
        dest=_dest(TOKEN_FILE),
        default=None,
        help="bearer token file, re-read before every request (default: the service account's, "
        "/var/run/secrets/kubernetes.io/serviceaccount/token)",
    )
    g.add_argument(
        CA_FILE,
        dest=_dest(CA_FILE),
        default=None,
        help="CA bundle for an https API server; empty trusts the system's store (default: the "
        "service account's, /var/run/secrets/kubernetes.io/serviceaccount/ca.crt)",
    )
    g.add_argument(
        NODE_NAME,
        dest=_dest(NODE_NAME),
        default=None,
        help="this node's name: its pods are watched with fieldSelector=spec.nodeName=<it>; empty "
        "turns every pod and ResourceSlice watch off (default: $NODE_NAME)",
    )


def add_aliases(parser: argparse.ArgumentParser, plugin: str) -> None:
    """Register a plug-in's deprecated flags (hidden from --help; they print a warning when used)."""
    for alias in ALIASES:
        if alias.plugin == plugin:
            parser.add_argument(alias.flag, dest=alias.dest, default=None, help=argparse.SUPPRESS)


def _given(args: argparse.Namespace, alias: Alias) -> str | None:
    value = getattr(args, alias.dest, None)
    return value if isinstance(value, str) else None


def turned_off(args: argparse.Namespace, flag: str) -> bool:
    """A deprecated node-name flag given as "": the part it named is off (as it was before --kube.*)."""
    alias = next(a for a in ALIASES if a.flag == flag)
    return _given(args, alias) == ""


def _resolve(args: argparse.Namespace, new_flag: str, warn: bool) -> str | None:
    """The --kube.* value, else the one the deprecated aliases agree on; ValueError when they differ."""
    new = getattr(args, _dest(new_flag), None)
    old: dict[str, str] = {}
    for alias in ALIASES:
        value = _given(args, alias)
        if alias.replacement != new_flag or value is None:
            continue
        if warn:
            log.warning("%s is deprecated and goes in the next release: use %s", alias.flag, new_flag)
        if value == "" and new_flag == NODE_NAME:
            continue  # "off for this plug-in" (turned_off), not a node name
        old[alias.flag] = value
    if isinstance(new, str):
        return new
    if len(set(old.values())) > 1:
        given = ", ".join(f"{flag}={value}" for flag, value in sorted(old.items()))
        raise ValueError(f"{given}: one pod watch serves every plug-in now, set {new_flag} once")
    return next(iter(old.values()), None)


def api_settings(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None, *, warn: bool = False
) -> ApiSettings | None:
    """Where this node's objects are watched; None when no node name is known (every watch is off).
    With `warn`, each deprecated flag given is logged once. Raises ValueError when they disagree."""
    env = os.environ if environ is None else environ
    url, token, ca, node = (_resolve(args, f, warn) for f in (API_URL, TOKEN_FILE, CA_FILE, NODE_NAME))
    node = env.get("NODE_NAME", "") if node is None else node
    if not node:
        return None
    from exporter.kube.client import ApiSettings, in_cluster_api_url

    given: dict[str, Any] = {}  # what is not given keeps ApiSettings' default (the service account's)
    if token:
        given["token_path"] = Path(token)
    if ca is not None:
        given["ca_path"] = Path(ca) if ca else None
    return ApiSettings(node_name=node, api_url=url or in_cluster_api_url(env), **given)
