"""Zarr on object storage (issue 41, item 2): ``s3://`` inputs and outputs against moto's standalone
S3 server on the loopback address (the ``s3`` fixture: a real HTTP server speaking S3's protocol, not
a mock of the client library). A run killed and resumed there is bit-identical to an uninterrupted
one and passes verify; a second writer is refused by S3's conditional write; an input object changed
before a resume is refused; a deleted input chunk is the missing-chunk error. A store that fails
while the run writes (the ``s3_faults`` endpoint) raises one :class:`ObjectStoreError` line naming
the request, the output is not complete, and a resume in the same process finishes it."""

from __future__ import annotations

import functools

import dask.config
import numpy as np
import pytest
import zarr
from _pipeline_helpers import contend, outputs_of, sigkill, start_and_kill, start_slow_run, wait_for_chunks

from batchlu import pipeline
from batchlu.pipeline import errors
from batchlu.pipeline.output import _fingerprint, _group, _ledger, _lock
from batchlu.pipeline.store import _object_store
from batchlu.pipeline.store._arrays import parse_ref
from batchlu.testing.ratios import THRESHOLD, get03

RNG = np.random.default_rng()


def _generate(s3: str, name: str = "a.zarr", count: int = 53, chunk: int = 10) -> str:
    return pipeline.generate(f"{s3}/{name}", count=count, size=6, chunk=chunk, seed=int(RNG.integers(1 << 30)))


def _input(url: str) -> np.ndarray:
    return np.asarray(zarr.open_array(_object_store.zarr_store(url), mode="r")[...])


def test_generate_run_kill_resume_verify_on_s3_is_bit_identical(client, s3, tmp_path):
    source = _generate(s3)
    killed, clean = f"{s3}/killed.zarr", f"{s3}/clean.zarr"
    start_and_kill(tmp_path, source, killed, "inv")

    done = _ledger.read(killed)
    assert 0 < done.sum() < done.size   # some, not all, chunks complete
    assert _group.read_provenance(killed)["status"] == "running"
    assert not pipeline.verify(source, killed).ok
    with pytest.warns(errors.BatchluWarning, match="Took over the stale lock"):   # the killed run's
        report = pipeline.run(source, killed, op="inv", resume=True, client=client, progress=False,
                              config={"chunk": 4})
    assert 0 < report.skipped < 53 and report.processed == 53 - report.skipped
    pipeline.run(source, clean, op="inv", client=client, progress=False, config={"chunk": 4})
    got, want = outputs_of(killed), outputs_of(clean)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert got[name].tobytes() == want[name].tobytes(), name   # bit for bit
    assert _group.read_provenance(killed)["status"] == "complete"
    assert pipeline.verify(source, killed).ok
    a = _input(source)
    assert got["inv"].dtype == a.dtype and got["inv"].shape == a.shape
    assert get03(a, got["inv"]).max() < THRESHOLD


def test_second_writer_on_s3_is_refused(client, s3, tmp_path):
    source = _generate(s3)
    out = f"{s3}/o.zarr"
    proc = start_slow_run(tmp_path, source, out, "inv")
    try:
        wait_for_chunks(proc, out, 2, timeout=60)
        for flag in ("resume", "overwrite"):
            with pytest.raises(errors.OutputLockedError, match="Got one running instead"):
                pipeline.run(source, out, op="inv", client=client, progress=False, **{flag: True})
    finally:
        sigkill(proc)
    assert _object_store.head(f"{out}.lock") is not None   # the first run's, left by SIGKILL


def test_the_lock_object_has_one_owner_of_many_at_once(s3):
    """S3's conditional write decides: of runs taking the lock at the same moment, exactly one gets it."""
    out = f"{s3}/o.zarr"
    got, refused = contend(lambda: _lock.OutputLock(out).acquire())
    assert len(got) == 1 and len(refused) == 5, (got, refused)
    fence = got[0].fence()
    fence.check()   # the tasks' check reads the lock object
    with pytest.raises(errors.FencedError, match="another run took the output"):
        _lock.Fence(fence.path, "another token").check()
    got[0].release()
    assert _object_store.head(f"{out}.lock") is None
    with pytest.raises(errors.FencedError, match="no lock file"):
        fence.check()


