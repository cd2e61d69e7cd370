"""Recording rules (level:metric:operations): activity, allocation and cost, memory limits, latency, KV cache,
fragmentation, energy and cost per token."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.model import Group, Record, RuleFile
from alerts.rules.promql import histogram_quantile_of, num

# Names other rule files and the dashboards join on.
SM_ACTIVITY = "uuid:gpu_sm_activity:ratio"
ALLOCATION_SHARE = "uuid_namespace_pod:gpu_allocation:share"
ALLOCATION_SOLE = "uuid_namespace_pod:gpu_allocation:sole"
USAGE_SHARE = "uuid_namespace_pod:gpu_usage:share"
POD_MEMORY = "namespace_workload_pod:gpu_process_memory_used_bytes:sum"
SOFT_LIMIT = "namespace_workload:gpu_process_memory_soft_limit_bytes:quantile"
HARD_LIMIT = "namespace_workload:gpu_process_memory_hard_limit_bytes:quantile"
WORKLOAD_MEMORY = "namespace_workload:gpu_process_memory_used_bytes:max"
ABOVE_HARD_LIMIT = "namespace_workload:gpu_process_memory_above_hard_limit:bool"
# Per run (pod and pid): its start (unix seconds); its start while its pod is above the hard limit;
# 1 for a run accepted as a new normal. Per pod: the start of its first run that went above its hard
# limit and was not accepted (the pod's memory is not learned from then on).
RUN_START = "namespace_workload_pod_pid:gpu_process_start_time_seconds:min"
RUN_ABOVE_HARD_LIMIT = "namespace_workload_pod_pid:gpu_process_memory_above_hard_limit_start_time_seconds:min"
RUN_NEW_NORMAL = "namespace_workload_pod_pid:gpu_process_memory_new_normal:present"
POD_LEAKED_SINCE = "namespace_workload_pod:gpu_process_memory_leaked_start_time_seconds:min"
# the soft and hard quantiles of the learned history (label quantile="soft" / "hard")
LEARNED_QUANTILES = "namespace_workload:gpu_process_memory_learned_bytes:quantile"
KV_HIT_RATIO_POD = "namespace_pod_model:inference_kv_cache_hit_ratio:rate"
MODEL_GPU_SHARE = "uuid_namespace_pod_model:inference_engine_gpu:share"
MODEL_GPUS = "namespace_model:inference_engine_gpu:sum"
MODEL_ENERGY_RATE = "namespace_model:gpu_energy_joules:rate"
MODEL_PROMPT_TOKENS_RATE = "namespace_model:inference_prompt_tokens:rate"
MODEL_GENERATION_TOKENS_RATE = "namespace_model:inference_generation_tokens:rate"
MODEL_ENERGY_PER_TOKEN = "namespace_model:gpu_energy_joules_per_generated_token:ratio"
MODEL_COST_PER_MILLION_TOKENS = "namespace_model:gpu_cost_per_million_generated_tokens:ratio"
HISTOGRAMS = (
    "inference_request_latency_seconds",
    "inference_time_to_first_token_seconds",
    "inference_inter_token_latency_seconds",
    "inference_batch_latency_seconds",
)
QUANTILES = {"p50": 0.5, "p99": 0.99}

# Pod name -> owning workload, most specific last (each later match overrides): StatefulSet
# `name-N`, DaemonSet/Job `name-xxxxx`, Deployment `name-<template hash>-xxxxx`. The characters are
# Kubernetes' random-suffix alphabet (no vowels), so ordinary words like `-small` are not stripped.
_SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]"
_WORKLOAD_PATTERNS = ("(.+)", "(.+)-[0-9]+", f"(.+)-{_SUFFIX}{{5}}", f"(.+)-{_SUFFIX}{{6,10}}-{_SUFFIX}{{5}}")


_ATTRIBUTED_PROCESS_MEMORY = 'gpu_process_memory_used_bytes{pod!=""}'


def latency_quantile_name(level: str, histogram: str, quantile: str) -> str:
    """Name of the recorded quantile of one inference histogram at one aggregation level."""
    return f"{level}:{histogram}:{quantile}"


def with_workload(selector: str) -> str:
    """Wrap a vector selector so that every series gains a `workload` label derived from `pod`."""
    expr = selector
    for pattern in _WORKLOAD_PATTERNS:
        expr = f'label_replace({expr}, "workload", "$1", "pod", "{pattern}")'
    return expr


def _activity(c: RulesConfig) -> Group:
    t = c.thresholds
    return Group(
        "gpupulse.activity-and-cost",
        (
            Record(
                SM_ACTIVITY,
                # GPM's SM activity where the GPU has it (Hopper+); NVML's coarser "a kernel was
                # running" share elsewhere. `source` says which, so nobody compares the two unknowingly.
                """
                label_replace(gpu_sm_active_ratio, "source", "gpm", "__name__", ".*")
                or on(uuid)
                label_replace(gpu_utilization_ratio, "source", "nvml_utilization", "__name__", ".*")
                """,
            ),
            Record(
                ALLOCATION_SHARE,
                # A GPU shared by k containers (time-slicing, MPS) counts 1/k to each, so sums stay GPUs.
                """
                group by (node, uuid, gpu, namespace, pod, container) (gpu_allocation_info)
                / on(uuid) group_left()
                count by (uuid) (group by (uuid, namespace, pod, container) (gpu_allocation_info))
                """,
            ),
            Record(ALLOCATION_SOLE, f"{ALLOCATION_SHARE} == 1"),
            Record(
                USAGE_SHARE,
                # Who pays for a shared GPU: each holding pod's part of the GPU's summed per-process SM
                # utilization where NVML reports it (a holder without a running process gets 0), else
                # (no process samples, MIG, or all idle) the even allocation share. Sums stay GPUs.
                f"""
                (
                  (
                    group by (node, uuid, namespace, pod) (gpu_allocation_info)
                    * on(uuid, namespace, pod) group_left()
                    sum by (uuid, namespace, pod) (gpu_process_sm_utilization_ratio{{pod!=""}})
                  )
                  or
                  group by (node, uuid, namespace, pod) (gpu_allocation_info) * 0
                )
                / on(uuid) group_left()
                (
                  sum by (uuid) (
                    group by (node, uuid, namespace, pod) (gpu_allocation_info)
                    * on(uuid, namespace, pod) group_left()
                    sum by (uuid, namespace, pod) (gpu_process_sm_utilization_ratio{{pod!=""}})
                  ) > 0
                )
                or on(uuid, namespace, pod)
                sum by (node, uuid, namespace, pod) ({ALLOCATION_SHARE})
                """,
            ),
            Record(
                "namespace:gpu_sm_activity:avg",
                f"""
                avg by (namespace, source) (
                  group by (uuid, namespace) ({ALLOCATION_SHARE})
                  * on(uuid) group_left(source) {SM_ACTIVITY}
                )
                """,
            ),
            Record("namespace:gpu_allocated:sum", f"sum by (namespace) ({USAGE_SHARE})"),
            Record(
                "namespace:gpu_idle_allocated:sum",
                f"""
                sum by (namespace) (
                  {USAGE_SHARE}
                  * on(uuid) group_left() ({SM_ACTIVITY} < bool {num(t.idle_sm_activity_ratio)})
                )
                """,
            ),
            Record(
                "namespace:gpu_allocated_cost_per_hour:sum",
                f"namespace:gpu_allocated:sum * {num(c.cost.price_per_gpu_hour)}",
                labels={"currency": c.cost.currency},
            ),
            Record(
                "namespace:gpu_idle_cost_per_hour:sum",
                f"namespace:gpu_idle_allocated:sum * {num(c.cost.price_per_gpu_hour)}",
                labels={"currency": c.cost.currency},
            ),
        ),
        scope="fleet",
    )


def _fragmentation(c: RulesConfig) -> Group:
    gang = num(c.thresholds.gang_size_gpus)
    return Group(
        "gpupulse.fragmentation",
        (
            Record(
                "node:gpu_free:count",
                # Healthy GPUs nobody holds; nodes with none free report 0 rather than vanishing.
                """
                count by (node) ((gpu_up == 1) unless on(uuid) gpu_allocation_info)
                or on(node)
                (count by (node) (gpu_up) * 0)
                """,
            ),
            Record(":gpu_free:sum", "sum(node:gpu_free:count)"),
            Record(
                ":gpu_free_on_gang_nodes:sum",
                # 0 rather than nothing when no node fits a gang; per cluster, as the sum is
                f"sum(node:gpu_free:count >= {gang}) or sum(node:gpu_free:count) * 0",
            ),
            Record(
                ":gpu_gang_slots:sum",
                # How many gang jobs of `gang_size_gpus` GPUs on one node fit right now: the seed's
                # "20 free GPUs, yet no 8 together" is :gpu_free:sum 20 with this at 0.
                f"sum(floor(node:gpu_free:count / {gang}))",
            ),
        ),
        scope="fleet",
    )


def _memory(c: RulesConfig) -> tuple[Group, Group]:
    """Per-workload memory and the limits learned from its healthy time.

    A limit learned from the whole history learns the leak: a leak that returns after every restart
    raises its own hard limit, each return is caught later, and a daily one stops firing. So the
    limits learn only from runs (process lives: pod and pid) that later proved healthy. Recording
    rules cannot take back what they have recorded, so the learned history is not recorded: each
    evaluation recomputes it over `memory_history` (a subquery) and drops, in all of it, a pod's time
    from the start of its first run that is *now* known to have gone above its hard limit (`@ end()`):
    the whole run-up, however long it took, and the pod's later runs too (one series per pod, where
    one per run would not fit promtool's 10,000-sample query limit), until that run leaves the history.
    Only samples older than `memory_history_offset` are learned, so a run-up in progress does not
    raise its own limit before it crosses it (one longer than that is learned while it climbs, the
    same on every return).
    A workload above its hard limit for the whole of `memory_history_offset` has a new normal, not a
    leak (a leak is freed by its restart): its runs above it over that time (restarts included) are
    accepted, and stay accepted (a latch) while
    they could still be dropped, so the limit that followed them does not fall back once they are
    below it. While a workload has nothing left to learn from (a leak that keeps returning), each limit
    keeps its last value instead of vanishing.
    Every read of another group's output looks back over `memory_limit_hold` (several of that group's
    intervals), never at the edge of one interval: Prometheus 3's left-open lookback drops a sample
    written exactly one interval earlier.
    """
    w, t = c.windows, c.thresholds
    delay, hold = w.memory_history_offset, w.memory_limit_hold
    run = "node, namespace, workload, pod, pid"
    run_on = "node, namespace, pod, pid"
    held_hard = f"last_over_time({HARD_LIMIT}[{hold}])"
    process = with_workload(_ATTRIBUTED_PROCESS_MEMORY)
    current = Group(
        "gpupulse.memory",
        (
            Record(
                POD_MEMORY,
                f"sum by (node, namespace, workload, pod) ({process})",
            ),
            Record(WORKLOAD_MEMORY, f"max by (namespace, workload) ({POD_MEMORY})"),
            Record(
                ABOVE_HARD_LIMIT,
                f"{WORKLOAD_MEMORY} > bool on(namespace, workload) {held_hard}",
            ),
            Record(
                # when each run (process life: pod and pid) was first seen, carried from evaluation to
                # evaluation while the process is there
                RUN_START,
                f"""
                (last_over_time({RUN_START}[{hold}]) and on({run_on}) {process})
                or
                (group by ({run}) ({process}) * 0 + time())
                """,
            ),
            Record(
                # the start of each run of a pod above its hard limit now; nothing otherwise
                RUN_ABOVE_HARD_LIMIT,
                f"""
                {RUN_START}
                and on(node, namespace, pod)
                ({POD_MEMORY} > on(namespace, workload) group_left() {held_hard})
                """,
            ),
        ),
        scope="fleet",
    )
    soft_q, hard_q = num(t.memory_soft_limit_quantile), num(t.memory_hard_limit_quantile)
    gap = num(1 + t.memory_limit_gap_ratio)
    # The pods' memory `delay` ago, less every pod while it ran a run that started no earlier than
    # the first of its runs known now to have leaked.
    learned = f"""
                  max by (namespace, workload) (
                    {POD_MEMORY} offset {delay}
                    unless on(node, namespace, pod)
                    (
                      {RUN_START} offset {delay}
                      >= on(node, namespace, pod) group_left()
                      {POD_LEAKED_SINCE} @ end()
                    )
                  )"""

    def history(q: str, quantile: str) -> str:
        return (
            f"label_replace(quantile_over_time({q}, ({learned}\n                  )[{w.memory_history}:"
            f'{w.memory_history_interval}]), "quantile", "{quantile}", "", "")'
        )

    # A limit's last value, held while the workload still runs and there is nothing healthy to learn
    # from; looked up over a few of the group's intervals so one late evaluation does not drop it.
    def held(name: str) -> str:
        return f"(last_over_time({name}[{hold}]) and on(namespace, workload) {WORKLOAD_MEMORY})"

    candidates = _leak_candidate(w.memory_history, delay)
    limits = Group(
        "gpupulse.memory-limits",
        (
            Record(
                RUN_NEW_NORMAL,
                f"""
                (
                  group by ({run}) (min_over_time({RUN_ABOVE_HARD_LIMIT}[{delay}]))
                  and on(namespace, workload)
                  (min_over_time({ABOVE_HARD_LIMIT}[{delay}]) == 1)
                )
                or
                (last_over_time({RUN_NEW_NORMAL}[{hold}]) and on({run_on}) {candidates})
                """,
            ),
            Record(
                POD_LEAKED_SINCE,
                f"""
                min by (node, namespace, workload, pod) (
                  {candidates}
                  unless on({run_on})
                  {RUN_NEW_NORMAL}
                )
                """,
            ),
            Record(
                # both learned quantiles in one rule: the history is recomputed once per quantile
                LEARNED_QUANTILES,
                f"""
                {history(soft_q, "soft")}
                or
                {history(hard_q, "hard")}
                """,
            ),
            Record(
                SOFT_LIMIT,
                f'max without (quantile) ({LEARNED_QUANTILES}{{quantile="soft"}})\n'
                f"or on(namespace, workload)\n{held(SOFT_LIMIT)}",
            ),
            Record(
                HARD_LIMIT,
                # The seed wants P99.9 as the hard limit and the limits 20% apart; where P99.9 sits
                # closer than that to P95 the gap wins, so the hard limit (which restarts) is never tight.
                f"""
                max by (namespace, workload) (
                  {LEARNED_QUANTILES}{{quantile="hard"}}
                  or
                  ({SOFT_LIMIT} * {gap} and on(namespace, workload) {LEARNED_QUANTILES}{{quantile="hard"}})
                )
                or on(namespace, workload)
                {held(HARD_LIMIT)}
                """,
            ),
        ),
        interval=w.memory_history_interval,
        scope="fleet",
    )
    return current, limits


def _leak_candidate(history: str, delay: str) -> str:
    """The start of each run above its hard limit at some time over the learned history or since."""
    above = RUN_ABOVE_HARD_LIMIT
    return f"(min_over_time({above}[{history}] offset {delay}) or min_over_time({above}[{delay}]))"


def _latency(c: RulesConfig) -> Group:
    rules: list[Record] = []
    for histogram in HISTOGRAMS:
        for level, by in (
            ("namespace_pod_model", "node, namespace, pod, model"),
            ("namespace_model", "namespace, model"),
        ):
            for qname, q in QUANTILES.items():
                rules.append(
                    Record(
                        latency_quantile_name(level, histogram, qname),
                        # classic buckets, or the native histogram that replaces them on a Prometheus 3
                        # converting classic histograms (kube-prometheus-stack convertClassicHistogramsToNHCB)
                        histogram_quantile_of(q, histogram, by, c.windows.rate),
                    )
                )
    return Group("gpupulse.latency", tuple(rules), scope="fleet")


def _kv_cache(c: RulesConfig) -> Group:
    rate = c.windows.rate
    rules: list[Record] = []
    for level, by in (
        ("namespace_pod_model", "node, namespace, pod, model"),
        ("namespace_model", "namespace, model"),
    ):
        on = "namespace, pod, model" if level == "namespace_pod_model" else "namespace, model"
        rules.append(
            Record(
                f"{level}:inference_kv_cache_hit_ratio:rate",
                # Engines that count hits and queries give a true ratio of sums; engines that only
                # publish a ratio are passed through. `source` tells the two apart.
                f"""
                label_replace(
                  sum by ({by}) (rate(inference_kv_cache_hits_total[{rate}]))
                  / (sum by ({by}) (rate(inference_kv_cache_queries_total[{rate}])) > 0),
                  "source", "counters", "__name__", ".*"
                )
                or on({on})
                label_replace(
                  avg by ({by}) (inference_kv_cache_hit_ratio), "source", "engine_ratio", "__name__", ".*"
                )
                """,
            )
        )
    return Group("gpupulse.kv-cache", tuple(rules), scope="fleet")


def _tokens(c: RulesConfig) -> Group:
    rate = c.windows.rate
    engine_gpu = "group by (node, namespace, pod, model, uuid) (inference_engine_gpu_info)"
    return Group(
        "gpupulse.tokens",
        (
            Record(
                MODEL_GPU_SHARE,
                # Each GPU a model runs on (a tensor-parallel engine has one row per GPU), weighted by
                # its pod's allocation share of that GPU; an engine on a GPU no pod holds (a static
                # target) takes 1/k of it, k the models seen on that GPU.
                f"""
                (
                  {engine_gpu}
                  * on(namespace, pod, uuid) group_left()
                  sum by (namespace, pod, uuid) ({USAGE_SHARE})
                )
                or
                (
                  {engine_gpu}
                  / on(uuid) group_left()
                  count by (uuid) ({engine_gpu})
                )
                """,
            ),
            Record(MODEL_GPUS, f"sum by (namespace, model) ({MODEL_GPU_SHARE})"),
            Record(
                MODEL_ENERGY_RATE,
                # Joules per second (watts) of the model's GPUs by the same shares; max by uuid so a
                # GPU scraped by two exporters (an HA pair) counts once.
                f"""
                sum by (namespace, model) (
                  {MODEL_GPU_SHARE}
                  * on(uuid) group_left()
                  max by (uuid) (rate(gpu_energy_joules_total[{rate}]))
                )
                """,
            ),
            Record(
                MODEL_PROMPT_TOKENS_RATE,
                f"sum by (namespace, model) (rate(inference_prompt_tokens_total[{rate}]))",
            ),
            Record(
                MODEL_GENERATION_TOKENS_RATE,
                f"sum by (namespace, model) (rate(inference_generation_tokens_total[{rate}]))",
            ),
            Record(
                MODEL_ENERGY_PER_TOKEN,
                f"{MODEL_ENERGY_RATE} / ({MODEL_GENERATION_TOKENS_RATE} > 0)",
            ),
            Record(
                MODEL_COST_PER_MILLION_TOKENS,
                # GPU-seconds per generated token at the price per GPU-hour, for a million tokens.
                f"{MODEL_GPUS} * {num(c.cost.price_per_gpu_hour)} / 3600 * 1e6"
                f" / ({MODEL_GENERATION_TOKENS_RATE} > 0)",
                labels={"currency": c.cost.currency},
            ),
        ),
        scope="fleet",
    )


def recording_file(c: RulesConfig) -> RuleFile:
    """alerts/recording.rules.yaml."""
    memory, limits = _memory(c)
    groups = (_activity(c), _fragmentation(c), memory, limits, _latency(c), _kv_cache(c), _tokens(c))
    return RuleFile("recording", groups)
