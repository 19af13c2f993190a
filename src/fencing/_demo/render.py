"""The demo on a terminal (rich): the intro, the progress bars, the table, the verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ..testing import ANOMALY_KINDS, LABELS
from .config import DemoConfig
from .queues import crashes, preflight, queue_module, shown_broker
from .runner import run_demo
from .scenario import LEASE_TTL, MODES, RunResult, TaskSpec, make_schedule

TITLES: Final = {
    "naive": "naive read-modify-write",
    "fencing": "fencing",
    "outbox": "fencing + outbox",
}
OUTBOX_TITLES: Final = {"naive": "naive: commit, then enqueue", "outbox": "fencing + outbox"}


def intro(config: DemoConfig, specs: list[TaskSpec]) -> str:
    paused = sum(1 for s in specs if s.pause > 0)
    if config.queue is not None:
        return _queue_intro(config, specs)
    where = "processes" if config.processes else "threads"
    return (
        f"Racing {len(specs)} tasks on {config.workers} worker {where} over {config.keys}"
        f" accounts (credits) and {config.keys} orders (ship/cancel decisions): random delays,"
        f" reordering, duplicate deliveries, crashes between commit and ack, and {paused}"
        f" workers paused past their {LEASE_TTL:g}s lease. The same seeded schedule"
        f" (seed {config.seed}) runs twice: naive read-modify-write, then fencing."
    )


def run_rich(config: DemoConfig) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    console = Console()
    if config.queue is not None:  # a missing extra or a broker down: say so before anything
        preflight(config)
    specs = make_schedule(config.seed, config.tasks, config.keys)
    console.print(intro(config, specs))
    if config.store:
        console.print(f"[dim]store: {config.store}[/]")
    if config.queue is not None:
        console.print(f"[dim]broker: {shown_broker(config)}[/]")
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    bars: dict[str, Any] = {}

    titles = OUTBOX_TITLES if config.outbox else TITLES
    if config.chain:
        from .queues.chain import TITLES as CHAIN_TITLES

        titles = CHAIN_TITLES

    def on_start(mode: str, total: int) -> None:
        bars[mode] = progress.add_task(f"{titles[mode]:>28}", total=total)

    def on_progress(mode: str, n: int) -> None:
        progress.advance(bars[mode], n)

    if config.chain:
        from .queues.chain import run_chain_demo

        with progress:
            chained = run_chain_demo(config, on_start, on_progress)
        console.print(_chain_table(chained))
        return _chain_verdict(console, chained)
    if config.outbox:
        from .queues.outbox import run_outbox_demo

        with progress:
            runs = run_outbox_demo(config, on_start, on_progress)
        console.print(_outbox_table(runs))
        return _outbox_verdict(console, runs, config.queue == "arq")
    with progress:
        results = run_demo(config, on_start, on_progress)
    console.print(_table(results))
    for mode, result in results.items():
        for error in result.errors[:3]:
            console.print(f"[yellow]{mode} worker error:[/] {error}")
        if result.history:
            console.print(f"[dim]{mode} history: {result.history}[/]")
    if config.report is not None:
        console.print(f"report: {config.report}")
    return _verdict(console, results)


def _table(results: dict[str, RunResult]) -> Any:
    from rich.table import Table

    table = Table(title="the same schedule, judged by the history checker")
    table.add_column("")
    for mode in MODES:
        table.add_column(TITLES[mode], justify="right")

    def cell(value: int, bad: bool = False) -> str:
        if bad and value:
            return f"[bold red]{value}[/]"
        return f"[green]{value}[/]" if bad else str(value)

    def row(label: str, values: list[str]) -> None:
        table.add_row(label, *values)

    runs = [results[m] for m in MODES]
    reports = [r.report for r in runs]
    row("tasks", [str(r.tasks) for r in runs])
    row("deliveries", [str(r.deliveries) for r in runs])
    for name, label in (
        ("committed", "committed"),
        ("stale", "stale (refused)"),
        ("duplicate", "duplicate (refused)"),
        ("fenced", "fenced (refused)"),
    ):
        row(label, [str(rep.outcomes[name]) if rep else "-" for rep in reports])
    table.add_section()
    labels = {"fence_regression": "fence regressions (zombie overwrites)"}
    for kind in ANOMALY_KINDS:
        row(
            labels.get(kind, LABELS[kind]),
            [cell(rep.counts[kind], bad=True) if rep else "-" for rep in reports],
        )
    row("account balance drift", [cell(r.drift, bad=True) for r in runs])
    if any(r.gave_up for r in runs):
        row("tasks given up", [cell(r.gave_up, bad=True) for r in runs])
    return table


def _verdict(console: Any, results: dict[str, RunResult]) -> int:
    naive, fenced = results["naive"], results["fencing"]
    assert naive.report is not None and fenced.report is not None
    if not fenced.report.ok:
        console.print(
            f"[bold red]FAIL[/]: the fencing run shows anomalies: {fenced.report.summary()}"
        )
        return 1
    console.print(
        "[bold green]PASS[/]: the fencing run has no anomaly: no decision committed over a"
        " newer version, none twice, no zombie write, nothing acknowledged lost."
    )
    if naive.report.ok:
        console.print(
            "[yellow]The naive run shows no anomaly on this schedule either: try more --tasks.[/]"
        )
    else:
        console.print(f"The naive run on the same schedule: {naive.report.summary()}.")
    return 0


def _count(value: int, bad: bool = False) -> str:
    """A count's cell: in red when it counts something bad."""
    return f"[bold red]{value}[/]" if bad and value else str(value)


