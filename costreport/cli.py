"""`gpupulse report`: the month-end GPU usage and cost report, from the cluster's Prometheus.

Exit status: 0 report printed; 2 bad arguments (a URL that is not http(s), a step shorter than
MIN_SCRAPES_PER_STEP scrape intervals, a step that leaves fewer than MIN_STEPS_PER_PERIOD steps in the
period among them); 3 Prometheus unreachable or answering errors; 4 the period holds no GPU
allocation data.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import urllib.parse
from collections.abc import Sequence
from datetime import UTC, datetime

from costreport.prom import PrometheusClient, PrometheusUnavailable, ScrapeInterval
from costreport.render import FORMATS, render
from costreport.usage import DEFAULT_IDLE_SM_ACTIVITY_RATIO, NoData, build_report
from gpupulse.cliargs import Parser
from gpupulse.durations import format_duration, parse_flag_duration
from gpupulse.version import package_version

EXIT_USAGE = 2
EXIT_PROMETHEUS = 3
EXIT_NO_DATA = 4

# Energy and tokens per step are the increase of a counter over the step, which needs two samples in
# it; Prometheus 3 counts a sample on a window's left edge out, so a step of two intervals can hold one
# and yield nothing. Three intervals still hold two samples when one scrape is missed.
MIN_SCRAPES_PER_STEP = 3
# the counter whose targets' scrape interval bounds the step (the exporters')
STEP_COUNTER = "gpu_energy_joules_total"
# Prometheus' default, assumed where the server cannot say (a query frontend) and no flag does
DEFAULT_SCRAPE_INTERVAL_SECONDS = 60.0
# Each step counts a GPU held for the whole step from one sample, so a pod that came or went within a
# step is off by up to one step: with too few steps in the period that error is the report (10 minutes
# at 5 m steps read 0.92 GPU-hours where 15 s steps read 0.50). A step must leave at least this many
# steps in the period; without --step the report takes DEFAULT_STEP_SECONDS, or period /
# AUTO_STEPS_PER_PERIOD where that is shorter (never under MIN_SCRAPES_PER_STEP scrape intervals).
MIN_STEPS_PER_PERIOD = 10
AUTO_STEPS_PER_PERIOD = 20
DEFAULT_STEP_SECONDS = 300.0


class _Usage(Exception):
    pass


def _instant(text: str) -> float:
    """RFC 3339 (a trailing Z allowed) or Unix seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise _Usage(f"not a time: {text!r} (RFC 3339, e.g. 2026-11-01T00:00:00Z, or Unix seconds)") from None
    if moment.tzinfo is None:
        raise _Usage(f"a time needs its offset: {text!r} (e.g. 2026-11-01T00:00:00Z)")
    return moment.timestamp()


