"""Training alerts: a hung job, a straggling rank, a degraded job, a node fault under a job's rank, a
job whose steps stopped.

Every rank of a distributed job is one GPU process; the exporter tells which job and rank it belongs to
in `gpu_training_rank_info` (docs/design/training.md), and the rules join the per-GPU signals to it on
`uuid`. A synchronous job shows a hang as every rank holding a kernel (NCCL's spinning collective)
with no tensor work and no interconnect traffic, and a straggler as one rank out of step with the
median of its gang: clocks held down, or busy while the others wait for it in the collective.
"""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.common import alert, held
from alerts.rules.hardware import GPU_BY, RANK_INFO, events
from alerts.rules.model import Group, Record, RuleFile
from alerts.rules.promql import num
from gpupulse.xid import xid_class

PCIE_THROUGHPUT = "gpu_pcie_throughput_bytes_per_second"
NVLINK_THROUGHPUT = "gpu_nvlink_throughput_bytes_per_second"
# the series the exporter adds for training (the catalog declares them: gpupulse/metrics/)
TRAINING_SERIES = (
    RANK_INFO,
    PCIE_THROUGHPUT,
    NVLINK_THROUGHPUT,
    "gpu_process_io_read_bytes_total",
    "gpu_process_io_write_bytes_total",
    "gpu_process_state",
    "gpu_training_progress_last_step_timestamp_seconds",
    "gpu_training_progress_update_interval_seconds",
)

THROTTLE_REASONS = "sw_power_cap|hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"
JOB_BY = "namespace, training_job_kind, training_job"
RANK_BY = f"{JOB_BY}, rank, pod, node, uuid, gpu"

RANK_TENSOR = "rank:gpu_tensor_active:ratio"
RANK_SM_CLOCK = "rank:gpu_sm_clock:hertz"
RANK_BUSY_IDLE = "rank:gpu_training_busy_idle:bool"
JOB_RANKS = "training_job:gpu_training_ranks:count"
JOB_RANKS_SEEN = "training_job:gpu_training_ranks_seen:count"
JOB_TENSOR = "training_job:gpu_tensor_active:sum"
RANK_TENSOR_STEP = "rank:gpu_tensor_active:ratio_avg_step"
RANK_NO_KERNEL = "rank:gpu_training_no_kernel:bool"
JOB_SPLIT = "training_job:gpu_training_split:bool"
RANK_WAITED_ON = "rank:gpu_training_waited_on:bool"
RANK_IO = "rank:gpu_process_io:bytes_per_second"
RANK_HOST_CPU = "rank:gpu_process_host_cpu:cores"
IO_READ = "gpu_process_io_read_bytes_total"
IO_WRITE = "gpu_process_io_write_bytes_total"
PROCESS_STATE = "gpu_process_state"
HOST_CPU = "gpu_process_host_cpu_seconds_total"
PROGRESS_LAST = "gpu_training_progress_last_step_timestamp_seconds"
PROGRESS_INTERVAL = "gpu_training_progress_update_interval_seconds"
JOB_STALL = "training_job:gpu_training_progress_stall:seconds"
JOB_INTERVAL = "training_job:gpu_training_progress_update_interval:seconds"
JOB_MOVING = "training_job:gpu_training_progress_moving:bool"
# the alerts that already say a job is hung, and the one that says so from its steps: one at a time
SHAPE_HANGS = ("TrainingJobHung", "TrainingRankStalled", "TrainingJobNodeFault")
NO_PROGRESS = "TrainingJobNoProgress"

_JOB_TEXT = "{{ $labels.training_job_kind }} {{ $labels.namespace }}/{{ $labels.training_job }}"
_RANK_TEXT = (
    "rank {{ $labels.rank }} (pod {{ $labels.pod }}, GPU {{ $labels.gpu }} {{ $labels.uuid }} "
    "on {{ $labels.node }})"
)


def _across_gaps(c: RulesConfig, selector: str) -> str:
    """A series as its exporter gives it now, and, on a node whose exporter gave nothing at this
    scrape (one missed scrape, an exporter restart: none of the node's GPUs has a gpu_up or a
    utilization either), as its last sample within `stale_hold`. So a gap neither blanks a training
    record nor restarts the `for:` of an alert reading it, while a new sample (a kernel back, a step
    landed) counts at once; and a series that ends while its node is still scraped (a rank died, its
    job ended, an elastic restart replaced its pod, a GPU gone) is let go at once, as before."""
    return (
        f"({selector} or (\n  {held(c, selector)}\n"
        f"  unless on(node) (group by (node) (gpu_up) or group by (node) (gpu_utilization_ratio))\n))"
    )