def _counts_table(
    title: str, runs: dict[str, Any], titles: dict[str, str]
) -> tuple[Any, Callable[..., None]]:
    """A table of one column per run, and ``row(label, name, bad=False)``: a row of each
    run's count ``name``."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("")
    for mode in runs:
        table.add_column(titles[mode], justify="right")

    def row(label: str, name: str, bad: bool = False) -> None:
        table.add_row(label, *(_count(int(getattr(r, name)), bad) for r in runs.values()))

    return table, row


def _outbox_table(runs: dict[str, Any]) -> Any:
    table, row = _counts_table(
        "the send after the commit, on the same schedule", runs, OUTBOX_TITLES
    )
    row("tasks decided (committed)", "decided")
    row("crashed before the enqueue", "enqueue_crashes")
    row("relay SIGKILLed (after a publish)", "relay_kills")
    row("rows published again", "republished")
    row("tasks delivered", "delivered")
    row("tasks applied", "applied")
    row("duplicates refused", "duplicates_refused")
    table.add_section()
    row("tasks lost", "lost", bad=True)
    row("tasks applied twice", "applied_twice", bad=True)
    checked = []
    for result in runs.values():
        report = result.run.report
        found = sum(report.counts.values()) if report is not None else 0
        checked.append(_count(found, bad=True))
    table.add_row("history checker anomalies", *checked)
    return table


def _outbox_verdict(console: Any, runs: dict[str, Any], arq: bool) -> int:
    naive, outbox = runs["naive"], runs["outbox"]
    if not outbox.ok:
        report = outbox.run.report
        detail = report.summary() if report is not None and not report.ok else ""
        console.print(
            f"[bold red]FAIL[/]: the outbox run lost {outbox.lost} task(s) and applied"
            f" {outbox.applied_twice} twice {detail}"
        )
        return 1
    console.print(
        f"[bold green]PASS[/]: through the outbox no task was lost and none applied twice,"
        f" with the relay SIGKILLed {outbox.relay_kills} times: {outbox.republished} row(s)"
        f" published again, {outbox.duplicates_refused} duplicate(s) refused by the workers"
        + (" (arq itself drops a re-published job id it still knows)." if arq else ".")
    )
    console.print(
        f"The naive send on the same schedule lost {naive.lost} of {naive.decided} committed"
        " decisions: the application crashed between its commit and the enqueue."
    )
    return 0


def _chain_table(runs: dict[str, Any]) -> Any:
    from .queues.chain import TITLES as CHAIN_TITLES

    table, row = _counts_table(
        "ship -> notify, the same orders and the same crashes", runs, CHAIN_TITLES
    )
    row("orders", "orders")
    row("worker SIGKILLed between its row and its commit", "killed_before_commit")
    row("worker SIGKILLed after its commit, before the ack", "killed_after_commit")
    row("relay SIGKILLed (after a publish)", "relay_kills")
    table.add_section()
    row("ship: shipped once", "shipped_once")
    row("ship: shipped twice (two shipment rows)", "shipped_twice", bad=True)
    row("ship: lost (never shipped)", "ship_lost", bad=True)
    row("ship: duplicates refused", "ship_duplicates_refused")
    table.add_section()
    row("notify: messages sent (with re-publishes)", "notify_sent")
    row("notify: published again (relay killed)", "notify_republished")
    row("notify: notified exactly once", "notified_once")
    row("notify: notified twice", "notified_twice", bad=True)
    row("notify: lost (shipped, never notified)", "notify_lost", bad=True)
    row("notify: duplicates refused", "notify_duplicates_refused")
    return table


def _chain_verdict(console: Any, runs: dict[str, Any]) -> int:
    naive, chain = runs["naive"], runs["chain"]
    for mode, result in runs.items():
        for error in result.errors[:3]:
            console.print(f"[yellow]{mode} worker error:[/] {error}")
    if not chain.ok:
        console.print(
            f"[bold red]FAIL[/]: in the worker's transaction {chain.shipped_once} of"
            f" {chain.orders} orders shipped once and {chain.notified_once} notified once;"
            f" lost {chain.lost}, shipped twice {chain.shipped_twice}, notified twice"
            f" {chain.notified_twice}"
        )
        return 1
    console.print(
        f"[bold green]PASS[/]: in the worker's transaction every one of the {chain.orders}"
        f" orders was shipped once and notified exactly once, lost 0, with"
        f" {chain.killed_before_commit} worker(s) killed before their commit,"
        f" {chain.killed_after_commit} after it and the relay killed {chain.relay_kills}"
        f" times; {chain.ship_duplicates_refused} ship and"
        f" {chain.notify_duplicates_refused} notify duplicate(s) refused."
    )
    console.print(
        f"Naive, on the same orders and crashes: {naive.shipped_twice} order(s) shipped"
        f" twice, {naive.notify_lost} notification(s) lost, {naive.notified_twice} sent twice."
    )
    return 0


def _queue_intro(config: DemoConfig, specs: list[TaskSpec]) -> str:
    paused = sum(1 for s in specs if s.pause > 0)
    if config.chain:
        return (
            f"Shipping {config.tasks} orders through {config.queue} on {config.workers} worker"
            f" processes (seed {config.seed}), each a chain of two fenced steps, ship then"
            " notify, twice: naive (the shipment row, then the fenced commit, then notify"
            " enqueued), then in the worker's transaction (the fenced commit, the shipment"
            " row and notify's outbox row together; a relay publishes it, SIGKILLed twice)."
            " For some orders (seeded) the first ship worker is SIGKILLed between its row and"
            " its commit, for others after its commit, before the ack."
        )
    if config.outbox:
        return (
            f"Deciding {len(specs)} tasks through {config.queue} on {config.workers} worker"
            f" processes (seed {config.seed}), twice: naive, each decision committed and then"
            " enqueued, the application crashing between the two for some tasks; then"
            " through the transactional outbox (the row in the decision's transaction) and a"
            " relay process, SIGKILLed after a publish and before marking it sent, and"
            " restarted."
        )
    crash_note = (
        "crashes between commit and ack (the worker process is SIGKILLed;"
        f" {queue_module(config.queue).REDELIVERY})"
        if config.queue is not None and crashes(config.queue)
        else f"no crashes ({config.queue} does not run a killed worker's message again)"
    )
    return (
        f"Racing {len(specs)} tasks through {config.queue} on {config.workers} worker"
        f" processes over {config.keys} accounts (credits) and {config.keys} orders"
        f" (ship/cancel decisions): delayed and reordered sends, duplicate deliveries,"
        f" {crash_note}, and {paused} workers paused past their {LEASE_TTL:g}s lease. The same"
        f" seeded schedule (seed {config.seed}) runs twice: naive read-modify-write, then"
        " fencing through the fencing.contrib integration."
    )
