"""bench --background-load: competing processes started, and always stopped."""

import argparse
import os
import subprocess
import sys
import time

import pytest

from policyopt.bench import background_load
from policyopt.bench.background_load import BackgroundLoad
from policyopt.cli import bench


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_started_and_stopped_with_the_block():
    with BackgroundLoad(2, threads=1) as load:
        pids = [p.pid for p in load.processes]
        time.sleep(0.3)
        assert load.running() == 2
    assert load.processes == []
    assert not any(alive(p) for p in pids)


def test_stopped_on_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt), BackgroundLoad(1, threads=1) as load:
        pids = [p.pid for p in load.processes]
        raise KeyboardInterrupt
    assert not any(alive(p) for p in pids)


@pytest.mark.slow
def test_a_burner_exits_when_its_starter_is_killed():
    code = (
        "import os, signal, sys, time; from policyopt.bench.background_load import BackgroundLoad;"
        "load = BackgroundLoad(1, threads=1).start(); print(load.processes[0].pid, flush=True);"
        "time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pid)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="-1 processes"):
        BackgroundLoad(-1)
    with pytest.raises(ValueError, match="0 threads"):
        BackgroundLoad(1, threads=0)


def test_bench_stops_the_load_when_the_loaded_run_fails(monkeypatch):
    made = []

    class Recording(BackgroundLoad):
        def start(self):
            made.append(self)
            return super().start()

    calls = []

    def fake_report(args, algos, settings, console):
        calls.append(algos)
        if len(calls) == 2:  # the run under load
            assert made[0].running() == 1
            raise KeyboardInterrupt
        return {"step_time_s": {"grpo": 1.0}}

    monkeypatch.setattr(background_load, "BackgroundLoad", Recording)
    monkeypatch.setattr(bench, "bench_report", fake_report)
    parser = argparse.ArgumentParser()
    bench.add_bench(parser.add_subparsers())
    args = parser.parse_args(["bench", "--background-load", "1", "--load-threads", "1"])
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(args)
    assert len(calls) == 2
    assert made[0].processes == []
    assert made[0].running() == 0


def test_bench_reports_the_loaded_run_beside_the_quiet_one(monkeypatch, tmp_path):
    def fake_report(args, algos, settings, console):
        return {"step_time_s": {"grpo": 2.0 if background_load_running() else 1.0}}

    started = []

    class Recording(BackgroundLoad):
        def start(self):
            started.append(self)
            return super().start()

    def background_load_running():
        return bool(started) and started[0].running() > 0

    monkeypatch.setattr(background_load, "BackgroundLoad", Recording)
    monkeypatch.setattr(bench, "bench_report", fake_report)
    parser = argparse.ArgumentParser()
    bench.add_bench(parser.add_subparsers())
    out = tmp_path / "b.json"
    args = parser.parse_args(
        ["bench", "--background-load", "2", "--load-threads", "1", "--json-out", str(out)]
    )
    assert bench.run_bench(args) == 0
    import json

    report = json.loads(out.read_text())
    assert report["step_time_s"] == {"grpo": 1.0}
    assert report["background_load"] == {
        "processes": 2,
        "threads_each": 1,
        "step_time_s": {"grpo": 2.0},
    }