def _month(text: str) -> tuple[float, float]:
    try:
        first = datetime.strptime(text, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise _Usage(f"not a month: {text!r} (YYYY-MM, e.g. 2026-11)") from None
    after = (
        first.replace(year=first.year + 1, month=1)
        if first.month == 12
        else first.replace(month=first.month + 1)
    )
    return first.timestamp(), after.timestamp()


def _previous_month(now: float) -> str:
    today = datetime.fromtimestamp(now, UTC)
    year, month = (today.year - 1, 12) if today.month == 1 else (today.year, today.month - 1)
    return f"{year:04d}-{month:02d}"


def _seconds(flag: str, text: str) -> float:
    try:
        seconds = parse_flag_duration(text)
    except ValueError as exc:
        raise _Usage(f"{flag}: {exc}") from None
    if seconds <= 0:
        raise _Usage(f"{flag}: must be longer than 0")
    return seconds


def period(args: argparse.Namespace, now: float) -> tuple[float, float]:
    chosen = [name for name in ("month", "last", "start") if getattr(args, name) is not None]
    if len(chosen) > 1:
        raise _Usage("choose one of --month, --last and --start/--end")
    if args.end is not None and args.start is None:
        raise _Usage("--end needs --start")
    if args.start is not None:
        start, end = _instant(args.start), (_instant(args.end) if args.end is not None else now)
    elif args.last is not None:
        start, end = now - _seconds("--last", args.last), now
    else:
        start, end = _month(args.month if args.month is not None else _previous_month(now))
    if end <= start:
        raise _Usage("the period ends before it starts")
    # a period still running is reported up to now
    return start, min(end, now)


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="gpupulse report",
        description="GPU-hours, idle GPU-hours, energy and cost per namespace and per model over a period, "
        "from gpupulse's recording rules in Prometheus. Default period: the previous calendar month (UTC).",
    )
    p.add_argument("--version", action="version", version=f"gpupulse {package_version()}")
    p.add_argument(
        "--prometheus.url",
        dest="url",
        default=os.environ.get("GPUPULSE_PROMETHEUS_URL", "http://127.0.0.1:9090"),
        help="Prometheus (or a Thanos/Mimir query frontend) base URL; env GPUPULSE_PROMETHEUS_URL. "
        "Default: %(default)s",
    )
    p.add_argument(
        "--prometheus.bearer-token-file", dest="token_file", help="file holding a bearer token to send"
    )
    p.add_argument(
        "--prometheus.timeout",
        dest="timeout",
        default="30s",
        help="per-query timeout (duration). Default: %(default)s",
    )
    p.add_argument("--month", help="a calendar month in UTC, YYYY-MM")
    p.add_argument("--last", help="the period ending now, a duration such as 7d or 24h")
    p.add_argument("--start", help="period start: RFC 3339 or Unix seconds")
    p.add_argument("--end", help="period end (default now): RFC 3339 or Unix seconds")
    p.add_argument(
        "--step",
        help="integration step (duration); shorter is finer and slower; at least "
        f"{MIN_SCRAPES_PER_STEP} scrape intervals, and at most 1/{MIN_STEPS_PER_PERIOD} of the period. "
        f"Default: {format_duration(DEFAULT_STEP_SECONDS)}, or 1/{AUTO_STEPS_PER_PERIOD} of a period "
        f"shorter than {AUTO_STEPS_PER_PERIOD} of them",
    )
    p.add_argument(
        "--scrape-interval",
        help="the exporters' scrape interval (duration); --step must be at least "
        f"{MIN_SCRAPES_PER_STEP} of it. Default: read from Prometheus (its targets, else its global "
        "scrape_interval), 1m where it cannot say",
    )
    p.add_argument("--format", choices=FORMATS, default="text", help="Default: %(default)s")
    p.add_argument(
        "--top", type=int, default=10, help="largest idle allocations to list. Default: %(default)s"
    )
    p.add_argument(
        "--idle-threshold",
        type=float,
        default=DEFAULT_IDLE_SM_ACTIVITY_RATIO,
        help="SM activity below which an allocated GPU counts idle for the per-pod list; keep it equal to "
        "your rules' idle_sm_activity_ratio. Default: %(default)s",
    )
    return p


def _prometheus_url(url: str) -> None:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise _Usage(
            f"--prometheus.url {url!r}: give the base URL with its scheme, e.g. http://{url or 'HOST:9090'}"
            if "://" not in url
            else f"--prometheus.url {url!r}: give an http:// or https:// URL"
        )


def auto_step(start: float, end: float, shortest: float) -> float:
    """The step without --step: DEFAULT_STEP_SECONDS, or 1/AUTO_STEPS_PER_PERIOD of a shorter period
    in whole seconds, and never under `shortest` (MIN_SCRAPES_PER_STEP scrape intervals) as long as
    the period still holds MIN_STEPS_PER_PERIOD of those."""
    step = min(DEFAULT_STEP_SECONDS, float(int((end - start) / AUTO_STEPS_PER_PERIOD)))
    if step < shortest <= (end - start) / MIN_STEPS_PER_PERIOD:
        step = float(math.ceil(shortest))
    return max(step, 1.0)


