"""Event-bus benchmark: the cost of the bus against the simplest code doing the same job.

Three measurements, each on asyncio and on uvloop, every bus figure next to a baseline from
the same run (and, where bubus is installed, a peer row for bubus, a widely used typed asyncio
event bus, used with its defaults):

* ``publish`` with no subscriber against an empty method call, ``blinker.Signal.send`` and
  ``pyee.EventEmitter.emit`` with no receivers (event built once outside the loop; peer
  rows without a target: their cost is theirs), and the same including building the event;
  bubus ``dispatch`` with no handler, per event until its run loop has processed it (events
  built before the clock starts, dispatched in bursts of 50: its queue holds 50 and its
  defaults refuse more than 100 pending);
* delivery throughput from one publishing task to 1, 4 and 16 subscriber tasks against one
  ``asyncio.Queue`` per subscriber: deliveries per second (N x subscribers / s), end to end
  until every subscriber has received all N events. Events are built before the clock
  starts; the producer yields to the loop every ``batch`` (64) events; queues never drop.
  At 16, bubus with 16 sync handlers (deliveries per second until the last event completed);
* safe-point latency with 1, 4 and 16 participants against a raw barrier of asyncio futures
  of the same shape (each participant task waits for a per-round request future and answers;
  a countdown completes one future that the caller awaits). Participants subscribe to every
  event, as ``bus.subscribe(safe_points=True)`` does, so they also receive
  ``SafePointResolved``. At 16 participants the target compares the bus with the fairer
  baseline, the raw barrier with its requests sent through one ``asyncio.Queue`` per
  participant (one ordered queue each, as the bus has, then the countdown); context rows show
  the bus with ``SafePointReached``-only subscribers, and bubus awaiting a dispatched event
  whose 16 handlers each return a value.

The two bus targets are printed after the table, per event loop: a 16-participant safe
point at most 1.5 times the queue baseline, and delivery to one subscriber at least 0.8 times
one ``asyncio.Queue``.

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
import importlib
import itertools
import sys
import time
from collections.abc import Callable
from collections.abc import Coroutine
from collections.abc import Mapping
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `eventbus` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Body
from benchmarks._common import Result
from benchmarks._common import add_output_arguments
from benchmarks._common import clock_ns
from benchmarks._common import load_average
from benchmarks._common import measure_group
from benchmarks._common import op_loop
from benchmarks._common import print_table
from benchmarks._common import run_facts
from benchmarks._common import save_results
from benchmarks._common import use_clock
from eventbus import Decision
from eventbus import EventBus
from eventbus import Subscription
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import StepStarted

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
    uvloop = None  # type: ignore[assignment]

NAME = "bus"
FANOUTS = (1, 4, 16)

# Targets, as ratios of two figures from the same run.
PUBLISH_VS_EMPTY_MAX = 1.5  # no-subscriber publish / empty method call
# Target: bus deliveries/s / one asyncio.Queue's deliveries/s, one subscriber.
DELIVERY_1_VS_QUEUE_MIN = 0.8
DELIVERY_16_VS_QUEUE_MIN = 0.8  # the same at 16 subscribers
# Target: bus safe point / raw barrier with requests via asyncio.Queue, 16 participants.
SAFE_POINT_VS_QUEUE_MAX = 1.5
TARGET_FANOUT = 16
DELIVERY_TARGETS = {1: DELIVERY_1_VS_QUEUE_MIN, TARGET_FANOUT: DELIVERY_16_VS_QUEUE_MIN}
QUEUE_BASELINE = "raw barrier, requests via asyncio.Queue"
HEADLINE_DELIVERY = ("delivery to 1 subscriber", "EventBus")
HEADLINE_SAFE_POINT = (f"safe point, {TARGET_FANOUT} participants", "EventBus.safe_point")


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


# Peer libraries timed against a no-subscriber publish when they are installed (the dev
# extra): (row, module, the class to build, its name in the loop, the timed call).
_PUBLISH_PEERS = (
    ("blinker Signal.send", "blinker", "Signal", "signal", "signal.send(event)"),
    ("pyee EventEmitter.emit", "pyee", "EventEmitter", "emitter", 'emitter.emit("step", event)'),
)


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
    for row, module, factory, name, stmt in _PUBLISH_PEERS:
        try:
            library = importlib.import_module(module)
        except ImportError:
            continue
        names[name] = getattr(library, factory)()
        bodies[row] = op_loop(stmt, names)
        baselines[row] = "EventBus.publish"
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
        else:
            rows[name].compare(rows[baseline])
    peer = bubus_row(
        runner,
        settings,
        "publish, no subscriber",
        "bubus EventBus.dispatch, no handler (until processed)",
        partial(bubus_dispatch, handlers=0),
        unit="ns",
        variant=backend,
    )
    if peer is not None:
        rows[peer.case] = peer.compare(rows["EventBus.publish"], paired=False)
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
        if k in DELIVERY_TARGETS:
            bus.compare(raw, ">=", DELIVERY_TARGETS[k])
        else:
            bus.compare(raw)
        rows += [raw, bus]
        if k == TARGET_FANOUT:
            peer = bubus_row(
                runner,
                settings,
                bus.group,
                f"bubus EventBus.dispatch, {k} handlers",
                partial(bubus_dispatch, handlers=k),
                unit="deliveries/s",
                variant=backend,
                scale=k,
                rate=True,
                params=params,
            )
            if peer is not None:
                rows.append(peer.compare(bus, paired=False))
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
            bodies[QUEUE_BASELINE] = on_loop(runner, partial(raw_queue_safe_points, participants=k))
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
        queue = made.get(QUEUE_BASELINE)
        for case, row in made.items():
            if queue is None or case == QUEUE_BASELINE:
                row.compare(raw)  # the shape of the barrier alone (and, at 16, of the queue)
            elif case == "EventBus.safe_point":
                row.compare(queue, "<=", SAFE_POINT_VS_QUEUE_MAX)
            else:
                row.compare(queue)
        rows += [raw, *made.values()]
        if k == TARGET_FANOUT:
            peer = bubus_row(
                runner,
                settings,
                group,
                f"bubus: await dispatch, {k} handlers return a value",
                partial(bubus_await_results, handlers=k),
                unit="us",
                variant=backend,
                scale=1000,
                params=params,
            )
            if peer is not None:
                rows.append(peer.compare(made["EventBus.safe_point"], paired=False))
    return rows


# --- bubus, the peer -----------------------------------------------------------------------

try:
    import bubus  # type: ignore[import-untyped]
except ImportError:  # a benchmark-only dependency (the dev extra): its rows are left out
    bubus = None

BUBUS_BURST = 50  # bubus's default queue holds 50 events and refuses more than 100 pending
_bubus_names = itertools.count()


def _bubus_events() -> tuple[type[Any], type[Any]]:
    """A fire-and-forget event and a request whose handlers return a string (bubus style)."""
    assert bubus is not None

    class BenchStep(bubus.BaseEvent[None]):  # type: ignore[misc]
        step: int = 0

    class BenchRequest(bubus.BaseEvent[str]):  # type: ignore[misc]
        step: int = 0

    return BenchStep, BenchRequest


_BUBUS_EVENTS: tuple[type[Any], type[Any]] | None = None


def _bubus_bus(event_type: type[Any], handlers: list[Callable[[Any], Any]]) -> Any:
    assert bubus is not None
    # Unique names: bubus warns about two live buses of one name.
    bus = bubus.EventBus(name=f"bench_{next(_bubus_names)}")
    for i, handler in enumerate(handlers):
        handler.__name__ = handler.__qualname__ = f"handler_{i}"  # bubus keys results by name
        bus.on(event_type, handler)
    return bus


def _events() -> tuple[type[Any], type[Any]]:
    global _BUBUS_EVENTS
    if _BUBUS_EVENTS is None:
        _BUBUS_EVENTS = _bubus_events()
    return _BUBUS_EVENTS


async def bubus_dispatch(n: int, handlers: int) -> int:
    """``n`` events through bubus with ``handlers`` sync handlers, until the last completed."""
    step_type, _ = _events()
    handled = [0]

    def make() -> Callable[[Any], None]:
        def handler(event: Any) -> None:
            handled[0] += 1

        return handler

    bus = _bubus_bus(step_type, [make() for _ in range(handlers)])
    events = [step_type(step=i) for i in range(n)]
    start = clock_ns()
    for first in range(0, n, BUBUS_BURST):
        burst = events[first : first + BUBUS_BURST]
        for event in burst:
            bus.dispatch(event)
        await burst[-1]  # processed in order: the last one done means the burst is
    elapsed = clock_ns() - start
    await bus.stop(clear=True)
    if handled[0] != n * handlers:
        raise AssertionError(f"bubus handled {handled[0]} of {n * handlers}")
    return elapsed


async def bubus_await_results(n: int, handlers: int) -> int:
    """``n`` rounds of awaiting one dispatched request whose handlers each return a value."""
    _, request_type = _events()

    def make() -> Callable[[Any], str]:
        def handler(event: Any) -> str:
            return "continue"

        return handler

    bus = _bubus_bus(request_type, [make() for _ in range(handlers)])
    start = clock_ns()
    for step in range(n):
        event = await bus.dispatch(request_type(step=step))
        votes = [result.result for result in event.event_results.values()]
        if votes != ["continue"] * handlers:
            raise AssertionError(f"unexpected bubus results {votes!r}")
    elapsed = clock_ns() - start
    await bus.stop(clear=True)
    return elapsed


def bubus_row(
    runner: asyncio.Runner,
    settings: Settings,
    group: str,
    case: str,
    make: Callable[[int], Coroutine[Any, Any, int]],
    **row: Any,
) -> Result | None:
    """One bubus row, measured on its own (it is far slower: sharing ``n`` with the bus's
    cases would make theirs too short to time)."""
    if bubus is None:
        return None
    stats = measure_group(
        {case: on_loop(runner, make)},
        target_s=settings.target_s,
        repeat=max(3, settings.repeat // 2),
        warmup=settings.warmup,
        start_n=BUBUS_BURST,
    )
    return Result.from_stats(group, case, stats[case], **row)


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


def headline_ratios(rows: Sequence[Result]) -> list[dict[str, Any]]:
    """The two ratios the bus has targets for, per event loop, from the table's rows."""
    found: list[dict[str, Any]] = []
    for group, case in (HEADLINE_SAFE_POINT, HEADLINE_DELIVERY):
        for row in rows:
            if (row.group, row.case) == (group, case) and row.ratio is not None:
                found.append(
                    {
                        "what": f"{group}: {case} / {row.baseline}",
                        "backend": row.variant,
                        "ratio": row.ratio,
                        "target": f"{row.target} {row.threshold:g}x" if row.target else None,
                        "met": row.met,
                    }
                )
    return found