def test_resume_refuses_an_input_object_changed_on_s3(client, s3):
    source = _generate(s3, count=40)
    out = f"{s3}/o.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 10})
    _ledger.unrecord(out, [3])
    before = _fingerprint.signature(parse_ref(source))
    array = zarr.open_array(_object_store.zarr_store(source), mode="r+")
    array[0:10] = RNG.uniform(-1, 1, (10, 6, 6))   # other values in a chunk recorded complete
    assert _fingerprint.signature(parse_ref(source), before["horizon"])["digest"] != before["digest"]
    with pytest.raises(errors.ResumeError, match="changed since the run started"):
        pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)
    assert not _ledger.read(out)[3]


def test_an_input_object_rewritten_during_the_run_fails_it(client, s3, tmp_path):
    """The end of a run compares every input object's key, size and ETag with the start's: here the
    objects keep their keys and sizes (no compression), only their bytes and ETags change."""
    source = f"{s3}/a.zarr"
    zarr.create_array(_object_store.zarr_store(source), shape=(53, 6, 6), chunks=(10, 6, 6), dtype="float64",
                      compressors=None)[...] = RNG.uniform(-1, 1, (53, 6, 6))
    out = f"{s3}/o.zarr"
    proc = start_slow_run(tmp_path, source, out, "inv")
    try:
        wait_for_chunks(proc, out, 3, timeout=60)
        zarr.open_array(_object_store.zarr_store(source), mode="r+")[...] = RNG.uniform(-1, 1, (53, 6, 6))
        output = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            sigkill(proc)
    assert proc.returncode != 0 and f"InputChangedError: Expected the input {source}" in output, output[-2000:]
    record = _group.read_provenance(out)
    assert record["status"] == "failed" and "changed during the run" in record["error"]
    with pytest.raises(errors.ResumeError, match="other values"):
        pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)


def test_a_deleted_input_chunk_object_is_the_missing_chunk_error(client, s3):
    source = _generate(s3, count=40)
    _object_store.delete(f"{source}/c/2/0/0")
    out = f"{s3}/o.zarr"
    with pytest.raises(errors.MissingChunkError, match=r"c/2/0/0 \(matrices 20:30\)"):
        pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 10})
    record = _group.read_provenance(out)   # nothing that looks complete
    assert record is None or (record["status"] != "complete" and not _ledger.read(out)[2])


def test_a_deleted_input_chunk_object_with_fill_is_minus_3(client, s3):
    source = _generate(s3, count=40)
    _object_store.delete(f"{source}/c/2/0/0")
    out = f"{s3}/o.zarr"
    report = pipeline.run(source, out, op="inv", client=client, progress=False,
                          config={"chunk": 10, "missing-chunks": "fill"})
    info = outputs_of(out)["info"]
    assert report.status == "complete" and report.missing == 10
    assert (info[20:30] == -3).all() and (info[:20] == 0).all() and (info[30:] == 0).all()
    assert pipeline.verify(source, out).ok


@pytest.mark.parametrize("policy", ["error", "fill"])
def test_an_object_the_store_lists_but_does_not_serve_is_an_error_not_the_fill_value(client, s3, s3_faults,
                                                                                       policy):
    """A store that answers HEAD for a chunk but "not found" for its GET (an eventually consistent
    S3-compatible store): zarr read the chunk as the fill value and the run completed with those
    matrices' inverses of zeros (NaN, "singular"; a right-hand side of zeros solves to zeros with
    info 0). Under either missing-chunks policy the input's reads refuse it in one line (fill marks
    -3 only what the missing-chunk check found absent), and the output is not complete."""
    source = _generate(s3, count=40, chunk=4)
    out = f"{s3}/o.zarr"
    s3_faults.fail(404, "NoSuchKey", method="GET", path="/a.zarr/c/3/0/0")
    with pytest.raises(errors.ObjectStoreError) as failed:
        pipeline.run(source, out, op="inv", client=client, progress=False,
                     config={"chunk": 4, "missing-chunks": policy})
    message = str(failed.value)
    assert len(message.splitlines()) == 1 and "c/3/0/0" in message and "not found" in message, message
    assert s3_faults.spoiled >= 1
    s3_faults.restore()
    assert _group.read_provenance(out)["status"] != "complete"
    assert not _ledger.read(out)[3]


def test_storage_options_in_fsspecs_names_reach_the_run(client, s3, s3_server, monkeypatch):
    """``storage_options=`` (fsspec's ``key``, ``secret``, ``endpoint_url``) in place of the environment."""
    source = _generate(s3, count=20)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)
    out = f"{s3}/o.zarr"
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_server}
    report = pipeline.run(source, out, op="slogdet", client=client, progress=False, storage_options=options)
    assert report.status == "complete" and report.processed == 20
    assert pipeline.verify(source, out, storage_options=options).ok


