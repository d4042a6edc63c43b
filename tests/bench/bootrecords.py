"""Benchmark of boot records (issue 43): what-if over a fleet of N stored records (default 10,000),
the fleet view's grouping, what a record costs the join, and what it costs the store per node.

Fleet: N records built from the real firmware logs of the public test data (``eventlogs/``, each
boot log in turn, every node its own boot id), as the join service keeps them, in a sqlite store
written by the store's own row code. Cases, per round (cases in a rotating order):

  whatif      ``nodegate policy whatif``'s work after reading: every record judged by a new
              measured_boot policy (the classes learned from the logs with one boot application
              dropped from every other class: half the fleet refused) and compared
  read        the sqlite store's records read (read only) and validated: the rest of whatif
  group       the fleet view's grouping of the N records
  join        the baseline, measured in the same run: the join's own verdict per log (parse,
              replay against the quote, facts, evaluate) times N / logs: what judging the same
              boots from their logs would cost
  build       a record built from a judged log (what a join now adds), per join

Sizes: the record's JSON (median, max); the sqlite file per node with and without records; a
NodeAttestation as the kubernetes store writes it, with and without (the record is an annotation
and status.boot). Results are medians over rounds, with the load average; the ratio whatif/join
is the point (a what-if must be cheaper than judging the logs again), absolute times vary by
machine. Targets (reported, never asserted): whatif + read of 10,000 records in under 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from attest import eventlog
from attest.bootrecord import fleet
from attest.bootrecord.build import build_record, record_facts
from attest.bootrecord.model import BootRecord
from attest.bootrecord.whatif import Policies, compare
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from attest.measuredboot.model import MeasuredBootClass, MeasuredBootPolicy
from attest.tpm import Counters
from bootstrap.gate.cache import slim_attestation
from bootstrap.store.kube.objects import boot_status, sessions_json, written_annotations
from bootstrap.store.model import NodeRecord
from bootstrap.store.sqlite.readonly import read_boot_records
from bootstrap.store.sqlite.rows import put_dbx, put_record
from bootstrap.store.sqlite.schema import SCHEMA, migrate
from tests.bench import common
from tests.support.shared_data import shared

NODES = 10_000
ROUNDS = 5
PCRS = range(10)
LOGS = shared("eventlogs")
NOT_A_BOOT = {"go-attestation-short-no-action.bin"}
TARGET_SECONDS = 10.0


def _quote(log: eventlog.EventLog) -> dict[str, dict[int, bytes]]:
    bank = bootfacts.preferred_bank(log.banks)
    assert bank is not None
    replayed = log.replay([bank])[bank]
    size = len(next(iter(replayed.values())))
    return {bank: {i: replayed.get(i, log.reset_value(i, size)) for i in PCRS}}


class Corpus:
    """The logs, their quotes and facts, and the policies (learned, stricter)."""

    def __init__(self) -> None:
        LOGS.require()
        self.names = sorted(set(LOGS.names()) - NOT_A_BOOT)
        self.raw = {n: LOGS.read(n) for n in self.names}
        self.quoted = {n: _quote(eventlog.parse(self.raw[n])) for n in self.names}
        self.facts = {}
        for n in self.names:
            facts = record_facts(eventlog.parse(self.raw[n]), self.quoted[n])
            assert facts is not None
            self.facts[n] = facts
        classes = [self._class(i, n) for i, n in enumerate(self.names)]
        self.learned = MeasuredBootPolicy(classes=tuple(c for c, _ in classes))
        self.stricter = MeasuredBootPolicy(classes=tuple(s for _, s in classes))

    def _class(self, i: int, name: str) -> tuple[MeasuredBootClass, MeasuredBootClass]:
        facts = self.facts[name]
        label = f"c{i}"
        if facts.bank == "sha256":
            c = measuredboot.learn([facts], name=label)
        else:
            c = MeasuredBootClass(
                name=label,
                authorities=tuple(f"sha256:{a.sha256}" for a in facts.authorities),
                efi_actions=tuple(dict.fromkeys(a.text for a in facts.vendor_actions)),
            )
        apps = c.boot_applications
        stricter = c.model_copy(update={"boot_applications": apps[1:]}) if apps and i % 2 else c
        return c, stricter

    def record(self, name: str, node: int, at: datetime) -> tuple[BootRecord, dict[str, bytes]]:
        log = eventlog.parse(self.raw[name])
        facts = self.facts[name]
        result = measuredboot.evaluate(self.learned, facts)
        built = build_record(
            attested_at=at,
            quoted=self.quoted[name],
            boot_id=f"{node:08x}-0000-4000-8000-000000000000",
            counters=Counters(node % 50, 0, node),
            pcr_class=None,
            firmware_version=0x0007_0055_0000_0000,
            log=log,
            facts=facts,
            policy=self.learned,
            matched_class=result.matched_class,
        )
        return built.record, built.dbx


def _fleet(corpus: Corpus, n: int) -> tuple[list[tuple[str, BootRecord]], dict[str, bytes]]:
    base = {
        name: corpus.record(name, i, datetime(2026, 3, 1, tzinfo=UTC)) for i, name in enumerate(corpus.names)
    }
    records, dbx = [], {}
    for i in range(n):
        rec, kept = base[corpus.names[i % len(corpus.names)]]
        records.append(
            (f"node-{i:05d}", rec.model_copy(update={"boot_id": f"{i:08x}-0000-4000-8000-000000000000"}))
        )
        dbx.update(kept)
    return records, dbx


def _node_record(name: str, i: int, rec: BootRecord | None) -> NodeRecord:
    at = datetime(2026, 3, 1, tzinfo=UTC) + timedelta(seconds=i)
    return NodeRecord(
        node_name=name,
        ek_sha256=f"{i:064x}",
        ak_public=os.urandom(280),
        spiffe_id=f"spiffe://fleet.example/node/{name}",
        counters=Counters(i % 50, 0, i),
        attested_at=at,
        expires_at=at + timedelta(hours=1),
        revoked=False,
        svid_serials=tuple(f"{i:x}{s:02x}" for s in range(8)),
        boot_id=rec.boot_id if rec is not None else None,
        boot_record=rec,
    )


def _sqlite(
    folder: Path, records: Sequence[tuple[str, BootRecord]], dbx: dict[str, bytes], with_records: bool
) -> int:
    path = folder / ("with.db" if with_records else "without.db")
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, SCHEMA)
    db.execute("BEGIN")
    for i, (name, rec) in enumerate(records):
        put_record(db, _node_record(name, i, rec if with_records else None))
    if with_records:
        put_dbx(db, tuple(dbx.items()))
    db.execute("COMMIT")
    db.execute("VACUUM")
    db.close()
    return path.stat().st_size


def _object_bytes(rec: BootRecord | None, *, gate: bool = False) -> int:
    """A NodeAttestation as the kubernetes store writes it (annotations, spec, status); with
    ``gate``, as the gate's informer keeps it (bootstrap.gate.cache.slim_attestation)."""
    node = _node_record("node-00001", 1, rec)
    now = datetime(2026, 3, 1, tzinfo=UTC)
    ann = written_annotations(
        node,
        sessions=sessions_json([]),
        audit=json.dumps(
            [{"at": "x" * 20, "action": "renew", "actor": "node", "code": "", "detail": "y" * 120}] * 20
        ),
    )
    obj = {
        "metadata": {"name": node.node_name, "annotations": {k: v for k, v in ann.items() if v is not None}},
        "spec": {"ekSha256": node.ek_sha256, "spiffeId": node.spiffe_id, "revoked": False},
        "status": {
            "attestedAt": now.isoformat(),
            "expiresAt": now.isoformat(),
            "bootID": node.boot_id,
            "resetCount": 1,
        },
    }
    if rec is not None:
        obj["status"]["boot"] = {k: v for k, v in (boot_status(rec) or {}).items() if v is not None}
    return len(json.dumps(slim_attestation(obj) if gate else obj, separators=(",", ":")))


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(nodes: int = NODES, rounds: int = ROUNDS) -> dict[str, Any]:
    corpus = Corpus()
    records, dbx = _fleet(corpus, nodes)
    sizes = sorted(len(r.to_json()) for _, r in records[: len(corpus.names)])
    new = Policies(corpus.stricter)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with_size = _sqlite(folder, records, dbx, True)
        without_size = _sqlite(folder, records, dbx, False)
        db = folder / "with.db"
        logs = [(corpus.raw[n], corpus.quoted[n]) for n in corpus.names]

        def join_all() -> None:  # the baseline: judge every node's boot from its log
            for i in range(nodes):
                raw, quoted = logs[i % len(logs)]
                parsed = eventlog.parse(raw)
                eventlog.verify_replay(parsed, quoted)
                facts = record_facts(parsed, quoted)
                assert facts is not None
                measuredboot.evaluate(corpus.stricter, facts)

        judged = [
            (
                eventlog.parse(corpus.raw[n]),
                corpus.quoted[n],
                corpus.facts[n],
                measuredboot.evaluate(corpus.learned, corpus.facts[n]),
            )
            for n in corpus.names
        ]
        at = datetime(2026, 3, 1, tzinfo=UTC)

        def build_all() -> None:  # what a join adds: the record from what its verdict read
            for log, quoted, facts, result in judged:
                build_record(
                    attested_at=at,
                    quoted=quoted,
                    boot_id="00000001-0000-4000-8000-000000000000",
                    counters=Counters(1, 0, 1),
                    firmware_version=1,
                    log=log,
                    facts=facts,
                    policy=corpus.learned,
                    matched_class=result.matched_class,
                )

        cases: dict[str, Callable[[], object]] = {
            "whatif": lambda: compare(records, new, None, dbx),
            "read": lambda: read_boot_records(db),
            "group": lambda: fleet.grouped(records),
            "join": join_all,
            "build": build_all,
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        loads = []
        for r in range(rounds):
            order = list(cases)[r % len(cases) :] + list(cases)[: r % len(cases)]
            for name in order:
                times[name].append(_time(cases[name]))
            loads.append(os.getloadavg()[0])
    changes = compare(records, new, None, dbx)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "benchmark": "bootrecords",
        "nodes": nodes,
        "logs": len(corpus.names),
        "rounds": rounds,
        "load_avg": statistics.median(loads),
        "seconds": med,
        "whatif_plus_read_s": med["whatif"] + med["read"],
        "whatif_vs_join": med["whatif"] / med["join"],
        "build_us_per_join": med["build"] / len(corpus.names) * 1e6,
        "join_us_per_node": med["join"] / nodes * 1e6,
        "refused": sum(1 for c in changes if c.kind == "refused"),
        "record_json_bytes": {"median": statistics.median(sizes), "max": max(sizes)},
        "sqlite_bytes_per_node": {"with": with_size / nodes, "without": without_size / nodes},
        "nodeattestation_bytes": {"with": _object_bytes(records[0][1]), "without": _object_bytes(None)},
        "gate_cache_bytes": {"with": _object_bytes(records[0][1], gate=True)},
        "distinct_dbx": len(dbx),
        "target_s": TARGET_SECONDS,
    }