def _ranks(c: RulesConfig) -> str:
    """gpu_training_rank_info across a gap (_across_gaps), where a held rank is one its node's last
    scrape before the gap still gave: a rank that died a minute before a missed scrape is not brought
    back for the gap (its last sample is older than its node's), so a hang of the ranks left keeps
    its `for:` too."""
    hold = c.windows.stale_hold
    last_scrape = (
        f"max by (node) (max_over_time((\n    max by (node) (timestamp(gpu_up))\n"
        f"    or max by (node) (timestamp(gpu_utilization_ratio))\n  )[{hold}:]))"
    )
    return (
        f"({RANK_INFO} or (\n  {held(c, RANK_INFO)}\n"
        f"  unless on(node) (group by (node) (gpu_up) or group by (node) (gpu_utilization_ratio))\n"
        f"  and on(instance, uuid, pod, rank) (\n"
        f"    max_over_time(timestamp({RANK_INFO})[{hold}:])\n"
        f"    >= on(node) group_left() {last_scrape}\n  )\n))"
    )


def _per_rank(c: RulesConfig, metric: str) -> str:
    """A per-GPU series as one series per rank, carrying the job's identity (info * value)."""
    info = _ranks(c)
    return f"max by ({RANK_BY}) ({info} * on(uuid) group_left() max by (uuid) ({metric}))"


def _records(c: RulesConfig) -> tuple[Record, ...]:
    t = c.thresholds
    # every per-GPU input and the ranks read across a missed scrape or an exporter restart (_across_gaps)
    tensor, power = _across_gaps(c, "gpu_tensor_active_ratio"), _across_gaps(c, "gpu_power_watts")
    limit = _across_gaps(c, "gpu_power_limit_watts")
    compute_idle = (
        f"(max by (uuid) ({tensor}) <= {num(t.training_idle_tensor_active_ratio)})\n"
        # without GPM (before Hopper) no tensor activity is known: a spinning collective draws little power
        "or on(uuid) (\n"
        f"  (max by (uuid) ({power}) / on(uuid) max by (uuid) ({limit}))\n"
        f"  <= {num(t.training_idle_power_ratio)}\n"
        f"  unless on(uuid) max by (uuid) ({tensor})\n"
        ")"
    )
    quiet = num(t.training_idle_interconnect_bytes_per_second)
    utilization = _across_gaps(c, "gpu_utilization_ratio")
    busy_idle = (
        f"max by (uuid) ({utilization}) >= {num(t.training_kernel_resident_ratio)}\n"
        f"and on(uuid) (\n{compute_idle}\n)\n"
        # "no traffic seen" rather than "traffic seen to be zero": a GPU whose driver has no PCIe
        # counters (NOT_SUPPORTED, never exported as 0) is judged by its compute alone
        f"unless on(uuid) (sum by (uuid) ({_across_gaps(c, PCIE_THROUGHPUT)}) > {quiet})\n"
        f"unless on(uuid) (sum by (uuid) ({_across_gaps(c, NVLINK_THROUGHPUT)}) > {quiet})"
    )
    info = _ranks(c)
    return (
        Record(RANK_TENSOR, _per_rank(c, tensor)),
        Record(RANK_SM_CLOCK, _per_rank(c, _across_gaps(c, "gpu_sm_clock_hertz"))),
        # 1 for a rank that holds a kernel but does no tensor work and moves no data, else 0
        Record(
            RANK_BUSY_IDLE,
            f"max by ({RANK_BY}) (\n  {info} * on(uuid) group_left() (\n"
            f"{busy_idle}\n  ) * 0 + 1\n)\nor on(uuid)\nmax by ({RANK_BY}) ({info}) * 0",
        ),
        Record(JOB_RANKS, f"count by ({JOB_BY}) (max by ({JOB_BY}, rank) ({info}))"),
        # a dead rank's process is gone with its series: the gang's size is what was seen lately
        Record(
            JOB_RANKS_SEEN,
            f"count by ({JOB_BY}) (max by ({JOB_BY}, rank) (last_over_time({RANK_INFO}[{c.windows.event}])))",
        ),
        Record(JOB_TENSOR, f"sum by ({JOB_BY}) ({RANK_TENSOR})"),
        # about one step's average: ranks sampled at other points of the step, or stopping a scrape
        # apart at a hang's onset, are not told apart from their gang by the phase they were caught in
        # (the scraped samples, not this group's records: those are one per evaluation interval)
        Record(
            RANK_TENSOR_STEP,
            _per_rank(c, f"avg_over_time(gpu_tensor_active_ratio[{c.windows.training_step}])"),
        ),
        # 1 for a rank whose GPU holds no kernel (a rank that waits on its host: loader, mount, loop)
        Record(
            RANK_NO_KERNEL,
            f"max by ({RANK_BY}) (\n  {info} * on(uuid) group_left() (\n"
            f"  max by (uuid) ({utilization}) <= {num(t.training_no_kernel_ratio)}\n  ) * 0 + 1\n)\n"
            f"or on(uuid)\nmax by ({RANK_BY}) ({info}) * 0",
        ),
        # 1 for a job split between ranks spinning in a collective and ranks with no kernel, and none
        # computing: the spinning ones wait for the idle ones; 0 for every other job with ranks
        Record(
            JOB_SPLIT,
            f"(\n  {JOB_RANKS} >= 2\n"
            f"  and on({JOB_BY}) (max by ({JOB_BY}) ({RANK_BUSY_IDLE}) == 1)\n"
            f"  and on({JOB_BY}) (max by ({JOB_BY}) ({RANK_NO_KERNEL}) == 1)\n"
            f"  and on({JOB_BY}) (min by ({JOB_BY}) ({RANK_BUSY_IDLE} + {RANK_NO_KERNEL}) == 1)\n"
            f") * 0 + 1\nor on({JOB_BY})\n{JOB_RANKS} * 0",
        ),
        # 1 for a rank with no kernel in a split job: the one the spinning ranks wait for; else 0
        Record(
            RANK_WAITED_ON,
            f"(\n  {RANK_NO_KERNEL} == 1\n  and on({JOB_BY}) ({JOB_SPLIT} == 1)\n) * 0 + 1\n"
            f"or on(uuid)\n{RANK_NO_KERNEL} * 0",
        ),
        # read + written through system calls by the rank's GPU processes (absent where io is unreadable)
        Record(
            RANK_IO,
            _per_rank(
                c,
                f"sum by (uuid) (rate({IO_READ}[{c.windows.training_stalled_rank_evidence}]))\n"
                f"+ on(uuid) sum by (uuid) (rate({IO_WRITE}[{c.windows.training_stalled_rank_evidence}]))",
            ),
        ),
        Record(
            RANK_HOST_CPU,
            _per_rank(c, f"sum by (uuid) (rate({HOST_CPU}[{c.windows.training_stalled_rank_evidence}]))"),
        ),
        *_progress_records(c),
    )


