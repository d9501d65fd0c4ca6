"""docs/grafana-dashboard.json parses, and every metric its queries read is one the library exports:
a program's instrument (``METRIC``) or a metric of ``python -m ledger metrics``, as Prometheus names it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, ObservableGauge
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ledger import LEDGER_METRICS, LedgerMetric
from ledger._metrics_cli import prometheus_name
from streams._metrics import _Instruments
from streams.store import METRIC

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
PAGE = ROOT / "docs" / "observability.md"


def program_names() -> set[str]:
    """The Prometheus names of the program's instruments, made on an SDK meter of their own."""
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("streamledger")
    made = vars(_Instruments(meter)).values()
    read_from_ledgers = {m.name for m in LEDGER_METRICS}
    assert {i.name for i in made} | {METRIC.LAG} == {
        v for k, v in vars(METRIC).items() if not k.startswith("_") and v not in read_from_ledgers
    }  # every METRIC of a program is made here (the lag gauge is not kept as an attribute)
    names = {prometheus_name(LedgerMetric(METRIC.LAG, "gauge", "{message}", ""))}
    for instrument in made:
        if isinstance(instrument, Counter):
            names.add(prometheus_name(LedgerMetric(instrument.name, "counter", instrument.unit, "")))
        elif isinstance(instrument, Histogram):
            base = prometheus_name(LedgerMetric(instrument.name, "gauge", instrument.unit, ""))
            names |= {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
        else:
            assert isinstance(instrument, ObservableGauge), instrument
    return names


def queried(expr: str) -> set[str]:
    """The metric names a PromQL query reads: what is left once label matchers and groupings are out."""
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)
    return set(re.findall(r"\b(?:streamledger|messaging)_[a-z_]+\b", expr))


def test_every_query_of_the_dashboard_reads_a_metric_the_library_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    assert "lag" in titles and "per second" in titles and "failed" in titles  # lag, throughput, failures
    read = set().union(*map(queried, exprs))
    exported = program_names() | {prometheus_name(m) for m in LEDGER_METRICS}
    assert read and read <= exported, sorted(read - exported)
    assert {"streamledger_ledger_consumer_lag", "messaging_client_sent_messages_total"} <= read


def test_the_page_names_every_metric_the_library_exports_to_prometheus() -> None:
    text = PAGE.read_text()
    bases = {re.sub(r"_(bucket|sum|count)$", "", n) for n in program_names()}
    missing = sorted(n for n in bases | {prometheus_name(m) for m in LEDGER_METRICS} if f"`{n}`" not in text)
    assert missing == []
