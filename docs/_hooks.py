"""MkDocs hooks: pages that quote the command line or the benchmark results show the real,
current thing, generated when the documentation is built.

* ``<!-- trainbus: config example | toml -->`` becomes a fenced block (here ``toml``) holding
  the output of ``trainbus config example``. The command runs as ``python -m trainer ...``
  with the Python that runs MkDocs, from the repository root. A command that fails fails the
  build.
* ``<!-- api: trainer -->`` becomes ``::: trainer`` listing the members of ``trainer.__all__``
  (each package derives it at import time from its one list of public names, which the
  documentation tool cannot evaluate by itself); ``<!-- api: eventbus except A B -->`` leaves
  ``A`` and ``B`` out (a page that renders them in a section of their own).
* ``<!-- metrics: table -->`` becomes the table of a run's metric names,
  ``trainer.runtime._metrics.METRICS`` (the one list the trainer and the exporters use);
  ``<!-- metrics: prometheus -->`` the Prometheus exporter's own series (its ``SERIES``).
* ``<!-- bench: bus -->`` becomes the tables of ``benchmarks/results/bus.json``, formatted
  as ``benchmarks/_common.py`` prints them; a missing file becomes a note saying how to
  produce it.

So the quoted text can never drift from the code or from the committed results.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
COMMAND = re.compile(r"^<!-- trainbus: (?P<args>[^|>]+?)(?: \| (?P<lang>\w+))? -->$", re.MULTILINE)
BENCH = re.compile(r"^<!-- bench: (?P<name>[\w-]+) -->$", re.MULTILINE)
API = re.compile(r"^<!-- api: (?P<module>[\w.]+)(?: except (?P<skip>[\w ]+))? -->$", re.MULTILINE)
METRIC_TABLE = re.compile(r"^<!-- metrics: (?P<which>table|prometheus) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    markdown = COMMAND.sub(lambda m: _command_block(m["args"].strip(), m["lang"]), markdown)
    markdown = API.sub(lambda m: _api_block(m["module"], (m["skip"] or "").split()), markdown)
    markdown = METRIC_TABLE.sub(lambda m: _metric_table(m["which"]), markdown)
    return BENCH.sub(lambda m: _bench_tables(m["name"]), markdown)


def _api_block(module: str, skip: list[str]) -> str:
    exported = importlib.import_module(module).__all__
    unknown = sorted(set(skip) - set(exported))
    if unknown:
        raise PluginError(f"<!-- api: {module} except ... -->: {unknown} not in {module}.__all__")
    names = [name for name in exported if name not in skip]
    return f"::: {module}\n    options:\n      members: {json.dumps(sorted(names))}"


def _metric_table(which: str) -> str:
    sys.path.insert(0, str(ROOT))
    try:
        from trainer.runtime._metrics import METRICS
        from trainer.runtime.exporters._prometheus import SERIES
    finally:
        sys.path.remove(str(ROOT))
    if which == "prometheus":
        out = ["| series | type | labels | what it says |", "|---|---|---|---|"]
        for name, kind, labels, meaning in SERIES:
            out.append(f"| `{name}` | {kind} | {', '.join(labels)} | {_cell(meaning)} |")
        return "\n".join(out) + "\n"
    out = ["| name | what it measures | when | before the slash names |", "|---|---|---|---|"]
    for metric in METRICS:
        when = {
            "step": "every step",
            "validation": "validation steps",
            "occurred": "the steps where it occurred",
            "setting": "every step, when its setting is on",
            "gpu": "every step on a GPU",
            "events": "exporters, from events",
        }[metric.when]
        short = f"`{metric.short}`" if metric.short else ""
        out.append(f"| `{metric.name}` | {_cell(metric.meaning)} | {when} | {short} |")
    return "\n".join(out) + "\n"


# --- command output ---------------------------------------------------------------------


@cache
def _run(args: str) -> str:
    command = [sys.executable, "-m", "trainer", *args.split()]
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise PluginError(f"`trainbus {args}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.rstrip("\n")


def _command_block(args: str, lang: str | None) -> str:
    return f"```{lang or 'text'}\n{_run(args)}\n```"


# --- benchmark results ------------------------------------------------------------------


def _bench_tables(name: str) -> str:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        return (
            f'!!! note "No results recorded yet"\n'
            f"    `benchmarks/results/{name}.json` is not in this checkout. Produce it with\n"
            f"    `./dev bench {name}` (or `.venv/bin/python benchmarks/{name}.py`).\n"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        body = _replay(data) if name == "replay" else _rows(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise PluginError(
            f"docs/_hooks.py cannot render {path.relative_to(ROOT)} "
            f"({type(exc).__name__}: {exc}); update the renderer for its format"
        ) from exc
    return _provenance(data) + "\n\n" + body


def _provenance(data: dict[str, Any]) -> str:
    machine = data.get("machine", {})
    cpus = machine.get("cpus_usable") or machine.get("cpus") or machine.get("cpu_count")
    load = machine.get("loadavg") or machine.get("load_average_at_end")
    parts = [f"recorded {data['created']}" if data.get("created") else "recorded"]
    if machine.get("python"):
        parts.append(f"Python {machine['python']}")
    if cpus:
        parts.append(f"{cpus} CPUs")
    if load:
        parts.append("load average " + " / ".join(f"{x:.2f}" for x in load))
    if data.get("clock"):
        parts.append(f"{data['clock']} clock")
    if data.get("quick"):
        parts.append("**quick (smoke) run**")
    return "*" + ", ".join(parts) + "*"


def _rows(data: dict[str, Any]) -> str:
    """The ``results`` rows of ``benchmarks._common.write_results``, one table per group."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks._common import format_ratio
        from benchmarks._common import format_value
    finally:
        sys.path.remove(str(ROOT))
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in data["results"]:
        groups.setdefault(row["group"], []).append(row)
    out: list[str] = []
    for group, rows in groups.items():
        out += [
            f"**{group}**",
            "",
            "| case | variant | median | spread | vs | ratio | target | met |",
            "|---|---|--:|--:|---|--:|---|---|",
        ]
        for row in rows:
            spread = row.get("spread")
            ratio = row.get("ratio")
            target = (
                f"{row['target']} {row['threshold']:g}x"
                if row.get("target") and row.get("threshold") is not None
                else ""
            )
            met = {None: "", True: "yes", False: "**no**"}[row.get("met")]
            cells = [
                row["case"],
                row.get("variant", ""),
                format_value(row["value"], row["unit"]),
                f"{spread:.0%}" if isinstance(spread, float) and not math.isnan(spread) else "",
                row.get("baseline") or "",
                format_ratio(ratio) if ratio is not None else "",
                target.replace("<=", "&le;").replace(">=", "&ge;"),
                met,
            ]
            out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        out.append("")
    headline = data.get("headline") or []
    if headline:
        out += [
            "**Headline ratios** (the bus targets, two figures of the same run each)",
            "",
            "| ratio | variant | value | target | met |",
            "|---|---|--:|---|---|",
        ]
        for item in headline:
            target = (item.get("target") or "").replace("<=", "&le;").replace(">=", "&ge;")
            met = {None: "", True: "yes", False: "**no**"}[item.get("met")]
            cells = [item["what"], item["backend"], format_ratio(item["ratio"]), target, met]
            out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        out.append("")
    checked = [row["met"] for row in data["results"] if row.get("met") is not None]
    if checked:
        out.append(f"Targets met: {sum(checked)} of {len(checked)}.")
        out.append("")
    return "\n".join(out)