def _progress_records(c: RulesConfig) -> tuple[Record, ...]:
    """A job's progress signal, where the exporter reads one (its log's step lines, or a counter it
    serves): seconds since any of its ranks' steps changed, how often they change, and whether the
    job is moving. Absent for a job without the signal: the GPU-shape rules alone judge it."""
    t = c.thresholds
    n, moving = num(t.training_progress_update_intervals), num(t.training_progress_moving_seconds)
    return (
        # read over `stale_hold`: a missed scrape or an exporter restart neither blanks the stall (nor
        # the veto of a job that moves) nor restarts TrainingJobNoProgress's `for:`; a new step counts
        # at once (the newest timestamp of the job's ranks is its last step)
        Record(JOB_STALL, f"time() - max by ({JOB_BY}) ({_across_gaps(c, PROGRESS_LAST)})"),
        Record(JOB_INTERVAL, f"max by ({JOB_BY}) ({_across_gaps(c, PROGRESS_INTERVAL)})"),
        # 1 while the step changed within n update intervals, and at most `moving` seconds ago (one
        # change seen, no interval yet: within `moving`); 0 for a job whose steps stopped
        Record(
            JOB_MOVING,
            f"(\n  {JOB_STALL} <= on({JOB_BY}) clamp_max({JOB_INTERVAL} * {n}, {moving})\n"
            f"  or on({JOB_BY}) ({JOB_STALL} <= {moving} unless on({JOB_BY}) {JOB_INTERVAL})\n"
            f") * 0 + 1\nor on({JOB_BY})\n{JOB_STALL} * 0",
        ),
    )


