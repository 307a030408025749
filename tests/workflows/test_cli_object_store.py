"""``batchlu run`` on ``s3://`` (issue 41, item 2) against moto's S3 server (the ``s3`` fixture): a run
and verify there, and each bad input one line ``Error: ...`` naming the problem, exit status 1, no
traceback and nothing written that looks like an output: a missing bucket, credentials the server
refuses, an endpoint that does not answer (a closed loopback port, within 3 s), a URL scheme
batchlu has no store for. A store that fails while a run writes (the ``s3_faults`` endpoint: no
answer from some request on, a 500, a 503, a 403) is one line too, naming the request and the
store's answer, with the output left incomplete and finished by ``--resume``; verify and inspect
of a failing store exit 1 in one line."""

from __future__ import annotations

import socket
import time

import pytest
from _cli_helpers import one_line_error

from batchlu.pipeline.output import _group, _ledger
from batchlu.pipeline.store import _object_store


@pytest.fixture()
def source(invoke, s3):
    url = f"{s3}/a.zarr"
    assert invoke("generate", url, "--count", 40, "--size", 5, "--chunk", 10, "--seed", 3).exit_code == 0
    return url


def _run(invoke, source, out, *extra):
    return invoke("run", source, out, "--op", "inv", "--no-progress", *extra)


def test_run_and_verify_on_s3(invoke, source, s3):
    out = f"{s3}/o.zarr"
    result = _run(invoke, source, out)
    assert result.exit_code == 0, result.output
    assert f"complete, 40 matrices -> {out}" in result.output
    checked = invoke("verify", source, out)
    assert checked.exit_code == 0 and "OK - all 40 of 40 matrices" in checked.output, checked.output
    one_line_error(_run(invoke, source, out), "not to exist", "--resume")


@pytest.mark.parametrize("which", ["input", "output"])
def test_a_missing_bucket_is_one_line(invoke, source, s3, which):
    out = f"{s3}/o.zarr"
    args = ("s3://no-such-bucket-batchlu/a.zarr", out) if which == "input" else (source, "s3://no-such-bucket-batchlu/o.zarr")
    one_line_error(_run(invoke, *args), "bucket no-such-bucket-batchlu", "no such bucket")
    assert not _object_store.probe(out)


def test_refused_credentials_are_one_line(invoke, source, s3):
    from moto.core.authorization import enable_iam_authentication

    out = f"{s3}/o.zarr"
    with enable_iam_authentication():   # moto checks keys from now on: "testing" is none of its users'
        one_line_error(_run(invoke, source, out), "credentials", "InvalidAccessKeyId", "AWS_ACCESS_KEY_ID")
    assert not _object_store.probe(out)


def test_an_endpoint_that_does_not_answer_is_one_line_within_seconds(invoke, source, s3, monkeypatch):
    with socket.socket() as closed:   # a loopback port with nothing listening: connection refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    one_line_error(_run(invoke, source, f"{s3}/o.zarr"), f"127.0.0.1:{port}", "no answer",
                    "connection refused")
    assert time.monotonic() - started < 3   # obstore's default retries alone took 4 s here, its default
    # retry timeout is 3 min: batchlu's client gives up after 2 retries (well under a second here)


@pytest.mark.parametrize("scheme", ["gs", "foo"])
def test_a_scheme_with_no_store_is_one_line(invoke, source, s3, scheme):
    one_line_error(_run(invoke, f"{scheme}://bucket/a.zarr", f"{s3}/o.zarr"), f"{scheme}://",
                    "no filesystem installed")
    one_line_error(_run(invoke, source, f"{scheme}://bucket/o.zarr"), f"{scheme}://", "no filesystem installed")
    assert not _object_store.probe(f"{s3}/o.zarr")


# ------------------------------------------------------------------------------- a store failing mid-run
def _assert_not_complete(out):
    """Nothing at ``out`` says complete: no output, or one whose status and ledger say otherwise."""
    record = _group.read_provenance(out)
    assert record is None or record["status"] != "complete", record
    assert record is None or not _ledger.read(out).all()


def test_an_endpoint_that_dies_mid_run_is_one_line_and_resume_finishes(invoke, source, s3, s3_faults):
    out = f"{s3}/o.zarr"
    s3_faults.go_down(method="PUT", path="/o.zarr/inv/c/", after=2)   # no answer from the third chunk on
    one_line_error(_run(invoke, source, out, "--chunk", 5), "no answer", f"127.0.0.1:{s3_faults.port}",
                   "--resume")
    assert s3_faults.spoiled >= 1
    s3_faults.restore()   # the endpoint is back, with what the run wrote
    _assert_not_complete(out)
    resumed = _run(invoke, source, out, "--resume")   # the lock the run could not delete: taken over
    assert resumed.exit_code == 0 and f"complete, 40 matrices -> {out}" in resumed.stdout, resumed.output
    checked = invoke("verify", source, out)
    assert checked.exit_code == 0 and "OK - all 40 of 40 matrices" in checked.stdout, checked.output


@pytest.mark.parametrize("method, path, status, code, words", [
    ("PUT", "/o.zarr/inv/c/", 500, "InternalError", ["500 Internal Server Error (InternalError)", "/o.zarr/inv/c/"]),
    ("GET", "/a.zarr/c/", 503, "SlowDown", ["503 Service Unavailable (SlowDown)", "/a.zarr/c/"]),
    ("PUT", "/o.zarr/inv/c/", 403, "AccessDenied", ["access refused (AccessDenied)", "/o.zarr/inv/c/"]),
])
def test_a_store_failing_a_task_is_one_line(invoke, source, s3, s3_faults, method, path, status, code, words):
    """obstore's error inside a task (zarr's read or write of a chunk) is one line naming the request
    and the store's answer, not a traceback, nor obstore's dump, nor (for a read) a corrupt chunk."""
    out = f"{s3}/o.zarr"
    s3_faults.fail(status, code, method=method, path=path, after=2)
    line = one_line_error(_run(invoke, source, out, "--chunk", 5), f"{method} s3://", *words, "--resume")
    assert s3_faults.spoiled >= 1
    assert "Debug source" not in line and "<?xml" not in line and "unreadable chunk" not in line, line
    s3_faults.restore()
    _assert_not_complete(out)
    resumed = _run(invoke, source, out, "--resume")
    assert resumed.exit_code == 0 and f"complete, 40 matrices -> {out}" in resumed.stdout, resumed.output


def test_verify_and_inspect_of_a_failing_store_are_one_line(invoke, source, s3, s3_faults):
    out = f"{s3}/o.zarr"
    assert _run(invoke, source, out).exit_code == 0
    s3_faults.fail(500, "InternalError", method="GET", path="/o.zarr/inv/c/")
    one_line_error(invoke("verify", source, out), f"GET {out}/inv/c/", "500 Internal Server Error")
    s3_faults.fail(500, "InternalError", method="GET", path="/o.zarr/info/c/")
    one_line_error(invoke("inspect", out), f"GET {out}/info/c/", "500 Internal Server Error")   # was exit 0
