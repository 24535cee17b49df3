"""The MLflow sink's HTTP bounds (``ledger.mlflow_uri.bounded``) are its calls' own: MLflow
reads them while a call runs, in that thread, and the environment is never written. Before,
they were put in ``os.environ`` for the call: a child process or another thread saw them
(another sink's call took them for a user's own and ran under the wrong ones, or under none
once the first call took them away)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from mlflow import environment_variables as mlflow_env

from ledger.mlflow_sink import MlflowSink, MlflowSinkError
from ledger.mlflow_uri import ANSWERING, AWAY, FIRST_CONTACT, HTTP_SETTINGS, bounded
from tests.fixtures.mlflow_store import MlflowServer

URI = "http://127.0.0.1:9"  # never called: the settings are read, not used


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in HTTP_SETTINGS:
        monkeypatch.delenv(name, raising=False)


#: A user's own request timeout (``MLFLOW_HTTP_REQUEST_TIMEOUT``) for the calls to a silent
#: server: the retries and their backoff stay orchestrate's (``bounded``), and the test waits
#: out three requests of 5 s, not of orchestrate's 10 s or 30 s (whose values reach MLflow's
#: readers: ``test_each_thread_reads_its_own_bounds_and_the_environment_is_never_written``).
USER_TIMEOUT = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def in_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_HTTP_REQUEST_")}


def as_mlflow_reads() -> tuple[int, ...]:
    """Retries, backoff factor and timeout as MLflow's REST calls read them (its
    ``rest_utils.http_request`` asks these objects)."""
    return tuple(getattr(mlflow_env, name).get() for name in HTTP_SETTINGS)


def test_each_thread_reads_its_own_bounds_and_the_environment_is_never_written() -> None:
    assert {*FIRST_CONTACT, *ANSWERING, *AWAY} <= set(HTTP_SETTINGS)
    mlflows_own = as_mlflow_reads()
    seen: dict[str, object] = {}
    a_inside, b_done = threading.Event(), threading.Event()

    def answering() -> None:  # a call to an MLflow that answers, still running
        with bounded(URI, ANSWERING):
            seen["a"] = as_mlflow_reads(), in_environment()
            a_inside.set()
            b_done.wait()
            seen["a after b"] = as_mlflow_reads()

    def away() -> None:  # meanwhile, another sink's short try of an MLflow away
        a_inside.wait()
        with bounded(URI, AWAY):
            seen["b"] = as_mlflow_reads(), in_environment()
            with bounded(URI, ANSWERING):  # nested: the inner block's, then the outer's
                seen["b inner"] = as_mlflow_reads()
            seen["b again"] = as_mlflow_reads()
        seen["b after its block, a in its own"] = as_mlflow_reads()
        b_done.set()

    threads = [threading.Thread(target=answering), threading.Thread(target=away)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {
        "a": ((2, 2, 30), {}),
        "b": ((0, mlflows_own[1], 10), {}),
        "b inner": (2, 2, 30),
        "b again": (0, mlflows_own[1], 10),
        "b after its block, a in its own": mlflows_own,
        "a after b": (2, 2, 30),
    }
    assert as_mlflow_reads() == mlflows_own and in_environment() == {}


def test_a_users_own_setting_wins_and_no_other_is_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")
    with bounded(URI, AWAY):
        assert as_mlflow_reads()[::2] == (0, 7)
        assert in_environment() == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "7"}
    assert in_environment() == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "7"}


class Silent:
    """A tracking server that takes connections and never answers."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.called = threading.Event()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._take, daemon=True).start()

    def _take(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return  # closed
            self._held.append(connection)
            self.called.set()

    def close(self) -> None:
        self.socket.close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    try:
        yield server
    finally:
        server.close()


# MLflow's own settings (7 retries, 120 s a request) wait about 16 minutes here; its retries
# and backoff at the user's 5 s a request, about 3 minutes.
@pytest.mark.timeout(180)
def test_a_call_to_a_silent_server_is_bounded_and_writes_no_environment(
    silent: Silent, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in USER_TIMEOUT.items():
        monkeypatch.setenv(name, value)
    before = dict(os.environ)
    failed: list[BaseException] = []

    def first_contact() -> None:
        try:
            MlflowSink(tracking_uri=silent.url)
        except MlflowSinkError as e:
            failed.append(e)

    started = time.monotonic()
    call = threading.Thread(target=first_contact)
    call.start()
    try:
        assert silent.called.wait(60), "the sink never called the tracking server"
        # the call is under way, bounded: nothing of it in the environment
        assert in_environment() == USER_TIMEOUT
    finally:
        call.join(150)
    took = time.monotonic() - started
    assert not call.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], MlflowSinkError)
    assert failed[0].unreachable
    # the first contact's bound: two retries (2 s of backoff), three requests of the user's 5 s
    assert took < 45, f"the first contact took {took:.0f}s"
    assert dict(os.environ) == before


# MLflow's own settings (7 retries, 120 s a request) hold such a call about 16 minutes; its
# retries and backoff at the user's 5 s a request, about 3 minutes.
@pytest.mark.timeout(400)
def test_a_logging_call_to_a_server_gone_silent_is_bounded_and_writes_no_environment(
    mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in USER_TIMEOUT.items():
        monkeypatch.setenv(name, value)
    before = dict(os.environ)
    sink = MlflowSink(tracking_uri=mlflow_server.url)
    run_id = sink.start_round(round_id=1, cluster="twin", params={"budget": "1"})
    sink.log_metrics(run_id, {"tokens_per_s": 1.0})
    assert dict(os.environ) == before
    failed: list[MlflowSinkError] = []

    def log() -> None:
        try:
            sink.log_metrics(run_id, {"tokens_per_s": 2.0}, step=1)
        except MlflowSinkError as e:
            failed.append(e)

    mlflow_server.pause()
    started = time.monotonic()
    call = threading.Thread(target=log)
    call.start()
    while call.is_alive():  # looking, not waiting on it: the call ends on its own bound
        assert in_environment() == USER_TIMEOUT, "the call's bounds are in the environment"
        call.join(0.5)
    took = time.monotonic() - started
    mlflow_server.resume()
    assert len(failed) == 1 and failed[0].unreachable
    # a call to an MLflow that answered: two retries (4 s of backoff), three requests of the
    # user's 5 s (orchestrate's own 30 s: about 94 s)
    assert 10 <= took < 60, f"the call took {took:.0f}s"
    assert dict(os.environ) == before
