"""The local backend: restart and migrate run configured commands, or restart signals a process.

Commands are argv lists (never a shell string). Each element may hold the placeholders {kind},
{node}, {namespace}, {pod}, {uuid}, {training_job_kind}, {training_job} (a `job` target's owner),
{rung} and {reason}; a placeholder is replaced inside that one argv element, so an alert label can
never add arguments or shell syntax. The same values are also passed as environment variables
GPUPULSE_TARGET_KIND, GPUPULSE_TARGET_NODE, GPUPULSE_TARGET_NAMESPACE, GPUPULSE_TARGET_POD,
GPUPULSE_TARGET_UUID, GPUPULSE_TARGET_TRAINING_JOB_KIND, GPUPULSE_TARGET_TRAINING_JOB, GPUPULSE_RUNG,
GPUPULSE_REASON.

Exit code convention: 0 = done; 75 (EX_TEMPFAIL in sysexits.h) = TemporaryError (the ladder retries
the same rung later); any other nonzero exit = PermanentError (the ladder moves on). A command that
outlives its timeout is killed and reported as a TemporaryError.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from remediation.errors import PermanentError, TemporaryError
from remediation.model import ActionResult, Target
from remediation.settings import LocalBackendSettings

EX_TEMPFAIL = 75
_PLACEHOLDER = re.compile(r"\{(kind|node|namespace|pod|uuid|training_job_kind|training_job|rung|reason)\}")
_SAFE_PATH_VALUE = re.compile(r"^[A-Za-z0-9._-]+$")
_OUTPUT_LIMIT = 4096


def command_name(argv: Sequence[str]) -> str:
    """What a human calls the command: `python -m demo.act ...` is demo.act, /usr/local/bin/x is x
    (an interpreter's or the tool's full path in a page is noise)."""
    name = Path(argv[0]).name
    if name.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        return argv[2]
    return name


def render_argv(template: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Substitute placeholders inside each argv element; never splits or joins elements."""
    return [_PLACEHOLDER.sub(lambda m: values.get(m.group(1), ""), part) for part in template]


def target_values(target: Target, rung: str, reason: str) -> dict[str, str]:
    """Placeholder values for one action (NUL bytes removed: exec would refuse them)."""
    raw = {
        "kind": target.kind,
        "node": target.node,
        "namespace": target.namespace,
        "pod": target.pod,
        "uuid": target.uuid,
        "training_job_kind": target.training_job_kind,
        "training_job": target.training_job,
        "rung": rung,
        "reason": reason,
    }
    return {k: v.replace("\x00", "") for k, v in raw.items()}


class LocalBackend:
    """ActionBackend for bare metal, Slurm and the demo."""

    name = "local"

    def __init__(self, settings: LocalBackendSettings) -> None:
        self.settings = settings

    async def restart(self, target: Target, reason: str) -> ActionResult:
        """Run restart_command, or signal the PID from the pidfile."""
        if self.settings.restart_command:
            return await self._run("restart", self.settings.restart_command, target, reason)
        if self.settings.pidfile is not None:
            return self._signal(target, reason)
        raise PermanentError("local backend: no restart command and no pidfile configured")

    async def migrate(self, target: Target, reason: str) -> ActionResult:
        """Run migrate_command."""
        if self.settings.migrate_command:
            return await self._run("migrate", self.settings.migrate_command, target, reason)
        raise PermanentError("local backend: no migrate command configured")

    async def _run(self, rung: str, template: Sequence[str], target: Target, reason: str) -> ActionResult:
        values = target_values(target, rung, reason)
        argv = render_argv(template, values)
        env = dict(os.environ)
        env.update(
            {f"GPUPULSE_TARGET_{k.upper()}": v for k, v in values.items() if k not in ("rung", "reason")}
        )
        env["GPUPULSE_RUNG"] = values["rung"]
        env["GPUPULSE_REASON"] = values["reason"]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
            )
        except OSError as exc:
            raise PermanentError(f"cannot run {argv[0]!r}: {exc}") from exc  # the path is the problem
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.settings.timeout_seconds)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise TemporaryError(
                f"{command_name(argv)} timed out after {self.settings.timeout_seconds} s"
            ) from None
        text = out.decode("utf-8", "replace")[-_OUTPUT_LIMIT:].strip()
        details = {"argv": argv, "exit_code": proc.returncode, "output": text}
        if proc.returncode == 0:
            return ActionResult(done=True, summary=f"{rung} command succeeded", details=details)
        last = text.splitlines()[-1] if text else ""
        message = f"{command_name(argv)} exited {proc.returncode}: {last}".strip()
        if proc.returncode == EX_TEMPFAIL:
            raise TemporaryError(message)
        raise PermanentError(message)

    def _signal(self, target: Target, reason: str) -> ActionResult:
        assert self.settings.pidfile is not None
        values = target_values(target, "restart", reason)
        for key in ("node", "namespace", "pod", "uuid"):
            # a label value becomes part of a path: allow only plain name characters
            if values[key] and not _SAFE_PATH_VALUE.match(values[key]):
                values[key] = ""
        path = Path(render_argv([str(self.settings.pidfile)], values)[0])
        try:
            pid = int(path.read_text(encoding="utf-8").strip())
        except (OSError, ValueError) as exc:
            raise PermanentError(f"cannot read a PID from {path}: {exc}") from exc
        if pid <= 1:
            raise PermanentError(f"refusing to signal PID {pid} from {path}")
        try:
            signum = signal.Signals[self.settings.restart_signal]
        except KeyError as exc:
            raise PermanentError(f"unknown signal {self.settings.restart_signal!r}") from exc
        try:
            os.kill(pid, signum)
        except ProcessLookupError as exc:
            raise PermanentError(f"process {pid} from {path} is gone") from exc
        except PermissionError as exc:
            raise PermanentError(f"not allowed to signal process {pid}: {exc}") from exc
        return ActionResult(
            done=True, summary=f"sent {signum.name} to PID {pid}", details={"pid": pid, "pidfile": str(path)}
        )
