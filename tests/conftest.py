"""Shared pytest setup: the ``gpu`` and ``multi_gpu`` markers.

A test marked ``gpu`` needs one CUDA GPU usable through CuPy, ``multi_gpu`` two. Where there are
fewer, the test is skipped, with the reason (CuPy missing, or the error CUDA gave while counting
the devices). On the GPU machine a skip would hide a broken CuPy or driver behind a green run, so
there the environment says how many GPUs there must be:

* ``BATCHLU_REQUIRE_GPU=1``: every ``gpu`` test that cannot run fails instead of skipping;
* ``BATCHLU_REQUIRE_GPUS=N``: every ``gpu`` and ``multi_gpu`` test that cannot run fails while
  fewer than ``N`` GPUs are found (``N >= 2`` makes the ``multi_gpu`` tests required too).

The failure message carries the same reason as the skip would have.
"""

from __future__ import annotations

import functools
import os

# One BLAS thread per process, as Dask's nanny gives each worker: the kernels tests call LAPACK per
# matrix, and oversubscribed OpenBLAS threads on a small CI machine slow them several times over.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402

# dask.array probes for the pydata ``sparse`` package as it is first imported. Once pytest has put
# tests/kernels on sys.path, that name finds the test folder tests/kernels/sparse and the probe fails;
# imported here, before any test folder is on the path, dask finds the real package or none.
try:
    import dask.array  # noqa: E402,F401
except ImportError:
    pass

REQUIRE_GPU = "BATCHLU_REQUIRE_GPU"
REQUIRE_GPUS = "BATCHLU_REQUIRE_GPUS"
MARKERS = {"gpu": 1, "multi_gpu": 2}  # marker -> GPUs the test needs


@functools.lru_cache(maxsize=None)
def gpu_probe() -> tuple[int, str]:
    """``(number of CUDA devices CuPy can use here, why it is 0)``; the reason is "" when some are found."""
    try:
        import cupy
    except ImportError as exc:
        return 0, f"CuPy cannot be imported ({type(exc).__name__}: {exc})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # any CUDA failure means no usable device: keep its text as the reason
        return 0, f"counting CUDA GPUs failed ({type(exc).__name__}: {exc})"
    return count, "" if count else "the CUDA driver reports no GPU"


def _flag(name: str, allowed: str) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return 0
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise pytest.UsageError(f"Expected {name} to be {allowed}. Got {value!r} instead.")
    return number


def required_gpus() -> int:
    """GPUs the environment says this machine has (0: none required, GPU tests may skip)."""
    gpu = _flag(REQUIRE_GPU, "0 or 1")
    if gpu > 1:
        raise pytest.UsageError(f"Expected {REQUIRE_GPU} to be 0 or 1. Got {gpu} instead; "
                                f"use {REQUIRE_GPUS}={gpu} for a number of GPUs.")
    return max(gpu, _flag(REQUIRE_GPUS, "a whole number of GPUs"))


def pytest_configure(config):
    required_gpus()  # a malformed setting stops the run before any test


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures are set up (a cluster, a GPU engine)
def pytest_runtest_setup(item):
    need = max((gpus for marker, gpus in MARKERS.items() if marker in item.keywords), default=0)
    if not need:
        return
    count, why = gpu_probe()
    if count >= need:
        return
    reason = f"needs {need} CUDA GPU{'s' if need > 1 else ''}; found {count}" + (f": {why}" if why else "")
    required = required_gpus()
    if required >= need:
        settings = " ".join(f"{name}={os.environ[name].strip()}" for name in (REQUIRE_GPU, REQUIRE_GPUS)
                            if os.environ.get(name, "").strip())
        pytest.fail(f"{reason} ({settings}: GPU tests may not be skipped here)", pytrace=False)
    pytest.skip(reason)


# ---------------------------------------------------------------------------------- object storage
@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server (a real HTTP server speaking S3's protocol) on a free loopback
    port, for the session: its endpoint URL."""
    import logging
    import socket

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)   # no line per request
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture()
def s3(s3_server, monkeypatch):
    """A fresh bucket on :func:`s3_server`, with the ``AWS_*`` variables pointing there (for this
    process and the processes it starts): its ``s3://`` URL."""
    import uuid

    import boto3

    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": s3_server,
           "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bucket = f"batchlu-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)
    return f"s3://{bucket}"


class S3Faults:
    """A second S3 endpoint over the objects of :func:`s3_server` (moto keeps them in this process),
    whose answers a test spoils for the requests whose method and path (``/BUCKET/KEY?QUERY``) match,
    once ``after`` of them have been answered as usual (a run then fails after it started writing):

    * :meth:`fail`: S3's error answer, a ``status`` with its ``code`` (500 ``InternalError``, 503
      ``SlowDown``, 403 ``AccessDenied``);
    * :meth:`go_down`: from that request on, no answer: the connection is closed, the port refuses.

    :meth:`restore` answers every request again, on the same port. ``spoiled`` counts the requests
    not answered as usual."""

    def __init__(self):
        import socket
        import threading

        self._lock = threading.Lock()
        self._rules: list[dict] = []
        self.down = False
        self.spoiled = 0
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None
        self._start()

    def fail(self, status: int, code: str, *, method: str | None = None, path: str = "", after: int = 0) -> None:
        with self._lock:
            self._rules.append({"answer": (status, code), "method": method, "path": path, "after": after})

    def go_down(self, *, method: str | None = None, path: str = "", after: int = 0) -> None:
        with self._lock:
            self._rules.append({"answer": "down", "method": method, "path": path, "after": after})

    def restore(self) -> None:
        with self._lock:
            self._rules.clear()
            self.down = False
        if self._server is None:
            self._start()

    def close(self) -> None:
        self._stop()

    def answer(self, method: str, path: str):
        """None (answer as usual), ``"down"`` or ``(status, code)`` for one request."""
        import urllib.parse

        path = urllib.parse.unquote(path)
        with self._lock:
            if self.down:
                return "down"
            for rule in self._rules:
                if rule["method"] in (None, method) and rule["path"] in path:
                    if rule["after"] > 0:
                        rule["after"] -= 1
                        return None
                    self.spoiled += 1
                    if rule["answer"] == "down":
                        self.down = True
                        import threading

                        threading.Thread(target=self._stop, daemon=True).start()   # the port refuses
                    return rule["answer"]
        return None

    def _start(self) -> None:
        import threading

        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        server = make_server("127.0.0.1", self.port, DomainDispatcherApplication(create_backend_app), True,
                             request_handler=_spoiling_handler())
        server.faults = self
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


def _spoiling_handler():
    """moto's request handler, with each request first put to the server's :class:`S3Faults`."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class SpoilingHandler(MotoRequestHandler):
        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            answer = self.server.faults.answer(self.command, self.path)
            if answer is None:
                return True
            self.close_connection = True
            if answer == "down":   # no answer: the connection closes
                return False
            status, code = answer
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)   # the request's body, read: the client sees the answer
            body = (f"<?xml version='1.0' encoding='UTF-8'?>\n<Error>\n<Code>{code}</Code>\n"
                    f"<Message>{code} (S3Faults)</Message>\n<RequestId>0</RequestId>\n</Error>").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return False

    return SpoilingHandler


@pytest.fixture()
def s3_faults(s3, monkeypatch):
    """:class:`S3Faults` over the ``s3`` fixture's bucket, with ``AWS_ENDPOINT_URL`` pointing to it."""
    faults = S3Faults()
    monkeypatch.setenv("AWS_ENDPOINT_URL", faults.url)
    try:
        yield faults
    finally:
        faults.close()
