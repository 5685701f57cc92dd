"""How the backend reaches Ray: a cluster address that nothing answers at fails the start at
once, naming the address, instead of leaving ``ray.init`` to retry it for many minutes with
nothing on screen; a malformed one is refused by the configuration; ``local`` is the run's own
confined instance; and Ray's own log records follow the command line's table."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer.config._ray_address import check_reachable
from trainer.rollout.ray import _session

from ...runfolder import trainbus

ray = pytest.importorskip("ray")


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listening, so nobody takes it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_an_address_that_accepts_connections_passes() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=5.0)


def test_a_refused_address_raises_naming_it_and_the_setting(closed_port: int) -> None:
    address = f"127.0.0.1:{closed_port}"
    with pytest.raises(ConnectionError) as raised:
        check_reachable(address, timeout_s=5.0)
    message = str(raised.value)
    assert message.startswith(f"no Ray cluster answers at {address} (")
    assert "rollout.ray_address" in message and "--ray-address" in message


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.5:6380", ("10.0.0.5", 6380)),
        ("10.0.0.5", ("10.0.0.5", 6379)),  # a head node's GCS port
        ("ray://head.example:10002", ("head.example", 10002)),
        ("ray://head.example", ("head.example", 10001)),  # the Ray Client server's port
        ("[::1]:6379", ("::1", 6379)),
    ],
)
def test_the_host_and_port_probed(
    address: str, expected: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    probed: list[tuple[str, int]] = []

    def connect(where: tuple[str, int], timeout: float) -> socket.socket:
        probed.append(where)
        return socket.socket()

    monkeypatch.setattr(socket, "create_connection", connect)
    check_reachable(address, timeout_s=1.0)
    assert probed == [expected]


@pytest.mark.parametrize("address", ["auto", "local"])
def test_addresses_naming_no_host_are_left_to_ray(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def connect(where: tuple[str, int], timeout: float) -> socket.socket:
        raise AssertionError(f"probed {where}")

    monkeypatch.setattr(socket, "create_connection", connect)
    check_reachable(address, timeout_s=1.0)


@pytest.mark.parametrize("address", ["head:port", ":6379"])
def test_a_malformed_address_is_a_value_error(address: str) -> None:
    with pytest.raises(ValueError, match=r"^rollout\.ray_address .*: expected HOST:PORT"):
        check_reachable(address, timeout_s=1.0)


def test_init_ray_never_calls_ray_init_for_an_unreachable_address(
    closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    with pytest.raises(ConnectionError):
        _session.init_ray(f"127.0.0.1:{closed_port}", 1.0, connect_timeout_s=5.0)
    assert calls == []


@pytest.mark.ray
def test_train_with_an_unreachable_address_fails_at_once_with_one_line(
    closed_port: int, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{closed_port}"
    out = tmp_path / "run"
    done = trainbus(
        "train", "--backend", "ray", "--ray-address", address, "--steps", "2", "--out", str(out)
    )
    # Refused before the run folder is made: the flag is wrong, not the run.
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: no Ray cluster answers at {address} (")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "address",
    ["", "10.0.0.5:99999", "10.0.0.5:0", "10.0.0.5:6379/x", "gcs://10.0.0.5", "https://h:8265"],
)
def test_the_configuration_refuses_what_the_backend_could_not_join(address: str) -> None:
    from trainer import load_config

    with pytest.raises(ValueError, match=r"^rollout\.ray_address '.*'"):
        load_config(overrides={"rollout.backend": "ray", "rollout.ray_address": address})


def test_a_malformed_ray_address_variable_is_named_as_such(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init called"))
    monkeypatch.setenv("RAY_ADDRESS", "head:port")
    with pytest.raises(ValueError, match=r"^RAY_ADDRESS 'head:port': expected HOST:PORT"):
        _session.init_ray(None, 1.0, connect_timeout_s=1.0)


@pytest.mark.parametrize(("address", "variable"), [("local", None), (None, "local")])
def test_local_starts_the_confined_local_instance_not_rays_default(
    address: str | None, variable: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, object]] = []
    cleaned: list[str] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(_session, "clean_leftovers", lambda: cleaned.append("clean"))
    monkeypatch.setattr(_session, "record_local_instance", lambda: cleaned.append("record"))
    monkeypatch.setattr(_session, "_local_instance", False)
    if variable is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", variable)
    assert _session.init_ray(address, 1.0, connect_timeout_s=1.0)
    (kwargs,) = calls
    assert kwargs["address"] == "local"
    assert kwargs["_node_ip_address"] == "127.0.0.1"
    assert kwargs["include_dashboard"] is False
    assert kwargs["num_cpus"] == 2
    assert cleaned == ["clean", "record"]  # a killed run's leftovers are stopped next time


def test_a_local_instance_keeps_loopback_and_never_asks_for_the_machines_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from ray._private import services

    asked: list[object] = []

    def perspective(address: object = None) -> str:
        asked.append(address)  # Ray's route towards 8.8.8.8:53, for the machine's address
        return "10.9.8.7"

    monkeypatch.setattr(services, "node_ip_address_from_perspective", perspective)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    # What ray.init does with the local instance's _node_ip_address="127.0.0.1" on Linux:
    assert services.resolve_ip_for_localhost("127.0.0.1") == "10.9.8.7"
    assert asked == [None]
    with _session._loopback_stays_loopback():
        assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
        assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # its processes too
    assert asked == [None]  # not asked again
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ  # as it was
    assert services.resolve_ip_for_localhost("127.0.0.1") == "10.9.8.7"


def test_rays_own_records_go_through_the_command_lines_table(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    # Ray's import leaves its logger with a handler of its own that does not propagate.
    monkeypatch.setattr(logging.getLogger("ray"), "propagate", False)

    def init(**kwargs: object) -> None:
        assert kwargs["configure_logging"] is False  # no handler of Ray's own either
        logging.getLogger("ray._private.authentication").warning("Token authentication is on")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(_session, "clean_leftovers", lambda: 0)
    monkeypatch.setattr(_session, "record_local_instance", lambda: None)
    monkeypatch.setattr(_session, "_local_instance", False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with caplog.at_level(logging.INFO):
        _session.init_ray(None, 1.0)
    # The root logger's handlers (the command line's, with its thresholds) get it.
    assert [r.name for r in caplog.records if "Token" in r.message] == [
        "ray._private.authentication"
    ]


async def test_ray_starts_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting Ray takes seconds; on the event loop it blocked the loop meanwhile (a stall
    diagnosis named `_ray_init`). The loop runs while it starts now."""
    import threading

    import anyio

    from trainer.config._schema import PolicyConfig
    from trainer.rollout._worker import WorkerSpec
    from trainer.rollout.ray._ray_backend import RayBackend

    loop_ran = threading.Event()
    seen: list[bool] = []

    class Stop(Exception):
        pass

    def init(**kwargs: object) -> None:
        seen.append(loop_ran.wait(30))  # the loop sets it, if it runs meanwhile
        raise Stop

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(_session, "clean_leftovers", lambda: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = WorkerSpec(task_name="reverse", task_params={"length": 4}, policy=PolicyConfig())
    backend = RayBackend(spec, 1)

    async def tick() -> None:
        await anyio.lowlevel.checkpoint()
        loop_ran.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(tick)
        with pytest.raises(Stop):
            await backend.start(None, b"", 0)  # type: ignore[arg-type]
    assert seen == [True]
