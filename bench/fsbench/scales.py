"""Workload sizes for the tiny (CI), quick and full modes."""

from dataclasses import asdict, dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Scale:
    name: str
    volume_mib: int  # every filesystem gets a volume of this size ...
    small_volume_mib: int  # ... or, for the out-of-space workloads, of this one (XFS needs >= 300 MiB)
    budget_s: float  # per filesystem and workload; loops stop and report "timed out" past it
    total_budget_min: float  # the whole run; workloads not started by then are skipped
    files: int  # create / stat / unlink in one directory (seed 000)
    name_lengths: tuple
    files_per_length: int
    steady_population: int
    steady_cycles: int
    steady_samples: int
    massdel_files: int
    ls_files: int
    interleave_dirs: int
    interleave_files: int  # per directory
    acl_dirs: int
    acl_files: int  # per directory
    dd_mib: int
    tar_full_files: int
    blurt_tasks: int
    blurt_rounds: int  # outer loop of the seed's one-liner (9 directories per round)
    blurt_writes: int  # 1 KiB writes per task
    fio_mib: int
    fio_runtime_s: int
    untar_files: int
    fsmark_files: int
    fsmark_kib: int

    def as_dict(self):
        return asdict(self)


TINY = Scale(
    name="tiny",
    volume_mib=512,
    small_volume_mib=320,
    budget_s=20,
    total_budget_min=5,
    files=1000,
    name_lengths=(8, 64, 255),
    files_per_length=300,
    steady_population=300,
    steady_cycles=1000,
    steady_samples=10,
    massdel_files=1000,
    ls_files=1000,
    interleave_dirs=10,
    interleave_files=30,
    acl_dirs=4,
    acl_files=50,
    dd_mib=16,
    tar_full_files=200,
    blurt_tasks=20,
    blurt_rounds=1,
    blurt_writes=40,
    fio_mib=16,
    fio_runtime_s=1,
    untar_files=200,
    fsmark_files=100,
    fsmark_kib=16,
)

QUICK = Scale(
    name="quick",
    volume_mib=1024,
    small_volume_mib=320,
    budget_s=45,
    total_budget_min=15,
    files=20_000,
    name_lengths=(8, 16, 32, 64, 128, 255),
    files_per_length=3_000,
    steady_population=5_000,
    steady_cycles=20_000,
    steady_samples=40,
    massdel_files=20_000,
    ls_files=20_000,
    interleave_dirs=50,
    interleave_files=100,
    acl_dirs=20,
    acl_files=250,
    dd_mib=64,
    tar_full_files=2_000,
    blurt_tasks=250,
    blurt_rounds=3,
    blurt_writes=40,
    fio_mib=128,
    fio_runtime_s=3,
    untar_files=2_000,
    fsmark_files=2_000,
    fsmark_kib=16,
)

FULL = Scale(
    name="full",
    volume_mib=4096,
    small_volume_mib=320,
    budget_s=180,
    total_budget_min=58,
    files=100_000,
    name_lengths=(8, 16, 32, 64, 128, 192, 255),
    files_per_length=10_000,
    steady_population=10_000,
    steady_cycles=100_000,
    steady_samples=100,
    massdel_files=100_000,
    ls_files=100_000,
    interleave_dirs=200,
    interleave_files=250,
    acl_dirs=50,
    acl_files=1_000,
    dd_mib=200,
    tar_full_files=4_000,
    blurt_tasks=1_000,
    blurt_rounds=9,
    blurt_writes=40,
    fio_mib=512,
    fio_runtime_s=10,
    untar_files=5_000,
    fsmark_files=10_000,
    fsmark_kib=16,
)

SCALES = {s.name: s for s in (TINY, QUICK, FULL)}
