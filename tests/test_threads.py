"""``expertcache._threads.thread_map``: results in input order, and a failure or an interrupt that stops the work
within one task's time (the tasks not yet started are cancelled)."""

from __future__ import annotations

import threading
import time

import pytest

from expertcache._threads import thread_map


@pytest.mark.parametrize("jobs", [0, 1, 2, 5])
def test_results_come_in_input_order(jobs):
    def slow_first(i):
        time.sleep(0.02 if i == 0 else 0.0)      # the first task finishes last
        return i * i

    with thread_map(jobs) as run:
        assert list(run(slow_first, range(12))) == [i * i for i in range(12)]


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_a_failure_or_an_interrupt_cancels_the_tasks_not_started(error):
    started = []
    lock = threading.Lock()

    def task(i):
        with lock:
            started.append(i)
        if i == 0:
            raise ValueError("first task failed")
        time.sleep(0.02)
        return i

    t0 = time.perf_counter()
    with pytest.raises(error):
        with thread_map(2) as run:
            results = run(task, range(200))
            if error is KeyboardInterrupt:
                raise KeyboardInterrupt        # as Ctrl-C in the main thread while the pool works
            list(results)
    took = time.perf_counter() - t0
    assert len(started) < 20 and took < 1.0, (len(started), took)   # 200 tasks x 20 ms / 2 threads would be 2 s
