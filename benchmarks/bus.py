"""Event-bus benchmark: the cost of the bus against the simplest code doing the same job.

Three measurements, each on asyncio and on uvloop, every bus figure next to a baseline from
the same run:

* ``publish`` with no subscriber against an empty method call, ``blinker.Signal.send`` and
  ``pyee.EventEmitter.emit`` with no receivers (event built once outside the loop), and the
  same including building the event;
* delivery throughput from one publishing task to 1, 4 and 16 subscriber tasks against one
  ``asyncio.Queue`` per subscriber: deliveries per second (N x subscribers / s), end to end
  until every subscriber has received all N events. Events are built before the clock
  starts; the producer yields to the loop every ``batch`` (64) events; queues never drop;
* safe-point latency with 1, 4 and 16 participants against a raw barrier of asyncio futures
  of the same shape (each participant task waits for a per-round request future and answers;
  a countdown completes one future that the caller awaits). Participants subscribe to every
  event, as ``bus.subscribe(safe_points=True)`` does, so they also receive
  ``SafePointResolved``; at 16 participants two context rows show the bus with
  ``SafePointReached``-only subscribers and the raw barrier with requests sent through an
  ``asyncio.Queue``.

Timing uses ``time.perf_counter_ns``; every figure is the median of several runs of about
0.1-0.15 s after a warm-up, and every ratio the median of run-by-run ratios of interleaved
runs (see ``_common``). On a machine shared with other busy processes, ``--cpu-time`` times
with this process's CPU time instead, which leaves out the time other processes take.

Results go to ``benchmarks/results/bus.json`` and a table on stdout.

    PYTHONPATH=. .venv/bin/python benchmarks/bus.py            # about 40 s
    PYTHONPATH=. .venv/bin/python benchmarks/bus.py --quick    # smoke test, a few seconds
    PYTHONPATH=. .venv/bin/python benchmarks/bus.py --cpu-time # on a busy machine
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `eventbus` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    Body,
    Result,
    add_output_arguments,
    clock_ns,
    measure_group,
    op_loop,
    print_table,
    print_targets_met,
    use_clock,
    versions,
    write_results,
)
from eventbus import (
    Decision,
    EventBus,
    SafePoint,
    SafePointReached,
    StepStarted,
    Subscription,
)

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
    uvloop = None  # type: ignore[assignment]

NAME = "bus"
FANOUTS = (1, 4, 16)

# Targets, as ratios of two figures from the same run.
PUBLISH_VS_EMPTY_MAX = 1.5  # no-subscriber publish / empty method call
BLINKER_VS_PUBLISH_MIN = 5.0  # blinker send / no-subscriber publish
DELIVERY_VS_QUEUE_MIN = 0.8  # bus deliveries/s / asyncio.Queue deliveries/s, 16 subscribers
SAFE_POINT_VS_RAW_MAX = 1.5  # bus safe point / raw barrier, 16 participants
TARGET_FANOUT = 16


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    target_s: float  # seconds per timed run
    micro_target_s: float
    repeat: int
    warmup: int
    batch: int  # events the producer publishes between two yields to the loop


FULL = Settings(target_s=0.15, micro_target_s=0.1, repeat=7, warmup=1, batch=64)
QUICK = Settings(target_s=0.01, micro_target_s=0.01, repeat=3, warmup=0, batch=64)


# --- event loops ---------------------------------------------------------------------------


def backends() -> list[str]:
    return ["asyncio", "uvloop"] if uvloop is not None else ["asyncio"]


def make_runner(backend: str) -> asyncio.Runner:
    if backend == "uvloop":
        if uvloop is None:
            raise RuntimeError("uvloop is not installed")
        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def on_loop(runner: asyncio.Runner, make: Callable[[int], Coroutine[Any, Any, int]]) -> Body:
    """A body that runs ``make(n)`` (which returns its own timed nanoseconds) on ``runner``."""

    def body(n: int) -> int:
        return runner.run(make(n))

    return body


# --- 1. publish with no subscriber ---------------------------------------------------------


class _Empty:
    def method(self, event: object) -> None:
        pass


def publish_bodies() -> tuple[dict[str, Body], dict[str, str]]:
    """Bodies timing one call each (unrolled loops); and what each one's baseline is."""
    bus = EventBus()
    event = StepStarted(step=1)
    names: dict[str, Any] = {
        "bus": bus,
        "event": event,
        "obj": _Empty(),
        "StepStarted": StepStarted,
    }
    bodies: dict[str, Body] = {
        "loop overhead (pass)": op_loop("pass", names),
        "empty method call": op_loop("obj.method(event)", names),
        "EventBus.publish": op_loop("bus.publish(event)", names),
    }
    baselines = {"EventBus.publish": "empty method call"}
    try:
        import blinker
    except ImportError:
        pass
    else:
        names["signal"] = blinker.Signal()
        bodies["blinker Signal.send"] = op_loop("signal.send(event)", names)
        baselines["blinker Signal.send"] = "EventBus.publish"
    try:
        import pyee
    except ImportError:
        pass
    else:
        names["emitter"] = pyee.EventEmitter()
        bodies["pyee EventEmitter.emit"] = op_loop('emitter.emit("step", event)', names)
        baselines["pyee EventEmitter.emit"] = "EventBus.publish"
    build = "StepStarted(step=1)"
    bodies["empty method call + build"] = op_loop(f"obj.method({build})", names)
    bodies["EventBus.publish + build"] = op_loop(f"bus.publish({build})", names)
    bodies["if bus.wants(): publish + build"] = op_loop(
        f"if bus.wants(StepStarted): bus.publish({build})", names
    )
    baselines["EventBus.publish + build"] = "empty method call + build"
    baselines["if bus.wants(): publish + build"] = "empty method call"
    return bodies, baselines


