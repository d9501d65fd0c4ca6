"""Download, extract, summarize: a graph with Sub mounts, run by id on the ledger; kill it, run it again.

    python examples/doc_pipeline.py LEDGER RUN_ID URL [URL]

The first call with a run id starts the run; every later call resumes it:
nodes whose records the ledger confirmed are restored without running, the
rest start again from their function's entry. Each node's body appends a
line to ``LEDGER/work.log`` when it runs, so you can see what ran twice.
With ``PAUSE_IN=summarize`` set, summarize waits forever once it starts (so
a test can kill the process right there); ``NODE_DELAY=0.1`` makes every
node take that long (so random kills land inside the run).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

from ledger import open_ledger
from streams import Graph, Key, NodeContext, Retry, Timeout

URL = Key("url", str)
LANG = Key("lang", str)
PAGE = Key("page", str)
TEXT = Key("text", str)
SUMMARY = Key("summary", str)
FIRST_URL = Key("first_url", str)
SECOND_URL = Key("second_url", str)
FIRST_SUMMARY = Key("first_summary", str)
SECOND_SUMMARY = Key("second_summary", str)
DIGEST = Key("digest", str)


def build(log: Path) -> Graph:
    def ran(ctx: NodeContext) -> None:
        with log.open("a") as out:
            out.write("/".join((*ctx.path, ctx.node)) + "\n")
            out.flush()
            os.fsync(out.fileno())  # the log must show a run even if the process dies right after
        if os.environ.get("PAUSE_IN") == ctx.node:
            print(f"paused in {'/'.join((*ctx.path, ctx.node))}", flush=True)

    async def work(ctx: NodeContext) -> None:
        ran(ctx)
        await anyio.sleep(float(os.environ.get("NODE_DELAY", "0")))

    doc = Graph("doc", version="1", inputs=[URL, LANG])

    @doc.node(requires=[URL], provides=[PAGE], aspects=[Retry(attempts=3), Timeout(30)])
    async def download(ctx: NodeContext) -> None:
        await work(ctx)
        ctx.set(PAGE, f"<html>{ctx[URL]}: a page about {ctx[URL].split('.')[0]}</html>")  # fetch it, really

    @doc.node(requires=[PAGE], provides=[TEXT])
    async def extract(ctx: NodeContext) -> None:
        await work(ctx)
        ctx.set(TEXT, ctx[PAGE].removeprefix("<html>").removesuffix("</html>"))

    @doc.node(requires=[TEXT, LANG], provides=[SUMMARY], aspects=[Retry(attempts=2)])
    async def summarize(ctx: NodeContext) -> None:
        await work(ctx)
        if os.environ.get("PAUSE_IN") == "summarize":
            await anyio.sleep_forever()
        ctx.set(SUMMARY, f"[{ctx[LANG]}] {ctx[TEXT].split(': ')[1]}")

    pipeline = Graph("pipeline", version="1", inputs=[FIRST_URL, SECOND_URL])
    for mount, url, summary in (("first", FIRST_URL, FIRST_SUMMARY), ("second", SECOND_URL, SECOND_SUMMARY)):
        pipeline.sub(mount, doc, inlets={URL: url}, outlets={SUMMARY: summary}, fixed={LANG: "en"})

    @pipeline.node(requires=[FIRST_SUMMARY, SECOND_SUMMARY], provides=[DIGEST])
    async def combine(ctx: NodeContext) -> None:
        await work(ctx)
        ctx.set(DIGEST, f"{ctx[FIRST_SUMMARY]} | {ctx[SECOND_SUMMARY]}")

    return pipeline


async def main(path: Path, run_id: str, first: str, second: str) -> str:
    graph = build(path / "work.log")
    async with open_ledger(path) as ledger:
        known = {run.run_id for run in await ledger.runs()}
        if run_id in known:
            outcome = await ledger.resume(run_id, graph)
        else:
            outcome = await ledger.run(graph, {FIRST_URL: first, SECOND_URL: second}, run_id=run_id)
    how = "already finished" if outcome.already_finished else "resumed" if outcome.resumed else "ran"
    return f"{outcome.result[DIGEST]} ({how})"


if __name__ == "__main__":
    ledger_path, run, url_1, url_2 = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    print(anyio.run(main, ledger_path, run, url_1, url_2))