def test_a_server_that_ignores_conditional_writes_is_refused(s3, monkeypatch):
    """A store that accepts every create (``If-None-Match`` ignored) cannot keep one writer: refused,
    and the lock object taken back."""
    out = f"{s3}/o.zarr"

    def unconditional(location, data):
        _object_store.put(location, data)
        return True

    monkeypatch.setattr(_object_store, "put_new", unconditional)
    with pytest.raises(errors.OutputLockedError, match="ignores the condition"):
        _lock.OutputLock(out).acquire()
    assert _object_store.head(f"{out}.lock") is None


@pytest.mark.parametrize("method, path, status, code", [
    ("PUT", "/o.zarr/inv/c/", 500, "InternalError"),   # a write of the output
    ("GET", "/a.zarr/c/", 503, "SlowDown"),            # a read of the input: no corrupt chunk
])
def test_a_store_failing_mid_run_is_one_line_and_resume_finishes(client, s3, s3_faults, method, path, status, code):
    """obstore's error in a task reaches ``batchlu.run``'s caller as one ObjectStoreError line, and
    is the error raised even where the lock's release fails too (its delete refused here): the lock
    is left, and a later run of this process takes it over."""
    source = _generate(s3, count=40, chunk=4)
    out = f"{s3}/o.zarr"
    s3_faults.fail(status, code, method=method, path=path, after=2)
    s3_faults.fail(500, "InternalError", method="POST", path="?delete")   # obstore's delete of the lock
    with pytest.raises(errors.ObjectStoreError) as failed:
        pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 4})
    message = str(failed.value)
    assert len(message.splitlines()) == 1, message
    assert f"{method} s3://" in message and path in message and f"{status} " in message and code in message, message
    assert "--resume" in message and "Debug source" not in message
    assert s3_faults.spoiled >= 2   # the task's request and the release's
    s3_faults.restore()
    record = _group.read_provenance(out)
    assert record["status"] == "failed" and len(record["error"].splitlines()) == 1, record
    assert not _ledger.read(out).all()
    assert _object_store.head(f"{out}.lock") is not None   # left: its delete failed
    with pytest.warns(errors.BatchluWarning, match="ended without giving it back"):
        report = pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)
    assert report.status == "complete" and 0 < report.processed < 40
    assert pipeline.verify(source, out).ok


def _obstore_error(text: str) -> Exception:
    """An exception as obstore raises it: a class of ``obstore.exceptions`` whose text is ``text``."""
    GenericError = type("GenericError", (Exception,), {"__module__": "obstore.exceptions"})
    return GenericError(text)


_DUMP = ("<?xml version='1.0' encoding='UTF-8'?>\n<Error>\n<Code>InternalError</Code>\n<Message>m</Message>\n"
         "</Error>\n\nDebug source:\nGeneric {\n    store: \"S3\",\n    source: RetryError(...),\n}")


@pytest.mark.parametrize("request_, answer, location, words", [
    ("PUT http://h:1/bkt/o.zarr/inv/c/3/0/0", "Server returned non-2xx status code: 500 Internal Server Error:",
     None, ["PUT s3://bkt/o.zarr/inv/c/3/0/0", "500 Internal Server Error (InternalError) after 2 retries",
            "failed or throttled"]),
    ("GET http://h:1/bkt?list-type=2&prefix=o.zarr%2F_complete%2Fc%2F",
     "Server returned non-2xx status code: 503 Service Unavailable:", None,
     ["LIST s3://bkt/o.zarr/_complete/c", "503 Service Unavailable (InternalError)"]),
    ("POST http://h:1/bkt?delete", "Server returned non-2xx status code: 500 Internal Server Error:",
     "s3://bkt/o.zarr.lock", ["DELETE s3://bkt/o.zarr.lock", "500"]),
    ("GET http://h:1/bkt/a.zarr/c/1/0/0", "Server returned non-2xx status code: 403 Forbidden:", None,
     ["credentials", "GET s3://bkt/a.zarr/c/1/0/0", "(InternalError)"]),
])
def test_obstore_errors_read_as_one_line(request_, answer, location, words):
    """translate: obstore's text (the request, the status, S3's XML, a Rust dump) as one line naming
    the request and the answer."""
    text = f"Generic S3 error: Error performing {request_} in 2ms, after 2 retries, max_retries: 2 - {answer} {_DUMP}"
    message = str(_object_store.store_error(_obstore_error(text), location))
    assert len(message.splitlines()) == 1 and "Debug source" not in message and "<" not in message, message
    for word in words:
        assert word in message, message
    assert _object_store.store_error(ValueError("not obstore's")) is None


