"""Benchmarks: ``python -m bench streams|recovery|writer [--json]``.

``streams`` runs the demo's graph on the LMDB ledger (and the same handlers
on bare streams) beside a raw py-lmdb loop and a per-message sqlite3 loop
writing the same records;
``recovery`` times opening a ledger of a million acknowledged messages
against one of a thousand; ``writer`` measures the ledger writer's commit
rate alone and next to a CPU-busy event loop. Figures are never asserted in
tests; every run verifies its result before it reports one.
"""