def publish_rows(runner: asyncio.Runner, backend: str, settings: Settings) -> list[Result]:
    bodies, baselines = publish_bodies()

    async def timed(body: Body, n: int) -> int:
        start = clock_ns()
        body(n)
        return clock_ns() - start

    def in_loop(body: Body) -> Body:
        # Called from inside the running loop, as the trainer would.
        return on_loop(runner, lambda n: timed(body, n))

    stats = measure_group(
        {name: in_loop(body) for name, body in bodies.items()},
        target_s=settings.micro_target_s,
        repeat=settings.repeat,
        warmup=settings.warmup,
        same_n=False,
        start_n=10_000,
    )
    rows = {
        name: Result.from_stats("publish, no subscriber", name, s, unit="ns", variant=backend)
        for name, s in stats.items()
    }
    for name, baseline in baselines.items():
        if name == "EventBus.publish":
            rows[name].compare(rows[baseline], "<=", PUBLISH_VS_EMPTY_MAX)
        elif name == "blinker Signal.send":
            rows[name].compare(rows[baseline], ">=", BLINKER_VS_PUBLISH_MIN)
        else:
            rows[name].compare(rows[baseline])
    return list(rows.values())


# --- 2. delivery throughput ----------------------------------------------------------------


async def _produce(
    publish: Callable[[StepStarted], None], events: list[StepStarted], batch: int
) -> None:
    for start in range(0, len(events), batch):
        for event in events[start : start + batch]:
            publish(event)
        await asyncio.sleep(0)


async def _consume_subscription(subscription: Subscription, n: int) -> None:
    count = 0
    async for _event in subscription:
        count += 1
        if count == n:
            break


async def _consume_queue(queue: asyncio.Queue[StepStarted], n: int) -> None:
    count = 0
    while True:
        await queue.get()
        count += 1
        if count == n:
            break


async def bus_delivery(n: int, subscribers: int, batch: int) -> int:
    events = [StepStarted(step=i) for i in range(n)]
    bus = EventBus()
    subscriptions = [bus.subscribe(maxsize=n, name=f"sub{i}") for i in range(subscribers)]
    tasks = [asyncio.create_task(_consume_subscription(s, n)) for s in subscriptions]
    await asyncio.sleep(0)  # every consumer is parked on its empty queue
    start = clock_ns()
    await _produce(bus.publish, events, batch)
    for task in tasks:
        await task
    elapsed = clock_ns() - start
    for subscription in subscriptions:
        stats = subscription.statistics()
        if stats.delivered != n or stats.dropped:
            raise AssertionError(f"{subscription!r} got {stats}")
    bus.close()
    return elapsed


async def queue_delivery(n: int, subscribers: int, batch: int) -> int:
    events = [StepStarted(step=i) for i in range(n)]
    queues: list[asyncio.Queue[StepStarted]] = [asyncio.Queue() for _ in range(subscribers)]
    tasks = [asyncio.create_task(_consume_queue(q, n)) for q in queues]
    await asyncio.sleep(0)

    def publish(event: StepStarted) -> None:
        for queue in queues:
            queue.put_nowait(event)

    start = clock_ns()
    await _produce(publish, events, batch)
    for task in tasks:
        await task
    return clock_ns() - start


