"""The equal-hardware comparison of afd_models.cli.bench_serve: which plain run is the baseline,
which comparisons are refused, and that a failed client run never yields a time. The real
client runs against a real AFD pair in tests/e2e_cpu/test_serve_pair.py."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from afd_models import supervisor
from afd_models.cli import serve
from afd_models.cli.bench_serve import (
    BenchError,
    Deployment,
    Serving,
    UnstreamedRun,
    bench_serve,
    check_equal_hardware,
    comparison,
)


def _server(tmp_path: Path) -> serve.Server:
    group = supervisor.launch("fake", [sys.executable, "-c", "pass"], tmp_path / "log")
    assert group.process is not None and group.process.wait(60) == 0
    return serve.Server(group, 1)


def _run(name: str, concurrency: int, tokens_per_s: float, cores: int = 2) -> Serving:
    return Serving(name, name != "AFD", cores, concurrency, 32, tokens_per_s, 1, 2, 3.0, 4)


def test_the_faster_plain_run_at_the_same_concurrency_is_the_baseline() -> None:
    afd = _run("AFD", 8, 500)
    both = _run("plain, 2 cores", 8, 450)
    one = _run("plain, 1 core", 8, 600, cores=1)
    other = _run("plain, 1 core", 32, 900, cores=1)
    result = comparison(afd, [both, one, other])
    assert result.baseline is one
    assert result.plain == (both, one)
    assert result.throughput_ratio == pytest.approx(500 / 600)
    assert one.per_core == 600 and afd.per_core == 250


def test_no_plain_run_at_that_concurrency_is_refused() -> None:
    with pytest.raises(ValueError, match="no plain vLLM run at concurrency 1"):
        comparison(_run("AFD", 1, 5), [_run("plain", 8, 5)])


def test_a_baseline_with_a_core_the_afd_deployment_lacks_is_refused(tmp_path: Path) -> None:
    server = _server(tmp_path)
    afd = Deployment("AFD pair", server, ("0", "1"), plain=False)
    check_equal_hardware(afd, [Deployment("plain", server, ("0", "1"), plain=True)])
    with pytest.raises(ValueError, match=r"plain ran on cores 0,2.*extra: 2"):
        check_equal_hardware(afd, [Deployment("plain", server, ("0", "2"), plain=True)])


def _client(tmp_path: Path, body: str) -> list[str]:
    """A stand-in for vLLM's CLI that writes ``body`` as its saved result."""
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, pathlib
            args = sys.argv[1:]
            out = pathlib.Path(args[args.index("--result-dir") + 1])
            (out / args[args.index("--result-filename") + 1]).write_text({body!r})
            """
        )
    )
    return [sys.executable, str(script)]


def test_a_client_that_fails_never_gives_a_time(tmp_path: Path) -> None:
    deployment = Deployment("AFD pair", _server(tmp_path), ("0",), plain=False)
    with pytest.raises(BenchError, match="exited with 1"):
        bench_serve(deployment, tmp_path, 8, 16, client=[sys.executable, "-c", "exit(1)"])
    failed = '{"completed": 15, "failed": 1, "output_throughput": 99.0}'
    with pytest.raises(BenchError, match="15 of 16 requests completed, 1 failed"):
        bench_serve(deployment, tmp_path, 8, 16, client=_client(tmp_path, failed))


def test_a_complete_run_reads_the_clients_figures(tmp_path: Path) -> None:
    deployment = Deployment("AFD pair", _server(tmp_path), ("0", "1"), plain=False)
    saved = (
        '{"completed": 16, "failed": 0, "output_throughput": 320.0, "median_ttft_ms": 10.0, '
        '"p99_ttft_ms": 20.0, "median_tpot_ms": 3.0, "p99_tpot_ms": 5.0}'
    )
    run = bench_serve(deployment, tmp_path, 8, 16, client=_client(tmp_path, saved))
    assert (run.output_tokens_per_s, run.per_core, run.tpot_p99_ms) == (320.0, 160.0, 5.0)
    assert (run.concurrency, run.prompts, run.plain) == (8, 16, False)


def test_exchanges_between_two_readings_of_the_connector_statistics() -> None:
    """The demo and the serving benchmark read the pair's round trips as the difference of two
    readings of its running totals; a window without an exchange is an error, not a time."""
    before = {
        "exchanges": 10,
        "mean_round_trip_s": 0.001,
        "mean_wait_s": 0.0005,
        "bytes_sent": 1000,
        "steps": 5,
    }
    after = {
        "exchanges": 30,
        "mean_round_trip_s": 0.002,
        "mean_wait_s": 0.0015,
        "bytes_sent": 5000,
        "steps": 9,
    }
    exchanges = serve.exchanges_between(before, after)
    assert exchanges.mean_wait_s == pytest.approx((30 * 0.0015 - 10 * 0.0005) / 20)
    assert exchanges.count == 20
    assert exchanges.mean_round_trip_s == pytest.approx((30 * 0.002 - 10 * 0.001) / 20)
    assert exchanges.mean_bytes_sent == 200
    with pytest.raises(serve.ServerError, match="exchanged no layer"):
        serve.exchanges_between(after, after)


def test_an_unstreamed_run_is_no_time(tmp_path: Path) -> None:
    """A run whose tokens reached the client in one chunk per request (TPOT median 0, as a
    starved one-core server once gave) is refused, not kept as the fastest."""
    deployment = Deployment("plain", _server(tmp_path), ("0",), plain=True)
    saved = (
        '{"completed": 16, "failed": 0, "output_throughput": 329.0, "median_ttft_ms": 90.0, '
        '"p99_ttft_ms": 100.0, "median_tpot_ms": 0.0, "p99_tpot_ms": 3.5}'
    )
    with pytest.raises(UnstreamedRun, match=r"TPOT median 0.00 ms: most requests' tokens"):
        bench_serve(deployment, tmp_path, 1, 16, client=_client(tmp_path, saved))
