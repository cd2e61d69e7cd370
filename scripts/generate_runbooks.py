"""The parts of docs/runbooks/*.md that follow from the contract: dashboards, escalation, what gpupulse did
and the manual path when it is in dry run. Each runbook is written by hand around two marked blocks.

What a block holds comes from one alert's rule labels (severity, layer, target_kind), the ladder of
the signature its labels reach in the shipped signature library, the dashboards' uids and variables,
and the commands the Kubernetes backend runs (remediation/backends/kubernetes.py, remediation/kube/):
the manual path is what the controller would have done, spelled as kubectl commands.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

import yaml

from dashboards.boards.filters import UIDS
from gpupulse.xid import XID_CLASSES
from remediation.signatures import Signature, SignatureLibrary

RUNBOOKS = PurePosixPath("docs/runbooks")
BLOCKS = ("links", "actions", "node")
_END = "<!-- END generated -->"


def begin_marker(block: str) -> str:
    """The line that opens a generated block of a runbook."""
    return f"<!-- BEGIN generated {block} by scripts/generate (scripts/generate_runbooks.py): edit that -->"


class RunbookError(Exception):
    """A runbook lacks a generated block's markers, or an alert has no runbook."""


@dataclass(frozen=True)
class AlertFacts:
    """What a runbook's generated parts are built from."""

    name: str
    severity: str
    layer: str
    fault_class: str
    target_kind: str
    signature: Signature


# Which boards an on-call opens first, by layer; an alert's own entry wins.
_BOARDS_BY_LAYER: Mapping[str, tuple[str, ...]] = {
    "hardware": ("node",),
    "scheduling": ("fleet", "node"),
    "serving": ("serving", "node"),
    "training": ("node",),
    "observability": ("fleet",),
}
_BOARDS_BY_ALERT: Mapping[str, tuple[str, ...]] = {
    "GPUCollectorFailing": ("node", "fleet"),
    "GPUExporterStale": ("node", "fleet"),
    "GPUProcessMemoryAboveHardLimit": ("node", "serving"),
    "GPUProcessMemoryAboveSoftLimit": ("node",),
    "GPUMemoryNearFull": ("node",),
    "ModelWeightsEvictedFromPageCache": ("node", "serving"),
}
# The placeholder each board variable is filled with (the names the runbooks' queries use).
_PLACEHOLDER = {"node": "<node>", "namespace": "<namespace>", "pod": "<pod>"}
# Which variables identify the alert's target, by target_kind.
_TARGET_VARS: Mapping[str, tuple[str, ...]] = {
    "gpu": ("node",),
    "node": ("node",),
    "exporter": ("node",),
    "pod": ("node", "namespace", "pod"),
    "job": ("node", "namespace"),
    "controller": (),
}

_CONTROLLER = (
    "kubectl get pods -n <release-namespace> -l app.kubernetes.io/component=controller -o name   "
    "# <controller-pod>"
)
_EXEC = "kubectl exec -n <release-namespace> <controller-pod> -- gpupulse-remediation"
_DRIVER_POD = (
    "kubectl get pods -n gpu-operator -l app=nvidia-driver-daemonset "
    "--field-selector spec.nodeName=<node> -o name   # <driver-pod>"
)


def _sh(*lines: str) -> str:
    return "```sh\n" + "\n".join(lines) + "\n```"


def facts(rules: Mapping[str, str], library: SignatureLibrary) -> list[AlertFacts]:
    """Every alert of the rendered rule files with the signature its static labels reach."""
    out = []
    for text in rules.values():
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                labels = {"alertname": rule["alert"], **{k: str(v) for k, v in rule["labels"].items()}}
                for cls in XID_CLASSES:  # the xid label comes from the series; any code of its class
                    if cls.alertname == rule["alert"]:
                        labels["xid"] = str(cls.codes[0])
                out.append(
                    AlertFacts(
                        name=rule["alert"],
                        severity=labels["severity"],
                        layer=labels["layer"],
                        fault_class=labels["fault_class"],
                        target_kind=labels["target_kind"],
                        signature=library.match(labels, {}),
                    )
                )
    return sorted(out, key=lambda a: a.name)


def _board_variables(dashboards: Mapping[str, str]) -> dict[str, tuple[str, set[str]]]:
    """Board key -> (title, names of its template variables)."""
    out = {}
    for key, uid in UIDS.items():
        board = json.loads(dashboards[f"{uid}.json"])
        out[key] = (str(board["title"]), {str(v["name"]) for v in board["templating"]["list"]})
    return out


