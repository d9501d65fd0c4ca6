"""The command line's tools on a PostgreSQL ledger: each reads one read-only snapshot beside the workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streams import StreamRef

from .._messages import KeyFilter
from .._progress import SILENT, Progress
from .._tools import Tools
from ._faults import translated
from ._inspect import backup_postgres, check_postgres, inspect_postgres, keys_postgres, messages_postgres
from ._schema import migrate
from ._store import connect, database_name, describe_url

__all__ = ["TOOLS", "migrate_url"]


def migrate_url(url: str) -> tuple[int, int]:
    """Make the ledger's tables in an empty database, or migrate an older schema: (from, to) versions."""
    where = describe_url(url)
    with translated(where), connect(url) as conn:
        return migrate(conn, where)


async def _demo(
    url: str,
    messages: int,
    workers: int,
    progress: Callable[[Any], None] | None,
    interval: float,
    max_map_size: int,
    /,
    *,
    run_id: str,
    fresh: bool,
) -> Any:
    """The demo's shards on ``workers`` worker processes (progress and the map limit are LMDB's)."""
    from ._demo import run_demo_postgres

    return await run_demo_postgres(url, messages, workers=workers, run_id=run_id, fresh=fresh)


def _messages(
    url: str,
    ref: StreamRef,
    start: int,
    limit: int | None,
    /,
    *,
    last: int | None = None,
    key: KeyFilter | None = None,
    progress: Progress = SILENT,
) -> dict[str, Any]:
    return messages_postgres(url, ref, start=start, limit=limit, last=last, key=key, progress=progress)


TOOLS = Tools(
    describe=describe_url,
    name=database_name,
    inspect=lambda url, values: inspect_postgres(url, values=values),
    messages=_messages,
    keys=lambda url, ref, group, start, stop, limit: keys_postgres(
        url, ref, group, start=start, stop=stop, limit=limit
    ),
    check=check_postgres,
    backup=backup_postgres,
    backup_note="pg_dump's directory format: restore it with pg_restore",
    demo=_demo,
)