def delivery_rows(runner: asyncio.Runner, backend: str, settings: Settings) -> list[Result]:
    rows: list[Result] = []
    for k in FANOUTS:
        stats = measure_group(
            {
                "asyncio.Queue per subscriber": on_loop(
                    runner, partial(queue_delivery, subscribers=k, batch=settings.batch)
                ),
                "EventBus": on_loop(
                    runner, partial(bus_delivery, subscribers=k, batch=settings.batch)
                ),
            },
            target_s=settings.target_s,
            repeat=settings.repeat,
            warmup=settings.warmup,
            start_n=100,
        )
        params = {"subscribers": k, "batch": settings.batch, "backend": backend}
        raw, bus = (
            Result.from_stats(
                f"delivery to {k} subscriber{'s' if k > 1 else ''}",
                case,
                stats[case],
                unit="deliveries/s",
                variant=backend,
                scale=k,
                rate=True,
                params=params,
            )
            for case in ("asyncio.Queue per subscriber", "EventBus")
        )
        if k == TARGET_FANOUT:
            bus.compare(raw, ">=", DELIVERY_VS_QUEUE_MIN)
        else:
            bus.compare(raw)
        rows += [raw, bus]
    return rows


# --- 3. safe-point latency -----------------------------------------------------------------


async def _participant(subscription: Subscription) -> None:
    async for event in subscription:
        if type(event) is SafePointReached:
            subscription.decide(event, Decision.CONTINUE)


async def bus_safe_points(n: int, participants: int, *, only_requests: bool = False) -> int:
    bus = EventBus()
    types = (SafePointReached,) if only_requests else ()
    subscriptions = [
        bus.subscribe(*types, maxsize=1024, safe_points=True, name=f"p{i}")
        for i in range(participants)
    ]
    tasks = [asyncio.create_task(_participant(s)) for s in subscriptions]
    await asyncio.sleep(0)
    outcome = None
    start = clock_ns()
    for step in range(n):
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=step)
    elapsed = clock_ns() - start
    if (
        outcome is None
        or len(outcome.votes) != participants
        or outcome.decision is not Decision.CONTINUE
    ):
        raise AssertionError(f"unexpected outcome {outcome!r}")
    if any(v.timed_out for v in outcome.votes):
        raise AssertionError(f"a participant timed out: {outcome!r}")
    bus.close()
    for task in tasks:
        await task
    return elapsed


class _RawBarrier:
    __slots__ = ("done", "remaining", "waiters")

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[int | None]] = []
        self.remaining = 0
        self.done: asyncio.Future[None] | None = None


async def _raw_participant(barrier: _RawBarrier, index: int) -> None:
    loop = asyncio.get_running_loop()
    while True:
        waiter: asyncio.Future[int | None] = loop.create_future()
        barrier.waiters[index] = waiter
        request = await waiter
        if request is None:
            return
        barrier.remaining -= 1  # answer
        if barrier.remaining == 0 and barrier.done is not None:
            barrier.done.set_result(None)


async def raw_safe_points(n: int, participants: int) -> int:
    loop = asyncio.get_running_loop()
    barrier = _RawBarrier()
    barrier.waiters = [loop.create_future() for _ in range(participants)]
    tasks = [asyncio.create_task(_raw_participant(barrier, i)) for i in range(participants)]
    await asyncio.sleep(0)  # every participant waits on its own request future
    start = clock_ns()
    for step in range(n):
        done: asyncio.Future[None] = loop.create_future()
        barrier.done = done
        barrier.remaining = participants
        for waiter in barrier.waiters:
            waiter.set_result(step)
        await done
    elapsed = clock_ns() - start
    for waiter in barrier.waiters:
        waiter.set_result(None)
    for task in tasks:
        await task
    return elapsed


async def _queue_participant(barrier: _RawBarrier, requests: asyncio.Queue[int | None]) -> None:
    while True:
        request = await requests.get()
        if request is None:
            return
        barrier.remaining -= 1
        if barrier.remaining == 0 and barrier.done is not None:
            barrier.done.set_result(None)


async def raw_queue_safe_points(n: int, participants: int) -> int:
    """The raw barrier, but each request travels through an ``asyncio.Queue`` (context)."""
    loop = asyncio.get_running_loop()
    barrier = _RawBarrier()
    queues: list[asyncio.Queue[int | None]] = [asyncio.Queue() for _ in range(participants)]
    tasks = [asyncio.create_task(_queue_participant(barrier, q)) for q in queues]
    await asyncio.sleep(0)
    start = clock_ns()
    for step in range(n):
        done: asyncio.Future[None] = loop.create_future()
        barrier.done = done
        barrier.remaining = participants
        for queue in queues:
            queue.put_nowait(step)
        await done
    elapsed = clock_ns() - start
    for queue in queues:
        queue.put_nowait(None)
    for task in tasks:
        await task
    return elapsed