def _s3_zarr_store(s3: str, endpoint: str, *, read_only: bool = False, prefix: str | None = None,
                  key: str = "testing"):
    """zarr's ObjectStore over obstore's S3Store of the test bucket, configured in the store itself."""
    from obstore.store import S3Store

    return zarr.storage.ObjectStore(
        S3Store(s3.removeprefix("s3://"), prefix=prefix, endpoint=endpoint, access_key_id=key,
                secret_access_key="testing", region="us-east-1", client_options={"allow_http": True}),
        read_only=read_only)


def test_zarr_objects_over_an_s3_object_store_run_with_that_stores_config(s3, s3_server, monkeypatch):
    """A zarr.Array over zarr's ObjectStore (obstore's S3Store, credentials and endpoint in the store,
    none in the environment) in, (store, name) out: the run reads and writes through the store's
    config, and gives what the same run on the URLs gives, bit for bit; verify and inspect take the
    objects too."""
    source = _generate(s3, "data/a.zarr")
    pipeline.run(source, f"{s3}/data/by-url.zarr", op="inv", progress=False)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)   # only the store's own config can reach the server now
    store = _s3_zarr_store(s3, s3_server, prefix="data")
    array = zarr.open_array(store, path="a.zarr", mode="r")
    report = pipeline.run(array, (store, "by-object.zarr"), op="inv", progress=False)
    assert report.output == f"{s3}/data/by-object.zarr" and report.status == "complete"
    config = {k: v for k, v in store.store.config.items() if k != "bucket"}
    with dask.config.set({_object_store.CONFIG_KEY: config}):
        got, want = outputs_of(f"{s3}/data/by-object.zarr"), outputs_of(f"{s3}/data/by-url.zarr")
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].tobytes() == want[name].tobytes(), name
    read_only = _s3_zarr_store(s3, s3_server, prefix="data", read_only=True)
    assert pipeline.verify(array, zarr.open_group(read_only, path="by-object.zarr", mode="r")).ok
    assert "inv" in pipeline.inspect((read_only, "by-object.zarr"))