def links_block(alert: AlertFacts, dashboards: Mapping[str, str], node: bool) -> str:
    """## Dashboards and ## Escalation, and a pointer to ## On the node when the runbook needs it."""
    boards = _board_variables(dashboards)
    lines = [
        "## Dashboards",
        "",
        "`<grafana>` is your Grafana; the chart's `dashboards.enabled` installs these boards.",
        "",
    ]
    for key in (*_BOARDS_BY_ALERT.get(alert.name, _BOARDS_BY_LAYER[alert.layer]), "remediation"):
        title, variables = boards[key]
        params = [f"var-{v}={_PLACEHOLDER[v]}" for v in _TARGET_VARS[alert.target_kind] if v in variables]
        query = "?" + "&".join(params) if params else ""
        what = " (what gpupulse did: actions, breaker, pause)" if key == "remediation" else ""
        lines.append(f"- {title}{what}: `<grafana>/d/{UIDS[key]}{query}`")
    lines += ["", "## Escalation", "", _escalation(alert)]
    if node:
        lines += [
            "",
            'Commands on a node (`<driver-pod>`, "in the node shell") need no SSH: see',
            "[On the node](#on-the-node) at the end.",
        ]
    return "\n".join(lines)


def _escalation(alert: AlertFacts) -> str:
    policy = (
        "your team's escalation policy (the alert's `escalation` annotation names it where the install "
        "sets one: `prometheusRule.additionalRuleAnnotations.escalation` in the chart)"
    )
    if alert.severity == "critical":
        text = (
            f"`critical` pages the on-call now. Escalate to the next level of {policy} if the target is "
            "not healthy again within 30 minutes (or the time the policy sets), at once when the page came "
            "from gpupulse after its ladder ran out (the incident ends in `page`), and when more than one "
            "node shows this alert."
        )
    elif alert.severity == "warning":
        text = (
            "`warning` does not page: it goes to the team's queue. Work it in business hours; escalate by "
            f"{policy} only if it turns critical, spreads to more nodes or workloads, or outlasts a "
            "working day."
        )
    else:
        text = (
            "`info` neither pages nor queues: it is context for other alerts and the dashboards. Nothing to "
            "escalate; if it keeps firing, tell the workload's owners."
        )
    if alert.layer == "hardware":
        text += (
            " A GPU that is still faulty after a reset or a reboot goes to the hardware vendor or the "
            "data-centre team (see What to do)."
        )
    if alert.severity == "info":
        return text
    return text + "\n\n" + _who_and_handover(alert)


def _who_and_handover(alert: AlertFacts) -> str:
    """Who gets gpupulse's own page, and what the next person needs to pick the incident up."""
    if alert.target_kind == "controller":
        return (
            "**Who**: this alert takes your Alertmanager's route, never the controller's pager (it is about "
            "the controller). **Hand over**: the output of `gpupulse-remediation status` (paused, breaker, "
            "pager, the last switches and who made them) and the controller's log since the alert began "
            "(`kubectl logs -n <release-namespace> <controller-pod> --since=1h`)."
        )
    return (
        "**Who**: this alert reaches people by your Alertmanager's route; when gpupulse pages itself (its "
        "ladder ran out, its breaker opened, it is paused) the page goes to the chart's `controller.pager` "
        "target (`controller.pager.kind`: `webhook`, `pagerduty` or `slack`). With the chart's default "
        "`none` those pages reach only the controller's log (`gpupulse-remediation status` says so on its "
        "`pager` line). **Hand over**: the incident id (`gpupulse-remediation incidents list`, below), "
        "`gpupulse-remediation incidents get <id>` (diagnosis, evidence, every step gpupulse took), the "
        "alert's target labels, and what you did since the page."
    )


def actions_block(alert: AlertFacts) -> str:
    """## What did gpupulse do?, ## By hand (dry run) and ## Stop the automation."""
    if alert.target_kind == "controller":
        return _controller_actions_block()
    sig = alert.signature
    rungs = " → ".join(sig.ladder.rungs)
    events = {
        "pod": "kubectl get events -n <namespace> --field-selector involvedObject.name=<pod>",
        "job": "kubectl get events -n <namespace> --field-selector involvedObject.name=<job>",
    }.get(
        alert.target_kind,
        "kubectl get events -A --field-selector involvedObject.kind=Node,involvedObject.name=<node>",
    )
    lines = [
        "## What did gpupulse do?",
        "",
        f"This alert reaches the signature `{sig.name}`; its ladder is **{rungs}**.",
        "Find the controller pod, then its incidents (the ledger, SQLite or GpuIncident objects alike),",
        "the one for this target, and the Events it wrote on the target:",
        "",
        _sh(_CONTROLLER),
        "",
        _sh(f"{_EXEC} incidents list"),
        "",
        _sh(f"{_EXEC} incidents get <id>"),
        "",
        _sh(events),
        "",
        "In cluster mode (`controller.cluster.enabled`) the incidents are also Kubernetes objects:",
        "",
        _sh("kubectl get gpuincidents -n <release-namespace>"),
        "",
        "## By hand (dry run, the default)",
        "",
        "The chart installs the controller with `controller.dryRun: true`: it records each step it would",
        'take (outcome `dry_run`, "dry run: would migrate ..." in the incident\'s history) and neither acts',
        "nor pages; the page you got came from your Alertmanager route. Until dry run is off, the steps",
        "are yours:",
        "",
        *_manual_path(alert),
        "",
        "## Stop the automation",
        "",
        "If gpupulse acts where it should not, pause it (every incident is still recorded), and resume",
        "when done:",
        "",
        _sh(f"{_EXEC} pause"),
        "",
        _sh(f"{_EXEC} resume"),
    ]
    return "\n".join(lines)


