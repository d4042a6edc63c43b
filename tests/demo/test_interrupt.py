"""Ctrl-C during ``nodegate demo`` ends it as interrupted (exit 130, one line), with its processes
stopped and its files removed, not as a failure of a step whose server the same Ctrl-C killed
(issue 34): the demo's child processes run in their own sessions, so the terminal's SIGINT reaches
only the demo, which stops them in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.demo import scenario
from bootstrap.demo.narration import DemoFailed
from tests.cli.test_cli import _processes_using

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.swtpm
def test_ctrl_c_ends_the_demo_as_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bootstrap.cli", "demo"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # its own process group, as a shell job is
    )
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("[4/12]"):  # swtpm and `nodegate serve` are running, joins start
                break
        else:
            pytest.fail("the demo ended before step 4: " + "".join(seen[-5:]))
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends: the whole foreground group
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["nodegate demo: interrupted; its processes and files are cleaned up"]
    assert _processes_using("nodegate-demo-") == []
    del out


class _DiesOfTheInterrupt:
    """A step that sees its server gone (killed by the same Ctrl-C) before the cancellation
    reaches it: the race the issue saw as "failed: ... Connect call failed"."""

    def __init__(self, root: Path, stack: object) -> None:
        del root, stack

    async def run(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # handled before the next line runs
        raise DemoFailed("nodegate serve: Cannot connect to host 127.0.0.1:1 [Connect call failed]")


def test_a_step_failing_of_the_interrupt_still_reads_interrupted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("kmock")
    monkeypatch.setattr(scenario, "Demo", _DiesOfTheInterrupt)
    assert scenario.run() == 130
    assert capsys.readouterr().err.splitlines() == [
        "nodegate demo: interrupted; its processes and files are cleaned up"
    ]