def _replay(data: dict[str, Any]) -> str:
    """``benchmarks/replay.py`` writes its own shape: hand-out latency and throughput."""
    latency, throughput = data["handout_latency"], data["tracker_throughput"]
    shape = latency["batch"]
    out = [
        f"**hand-out latency**: last rollout lands -> `sample()` returns; batches of "
        f"{shape['groups']} groups x {shape['rollouts_per_group']} rollouts; target p99 < "
        f"{latency['target_p99_ms']:g} ms",
        "",
        "| case | p50 | p99 | max | trials |",
        "|---|--:|--:|--:|--:|",
    ]
    cases = {
        "sync_notified": "`ReplayBuffer.sample` (notified)",
        "async_notified": "`AsyncReplayBuffer.sample` (notified)",
        "reference_polling_2s": "reference design: poll every 2 s",
    }
    for key, label in cases.items():
        case = latency[key]
        out.append(
            f"| {label} | {case['p50_ms']:.3f} ms | {case['p99_ms']:.3f} ms | "
            f"{case['max_ms']:.3f} ms | {case['trials']} |"
        )
    out += [
        "",
        f"**tracker throughput**: {throughput['results']:,} results offered to one "
        f"{throughput['batch_rollouts']:,}-rollout batch; target "
        f"{throughput['target_per_s']:,} results/s on one thread",
        "",
        "| case | results/s |",
        "|---|--:|",
    ]
    rates = {
        "single_thread_per_s": "`RolloutTracker.record`, one thread",
        "single_thread_per_cpu_s": "same, per second of the thread's CPU time",
        "two_threads_per_s": "`RolloutTracker.record`, two threads at once",
        "replay_buffer_add_per_s": "`ReplayBuffer.add`, one thread",
        "with_rejected_subscriber_per_s": "`record`, every drop published to a subscriber",
    }
    for key, label in rates.items():
        if key in throughput:
            out.append(f"| {label} | {throughput[key]:,.0f} |")
    verdicts = ", ".join(f"{k} {v:,}" for k, v in throughput["verdicts"].items())
    p99 = max(latency["sync_notified"]["p99_ms"], latency["async_notified"]["p99_ms"])
    met = [
        p99 < latency["target_p99_ms"],
        throughput["single_thread_per_s"] >= throughput["target_per_s"],
    ]
    out += [
        "",
        f"What the offered results were, as the tracker classified them: {verdicts}.",
        "",
        f"Targets met: {sum(met)} of 2.",
        "",
    ]
    return "\n".join(out)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")
