"""Built-in GPU model table: the static facts a scenario GPU inherits from its `model`."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024

# NVML architecture ids (pynvml NVML_DEVICE_ARCH_*), repeated so this table needs no pynvml import
ARCH_VOLTA = 5
ARCH_TURING = 6
ARCH_AMPERE = 7
ARCH_ADA = 8
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile of a model."""

    name: str
    memory_bytes: int
    slices: int


@dataclass(frozen=True)
class GpuModel:
    """Static facts about one GPU product, close to what the real board reports."""

    key: str
    name: str
    architecture: int
    compute_capability: tuple[int, int]
    pci_device_id: int
    memory_total_bytes: int
    memory_reserved_bytes: int
    power_limit_watts: float
    power_idle_watts: float
    sm_clock_max_hertz: float
    memory_clock_max_hertz: float
    sm_clock_idle_hertz: float
    pcie_generation_max: int
    pcie_width_max: int
    shutdown_temperature_celsius: int
    slowdown_temperature_celsius: int
    memory_max_temperature_celsius: int
    gpu_max_temperature_celsius: int
    nvlink_count: int
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_max_devices: int = 0

    @property
    def gpm_supported(self) -> bool:
        """GPM exists on Hopper and newer only."""
        return self.architecture >= ARCH_HOPPER

    @property
    def row_remap_supported(self) -> bool:
        """Row remapping replaced page retirement with Ampere."""
        return self.architecture >= ARCH_AMPERE

    @property
    def mig_supported(self) -> bool:
        """Whether the board can be put in MIG mode."""
        return self.mig_max_devices > 0


