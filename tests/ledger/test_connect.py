"""``ledger.connect(target)``: one program, moved from a directory to a server by its one argument."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from ledger import Ledger, LmdbBackend, NotALedgerError, connect
from ledger._connect import tools_for
from ledger.postgres import PgBackend
from streams import Key, MessageTx, Stream, handle_messages, open_scope

from ..ledger_command import ledger_command
from .pool_graphs import ANSWER, N, answer, summing

pytestmark = pytest.mark.anyio

NUMBERS = Key("numbers", Stream[int])


async def program(target: str) -> tuple[int, int, int]:
    """A pipeline and a graph run, written once against whatever ``connect`` opens."""

    async def add(tx: MessageTx[int], value: int) -> None:
        tx.set_state(tx.state + value)

    async with connect(target) as ledger:
        async with open_scope(ledger.streams, scope="p") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("adder",))
            for i in range(1, 11):
                await stream.writer().send(i)
            await stream.writer().finish()
            total = (await handle_messages(stream.reader("adder"), add, initial_state=0)).state
        result = (await ledger.run(summing(), {N: 6}, run_id="r")).result[ANSWER]
        return total, result, len(await ledger.runs())


async def test_the_same_program_runs_on_a_path_and_on_a_url(tmp_path: Path, postgres_url: str) -> None:
    on_lmdb = await program(str(tmp_path / "ledger"))
    on_postgres = await program(postgres_url)
    assert on_lmdb == on_postgres == (55, answer(6), 1)
    async with connect(tmp_path / "ledger") as local, connect(postgres_url) as shared:
        assert type(local) is type(shared) is Ledger  # one face over both backends
        assert isinstance(local.backend, LmdbBackend) and isinstance(shared.backend, PgBackend)


async def test_a_url_takes_no_lmdb_options(postgres_url: str) -> None:
    with pytest.raises(TypeError, match="takes no options"):
        async with connect(postgres_url, sync=False):
            pass


@pytest.mark.parametrize(
    "target", ["http://example.com/x", "HTTPS://user:secret@example.com/x", "sqlite:///x"]
)
async def test_a_url_of_another_scheme_is_no_ledger_and_no_path(target: str, tmp_path: Path) -> None:
    """Read as a path, ``http://example.com/x`` would name a directory ``http:/example.com/x``."""
    with pytest.raises(NotALedgerError, match=r"is not a ledger's scheme: .* postgresql://") as refused:
        async with connect(target):
            pass
    assert "secret" not in str(refused.value)
    with pytest.raises(NotALedgerError):
        tools_for(target)
    done = ledger_command("inspect", target, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    scheme = target.partition("://")[0]
    assert done.stderr == (
        f"error: {scheme}:// is not a ledger's scheme: a ledger is a directory, or a postgresql:// "
        "(or postgres://) URL\n"
    )
    assert [made async for made in anyio.Path(tmp_path).iterdir()] == []  # no directory was made