@pytest.mark.parametrize("case", ["read-only-output", "two-configs", "other-options"])
def test_zarr_objects_over_s3_that_cannot_be_used_are_refused_in_one_line(s3, s3_server, case):
    _generate(s3)
    array = zarr.open_array(_s3_zarr_store(s3, s3_server), path="a.zarr", mode="r")
    out, kwargs = (_s3_zarr_store(s3, s3_server), "o.zarr"), {}
    if case == "read-only-output":
        out = (_s3_zarr_store(s3, s3_server, read_only=True), "o.zarr")
    elif case == "two-configs":
        out = (_s3_zarr_store(s3, s3_server, key="someone-else"), "o.zarr")
    else:
        kwargs = {"storage_options": {"endpoint_url": "http://127.0.0.1:9"}}
    error = errors.OutputError if case == "read-only-output" else errors.ConfigError
    with pytest.raises(error) as caught:
        pipeline.run(array, out, op="inv", progress=False, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    assert {"read-only-output": "read-only ObjectStore", "two-configs": "one S3 configuration",
            "other-options": "storage_options to agree"}[case] in message
    assert _object_store.head(f"{s3}/o.zarr/zarr.json") is None   # nothing written


def test_a_deleted_shard_and_a_hole_in_a_shard_with_fill_are_minus_3(client, s3):
    """Sharded input on S3 under missing-chunks fill: the strict input store lets through the
    "not found" of a shard the check found absent (its matrices -3), and an inner chunk absent from
    a shard that is there reads as the fill value without a request that fails (-3 too)."""
    rng = np.random.default_rng()
    a = rng.standard_normal((48, 5, 5))
    source = f"{s3}/sharded.zarr"
    z = zarr.create_array(_object_store.zarr_store(source), shape=a.shape, dtype=a.dtype, chunks=(4, 5, 5),
                          shards=(16, 5, 5))
    z[...] = a
    z[20:24] = 0.0   # all fill value: zarr leaves this inner chunk out of its shard
    _object_store.delete(f"{source}/c/2/0/0")   # the third shard: matrices 32:48
    out = f"{s3}/o.zarr"
    report = pipeline.run(source, out, op="inv", client=client, progress=False, config={"missing-chunks": "fill"})
    info = outputs_of(out)["info"]
    assert report.status == "complete" and report.missing == 20
    assert (info[32:48] == -3).all() and (info[20:24] == -3).all()
    assert (info[:20] == 0).all() and (info[24:32] == 0).all()


@pytest.mark.parametrize("embedded", [False, True])
def test_a_chunk_found_absent_by_an_earlier_run_is_no_fill_value_in_a_later_one(client, s3, s3_faults, embedded):
    """What the missing-chunk check found absent holds for the read of that batch only: the input
    arrays (and their stores) are cached per process, and a right-hand side chunk once found absent
    under fill (its matrices -3) read as the fill value in a later run of the same process after it
    was restored and the store answered its GET "not found": a solve of zeros with info 0, "complete"."""
    n = 6
    rng = np.random.default_rng()
    a = rng.standard_normal((40, n, n)) + 6 * np.eye(n)
    b = rng.standard_normal((40, n)) + 1.0
    za = zarr.create_array(_object_store.zarr_store(f"{s3}/a.zarr"), shape=a.shape, dtype=a.dtype, chunks=(4, n, n))
    za[...] = a
    zb = zarr.create_array(_object_store.zarr_store(f"{s3}/b.zarr"), shape=b.shape, dtype=b.dtype, chunks=(4, n))
    zb[...] = b
    _object_store.delete(f"{s3}/b.zarr/c/3/0")   # the right-hand sides of matrices 12:16
    run = functools.partial(pipeline.run, f"{s3}/a.zarr", op="solve", rhs=f"{s3}/b.zarr",
                            client=None if embedded else client, progress=False)
    first = run(f"{s3}/o1.zarr", config={"missing-chunks": "fill"})
    assert first.status == "complete" and first.missing == 4
    assert (outputs_of(f"{s3}/o1.zarr")["info"][12:16] == -3).all()
    zb[12:16] = b[12:16]
    s3_faults.fail(404, "NoSuchKey", method="GET", path="/b.zarr/c/3/0")
    for policy in ("error", "fill"):
        with pytest.raises(errors.ObjectStoreError, match="not found"):
            run(f"{s3}/o-{policy}.zarr", config={"missing-chunks": policy})
    assert s3_faults.spoiled >= 2


def test_an_s3_zarr_object_whose_name_holds_a_colon_is_refused_not_read_as_another(s3, s3_server):
    """The array 'g/a:b' became the URL s3://bkt/g/a:b, whose last ':' reads as PATH:ARRAY: the run
    inverted the array g/a/b, reported complete, and verify of the same objects said OK."""
    store = _s3_zarr_store(s3, s3_server)
    g = zarr.open_group(store, mode="w").create_group("g")
    rng = np.random.default_rng()
    for path, group in (("a:b", g), ("b", g.create_group("a"))):
        x = group.create_array(path, shape=(20, 5, 5), dtype="f8", chunks=(10, 5, 5))
        x[...] = rng.standard_normal((20, 5, 5))
    arr = zarr.open_array(store, path="g/a:b", mode="r")
    for call in (lambda: pipeline.run(arr, (store, "o.zarr"), op="inv", progress=False),
                 lambda: pipeline.verify(arr, (store, "o.zarr")),
                 lambda: pipeline.run(zarr.open_array(store, path="g/a/b", mode="r"), (store, "inv:1"), op="inv",
                                      progress=False)):
        with pytest.raises(errors.InputError, match=r"without ':'"):
            call()


def test_an_output_at_a_buckets_root_is_refused(s3, s3_server, tmp_path):
    """s3://BUCKET as the output (a URL, or a prefixless store's root): its lock, OUT.lock beside it,
    was another bucket's name, and the run failed blaming the server (500, 'failed or throttled')."""
    source = pipeline.generate(tmp_path / "a.zarr", count=20, size=5, chunk=10, seed=3)
    bucket = s3.removeprefix("s3://").split("/")[0]
    for output in (f"s3://{bucket}", _s3_zarr_store(f"s3://{bucket}", s3_server)):
        with pytest.raises(errors.OutputError, match=r"below a bucket's root"):
            pipeline.run(source, output, op="inv", progress=False)
