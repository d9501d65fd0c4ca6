"""A ledger's metrics read from the ledger by another process: ``python -m ledger metrics`` through a
subprocess on both backends, and ``observe_ledger`` through the OpenTelemetry SDK's reader."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import LEDGER_METRICS, LmdbBackend, observe_ledger, open_ledger, read_ledger_metrics
from ledger._metrics_cli import prometheus_name
from streams import Graph, Key, MessageTx, NodeContext, Retry, Stream
from tests.conftest import Metrics

from ..ledger_command import ledger_command
from .conftest import Opener

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
ORDERS = Key("orders", Stream[int])
SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")


def shop(name: str, *, read: int | None = None, hold: anyio.Event | None = None, fail: bool = False) -> Graph:
    """Five orders written, read by ``count`` (which holds after ``read`` of them), and a node that
    fails both its attempts if ``fail``."""
    graph = Graph(name, version="1")

    @graph.node(provides=[ORDERS])
    async def write(ctx: NodeContext) -> None:
        for i in range(5):
            await ctx.writer(ORDERS).send(i)

    @graph.node(requires=[ORDERS])
    async def count(ctx: NodeContext) -> None:
        async def handle(tx: MessageTx[None], value: int) -> None:
            pass

        await ctx.handle_messages(ORDERS, handle, limit=read)
        if hold is not None:
            hold.set()
            await anyio.sleep_forever()

    @graph.node(aspects=[Retry(2)])
    async def stamp(ctx: NodeContext) -> None:
        if fail:
            raise ConnectionError("no stamps")

    return graph


def _target(ledger: Any) -> str:
    backend = ledger.backend
    return str(backend.env.path) if isinstance(backend, LmdbBackend) else str(backend.url)


def samples(exposition: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """Prometheus' text format, parsed: each sample name's values by label set; HELP and TYPE checked."""
    found: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    typed = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match is not None, line
        name, labels, value = match.groups()
        assert name in typed, f"{name} has no TYPE line"
        pairs = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
        found.setdefault(name, {})[pairs] = float(value)
    return found


def value(found: dict[str, dict[frozenset[tuple[str, str]], float]], name: str, **labels: str) -> float:
    matching = [v for pairs, v in found.get(name, {}).items() if set(labels.items()) <= pairs]
    assert len(matching) == 1, f"{name} {labels}: {matching}"
    return matching[0]


def metrics_once(target: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    done = ledger_command("metrics", target, "--once")
    assert done.returncode == 0, done.stderr
    return samples(done.stdout)


async def test_lag_throughput_runs_and_failures_are_read_from_the_ledger_by_another_process(
    open_any: Opener,
) -> None:
    async with open_any() as ledger:
        target = _target(ledger)
        await ledger.run(shop("metered-done"), {}, run_id="done")
        with pytest.raises(ConnectionError):
            await ledger.run(shop("metered-broken", fail=True), {}, run_id="broken")
        held = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ledger.run(shop("metered-held", read=2, hold=held), {}, run_id="held"))
            await held.wait()
            found = await anyio.to_thread.run_sync(metrics_once, target)
            tg.cancel_scope.cancel()
    orders = {
        "messaging_destination_template": "{run_id}/write/orders",
        "messaging_consumer_group_name": "count",
    }
    held_orders = {**orders, "streamledger_graph_name": "metered-held"}
    assert value(found, "streamledger_ledger_up") == 1
    assert value(found, "streamledger_ledger_consumer_lag", **held_orders) == 3  # 5 written, 2 handled
    assert value(found, "streamledger_ledger_consumer_acked_total", **held_orders) == 2
    # message 3 waits: appended at most a second or so before its mark says, never after
    assert 0 <= value(found, "streamledger_ledger_consumer_lag_age_seconds", **held_orders) < 120
    done_orders = {**orders, "streamledger_graph_name": "metered-done"}
    assert value(found, "streamledger_ledger_consumer_lag_age_seconds", **done_orders) == 0
    # the streams of a run that ended: nothing will read them, so their lag is no one's to catch up
    assert (
        value(found, "streamledger_ledger_consumer_lag", **orders, streamledger_graph_name="metered-done")
        == 0
    )
    appended = found["streamledger_ledger_stream_appended_total"]
    assert sorted(v for pairs, v in appended.items() if ("messaging_system", "streamledger") in pairs) == [
        5,
        5,
        5,
    ]
    runs = {"streamledger_graph_name": "metered-broken"}
    assert value(found, "streamledger_ledger_runs", **runs, streamledger_run_status="failed") == 1
    assert value(found, "streamledger_ledger_runs", **runs, streamledger_run_status="completed") == 0
    assert (
        value(
            found,
            "streamledger_ledger_runs",
            streamledger_graph_name="metered-held",
            streamledger_run_status="running",
        )
        == 1
    )
    stamp = {**runs, "streamledger_graph_node_id": "stamp"}
    assert value(found, "streamledger_ledger_nodes", **stamp, streamledger_node_status="failed") == 1
    assert value(found, "streamledger_ledger_node_failed_attempts_total", **stamp) == 2
    for name, series in found.items():  # a run's id is in no label
        assert not [pairs for pairs in series if any(v in ("done", "broken", "held") for _, v in pairs)], name


async def test_the_number_of_series_does_not_grow_with_the_number_of_runs(tmp_path: Path) -> None:
    graph = shop("metered-many")
    path = tmp_path / "ledger"
    async with open_ledger(path) as ledger:
        await ledger.run(graph, {}, run_id="run-0")
    one = await anyio.to_thread.run_sync(read_ledger_metrics, path)
    async with open_ledger(path) as ledger:
        for i in range(1, 30):
            await ledger.run(graph, {}, run_id=f"run-{i}")
    many = await anyio.to_thread.run_sync(read_ledger_metrics, path)
    assert {n: set(p) for n, p in many.points.items()} == {n: set(p) for n, p in one.points.items()}
    appended = many.points["streamledger.ledger.stream.appended"]
    assert list(appended.values()) == [5 * 30]  # one series, summed over the runs


def test_the_exporter_serves_prometheus_text_over_http_and_says_when_the_ledger_cannot_be_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger"
    anyio.run(_one_run, path)
    server = subprocess.Popen(
        [sys.executable, "-m", "ledger", "metrics", str(path), "--port", "0", "--max-age", "0.01"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        url = re.search(r"http://\S+/metrics", line)
        assert url is not None, line
        with urllib.request.urlopen(url[0], timeout=30) as answer:
            assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            found = samples(answer.read().decode())
        assert value(found, "streamledger_ledger_up") == 1
        assert value(found, "streamledger_ledger_runs", streamledger_run_status="completed") == 1
        with pytest.raises(urllib.error.HTTPError) as elsewhere:
            urllib.request.urlopen(url[0].removesuffix("metrics") + "other", timeout=30)
        assert elsewhere.value.code == 404
        elsewhere.value.close()
        shutil.move(path, tmp_path / "moved")  # the ledger is gone: the exporter says so, and stays up
        time.sleep(0.05)  # past --max-age: the next scrape reads again
        with urllib.request.urlopen(url[0], timeout=30) as answer:
            down = samples(answer.read().decode())
        assert value(down, "streamledger_ledger_up") == 0 and list(down) == ["streamledger_ledger_up"]
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
        assert server.returncode == 0, err
        assert "reading ledger failed: " in err
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()


async def _one_run(path: Path) -> None:
    async with open_ledger(path) as ledger:
        await ledger.run(shop("metered-served"), {}, run_id="served")


def test_a_path_that_is_no_ledger_is_the_commands_error(tmp_path: Path) -> None:
    done = ledger_command("metrics", str(tmp_path / "none"), "--once")
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1


async def test_observe_ledger_reports_through_the_sdk_until_closed(
    metrics_now: Metrics, tmp_path: Path
) -> None:
    path = tmp_path / "observed"
    async with open_ledger(path) as ledger:
        await ledger.run(shop("metered-observed"), {}, run_id="observed")
    runs = {"streamledger__graph__name": "metered-observed", "streamledger__run__status": "completed"}
    with observe_ledger(path, max_age=60):
        counted = await anyio.to_thread.run_sync(
            lambda: metrics_now.value("streamledger.ledger.runs", **runs)
        )
        assert counted == 1
    assert (
        await anyio.to_thread.run_sync(lambda: metrics_now.value("streamledger.ledger.runs", **runs)) is None
    )


def test_every_ledger_metric_has_the_name_opentelemetrys_prometheus_exporter_gives_it() -> None:
    names = {metric.name: prometheus_name(metric) for metric in LEDGER_METRICS}
    assert names["streamledger.ledger.read.duration"] == "streamledger_ledger_read_duration_seconds"
    assert names["streamledger.ledger.stream.appended"] == "streamledger_ledger_stream_appended_total"
    assert names["streamledger.ledger.consumer.lag"] == "streamledger_ledger_consumer_lag"
    assert names["streamledger.ledger.up"] == "streamledger_ledger_up"
