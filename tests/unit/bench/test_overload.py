"""The overload benchmark's own arithmetic: the event-loop bound from r and a, the socket
sampling and the refusal-only model's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import overload
from bench.fleet import bench_tables
from livefit.server.config.model_tables import ServeSettings


def test_bound_is_what_one_loop_can_answer_at_m_times_its_capacity() -> None:
    assert overload.bound(1, 0.5) == 1.0
    assert overload.bound(3, 0.0) == 1.0
    # r/a = 0.09 is about what 0.8x at 3x needs (issue #29 item 5)
    assert overload.bound(3, 0.09) == pytest.approx(0.802, abs=1e-3)
    assert overload.bound(3, 0.2) == pytest.approx(0.5)
    assert overload.bound(3, 0.4) == 0.0  # refusing alone takes more than the loop
    # at the bound the loop spends exactly one second per second
    a, r, capacity = 140e-6, 30e-6, 1 / 140e-6
    g = overload.bound(3, r / a) * capacity
    assert g * a + (3 * capacity - g) * r == pytest.approx(1.0)


def test_socket_sampling_counts_the_server_side_only(tmp_path: Path) -> None:
    port = 8123  # 0x1FBB
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt\n"
        "   0: 0100007F:1FBB 00000000:0000 0A 00000000:00000003 00:00000000 00000000\n"
        "   1: 0100007F:1FBB 0100007F:C350 01 00000000:00000190 00:00000000 00000000\n"
        "   2: 0100007F:C350 0100007F:1FBB 01 00000000:00000999 00:00000000 00000000\n"
        "   3: 0100007F:1FBB 0100007F:C351 01 00000000:00000000 00:00000000 00000000\n"
    )
    sampler = overload._RssSampler.__new__(overload._RssSampler)
    sampler.port, sampler.request_bytes = f":{port:04X} ", 200
    sampler.proc_net_tcp, sampler.unread, sampler.backlog = str(table), [], []
    sampler._sample_sockets()
    assert sampler.unread == [0x190] and sampler.backlog == [3]
    assert sampler.sockets(1.0) == {
        "unread_requests_mean": 2.0, "unread_requests_peak": 2.0, "accept_queue_peak": 3.0
    }  # fmt: skip


def test_the_refusal_only_model_holds_one_row_for_longer_than_a_run() -> None:
    serve = ServeSettings(**bench_tables((overload.REFUSE_MODEL,))[overload.REFUSE_MODEL]["serve"])
    assert serve.max_queue_rows == 1
    assert serve.batch_timeout_ms == serve.max_batch_timeout_ms == 10_000
    assert serve.default_deadline_ms > serve.batch_timeout_ms


def test_event_loop_share_from_schedstat_samples() -> None:
    sampler = overload._RssSampler.__new__(overload._RssSampler)
    # (when, CPU s, run-queue wait s): 2 s of load from t=10, sampled before, during, after
    sampler.loop = [(9.0, 0.0, 0.0), (10.0, 1.0, 0.0), (11.0, 1.5, 0.25), (12.0, 2.0, 0.5),
                    (13.0, 3.0, 0.5)]  # fmt: skip
    share = overload._RssSampler.event_loop(sampler, 10.0, 2.0)
    assert share == {"ran": 0.5, "waited": 0.25, "idle": 0.25}
    assert overload._RssSampler.event_loop(sampler, 20.0, 2.0) == {}