def print_headline(headline: Sequence[Mapping[str, Any]]) -> None:
    if not headline:
        return
    print("\nheadline ratios (the bus targets, ratios of two figures of this run):")
    for item in headline:
        verdict = "" if item["met"] is None else ("met" if item["met"] else "MISSED")
        print(
            f"  {item['backend']:8} {item['what']}: {item['ratio']:.2f}x"
            f" (target {item['target']}) {verdict}"
        )


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
    load_before = load_average()
    started = time.perf_counter()
    rows = run(settings, selected)
    seconds = time.perf_counter() - started

    clock = "cpu" if args.cpu_time else "wall"
    kind = "quick" if args.quick else "full"
    missed = print_table(rows, targets=f"{kind} run, {clock} clock, {seconds:.1f} s")
    headline = headline_ratios(rows)
    print_headline(headline)
    targets = {
        "publish_vs_empty_call_max": PUBLISH_VS_EMPTY_MAX,
        "delivery_1_vs_queue_min": DELIVERY_1_VS_QUEUE_MIN,
        "delivery_16_vs_queue_min": DELIVERY_16_VS_QUEUE_MIN,
        "safe_point_16_vs_queue_max": SAFE_POINT_VS_QUEUE_MAX,
    }
    save_results(
        args,
        NAME,
        rows,
        {
            **run_facts(args, settings, load_before, seconds),
            "targets": targets,
            "headline": headline,
        },
        packages=("msgspec", "anyio", "uvloop", "blinker", "pyee", "bubus", "pydantic"),
    )
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