def _not_moving(c: RulesConfig) -> str:
    """What a GPU-shape hang alert adds where the job has a progress signal: its steps stopped too,
    and no TrainingJobNoProgress already fires for it (one hang alert per job at a time)."""
    return (
        f"unless on({JOB_BY}) ({JOB_MOVING} == 1)\n"
        f'unless on({JOB_BY}) max by ({JOB_BY}) (ALERTS{{alertname="{NO_PROGRESS}", alertstate="firing"}})'
    )


def _no_progress(c: RulesConfig) -> str:
    """TrainingJobNoProgress: no step for n of the job's update intervals and at least the floor, where
    no GPU-shape hang alert already names the job (pending or firing: it is the more precise one)."""
    t = c.thresholds
    n, floor = num(t.training_progress_update_intervals), num(t.training_progress_floor_seconds)
    shape = "|".join(SHAPE_HANGS)
    return (
        f"(\n  {JOB_STALL} > on({JOB_BY}) clamp_min({JOB_INTERVAL} * {n}, {floor})\n"
        # a job that changed its step once since the exporter started has no interval: the floor alone
        f"  or on({JOB_BY}) ({JOB_STALL} > {floor} unless on({JOB_BY}) {JOB_INTERVAL})\n)\n"
        f'unless on({JOB_BY}) max by ({JOB_BY}) (ALERTS{{alertname=~"{shape}", layer="training"}})'
    )


def _stalled(c: RulesConfig, ranks_of_lost: str) -> str:
    """TrainingRankStalled: the idle ranks of a job split between spinning and idle ranks, held long
    enough; `evidence` says what the idle rank's process shows (or `none` where its I/O is unknown)."""
    t, w = c.thresholds, c.windows

    def waited(window: str) -> str:
        # split and idle at every evaluation of the window, and the rank already there at its start
        # (a fresh record's short history is no proof of a long wait)
        return (
            f"(min_over_time({RANK_WAITED_ON}[{window}]) == 1)\n"
            f"and on(uuid) max by (uuid) (last_over_time({RANK_INFO}[{w.stale_hold}] offset {window}))"
        )

    quiet = f"and on(uuid) ({RANK_IO} < {num(t.training_stalled_io_bytes_per_second)})"
    evidence = f"{waited(w.training_stalled_rank_evidence)}\n{quiet}"
    disk_sleep = (
        f'max by (uuid) (min_over_time({PROCESS_STATE}{{state="disk_sleep"}}'
        f"[{w.training_stalled_rank_evidence}])) == 1"
    )
    cpu_bound = f"{RANK_HOST_CPU} >= {num(t.training_wedged_cpu_cores)}"

    def tagged(value: str, *parts: str) -> str:
        body = "\n".join(parts)
        return f'label_replace(\n{body},\n"evidence", "{value}", "", ""\n)'

    suspects = "\nor\n".join(
        (
            tagged("disk_sleep", evidence, f"and on(uuid) ({disk_sleep})"),
            tagged("cpu_bound", evidence, f"and on(uuid) ({cpu_bound})", f"unless on(uuid) ({disk_sleep})"),
            # asleep with no I/O looks like a loader stall (the main process waits on its workers,
            # whose reads are theirs): the long window, as where I/O is unknown
            tagged(
                "blocked",
                waited(w.training_stalled_rank),
                quiet,
                f"unless on(uuid) ({disk_sleep})",
                f"unless on(uuid) ({cpu_bound})",
            ),
            # io unknown: only the long window; a rank seen moving bytes is a writer or a loader, never this
            tagged("none", waited(w.training_stalled_rank), f"unless on(uuid) ({RANK_IO})"),
        )
    )
    # a rank waiting on a lost GPU's rank is TrainingJobNodeFault's (its ladder cordons first)
    return f"(\n{suspects}\n)\nunless on({JOB_BY}) max by ({JOB_BY}) (\n{ranks_of_lost}\n)\n{_not_moving(c)}"


def ranks_in_incident(c: RulesConfig) -> str:
    """The GPUs of every rank of a job a training alert fires for: their idle warnings are the job's
    incident, not one more per GPU (usage.py's GPUIdleWhileAllocated keeps out of them). Ranks seen
    within the idle warning's window (`idle_allocated`): a dead rank's GPU stays allocated to its pod
    with no process."""
    seen = c.windows.idle_allocated
    return (
        f"max by (uuid) (\n  last_over_time({RANK_INFO}[{seen}])\n  * on({JOB_BY}) group_left()\n"
        f'  max by ({JOB_BY}) (ALERTS{{alertstate="firing", layer="training", target_kind="job"}})\n)'
    )


