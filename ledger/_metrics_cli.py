"""``python -m ledger metrics PATH|URL``: a ledger's metrics for Prometheus, read from the ledger.

It serves ``/metrics`` over HTTP in Prometheus' text format (version
0.0.4), each scrape reading the ledger as ``inspect`` does (read-only,
beside its owner or its workers; a read is reused for ``--max-age``
seconds, so scrapes close together read it once). ``--once`` prints the
exposition and exits. Names and labels are what OpenTelemetry's Prometheus
exporter makes of :data:`~ledger._ledger_metrics.LEDGER_METRICS` (dots become
underscores, a unit becomes a suffix, a counter ends in ``_total``), so a
dashboard reads these and a program's own metrics alike.

The first read must succeed (a path that is no ledger is the command's
error and exit code). A later read that fails is ``streamledger_ledger_up
0`` and one line on stderr, and the next scrape reads again. Ctrl-C or
SIGTERM stops it with exit code 0.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from ._arguments import port, positive_float
from ._connect import tools_for
from ._ledger_metrics import LEDGER_METRICS, LedgerMetric, LedgerReading, ObservedLedger, read_ledger_metrics
from ._listen import listening

__all__ = ["add_metrics_command", "as_json", "exposition", "prometheus_name", "run_metrics_command"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
#: OpenTelemetry's Prometheus names for the units the ledger's metrics have ("1" is no suffix).
_UNITS: Final = {"s": "seconds", "1": ""}


def add_metrics_command(commands: Any) -> None:
    metrics = commands.add_parser(
        "metrics",
        help="serve a ledger's lag, throughput, runs and failures to Prometheus, read from the ledger",
        description=(
            "Serve /metrics in Prometheus' text format at http://HOST:PORT, each scrape reading the ledger "
            "as inspect does (read-only, beside its owner or workers): lag, messages appended and "
            "acknowledged, exhausted and dead-lettered messages per stream template and group, runs and "
            "nodes by status, failed attempts. --once prints it once instead. Ctrl-C stops it (exit 0)."
        ),
    )
    metrics.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    metrics.add_argument("--once", action="store_true", help="print the exposition once and exit")
    metrics.add_argument(
        "--json",
        action="store_true",
        help=(
            'with --once, the reading as one JSON object: {"ledger": ..., "up": ..., "error": ..., '
            '"metrics": {NAME: [{"attributes": {...}, "value": ...}]}} (the names Prometheus sees); '
            'serving, its line as {"serving": URL, "ledger": ...}'
        ),
    )
    metrics.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    metrics.add_argument(
        "--port", type=port, default=9465, help="the port to listen on (default 9465; 0 picks a free one)"
    )
    metrics.add_argument(
        "--max-age",
        type=positive_float,
        default=1.0,
        metavar="S",
        help="reuse a read of the ledger for S seconds (default 1)",
    )


def run_metrics_command(args: argparse.Namespace) -> int:
    reading = read_ledger_metrics(args.path)  # the ledger's own error and exit code if it is none
    if args.once:
        sys.stdout.write(json.dumps(as_json(reading)) + "\n" if args.json else exposition(reading))
        return 0
    source = ObservedLedger(args.path, args.max_age)
    server = listening(
        args.host, args.port, lambda: ThreadingHTTPServer((args.host, args.port), _handler(source))
    )
    server.daemon_threads = True
    where, port = tools_for(args.path).describe(args.path), server.server_port
    url = f"http://{args.host}:{port}/metrics"
    if args.json:
        print(json.dumps({"serving": url, "ledger": where}), flush=True)
    else:
        print(f"serving the metrics of {where} at {url} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # the way to stop serving: not an error
        return 0
    finally:
        server.server_close()
    return 0


def _handler(source: ObservedLedger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self._answer(404, "text/plain; charset=utf-8", "the metrics are at /metrics\n")
                return
            reading = source.reading()
            if reading.error is not None:
                print(f"reading {reading.ledger} failed: {reading.error}", file=sys.stderr, flush=True)
            self._answer(200, CONTENT_TYPE, exposition(reading))

        def _answer(self, status: int, content_type: str, text: str) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a line per scrape says nothing an operator needs

    return Handler


def prometheus_name(metric: LedgerMetric) -> str:
    """``metric``'s name as OpenTelemetry's Prometheus exporter writes it."""
    name = re.sub(r"[^a-zA-Z0-9:]+", "_", metric.name)
    unit = re.sub(r"\{.*\}", "", metric.unit)
    suffix = _UNITS.get(unit, unit)
    if suffix and not name.endswith(f"_{suffix}"):
        name = f"{name}_{suffix}"
    return f"{name}_total" if metric.kind == "counter" else name


def exposition(reading: LedgerReading) -> str:
    """``reading`` in Prometheus' text format: a HELP and a TYPE line per metric, then its samples."""
    lines: list[str] = []
    for metric in LEDGER_METRICS:
        points = reading.points.get(metric.name)
        if not points:
            continue
        name = prometheus_name(metric)
        lines += [f"# HELP {name} {metric.description}", f"# TYPE {name} {metric.kind}"]
        for attributes, value in sorted(points.items()):
            labels = ",".join(f'{_label(key)}="{_escaped(text)}"' for key, text in attributes)
            lines.append(f"{name}{{{labels}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def as_json(reading: LedgerReading) -> dict[str, Any]:
    """``reading`` as ``metrics --once --json`` prints it: each metric's points by its Prometheus name."""
    metrics = {
        prometheus_name(metric): [
            {"attributes": dict(attributes), "value": int(value) if float(value).is_integer() else value}
            for attributes, value in sorted(reading.points[metric.name].items())
        ]
        for metric in LEDGER_METRICS
        if reading.points.get(metric.name)
    }
    return {"ledger": reading.ledger, "up": reading.error is None, "error": reading.error, "metrics": metrics}


def _label(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "_", key)


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
