"""A graph's identity is its declarations, not the module that loaded them; older records still resume.

A run started by ``python app.py`` (its types in ``__main__``) is resumed by a
program that does ``import app``, and taken over by a PostgreSQL worker given
``--graphs app:graph``. A type whose fields changed is still another graph.
A run, its Sub scope and its stream recorded by a release that named types
with their modules resume with the code that recorded them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import anyio
import msgspec
import psycopg
import pytest

from streams import ExecCheckpoint, Execution, Graph, Key, MessageTx, NodeContext, Stream, StreamRef
from streams.store import CheckpointChild, StreamOpen, qualified_type_name

from .conftest import Opener

ROOT = Path(__file__).resolve().parents[2]


class Size(Enum):
    SMALL = "s"
    LARGE = "l"


class Item(msgspec.Struct, frozen=True):
    sku: str
    size: Size


class Order(msgspec.Struct, frozen=True):
    number: int
    items: list[Item]
    note: str | None = None


class Summary(msgspec.Struct, frozen=True):
    orders: int
    largest: Literal["small", "large"]


COUNT = Key("count", int)
ORDERS = Key("orders", Stream[Order])
SUMMARY = Key("summary", Summary)
REPORT = Key("report", str)


def reporting(entered: anyio.Event, gate: anyio.Event, ran: list[str]) -> Graph:
    """report: sets ``entered``, waits for ``gate``, then reports the summary."""
    g = Graph("reporting", inputs=[SUMMARY])

    @g.node(requires=[SUMMARY], provides=[REPORT])
    async def report(ctx: NodeContext) -> None:
        ran.append("report")
        entered.set()
        await gate.wait()
        summary = ctx[SUMMARY]
        ctx.set(REPORT, f"{summary.orders} orders, largest {summary.largest}")

    return g


def shop(entered: anyio.Event, gate: anyio.Event, ran: list[str]) -> Graph:
    """take (writes orders) -> tally (reads them) -> Sub reports (:func:`reporting`).

    Each node appends its name to ``ran`` when it runs.
    """
    g = Graph("shop", inputs=[COUNT])

    @g.node(requires=[COUNT], provides=[ORDERS])
    async def take(ctx: NodeContext) -> None:
        ran.append("take")
        writer = ctx.writer(ORDERS)
        for number in range(1, ctx[COUNT] + 1):
            size = Size.LARGE if number % 2 else Size.SMALL
            await writer.send(Order(number, [Item(f"sku-{number}", size)]))

    @g.node(requires=[ORDERS], provides=[SUMMARY])
    async def tally(ctx: NodeContext) -> None:
        ran.append("tally")

        async def add(tx: MessageTx[int], order: Order) -> None:
            tx.set_state(tx.state + 1)
            large = any(item.size is Size.LARGE for item in order.items)
            largest: Literal["small", "large"] = "large" if large else "small"
            tx.set(SUMMARY, Summary(tx.state, largest))

        await ctx.handle_messages(ORDERS, add, initial_state=0)

    g.sub("reports", reporting(entered, gate, ran), inlets={SUMMARY: SUMMARY}, outlets={REPORT: REPORT})
    return g


#: The fingerprints the release before gave ``shop`` and its Sub's child, the types named with their
#: module (``tests.ledger.test_graph_identity.Order``): computed by that release, so they hold only
#: while this module keeps its name.
OLDER_FINGERPRINT = "f888e210da0da8f93d96489c97ad66512dbe738dfb84bd463706c898451acc1c"
OLDER_CHILD_FINGERPRINT = "ed4084ab4852e781c656eff52fad85d8df9c3ef6bcc5283acc023eb5522628ec"


class OlderStreams:
    """Stream hooks that open streams as the release before did: the message type with its module."""

    def __init__(self, hooks: Any) -> None:
        self._hooks = hooks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hooks, name)

    async def open(self, request: StreamOpen) -> Any:
        assert request.legacy_type_name is not None
        older = msgspec.structs.replace(request, type_name=request.legacy_type_name, legacy_type_name=None)
        return await self._hooks.open(older)


class OlderRelease:
    """Node hooks that write what the release before wrote: its Sub scopes under the legacy fingerprint
    (and, through ``streams``, its stream descriptors)."""

    def __init__(self, hooks: Any) -> None:
        self._hooks = hooks
        self.streams = OlderStreams(hooks.streams)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hooks, name)

    async def open_child(self, child: CheckpointChild) -> Any:
        assert child.legacy_fingerprint is not None
        older = msgspec.structs.replace(child, fingerprint=child.legacy_fingerprint, legacy_fingerprint=None)
        return await self._hooks.open_child(older)


async def test_a_run_recorded_before_types_were_named_by_shape_resumes_with_the_code_that_started_it(
    open_any: Opener,
) -> None:
    ran: list[str] = []
    entered, gate = anyio.Event(), anyio.Event()
    graph = shop(entered, gate, ran)
    topology = graph.topology()
    assert topology.legacy_fingerprint == OLDER_FINGERPRINT != topology.fingerprint
    assert reporting(entered, gate, ran).topology().legacy_fingerprint == OLDER_CHILD_FINGERPRINT
    async with open_any() as ledger:
        # the run as the release before recorded it: its fingerprint and shape name types with modules
        submitted = await ledger.submit(graph, {COUNT: 3}, run_id="older")
        older = msgspec.structs.replace(
            submitted, fingerprint=OLDER_FINGERPRINT, shape=dict(topology.legacy_shape)
        )
        await ledger.backend.run_book.write(older, new=False)
        first = Execution(graph, {COUNT: 3}, checkpoint=ExecCheckpoint("older", OlderRelease(ledger.nodes)))
        with anyio.CancelScope() as process:  # it stops inside the Sub: take, tally and the scope confirmed
            async with first:
                await entered.wait()
                process.cancel()
                await first.wait()
        descriptor = await ledger.streams.describe(StreamRef("older", "take", "orders"))
        assert descriptor is not None and descriptor.type_name == qualified_type_name(Order)

        gate.set()
        outcome = await ledger.resume("older", shop(anyio.Event(), gate, ran))
        assert outcome.resumed and outcome.result[REPORT] == "3 orders, largest large"
        assert ran == ["take", "tally", "report", "report"]  # take and tally were restored, not run
        (record,) = await ledger.runs()
        assert record.fingerprint == OLDER_FINGERPRINT  # kept as written: the release before resumes it too


#: An application: ``python app.py start|submit WHERE`` starts or submits run ``shop-1``. Its last
#: node stops the process (exit 3) unless the file ``go`` is beside it, so its first run ends there
#: with everything before confirmed. Each node that runs appends its name to the file ``ran``.
APP = """\
from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Literal