def _controller_actions_block() -> str:
    """The controller's own alerts: nothing of gpupulse acted, and the kill switch is what to read."""
    lines = [
        "## What did gpupulse do?",
        "",
        "Nothing: this alert is about the controller, and the chart routes it past the controller to your",
        "own receivers. What the controller last did, and its switches (who paused, resumed or reset the",
        "breaker, when and why):",
        "",
        _sh(_CONTROLLER),
        "",
        _sh(f"{_EXEC} status"),
        "",
        _sh(f"{_EXEC} incidents list"),
        "",
        "## By hand (dry run, the default)",
        "",
        "The same in dry run (`controller.dryRun: true`): a dry-run controller records what it would do,",
        "so a stuck one records nothing either. Follow What to do.",
        "",
        "## Stop the automation",
        "",
        "A stuck controller acts on nothing, but if it must stay off while you repair it, pause it; the",
        "pause is kept in its ledger and `status` shows it:",
        "",
        _sh(f'{_EXEC} pause --reason "<why>"'),
    ]
    return "\n".join(lines)


def _manual_path(alert: AlertFacts) -> list[str]:
    rungs = alert.signature.ladder.rungs
    kind = alert.target_kind
    if rungs == ("page",):
        return [
            "Nothing that gpupulse would do: its ladder only pages. Follow What to do.",
        ]
    out: list[str] = []
    step = 1
    if "restart" in rungs and kind == "pod":
        out += [
            f"{step}. Restart the pod through its controller. Check it has one first: a pod without an",
            "   owner is never deleted by gpupulse, because nothing would bring it back.",
            "",
            _sh(
                "kubectl get pod -n <namespace> <pod> "
                "-o jsonpath='{.metadata.ownerReferences[?(@.controller==true)].kind}{\"\\n\"}'"
            ),
            "",
            "   It must print an owner (ReplicaSet, StatefulSet, Job, ...); then:",
            "",
            _sh("kubectl delete pod -n <namespace> <pod>"),
            "",
        ]
        step += 1
    if "restart" in rungs and kind == "job":
        out += [f"{step}. Restart the whole job at once, through its controller (never one rank's pod):", ""]
        out += _job_restart()
        step += 1
    if "migrate" in rungs and kind == "job":
        out += [
            f"{step}. Cordon the suspect rank's node (the alert's `node` label) so that the job cannot",
            "   land on it again, then restart the whole job at once (never one rank's pod):",
            "",
            _sh("kubectl cordon <node>"),
            "",
        ]
        if "restart" not in rungs:
            out += _job_restart()
        step += 1
    elif "migrate" in rungs:
        then = "If the restart did not help (the alert comes back), move" if "restart" in rungs else "Move"
        out += [
            f"{step}. {then} the workloads off the node: cordon it, then drain it. The drain evicts",
            "   through PodDisruptionBudgets, leaves DaemonSet pods (the exporter, the GPU Operator) alone,",
            "   and waits:",
            "",
            _sh("kubectl cordon <node>"),
            "",
            _sh("kubectl drain <node> --ignore-daemonsets --delete-emptydir-data --timeout=15m"),
            "",
        ]
        if kind == "pod":
            out += [
                "   gpupulse itself evicts only the alert's pod; to do the same, cordon and delete that pod",
                "   (after the owner check above) instead of draining.",
                "",
            ]
        if kind == "gpu":
            out += [
                "   gpupulse itself evicts only the pods on the faulty GPU (the pods of",
                '   `uuid_namespace_pod:gpu_allocation:share{uuid="<uuid>"}`) and leaves the node\'s',
                "   other GPUs at work; to do the same, cordon and `kubectl delete pod` those pods",
                "   instead of draining.",
                "",
            ]
        step += 1
    out += [
        f"{step}. When gpupulse would page, it is you: follow What to do. Uncordon",
        "   (`kubectl uncordon <node>`) only once the node is healthy again; gpupulse never uncordons",
        "   unless configured to.",
    ]
    return out