def render(r: dict[str, Any]) -> str:
    s, size = r["seconds"], r["record_json_bytes"]
    sql, obj = r["sqlite_bytes_per_node"], r["nodeattestation_bytes"]
    lines = [
        f"boot records: {r['nodes']} nodes from {r['logs']} real logs, {r['rounds']} rounds, "
        f"load {r['load_avg']:.2f}",
        f"  whatif (judge + compare)   {s['whatif']:.2f} s   ({r['refused']} would be refused)",
        f"  read (sqlite, validate)    {s['read']:.2f} s",
        f"  whatif + read              {r['whatif_plus_read_s']:.2f} s   (target < {r['target_s']:.0f} s)",
        f"  group (fleet view)         {s['group']:.3f} s",
        f"  join baseline (from logs)  {s['join']:.2f} s   ({r['join_us_per_node']:.0f} us/node); "
        f"whatif/join = {r['whatif_vs_join']:.2f}",
        f"  record build per join      {r['build_us_per_join']:.0f} us",
        f"  record JSON                median {size['median']:.0f} B, max {size['max']} B",
        f"  sqlite per node            {sql['with']:.0f} B with records, {sql['without']:.0f} B without "
        f"({r['distinct_dbx']} distinct dbx kept once)",
        f"  NodeAttestation            {obj['with']} B with the record, {obj['without']} B without; "
        f"the gate keeps {r['gate_cache_bytes']['with']} B of it",
    ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench bootrecords", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument("--rounds", type=common.positive, default=ROUNDS, help=f"timed rounds (default {ROUNDS})")
    p.add_argument("--nodes", type=common.positive, default=NODES, help=f"records (default {NODES})")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of 1,000 records")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    nodes, rounds = (1000, 2) if args.quick else (args.nodes, args.rounds)
    results = run(nodes, rounds)
    print(json.dumps(results, separators=(",", ":")) if args.json else render(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