import anyio
import msgspec

from ledger import connect
from streams import Graph, Key, MessageTx, NodeContext, Stream

HERE = Path(__file__).resolve().parent


class Size(Enum):
    SMALL = "s"
    LARGE = "l"


class Item(msgspec.Struct, frozen=True):
    sku: str
    size: Size


class Order(msgspec.Struct, frozen=True):
    number: int
    items: list[Item]
    note: str | None = None


class Summary(msgspec.Struct, frozen=True):
    orders: int
    largest: Literal["small", "large"]


COUNT = Key("count", int)
ORDERS = Key("orders", Stream[Order])
SUMMARY = Key("summary", Summary)
REPORT = Key("report", str)


def ran(node: str) -> None:
    with open(HERE / "ran", "a") as log:
        log.write(node + "\\n")


reporting = Graph("reporting", inputs=[SUMMARY])


@reporting.node(requires=[SUMMARY], provides=[REPORT])
async def report(ctx: NodeContext) -> None:
    ran("report")
    if not (HERE / "go").exists():
        os._exit(3)  # the process stops here: take, tally and the Sub's scope are confirmed
    summary = ctx[SUMMARY]
    ctx.set(REPORT, f"{summary.orders} orders, largest {summary.largest}")


graph = Graph("shop", inputs=[COUNT])


@graph.node(requires=[COUNT], provides=[ORDERS])
async def take(ctx: NodeContext) -> None:
    ran("take")
    writer = ctx.writer(ORDERS)
    for number in range(1, ctx[COUNT] + 1):
        size = Size.LARGE if number % 2 else Size.SMALL
        await writer.send(Order(number, [Item(f"sku-{number}", size)]))


@graph.node(requires=[ORDERS], provides=[SUMMARY])
async def tally(ctx: NodeContext) -> None:
    ran("tally")

    async def add(tx: MessageTx[int], order: Order) -> None:
        tx.set_state(tx.state + 1)
        large = any(item.size is Size.LARGE for item in order.items)
        tx.set(SUMMARY, Summary(tx.state, "large" if large else "small"))

    await ctx.handle_messages(ORDERS, add, initial_state=0)


graph.sub("reports", reporting, inlets={SUMMARY: SUMMARY}, outlets={REPORT: REPORT})


