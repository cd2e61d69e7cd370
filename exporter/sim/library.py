"""SimulatedNvml: patches pynvml so its real wrappers call Python fakes of the C library."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import pynvml as N

from exporter.errors import ReleasedError, SimAlreadyInstalledError

# Importing the symbol modules fills the registry
from exporter.sim import (
    sym_device,
    sym_events,
    sym_gpm,
    sym_health,
    sym_mig,
    sym_process,
    sym_system,
    sym_topology,
)
from exporter.sim.clock import ManualClock, RealClock
from exporter.sim.lifecycle import Inbox
from exporter.sim.registry import (
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SYMBOLS,
    UNINITIALIZED,
    Symbol,
    pointer_value,
)
from exporter.sim.runtime import SimGpu, SimState
from exporter.sim.scenario_types import Scenario
from gpupulse.clock import Clock

_SYMBOL_MODULES = (
    sym_device,
    sym_events,
    sym_gpm,
    sym_health,
    sym_mig,
    sym_process,
    sym_system,
    sym_topology,
)

# pynvml private names the patch relies on (pinned by a test)
PATCHED_NAMES = ("_LoadNvmlLibrary", "nvmlLib", "_nvmlGetFunctionPointer")
# Saved and restored too, so pynvml's init bookkeeping looks untouched afterwards
RESTORED_NAMES = (*PATCHED_NAMES, "_nvmlLib_refcount")
PYNVML_PRIVATE_NAMES = (*PATCHED_NAMES, "_nvmlGetFunctionPointer_cache", "libLoadLock", "_nvmlLib_refcount")

_install_lock = threading.Lock()
_installed: SimulatedNvml | None = None


class _FakeLib:
    """Stands in for the CDLL object pynvml keeps in `nvmlLib`."""

    def __repr__(self) -> str:
        return "<gpupulse simulated libnvidia-ml>"


def implemented_symbols() -> list[str]:
    """Every C symbol name the simulation answers."""
    return sorted(SYMBOLS)


class SimulatedNvml:
    """An installed simulation; use as a context manager or call uninstall()."""

    def __init__(self, scenario: Scenario, clock: Clock) -> None:
        self.scenario = scenario
        self.clock = clock
        self.calls: collections.Counter[str] = collections.Counter()
        self.state = SimState(scenario, clock)
        self._calls_lock = threading.Lock()
        self._functions: dict[str, Callable[..., Any]] = {}
        self._saved: dict[str, Any] = {}
        self._installed = False
        self.inbox: Inbox | None = None

    # ---- public ------------------------------------------------------------------------------
    @property
    def epoch_us(self) -> int:
        """Wall-clock microseconds that process-utilization timestamps count from (scenario t=0)."""
        return self.state.epoch_us

    def uninstall(self) -> None:
        """Restore pynvml and release every blocked call and event wait at once."""
        global _installed
        with _install_lock:
            if not self._installed:
                return
            self.state.release()
            if self.inbox is not None:
                self.inbox.stop()
            if isinstance(self.clock, ManualClock):
                self.clock.remove_listener(self.state.wake)
            for name, value in self._saved.items():
                setattr(N, name, value)
            N._nvmlGetFunctionPointer_cache.clear()
            self._installed = False
            _installed = None

    def __enter__(self) -> SimulatedNvml:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.uninstall()

    # ---- patching ----------------------------------------------------------------------------
    def _install(self) -> None:
        global _installed
        with _install_lock:
            if _installed is not None:
                raise SimAlreadyInstalledError("a simulated NVML is already installed; uninstall it first")
            self._saved = {name: getattr(N, name) for name in RESTORED_NAMES}
            N._LoadNvmlLibrary = _load_library_noop
            N.nvmlLib = _FakeLib()
            N._nvmlGetFunctionPointer = self._lookup
            N._nvmlGetFunctionPointer_cache.clear()
            if isinstance(self.clock, ManualClock):
                self.clock.add_listener(self.state.wake)
            self._installed = True
            _installed = self
        if self.scenario.scheduler.inbox is not None:
            self.inbox = Inbox(self, self.scenario.scheduler.inbox)
            self.inbox.start()

    def _lookup(self, name: str) -> Callable[..., Any]:
        fn = self._functions.get(name)
        if fn is not None:
            return fn
        symbol = SYMBOLS.get(name)
        if symbol is None:
            # Behaves like a driver too old to have the symbol
            raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
        fn = self._make_device_function(symbol) if symbol.per_device else self._make_system_function(symbol)
        self._functions[name] = fn
        return fn

    def _count(self, name: str) -> None:
        with self._calls_lock:
            self.calls[name] += 1

    def _make_system_function(self, symbol: Symbol) -> Callable[..., Any]:
        impl, name, state, count = symbol.fn, symbol.name, self.state, self._count

        def call(*args: Any) -> Any:
            count(name)
            return impl(state, *args)

        call.__name__ = name
        return call

    def _make_device_function(self, symbol: Symbol) -> Callable[..., Any]:
        impl, name, mig_ok, state, clock, count = (
            symbol.fn, symbol.name, symbol.mig_ok, self.state, self.clock, self._count,
        )  # fmt: skip
        by_handle = state.by_handle

        def call(handle: Any, *args: Any) -> Any:
            count(name)
            if state.init_count <= 0 or state.released:
                return UNINITIALIZED
            dev = by_handle.get(pointer_value(handle) or 0)
            if dev is None:
                return INVALID_ARGUMENT
            gpu = dev.gpu
            t = clock.monotonic()
            if t >= gpu.lost_at:
                return GPU_IS_LOST
            if gpu.faults or gpu.not_supported:
                if name in gpu.not_supported:
                    return NOT_SUPPORTED
                early = _apply_faults(state, gpu, name, t)
                if early is not None:
                    return early
                t = clock.monotonic()  # a hang or delay lets scenario time move on
                if t >= gpu.lost_at:
                    return GPU_IS_LOST
            if dev.is_mig and not mig_ok:
                return NOT_SUPPORTED
            return impl(state, dev, t, *args)

        call.__name__ = name
        return call


def _load_library_noop() -> None:
    return None


def _apply_faults(state: SimState, gpu: SimGpu, name: str, t: float) -> int | None:
    """Run the faults active for this call: an error code to return, or None to go on."""
    for f in gpu.faults:
        if (f.call == name or f.call == "*") and f.from_seconds <= t < f.until_seconds:
            try:
                if f.kind == "error":
                    return f.error
                if f.kind == "slow":
                    state.sleep_real(f.seconds)
                else:
                    state.block_until(f.until_seconds)
            except ReleasedError:
                return UNINITIALIZED
    return None


def install(scenario: Scenario, clock: Clock | None = None) -> SimulatedNvml:
    """Patch pynvml to run on `scenario` (default clock: RealClock()); only one at a time."""
    sim = SimulatedNvml(scenario, clock if clock is not None else RealClock())
    sim._install()
    return sim


def installed() -> SimulatedNvml | None:
    """The currently installed simulation, if any."""
    return _installed


def pynvml_private_names_present() -> dict[str, bool]:
    """Which of the pynvml private names the simulation patches exist in this pynvml."""
    return {name: hasattr(N, name) for name in PYNVML_PRIVATE_NAMES}