def safe_point_rows(runner: asyncio.Runner, backend: str, settings: Settings) -> list[Result]:
    rows: list[Result] = []
    for k in FANOUTS:
        bodies: dict[str, Body] = {
            "raw barrier of futures": on_loop(runner, partial(raw_safe_points, participants=k)),
            "EventBus.safe_point": on_loop(runner, partial(bus_safe_points, participants=k)),
        }
        if k == TARGET_FANOUT:
            # Context: how much the SafePointResolved wake-ups and a queue per participant cost.
            bodies["EventBus.safe_point, SafePointReached-only subscribers"] = on_loop(
                runner, partial(bus_safe_points, participants=k, only_requests=True)
            )
            bodies["raw barrier, requests via asyncio.Queue"] = on_loop(
                runner, partial(raw_queue_safe_points, participants=k)
            )
        stats = measure_group(
            bodies,
            target_s=settings.target_s,
            repeat=settings.repeat,
            warmup=settings.warmup,
            start_n=10,
        )
        group = f"safe point, {k} participant{'s' if k > 1 else ''}"
        params = {"participants": k, "backend": backend}
        made = {
            case: Result.from_stats(
                group, case, s, unit="us", variant=backend, scale=1000, params=params
            )
            for case, s in stats.items()
        }
        raw = made.pop("raw barrier of futures")
        for case, row in made.items():
            if k == TARGET_FANOUT and case == "EventBus.safe_point":
                row.compare(raw, "<=", SAFE_POINT_VS_RAW_MAX)
            else:
                row.compare(raw)
        rows += [raw, *made.values()]
    return rows


# --- driver --------------------------------------------------------------------------------


def run(settings: Settings, selected: Sequence[str]) -> list[Result]:
    rows: list[Result] = []
    for backend in selected:
        with make_runner(backend) as runner:
            rows += publish_rows(runner, backend, settings)
            rows += delivery_rows(runner, backend, settings)
            rows += safe_point_rows(runner, backend, settings)
    # One block per measurement, backends side by side.
    order = {group: i for i, group in enumerate(dict.fromkeys(r.group for r in rows))}
    return sorted(rows, key=lambda r: (order[r.group], selected.index(r.variant)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few, short runs (smoke test)")
    parser.add_argument("--repeat", type=int, help="timed runs per case (default 5, quick 3)")
    parser.add_argument(
        "--backend", action="append", choices=backends(), help="event loop(s); default: all"
    )
    add_output_arguments(parser, NAME)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with process CPU time instead of perf_counter (robust to other processes "
        "competing for the CPU; the loops never idle, so on an idle machine both agree)",
    )
    args = parser.parse_args(argv)

    settings = QUICK if args.quick else FULL
    if args.repeat:
        settings = dataclasses.replace(settings, repeat=args.repeat)
    selected = args.backend or backends()
    use_clock("cpu" if args.cpu_time else "wall")
    load_before = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    started = time.perf_counter()
    rows = run(settings, selected)
    seconds = time.perf_counter() - started

    print_table(rows)
    clock = "cpu" if args.cpu_time else "wall"
    kind = "quick" if args.quick else "full"
    missed = print_targets_met(rows, f"{kind} run, {clock} clock, {seconds:.1f} s")
    if not args.no_write:
        path = write_results(
            NAME,
            rows,
            {
                "quick": args.quick,
                "loadavg_before": load_before,
                "settings": dataclasses.asdict(settings),
                "versions": versions("msgspec", "anyio", "uvloop", "blinker", "pyee"),
                "seconds": round(seconds, 2),
                "targets": {
                    "publish_vs_empty_call_max": PUBLISH_VS_EMPTY_MAX,
                    "blinker_vs_publish_min": BLINKER_VS_PUBLISH_MIN,
                    "delivery_16_vs_queue_min": DELIVERY_VS_QUEUE_MIN,
                    "safe_point_16_vs_raw_max": SAFE_POINT_VS_RAW_MAX,
                },
                "met": {
                    f"{r.group} / {r.case} / {r.variant}": r.met for r in rows if r.met is not None
                },
            },
            directory=args.results_dir,
        )
        print(f"results written to {path}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