async def main(command: str, where: str) -> None:
    async with connect(where) as ledger:
        if command == "submit":
            await ledger.submit(graph, {COUNT: 3}, run_id="shop-1")
        else:
            outcome = await ledger.start(graph, {COUNT: 3}, run_id="shop-1")
            print(outcome.result[REPORT])


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
"""

#: Another program, which imports the application and continues its run: prints its report, or the
#: refusal (exit 2).
RESUME = """\
import sys

import anyio

import app
from ledger import RunMismatchError, connect


async def main(where: str) -> None:
    async with connect(where) as ledger:
        try:
            outcome = await ledger.resume("shop-1", app.graph)
        except RunMismatchError as exc:
            print(exc)
            raise SystemExit(2) from None
        print(outcome.result[app.REPORT], "(already finished)" if outcome.already_finished else "(resumed)")


anyio.run(main, sys.argv[1])
"""


@pytest.fixture(params=["lmdb", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger, as the programs are told where it is: an LMDB directory or a PostgreSQL URL."""
    if request.param == "lmdb":
        return str(tmp_path / "ledger")
    return str(request.getfixturevalue("postgres_url"))


def programs(tmp_path: Path) -> Path:
    """The application and the program that imports it, beside each other in ``tmp_path``."""
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "resume.py").write_text(RESUME)
    return tmp_path


def python(here: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` run in ``here`` on this checkout's packages."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=here, env=env, capture_output=True, text=True, timeout=120
    )


def nodes_ran(here: Path) -> list[str]:
    return (here / "ran").read_text().split()


def stopped_in_report(here: Path, where: str) -> None:
    """Start the run as a script; it stops in its last node, the nodes before it confirmed."""
    first = python(here, "app.py", "start", where)
    assert first.returncode == 3, first.stderr
    assert nodes_ran(here) == ["take", "tally", "report"]
    if where.startswith(
        "postgresql:"
    ):  # the dead process's lease on the run runs out (now, not in its seconds)
        with psycopg.connect(where) as conn:
            conn.execute("UPDATE streamledger_leases SET expires_at = now() - interval '1s'")


def test_a_run_started_as_a_script_is_resumed_by_a_program_that_imports_it(
    tmp_path: Path, where: str
) -> None:
    here = programs(tmp_path)
    stopped_in_report(here, where)
    (here / "go").touch()
    resumed = python(here, "resume.py", where)  # Order is app.Order now, not __main__.Order
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    assert resumed.stdout.strip() == "3 orders, largest large (resumed)"
    assert nodes_ran(here) == ["take", "tally", "report", "report"]  # take and tally were restored


def test_a_run_resumed_with_a_type_whose_fields_changed_is_refused_naming_the_type(
    tmp_path: Path,
) -> None:
    here = programs(tmp_path)
    where = str(tmp_path / "ledger")
    stopped_in_report(here, where)
    (here / "app.py").write_text(
        APP.replace("    note: str | None = None\n", "    note: str | None = None\n    rush: bool = False\n")
    )
    (here / "go").touch()
    refused = python(here, "resume.py", where)
    assert refused.returncode == 2, refused.stderr
    message = refused.stdout.strip()
    assert message.startswith(
        "run 'shop-1' started with graph 'shop' version '1'; the graph given is 'shop' "
    )
    assert "node 'take' provides key 'orders' was Stream[Order{number: int, items: list[Item{" in message
    assert "note: str | None, rush: bool}] (type Order: field 'rush' is new)" in message
    assert "node 'tally' requires key 'orders' was " in message
    assert nodes_ran(here) == ["take", "tally", "report"]  # nothing ran


def test_a_run_a_script_submitted_is_taken_over_by_a_worker_given_the_imported_graph(
    tmp_path: Path, postgres_url: str
) -> None:
    here = programs(tmp_path)
    submitted = python(here, "app.py", "submit", postgres_url)
    assert submitted.returncode == 0, submitted.stderr
    (here / "go").touch()
    worker = python(
        here,
        "-m",
        "ledger",
        "worker",
        postgres_url,
        "--graphs",
        "app:graph",
        "--poll",
        "0.05",
        "--until-idle",
    )
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.splitlines() == [
        "run shop-1: claimed",
        "run shop-1: completed",
        "worker ended 1 run(s)",
    ]
    assert nodes_ran(here) == ["take", "tally", "report"]
    finished = python(here, "resume.py", postgres_url)
    assert finished.stdout.strip() == "3 orders, largest large (already finished)", finished.stderr
