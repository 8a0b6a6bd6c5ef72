"""What the benchmarks read of a process tree, checked on real processes: CPU seconds and
preemptions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamsafe_bench.processes import cpu_seconds, preempted_since, preemptions, process_tree

pytestmark = pytest.mark.timeout(60)

# Spins until it has used the given CPU seconds (its own clock: however long another process on
# the same CPU delays it), then exits.
_SPIN = """
import sys, time
end = float(sys.argv[1])
while time.process_time() < end:
    pass
"""


def _spinners(n: int, cpu_s: float, cpu: int) -> list[subprocess.Popen[bytes]]:
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN, str(cpu_s)]) for _ in range(n)]
    for p in procs:
        os.sched_setaffinity(p.pid, {cpu})
    return procs


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_two_spinners_sharing_one_cpu_preempt_each_other_and_their_cpu_is_counted():
    cpu = min(os.sched_getaffinity(0))
    procs = _spinners(2, 0.3, cpu)
    pids = [p.pid for p in procs]
    try:
        # Neither can finish its 0.3 s of CPU before the other ran: the scheduler's slices on
        # a shared CPU are a few milliseconds, so each is preempted many times.
        while preempted_since({}, pids[:1]) == 0 or preempted_since({}, pids[1:]) == 0:
            assert all(p.poll() is None for p in procs), "a spinner ended unpreempted"
        before = preemptions(pids)
        assert len(before) == 2 and all(n >= 1 for n in before.values())
        assert preempted_since(before, pids) >= 0
        assert cpu_seconds(pids) > 0
    finally:
        for p in procs:
            p.wait(timeout=30)
    # Gone processes count nothing (the benchmark reads trees whose members come and go), and
    # the threads that left never make the count negative.
    assert preemptions(pids) == {} and cpu_seconds(pids) == 0
    assert preempted_since(before, pids) == 0


def test_a_process_tree_is_the_process_and_its_children():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
        assert all(n >= 0 for n in preemptions(tree).values())
    finally:
        child.communicate(b"")
