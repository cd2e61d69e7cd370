"""XID classes as data: which XID codes NVIDIA resolves the same way, and the alert that reports them.

The alert rules (alerts/rules/hardware.py), the fault signatures (`match: {xid_class: ...}`), the
docs (a test compares them) and the tests all read this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class XidClass:
    """XID codes that NVIDIA resolves the same way ("Immediate action" of its XID catalog)."""

    name: str
    bucket: str  # NVIDIA's resolution bucket(s)
    codes: tuple[int, ...]
    fault_class: str  # one of gpupulse.contract.FAULT_CLASSES
    # the gpupulse alert that reports this class; it may aggregate the `xid` label away
    alertname: str

    @property
    def regex(self) -> str:
        """The codes as a PromQL/RE2 alternation, e.g. `13|31|32`."""
        return "|".join(str(code) for code in self.codes)

    def holds(self, labels: Mapping[str, str]) -> bool:
        """True when an alert's labels report this class: its `xid` is one of the codes (whatever rule
        sent it), or it is the gpupulse alert for the class."""
        xid = labels.get("xid")
        if xid is not None:
            return xid in {str(code) for code in self.codes}
        return labels.get("alertname") == self.alertname


XID_CLASSES: tuple[XidClass, ...] = (
    XidClass(
        name="restart_app",
        bucket="RESTART_APP / IGNORE",
        codes=(13, 31, 32, 43, 68, 69, 94),
        fault_class="xid_app",
        alertname="GPUXidAppError",
    ),
    XidClass(
        name="reset_gpu",
        bucket="RESET_GPU",
        codes=(48, 62, 64, 95, 109, 119, 120, 136, 140, 143, 155, 158),
        fault_class="xid_reset",
        alertname="GPUXidResetRequired",
    ),
    XidClass(
        name="fell_off_bus",
        bucket="RESTART_BM",
        codes=(79,),
        fault_class="gpu_lost",
        alertname="GPUFellOffBus",
    ),
)


def xid_class(name: str) -> XidClass:
    """The XID class of this name; KeyError naming the known ones otherwise."""
    for cls in XID_CLASSES:
        if cls.name == name:
            return cls
    raise KeyError(f"unknown XID class {name!r} (known: {', '.join(c.name for c in XID_CLASSES)})")
