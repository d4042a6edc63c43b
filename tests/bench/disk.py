"""A disk-key release against a join on the same machine (docs/disk-keys.md, "Cost"): the real
service in this process, a swtpm as the node's TPM, the real node clients. Both exchanges make
the TPM quote (the shared cost); a join also verifies the EK certificate chain, activates a
credential before the quote and issues an SVID; a release activates one after it and derives
keys. Also timed: the pin as Clevis runs it at boot (``clevis-decrypt-nodegate``, a new Python
process per unlock), which is what an unlock costs on top of the release.

Method: R rounds; each round times one join and one release in alternating order (and, every
round, one pin run); times are medians and p90 over rounds, the ratio the median of per-round
release/join ratios. The load average (os.getloadavg) is reported before and after: the machine
is shared, so compare ratios measured in one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench import common

ROUNDS = 15


async def _run(rounds: int, quick: bool, work: Path) -> dict[str, Any]:
    from bootstrap.demo import swtpm as harness
    from bootstrap.node.disk import jwe
    from tests.disk import luksimg
    from tests.disk import support as ds
    from tests.support.service import running
    from tests.support.swtpms import TpmInfo

    local = harness.make_ca(work / "xdg")
    (work / "tpm").mkdir()
    harness.manufacture(local, work / "tpm")
    tpm_server = harness.start(local, work / "tpm")
    tpm = TpmInfo(tpm_server.tcti, local.root, local.intermediate, tpm_server)
    try:
        async with running(ds.settings(work, tpm)) as r:
            await ds.joined(r, tpm, work)
            await ds.released(r, tpm, work)  # warm: caches, the first session key use
            out = await ds.released(r, tpm, work)
            binding = jwe.Binding(
                url=r.base, ca=ds.bundle(r, work).read_text(), node="disk-node", volume=ds.VOLUME,
                ek_sha256=out.ek_sha256, epoch=out.epoch, version=out.key_version,
            )  # fmt: skip
            token = jwe.seal(binding, out.key, b"a passphrase")
            env = luksimg.environment(work, luksimg.Machine(tpm.tcti, ds.boot_id(work)))
            pin = str(luksimg.pin_path(work) / "clevis-decrypt-nodegate")
            rounds = 3 if quick else rounds
            times: dict[str, list[float]] = {"join": [], "release": [], "pin": []}
            for i in range(rounds):
                order = ("join", "release") if i % 2 == 0 else ("release", "join")
                for what in order:
                    started = time.perf_counter()
                    if what == "join":
                        await ds.joined(r, tpm, work)
                    else:
                        await ds.released(r, tpm, work)
                    times[what].append(time.perf_counter() - started)
                started = time.perf_counter()
                code, plain, err = await luksimg.run([pin], env, stdin=token.encode())
                if code != 0 or plain != b"a passphrase":
                    raise RuntimeError(f"the pin failed: {err.decode()[-300:]}")
                times["pin"].append(time.perf_counter() - started)
    finally:
        tpm_server.stop()
    ratios = [rel / join for rel, join in zip(times["release"], times["join"], strict=True)]
    return {
        "rounds": rounds,
        "ms": {
            k: {"median": statistics.median(v) * 1000, "p90": common.percentile(v, 0.9) * 1000}
            for k, v in times.items()
        },
        "release_vs_join": statistics.median(ratios),
    }


def run(*, rounds: int, quick: bool) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="nodegate-bench-disk-") as folder:
        res = asyncio.run(_run(rounds, quick, Path(folder)))
    return {
        "benchmark": "disk",
        "quick": quick,
        **res,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": len(common.usable_cpus()),
        "versions": {"python": sys.version.split()[0], **common.versions(["cryptography", "tpm2-pytss"])},
        "swtpm": subprocess.run(
            ["swtpm", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
    }


def render(res: dict[str, Any]) -> str:
    ms = res["ms"]
    return "\n".join(
        [
            f"disk: {res['rounds']} rounds{' (quick)' if res['quick'] else ''}, {res['cpus']} CPUs, "
            f"load {res['loadavg_before'][0]:.1f} -> {res['loadavg_after'][0]:.1f}, {res['swtpm']}",
            "  exchange                         median ms    p90 ms",
            f"  join (start + finish)            {ms['join']['median']:9.1f} {ms['join']['p90']:9.1f}",
            f"  release (start + finish)         {ms['release']['median']:9.1f} {ms['release']['p90']:9.1f}",
            f"  pin process (release + unseal)   {ms['pin']['median']:9.1f} {ms['pin']['p90']:9.1f}",
            f"  release / join: {res['release_vs_join']:.2f} (median of per-round ratios)",
        ]
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench disk", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument("--rounds", type=common.positive, default=ROUNDS, help=f"timed rounds (default {ROUNDS})")
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results = run(rounds=args.rounds, quick=args.quick)
    print(json.dumps(results) if args.json else render(results))
    return 0