def _mig(total_gib: int, *profiles: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    del total_gib
    return tuple(MigProfile(name, mem_mib * MIB, slices) for name, mem_mib, slices in profiles)


_A100_MIG = _mig(
    80,
    ("1g.10gb", 9728, 1),
    ("1g.20gb", 19968, 1),
    ("2g.20gb", 19968, 2),
    ("3g.40gb", 40192, 3),
    ("4g.40gb", 40192, 4),
    ("7g.80gb", 80384, 7),
)
_H100_MIG = _mig(
    80,
    ("1g.10gb", 9984, 1),
    ("1g.20gb", 19968, 1),
    ("2g.20gb", 19968, 2),
    ("3g.40gb", 40448, 3),
    ("4g.40gb", 40448, 4),
    ("7g.80gb", 80896, 7),
)
_H200_MIG = _mig(
    141,
    ("1g.18gb", 16896, 1),
    ("1g.35gb", 33792, 1),
    ("2g.35gb", 33792, 2),
    ("3g.71gb", 71680, 3),
    ("4g.71gb", 71680, 4),
    ("7g.141gb", 143360, 7),
)

MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            key="A100-SXM4-80GB",
            name="NVIDIA A100-SXM4-80GB",
            architecture=ARCH_AMPERE,
            compute_capability=(8, 0),
            pci_device_id=0x20B210DE,
            memory_total_bytes=81920 * MIB,
            memory_reserved_bytes=580 * MIB,
            power_limit_watts=400.0,
            power_idle_watts=62.0,
            sm_clock_max_hertz=1410e6,
            memory_clock_max_hertz=1593e6,
            sm_clock_idle_hertz=210e6,
            pcie_generation_max=4,
            pcie_width_max=16,
            shutdown_temperature_celsius=92,
            slowdown_temperature_celsius=89,
            memory_max_temperature_celsius=95,
            gpu_max_temperature_celsius=87,
            nvlink_count=12,
            mig_profiles=_A100_MIG,
            mig_max_devices=7,
        ),
        GpuModel(
            key="H100-SXM5-80GB",
            name="NVIDIA H100 80GB HBM3",
            architecture=ARCH_HOPPER,
            compute_capability=(9, 0),
            pci_device_id=0x233010DE,
            memory_total_bytes=81559 * MIB,
            memory_reserved_bytes=520 * MIB,
            power_limit_watts=700.0,
            power_idle_watts=72.0,
            sm_clock_max_hertz=1980e6,
            memory_clock_max_hertz=2619e6,
            sm_clock_idle_hertz=345e6,
            pcie_generation_max=5,
            pcie_width_max=16,
            shutdown_temperature_celsius=92,
            slowdown_temperature_celsius=90,
            memory_max_temperature_celsius=95,
            gpu_max_temperature_celsius=87,
            nvlink_count=18,
            mig_profiles=_H100_MIG,
            mig_max_devices=7,
        ),
        GpuModel(
            key="H200-SXM-141GB",
            name="NVIDIA H200",
            architecture=ARCH_HOPPER,
            compute_capability=(9, 0),
            pci_device_id=0x233510DE,
            memory_total_bytes=143771 * MIB,
            memory_reserved_bytes=560 * MIB,
            power_limit_watts=700.0,
            power_idle_watts=76.0,
            sm_clock_max_hertz=1980e6,
            memory_clock_max_hertz=3201e6,
            sm_clock_idle_hertz=345e6,
            pcie_generation_max=5,
            pcie_width_max=16,
            shutdown_temperature_celsius=92,
            slowdown_temperature_celsius=90,
            memory_max_temperature_celsius=95,
            gpu_max_temperature_celsius=87,
            nvlink_count=18,
            mig_profiles=_H200_MIG,
            mig_max_devices=7,
        ),
        GpuModel(
            key="B200",
            name="NVIDIA B200",
            architecture=ARCH_BLACKWELL,
            compute_capability=(10, 0),
            pci_device_id=0x290110DE,
            memory_total_bytes=183359 * MIB,
            memory_reserved_bytes=640 * MIB,
            power_limit_watts=1000.0,
            power_idle_watts=120.0,
            sm_clock_max_hertz=1965e6,
            memory_clock_max_hertz=3996e6,
            sm_clock_idle_hertz=345e6,
            pcie_generation_max=5,
            pcie_width_max=16,
            shutdown_temperature_celsius=92,
            slowdown_temperature_celsius=90,
            memory_max_temperature_celsius=95,
            gpu_max_temperature_celsius=87,
            nvlink_count=18,
            mig_profiles=_H200_MIG,
            mig_max_devices=7,
        ),
        GpuModel(
            key="L40S",
            name="NVIDIA L40S",
            architecture=ARCH_ADA,
            compute_capability=(8, 9),
            pci_device_id=0x26B910DE,
            memory_total_bytes=46068 * MIB,
            memory_reserved_bytes=440 * MIB,
            power_limit_watts=350.0,
            power_idle_watts=34.0,
            sm_clock_max_hertz=2520e6,
            memory_clock_max_hertz=9001e6,
            sm_clock_idle_hertz=210e6,
            pcie_generation_max=4,
            pcie_width_max=16,
            shutdown_temperature_celsius=94,
            slowdown_temperature_celsius=91,
            memory_max_temperature_celsius=95,
            gpu_max_temperature_celsius=89,
            nvlink_count=0,
        ),
        GpuModel(
            key="V100-SXM2-32GB",
            name="Tesla V100-SXM2-32GB",
            architecture=ARCH_VOLTA,
            compute_capability=(7, 0),
            pci_device_id=0x1DB510DE,
            memory_total_bytes=32768 * MIB,
            memory_reserved_bytes=300 * MIB,
            power_limit_watts=300.0,
            power_idle_watts=42.0,
            sm_clock_max_hertz=1530e6,
            memory_clock_max_hertz=877e6,
            sm_clock_idle_hertz=135e6,
            pcie_generation_max=3,
            pcie_width_max=16,
            shutdown_temperature_celsius=90,
            slowdown_temperature_celsius=87,
            memory_max_temperature_celsius=95,
            gpu_max_temperature_celsius=83,
            nvlink_count=6,
        ),
        GpuModel(
            key="T4",
            name="Tesla T4",
            architecture=ARCH_TURING,
            compute_capability=(7, 5),
            pci_device_id=0x1EB810DE,
            memory_total_bytes=15360 * MIB,
            memory_reserved_bytes=250 * MIB,
            power_limit_watts=70.0,
            power_idle_watts=10.0,
            sm_clock_max_hertz=1590e6,
            memory_clock_max_hertz=5001e6,
            sm_clock_idle_hertz=300e6,
            pcie_generation_max=3,
            pcie_width_max=16,
            shutdown_temperature_celsius=96,
            slowdown_temperature_celsius=93,
            memory_max_temperature_celsius=95,
            gpu_max_temperature_celsius=85,
            nvlink_count=0,
        ),
    )
}

# Short names accepted in scenario files
ALIASES: dict[str, str] = {
    "A100": "A100-SXM4-80GB",
    "H100": "H100-SXM5-80GB",
    "H200": "H200-SXM-141GB",
    "V100": "V100-SXM2-32GB",
}


def lookup_model(key: str) -> GpuModel | None:
    """The model for a table key or alias, or None."""
    return MODELS.get(ALIASES.get(key, key))
