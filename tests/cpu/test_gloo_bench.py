"""The connector benchmark's five runs on a tiny payload, and a failing side ending a run with an
error rather than a time."""

from __future__ import annotations

import math
import socket
import time

import pytest

from afd_models.cli import gloo_bench

# AFD's own benchmark tool, on the primary release


@pytest.mark.timeout(300)
def test_connector_and_both_raw_baselines_give_positive_times() -> None:
    result = gloo_bench.measure(2, 8, iterations=6, layers=3, repeats=1)
    timings = (
        result.connector,
        result.connector_gloo,
        result.raw_shm,
        result.raw_gloo,
        result.raw_tcp,
    )
    for timing in timings:
        times = (timing.mean_s, timing.median_s, *timing.median_by_layer_s, timing.p99_s)
        assert len(times) == 2 + 3 + 1 and all(math.isfinite(t) and t > 0 for t in times), result
        assert timing.median_s <= timing.p99_s, timing
    assert result.nbytes == 2 * 8 * 2
    raws = (result.raw_shm, result.raw_gloo, result.raw_tcp)
    assert result.best_raw_s == min(t.mean_s for t in raws)
    assert result.ratio == result.connector_s / result.best_raw_s


@pytest.mark.timeout(120)
def test_a_failing_side_is_an_error_not_a_time() -> None:
    # The echo side cannot listen on a port this test holds; the timer side connects to the
    # test's socket instead and would wait for an answer until its 60 s timeout.
    with socket.create_server(("127.0.0.1", 0)) as held:
        plan = gloo_bench._Plan((1, 8), layers=3, warmup_steps=1, steps=1)
        started = time.monotonic()
        with pytest.raises(gloo_bench.BenchmarkError, match="raw TCP: rank 0 failed"):
            gloo_bench._run_pair("raw TCP", held.getsockname()[1], plan)
    assert time.monotonic() - started < gloo_bench.TIMEOUT_S / 2


def test_best_takes_the_lowest_of_each_statistic() -> None:
    runs = [
        gloo_bench.Timing(3.0, 1.0, (2.0, 1.0), 4.0),
        gloo_bench.Timing(2.0, 1.5, (1.0, 1.5), 5.0),
    ]
    assert gloo_bench.Timing.best(runs) == gloo_bench.Timing(2.0, 1.0, (1.0, 1.0), 4.0)