def _too_few_steps(what: str, start: float, end: float) -> str:
    longest = int((end - start) / MIN_STEPS_PER_PERIOD)
    fix = f"use --step {format_duration(longest)} or shorter" if longest >= 1 else "report a longer period"
    return (
        f"{what} leaves fewer than {MIN_STEPS_PER_PERIOD} steps in the {format_duration(end - start)} "
        "period: each step counts a GPU from one sample, so a pod that came or went within a step is "
        f"counted for the whole step; {fix}"
    )


def _usage_error(message: str) -> None:
    print(f"gpupulse report: error: {message}\nSee 'gpupulse report --help'.", file=sys.stderr)


def main(argv: Sequence[str] | None = None, now: float | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `gpupulse report ...` and `gpupulse-report ...` both work; the report is the one command so far
    if argv[:1] == ["report"]:
        argv = argv[1:]
    p = parser()
    args = p.parse_args(argv)
    try:
        _prometheus_url(args.url)
        start, end = period(args, time.time() if now is None else now)
        given_step = _seconds("--step", args.step) if args.step is not None else None
        timeout_seconds = _seconds("--prometheus.timeout", args.timeout)
        if not 0.0 <= args.idle_threshold <= 1.0:
            raise _Usage("--idle-threshold: a ratio between 0 and 1")
        if args.top < 0:
            raise _Usage("--top: 0 or more")
        if given_step is not None and given_step != int(given_step):
            raise _Usage("--step: whole seconds")
        if given_step is not None and given_step > (end - start) / MIN_STEPS_PER_PERIOD:
            raise _Usage(_too_few_steps(f"--step {format_duration(given_step)}", start, end))
        flag_interval = (
            ScrapeInterval(_seconds("--scrape-interval", args.scrape_interval), "--scrape-interval")
            if args.scrape_interval is not None
            else None
        )
        token = None
        if args.token_file:
            try:
                with open(args.token_file, encoding="utf-8") as f:
                    token = f.read().strip()
            except OSError as exc:
                raise _Usage(f"--prometheus.bearer-token-file: {exc.strerror}: {args.token_file}") from None
    except _Usage as exc:
        _usage_error(str(exc))
        return EXIT_USAGE
    client = PrometheusClient(args.url, timeout_seconds=timeout_seconds, bearer_token=token)
    try:
        interval = flag_interval or client.scrape_interval(STEP_COUNTER)
        if interval is None:
            interval = ScrapeInterval(DEFAULT_SCRAPE_INTERVAL_SECONDS, "Prometheus' default scrape interval")
            print(
                f"gpupulse report: {args.url} does not say its scrape interval (a query frontend?); "
                f"assuming {format_duration(interval.seconds)}, set --scrape-interval if it is longer",
                file=sys.stderr,
            )
        shortest = MIN_SCRAPES_PER_STEP * interval.seconds
        step_seconds = given_step if given_step is not None else auto_step(start, end, shortest)
        if step_seconds < shortest:
            counters = (
                f"is shorter than {MIN_SCRAPES_PER_STEP} scrape intervals of "
                f"{format_duration(interval.seconds)} ({interval.source}): a step that short holds too "
                "few samples of the energy and token counters, and their increase over it is lost"
            )
            if given_step is not None:
                fix = f"use --step {format_duration(shortest)} or longer"
                _usage_error(f"--step {format_duration(step_seconds)} {counters}; {fix}")
            else:  # the period is too short for a step of both enough samples and enough steps
                fix = f"report a period of {format_duration(shortest * MIN_STEPS_PER_PERIOD)} or longer"
                longest = float(int((end - start) / MIN_STEPS_PER_PERIOD))
                _usage_error(
                    f"the {format_duration(end - start)} period allows a step of at most "
                    f"{format_duration(longest)} (1/{MIN_STEPS_PER_PERIOD} of it), which {counters}; {fix}"
                )
            return EXIT_USAGE
        report = build_report(
            client, start, end, step_seconds, idle_threshold=args.idle_threshold, top=args.top
        )
    except PrometheusUnavailable as exc:
        print(f"gpupulse report: {exc}", file=sys.stderr)
        return EXIT_PROMETHEUS
    except NoData as exc:
        print(f"gpupulse report: {exc}", file=sys.stderr)
        return EXIT_NO_DATA
    sys.stdout.write(render(report, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
