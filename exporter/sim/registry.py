"""Registry of fake C symbols and the ctypes helpers they share."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml as N

F = TypeVar("F", bound=Callable[..., Any])

SUCCESS: int = N.NVML_SUCCESS
INVALID_ARGUMENT: int = N.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED: int = N.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND: int = N.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE: int = N.NVML_ERROR_INSUFFICIENT_SIZE
UNINITIALIZED: int = N.NVML_ERROR_UNINITIALIZED
GPU_IS_LOST: int = N.NVML_ERROR_GPU_IS_LOST
TIMEOUT: int = N.NVML_ERROR_TIMEOUT
UNKNOWN: int = N.NVML_ERROR_UNKNOWN
VERSION_MISMATCH: int = N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


@dataclass(frozen=True)
class Symbol:
    """One fake C function; per-device ones get (state, device, t, *rest) after the handle check."""

    name: str
    fn: Callable[..., int]
    per_device: bool
    mig_ok: bool


SYMBOLS: dict[str, Symbol] = {}


def device_symbol(*aliases: str, mig: bool = False) -> Callable[[F], F]:
    """Register a per-device C function (first C argument is a device handle)."""

    def register(fn: F) -> F:
        for name in (fn.__name__, *aliases):
            SYMBOLS[name] = Symbol(name, fn, per_device=True, mig_ok=mig)
        return fn

    return register


def system_symbol(*aliases: str) -> Callable[[F], F]:
    """Register a C function that takes no device handle first (gets (state, *args))."""

    def register(fn: F) -> F:
        for name in (fn.__name__, *aliases):
            SYMBOLS[name] = Symbol(name, fn, per_device=False, mig_ok=True)
        return fn

    return register


_void_p_from_buffer = ctypes.c_void_p.from_buffer
_addressof = ctypes.addressof


def out(ref: Any) -> Any:
    """The object behind a byref() argument."""
    return ref._obj


def as_int(value: Any) -> int:
    """A C integer argument, whether pynvml passed a ctypes object or a Python int."""
    return int(value if isinstance(value, int) else value.value)


def pointer_value(ptr: Any) -> int | None:
    """The address an opaque handle (ctypes POINTER) holds, or None for NULL/garbage."""
    try:
        return _addressof(ptr.contents)
    except (ValueError, AttributeError, TypeError):
        return None


def write_pointer(ref: Any, address: int) -> None:
    """Store `address` into the POINTER behind byref(handle)."""
    _void_p_from_buffer(out(ref)).value = address


def write_pointer_field(struct: Any, field_name: str, address: int) -> None:
    """Store `address` into a POINTER field of a struct."""
    offset = getattr(type(struct), field_name).offset
    _void_p_from_buffer(struct, offset).value = address


def write_string(buf: Any, size: Any, value: str) -> int:
    """Copy a NUL-terminated string into a caller buffer of `size` bytes."""
    data = value.encode()
    if len(data) + 1 > as_int(size):
        return INSUFFICIENT_SIZE
    ctypes.memmove(buf, data + b"\0", len(data) + 1)
    return SUCCESS