def training_file(c: RulesConfig) -> RuleFile:
    """alerts/training.rules.yaml."""
    t, w = c.thresholds, c.windows
    bus, reset = xid_class("fell_off_bus"), xid_class("reset_gpu")
    matcher = f'xid=~"{bus.regex}|{reset.regex}"'
    xids = events("gpu_xid_errors_total", matcher, w.event, f"{GPU_BY}, xid")
    lost = (
        f"max by ({GPU_BY}) (\n{xids}\n)\n"
        f"or on(uuid)\n(max by ({GPU_BY}) ({_across_gaps(c, 'gpu_up')}) == 0)\n"
        f"unless on(uuid) (max by (uuid) ({_across_gaps(c, 'gpupulse_gpu_stale')}) == 1)"
    )
    ranks_of_lost = (
        f"max by ({RANK_BY}) (\n  last_over_time({RANK_INFO}[{w.event}])\n"
        f"  * on(uuid) group_left() max by (uuid) (\n{lost}\n  )\n)"
    )
    median_clock = f"quantile by ({JOB_BY}) (0.5, {RANK_SM_CLOCK})"
    # a clock held down by a limiter, not one that dropped because the GPU idles (gpu_idle)
    clock_events = _across_gaps(c, f'gpu_clock_event_active{{reason=~"{THROTTLE_REASONS}"}}')
    throttled = f"max by (uuid) ({clock_events}) == 1"
    median_tensor = f"quantile by ({JOB_BY}) (0.5, {RANK_TENSOR_STEP})"
    two_ranks = f"on({JOB_BY}) ({JOB_RANKS} >= 2)"
    straggler = (
        "label_replace(\n"
        f"  {RANK_SM_CLOCK}\n"
        f"  < on({JOB_BY}) group_left() ({median_clock} * {num(t.training_straggler_clock_ratio)})\n"
        f"  and {two_ranks}\n"
        f"  and on(uuid) ({throttled}),\n"
        '  "signal", "sm_clock", "", ""\n)\n'
        "or\n"
        "label_replace(\n"
        f"  {RANK_TENSOR_STEP}\n"
        f"  - on({JOB_BY}) group_left() {median_tensor}\n"
        f"  > {num(t.training_straggler_tensor_margin_ratio)}\n"
        f"  and {two_ranks},\n"
        '  "signal", "tensor_active", "", ""\n)'
    )
    rules = (
        alert(
            c,
            "TrainingJobHung",
            # every running rank (the least busy-idle of them is 1) of a gang of at least two ranks
            # seen lately: of a 2-rank job whose rank died, one rank runs; the value is the running ones
            expr=(
                f"{JOB_RANKS}\n"
                f"and on({JOB_BY}) ({JOB_RANKS_SEEN} >= 2)\n"
                f"and on({JOB_BY}) (min by ({JOB_BY}) (max by ({JOB_BY}, rank) ({RANK_BUSY_IDLE})) == 1)\n"
                # the ranks that wait for a rank whose GPU is lost: TrainingJobNodeFault's, which also
                # cordons the node (a restart alone would bring the job back onto it)
                f"unless on({JOB_BY}) max by ({JOB_BY}) (\n{ranks_of_lost}\n)\n"
                # a job whose steps still move is slow, not hung (where it gives a progress signal)
                f"{_not_moving(c)}"
            ),
            severity="critical",
            layer="training",
            fault_class="training_hang",
            target_kind="job",
            summary="Every rank of a training job holds a kernel but does no work.",
            description=(
                f"Every running rank of {_JOB_TEXT} ({{{{ $value }}}} of them) has kept a kernel resident "
                f"for {c.for_('TrainingJobHung')} with tensor activity at or below "
                f"{num(t.training_idle_tensor_active_ratio)} and PCIe and NVLink traffic at or below "
                f"{num(t.training_idle_interconnect_bytes_per_second)} B/s: a collective waits for a rank "
                "that never arrives (a dead or wedged rank, a lost peer). The job makes no progress."
            ),
        ),
        alert(
            c,
            "TrainingRankStalled",
            expr=_stalled(c, ranks_of_lost),
            severity="critical",
            layer="training",
            fault_class="training_hang",
            target_kind="job",
            summary="A training job is hung on one rank: it holds no kernel while the others wait for it.",
            description=(
                f"{_RANK_TEXT} of {_JOB_TEXT} has held no kernel (utilization at or below "
                f"{num(t.training_no_kernel_ratio)}) while every other rank spins in a collective with no "
                "tensor work and no traffic, for "
                f"{w.training_stalled_rank_evidence} with its process moving under "
                f"{num(t.training_stalled_io_bytes_per_second)} B/s in state D or burning "
                f"{num(t.training_wedged_cpu_cores)} cores (else {w.training_stalled_rank}), then "
                f"{c.for_('TrainingRankStalled')}. Its process shows "
                "{{ $labels.evidence }} (disk_sleep: stuck in the kernel, e.g. on a hung mount; cpu_bound: "
                "a loop burning a core; blocked, after the long window: asleep with no I/O, e.g. a "
                "data-loader deadlock or a restarted rank waiting in rendezvous; none, after the long "
                "window: I/O unknown). The job makes no progress."
            ),
        ),
        alert(
            c,
            "TrainingRankStraggler",
            expr=straggler,
            severity="warning",
            layer="training",
            fault_class="training_straggler",
            target_kind="job",
            summary="One rank of a training job is out of step with its gang.",
            description=(
                f"{_RANK_TEXT} of {_JOB_TEXT} is out of step with the median rank of its job "
                "({{ $labels.signal }}: "
                f"SM clock below {num(t.training_straggler_clock_ratio)} x the median, or tensor activity "
                f"more than {num(t.training_straggler_tensor_margin_ratio)} above it while the others wait) "
                f"for {c.for_('TrainingRankStraggler')}. A synchronous job runs at its slowest rank's pace."
            ),
        ),
        alert(
            c,
            "TrainingJobDegraded",
            expr=(
                f"avg_over_time({JOB_TENSOR}[{w.training_throughput}])\n"
                f"< on({JOB_BY}) (\n"
                f"  avg_over_time({JOB_TENSOR}[{w.baseline}] offset {w.baseline_offset})\n"
                f"  * {num(t.training_degraded_ratio)}\n)"
            ),
            severity="warning",
            layer="training",
            fault_class="training_degraded",
            target_kind="job",
            summary="A training job runs well below its own recent pace.",
            description=(
                f"{_JOB_TEXT}'s summed tensor activity over {w.training_throughput} is "
                # an average of a sum of ratios: its far decimals are noise
                f'{{{{ $value | printf "%.2f" }}}}, '
                f"below {num(t.training_degraded_ratio)} x its average over the {w.baseline} ending "
                f"{w.baseline_offset} ago, for {c.for_('TrainingJobDegraded')}."
            ),
        ),
        alert(
            c,
            "TrainingJobNodeFault",
            expr=ranks_of_lost,
            severity="critical",
            layer="training",
            fault_class="training_node_fault",
            target_kind="job",
            summary="A GPU under a rank of a training job fell off the bus or needs a reset.",
            description=(
                f"{_RANK_TEXT} of {_JOB_TEXT} lost its GPU (XID 79, a reset-class XID, or gpu_up 0). "
                "The job cannot continue on this node; it must restart elsewhere from its last checkpoint."
            ),
        ),
        # last: it reads this evaluation's ALERTS of the GPU-shape hang alerts above
        alert(
            c,
            NO_PROGRESS,
            expr=_no_progress(c),
            severity="critical",
            layer="training",
            fault_class="training_hang",
            target_kind="job",
            summary="A training job has logged or served no new step for many of its step intervals.",
            description=(
                f"{_JOB_TEXT} has given no new training step for "
                "{{ $value | humanizeDuration }}: more than "
                f"{num(t.training_progress_update_intervals)} of its update intervals (the median time "
                "between its step changes) and more than "
                f"{num(t.training_progress_floor_seconds)} s, then {c.for_(NO_PROGRESS)}. Its step "
                "comes from its own log's step lines or the counter it serves "
                "(gpu_training_progress_steps_total). Nothing on its GPUs names a suspect rank: the ranks "
                "may all wait on their hosts (a shared mount, the data pipeline, a deadlock), or compute "
                "without finishing a step. The job makes no progress."
            ),
        ),
    )
    # one group, records first: rules of a group run in order, so an alert sees this evaluation's
    # records rather than the previous one's (one interval sooner)
    return RuleFile("training", (Group("gpupulse.training", _records(c) + rules, scope="fleet"),))