def _job_restart() -> list[str]:
    """The gang restart of remediation/kube/jobs.py, per training_job_kind."""
    return [
        "   - `JobSet.jobset.x-k8s.io`: delete its child Jobs; the JobSet recreates them.",
        "",
        _sh(
            "kubectl delete jobs -n <namespace> -l jobset.sigs.k8s.io/jobset-name=<job> --cascade=foreground"
        ),
        "",
        "   - `PyTorchJob.kubeflow.org`: delete every pod of the job; the operator recreates them.",
        "",
        _sh("kubectl delete pods -n <namespace> -l training.kubeflow.org/job-name=<job>"),
        "",
        "   - `Job.batch` (Indexed): delete every pod of the Job; each counts against its backoffLimit.",
        "",
        _sh("kubectl delete pods -n <namespace> -l batch.kubernetes.io/job-name=<job>"),
        "",
        "   - `Job.batch.volcano.sh`: ask Volcano for a RestartJob (a Command, what gpupulse creates).",
        "",
        _sh(
            "kubectl create -f - <<EOF",
            "apiVersion: bus.volcano.sh/v1alpha1",
            "kind: Command",
            "metadata: {generateName: <job>-restart-, namespace: <namespace>}",
            "action: RestartJob",
            "target: {apiVersion: batch.volcano.sh/v1alpha1, kind: Job, name: <job>, uid: <job uid>}",
            "EOF",
        ),
        "",
        "   `<job uid>`: `kubectl get vcjob -n <namespace> <job> -o jsonpath='{.metadata.uid}'`. Other",
        "   owners (LeaderWorkerSet, StatefulSet) have no gang restart: gpupulse pages, and so do you.",
        "",
    ]


def on_the_node() -> str:
    """## On the node: how the runbooks' node commands run without SSH."""
    return "\n".join(
        [
            "## On the node",
            "",
            "No SSH needed. `nvidia-smi` runs in the GPU Operator's driver pod on the node (namespace",
            "`gpu-operator`, or the one your GPU Operator is installed in):",
            "",
            _sh(_DRIVER_POD),
            "",
            _sh("kubectl exec -n gpu-operator -c nvidia-driver-ctr <driver-pod> -- nvidia-smi"),
            "",
            "Host commands (`dmesg`, `lspci`, `free`; and `nvidia-smi` where the driver is installed on the",
            "host, not by the GPU Operator) run in the node shell, a debug pod in the node's namespaces with",
            "its root at /host:",
            "",
            _sh("kubectl debug node/<node> -it --profile=sysadmin --image=busybox:1.36 -- chroot /host sh"),
            "",
            "`--profile=sysadmin` makes the pod privileged (kubectl's newer profiles; on an older kubectl",
            "drop the flag, and `dmesg` may then be refused). Leaving the shell leaves the pod behind:",
            "`kubectl get pods -o name | grep node-debugger` and `kubectl delete` it.",
        ]
    )


def _blocks(block: str) -> re.Pattern[str]:
    return re.compile(re.escape(begin_marker(block)) + r"\n.*?" + re.escape(_END), re.DOTALL)


def hand_written(text: str) -> str:
    """A runbook's text without the contents of its generated blocks."""
    for block in BLOCKS:
        text = _blocks(block).sub("", text)
    return text


def uses_the_node(text: str) -> bool:
    """Whether a runbook's hand-written commands need ## On the node."""
    hand = hand_written(text)
    return "<driver-pod>" in hand or "node shell" in hand


def _replacement(text: str, _: re.Match[str]) -> str:
    return text


def render(text: str, blocks: Mapping[str, str], path: PurePosixPath) -> str:
    """The runbook text with each generated block replaced by its content."""
    for block, content in blocks.items():
        pattern = _blocks(block)
        if len(pattern.findall(text)) != 1:
            raise RunbookError(f"{path}: the BEGIN/END markers of the generated {block} block are missing")
        # a function, not a template: the content holds backslashes (jsonpath's "\\n")
        whole = "\n".join(part for part in (begin_marker(block), content, _END) if part)
        text = pattern.sub(functools.partial(_replacement, whole), text)
    return text


def runbook_files(
    rules: Mapping[str, str],
    dashboards: Mapping[str, str],
    library: SignatureLibrary,
    read: Callable[[PurePosixPath], str],
) -> dict[PurePosixPath, str]:
    """Runbook path -> the text it must hold; read(path) is its hand-written text now."""
    want = {}
    for alert in facts(rules, library):
        path = RUNBOOKS / f"{alert.name}.md"
        text = read(path)
        node = uses_the_node(text)
        blocks = {
            "links": links_block(alert, dashboards, node),
            "actions": actions_block(alert),
            "node": on_the_node() if node else "",
        }
        want[path] = render(text, blocks, path)
    return want
