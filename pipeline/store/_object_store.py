"""Zarr on object storage: ``s3://BUCKET/KEY`` in place of a path, for inputs and outputs.

A location is a local path or an S3 URL; :func:`is_url` tells them apart, and everything that asks
a local folder a question (does it exist, which files does it hold, write this file whole, create
this file if it is not there) asks the object store instead where the location is a URL:

* :func:`zarr_store`: the store zarr opens a location with: the path itself, or zarr's
  ``ObjectStore`` over obstore's ``S3Store`` (the prefix is the URL's key);
* :func:`probe`: one listing request, so that a missing bucket, refused credentials or an endpoint
  that does not answer end in one line before anything is written;
* :func:`head`, :func:`listing` (each object's size and ETag), :func:`get`, :func:`put`,
  :func:`put_new` (S3's conditional write, ``If-None-Match: *``: the output's lock), :func:`delete`,
  :func:`delete_tree`.

Credentials, endpoint and region are taken as the AWS tools take them (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``), overridden
by the Dask config's ``batchlu-s3.storage-options`` (obstore's S3 keys, or fsspec's spelling of the
usual ones: :data:`FSSPEC_KEYS`); ``batchlu.run(..., storage_options=...)`` sets that for the run.
The client gives up on an endpoint that does not answer within :data:`CONNECT_TIMEOUT`, after
:data:`RETRIES` retries, instead of waiting minutes.

Why obstore's store and not fsspec's (s3fs): docs/design.md, "Object storage".
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import functools
import inspect
import json
import os
import re

from ..errors import ConfigError, DependencyError, InputError, ObjectStoreError, OutputError

__all__ = ["CONNECT_TIMEOUT", "CONFIG_KEY", "FSSPEC_KEYS", "RETRIES", "SCHEMES", "Url", "delete", "delete_tree",
           "get", "head", "is_store_error", "is_url", "takes_storage_options", "join", "listing", "naming_store_failures",
           "parse", "probe", "put", "put_new", "storage_options", "store_error", "translate", "zarr_store"]

SCHEMES = ("s3",)
CONFIG_KEY = "batchlu-s3.storage-options"
CONNECT_TIMEOUT = "5s"
RETRIES = 2
RETRY_TIMEOUT = datetime.timedelta(seconds=20)
# fsspec's (s3fs') names of the usual storage options, and obstore's S3 config key for each
FSSPEC_KEYS = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
               "endpoint_url": "endpoint", "region_name": "region", "anon": "skip_signature"}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def is_url(location) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(location, str) and _URL.match(location) is not None


@dataclasses.dataclass(frozen=True)
class Url:
    """An object store location: ``s3://bucket/key`` (key without leading or trailing ``/``)."""

    scheme: str
    bucket: str
    key: str = ""

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.key else f"{self.scheme}://{self.bucket}"


def parse(text: str, error: type = ObjectStoreError) -> Url:
    """The :class:`Url` of ``text``; a scheme batchlu has no store for, or no bucket, raises ``error``."""
    match = _URL.match(text)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme not in SCHEMES:
        raise error(f"Expected a local path or an s3:// URL. Got {text!r} instead: batchlu has no "
                    f"filesystem installed for {scheme}:// (object storage is reached through S3's protocol).")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise error(f"Expected s3://BUCKET/KEY. Got {text!r}, with no bucket, instead.")
    return Url(scheme, bucket, key.strip("/"))


def join(location: str, *parts: str) -> str:
    """``os.path.join`` for a path, ``/`` between the parts of a URL."""
    if is_url(location):
        return "/".join([location.rstrip("/"), *(p.strip("/") for p in parts if p)])
    return os.path.join(location, *parts)


# ------------------------------------------------------------------------------------------ the client
def _obstore():
    """The ``obstore`` package, or the one-line :class:`DependencyError` that says how to install it."""
    try:
        import obstore
        import obstore.store   # noqa: F401
    except ImportError as exc:
        raise DependencyError(f"Expected the obstore package for s3:// stores (pip install 'batchlu[s3]'). "
                              f"Got {exc} instead.") from None
    return obstore


def storage_options() -> dict:
    """obstore's S3 config from the Dask config's ``batchlu-s3.storage-options`` (fsspec's names of
    the usual options translated, ``client_kwargs``' endpoint and region too)."""
    import dask.config

    return _obstore_keys(dask.config.get(CONFIG_KEY, default=None) or {})


def _obstore_keys(given) -> dict:
    """Storage options in obstore's S3 keys: fsspec's names translated, ``client_kwargs``' endpoint
    and region too."""
    given = dict(given)
    client = given.pop("client_kwargs", None) or {}
    given.update({k: v for k, v in dict(client).items() if k in ("endpoint_url", "region_name")})
    return {FSSPEC_KEYS.get(k, k): v for k, v in given.items()}


def takes_storage_options(func=None, *, writes: str | None = None):
    """Decorator: ``func`` takes ``storage_options=`` (a mapping, as :func:`storage_options` reads
    it), set as the Dask config's ``batchlu-s3.storage-options`` for the call (the workers of a
    cluster the call starts get it too; an external cluster's need it in their own config). A zarr
    object given for one of ``func``'s arguments over zarr's ``ObjectStore`` with obstore's
    ``S3Store`` (:func:`s3_object`) is passed on as its ``s3://`` URL, its store's S3 config as the
    storage options (one config per call); ``writes`` names the argument ``func`` writes, whose
    store must not be read-only."""
    if func is None:
        return functools.partial(takes_storage_options, writes=writes)
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args, storage_options=None, **kwargs):
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:   # arguments func does not take: Python's own message, naming func
            return func(*args, **kwargs)
        configs = []
        for name, value in list(bound.arguments.items()):
            found = s3_object(value, name, writing=name == writes)
            if found is not None:
                bound.arguments[name], config = found
                configs.append((name, config))
        if configs:
            storage_options = _one_config(configs, storage_options)
        if storage_options is None:
            return func(*bound.args, **bound.kwargs)
        import dask.config

        with dask.config.set({CONFIG_KEY: dict(storage_options)}):
            return func(*bound.args, **bound.kwargs)

    wrapper.__signature__ = signature.replace(parameters=[   # help() and inspect show the keyword too
        *signature.parameters.values(),
        inspect.Parameter("storage_options", inspect.Parameter.KEYWORD_ONLY, default=None)])
    return wrapper


def zarr_parts(obj) -> tuple[object, str, str]:
    """``(store, path inside it, name)`` of a zarr object given in place of a path: a ``zarr.Array``
    or ``zarr.Group`` (its store and path), a ``zarr.storage`` store (its root), either as
    ``(object, name)``; ``store`` None for anything else (a path; ``name`` kept where one was given)."""
    import zarr

    name = ""
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], str):
        obj, name = obj
    if isinstance(obj, (zarr.Array, zarr.Group)):
        return obj.store_path.store, obj.store_path.path, name
    if isinstance(obj, zarr.abc.store.Store):
        return obj, "", name
    return None, "", name


def s3_object(obj, what: str = "input", *, writing: bool = False) -> tuple[str, dict] | None:
    """A zarr object over zarr's ``ObjectStore`` with obstore's ``S3Store`` (a ``zarr.Array``, a
    ``zarr.Group``, the store itself, or ``(group or store, name)``): its ``s3://`` URL (the store's
    bucket and prefix, then the object's path) and the store's S3 config less the bucket (endpoint,
    region, credentials); None for anything else. ``writing``: a read-only store is refused, as a
    local one is."""
    import zarr

    store, inner, name = zarr_parts(obj)
    s3 = getattr(store, "store", None) if isinstance(store, zarr.storage.ObjectStore) else None
    if s3 is None or type(s3).__name__ != "S3Store":
        return None
    if writing and store.read_only:
        raise OutputError(f"Expected a writable store for the {what}. Got a read-only ObjectStore "
                          f"over s3://{s3.config.get('bucket')} instead.")
    config = {k: v for k, v in dict(s3.config).items() if k != "bucket"}
    key = "/".join(part.strip("/") for part in (s3.prefix or "", inner, name) if part and part.strip("/"))
    if ":" in key:   # the URL would read as PATH:ARRAY (another array: g/a:b read g/a, array b)
        raise InputError(f"Expected the {what}'s S3 location without ':' (a location's last ':' names its "
                         f"array, PATH:ARRAY). Got s3://{s3.config['bucket']}/{key} instead; rename it.")
    return f"s3://{s3.config['bucket']}" + (f"/{key}" if key else ""), config


def _one_config(found: list[tuple[str, dict]], given: dict | None) -> dict:
    """The one S3 config of a call's zarr objects (and its ``storage_options``, if given)."""
    first_name, first = found[0]
    for name, config in found[1:]:
        if config != first:
            raise ConfigError(f"Expected the zarr objects of one call over one S3 configuration. Got "
                              f"{first_name} and {name} over stores configured otherwise instead "
                              f"(endpoint, region or credentials).")
    if given is not None and _obstore_keys(given) != first:
        raise ConfigError(f"Expected storage_options to agree with the S3 store of the zarr object "
                          f"given for {first_name}, or none. Got other options instead: drop "
                          f"storage_options, or pass the s3:// URL.")
    return first


def _endpoint(config: dict) -> str:
    return str(config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3")
               or os.environ.get("AWS_ENDPOINT_URL") or "https://s3.amazonaws.com")


@functools.lru_cache(maxsize=64)
def _s3(bucket: str, prefix: str, config_json: str, environment: tuple):
    """obstore's ``S3Store``, made once per bucket, prefix, config and ``AWS_*`` variables (which
    obstore reads itself: ``environment`` is only the cache's key)."""
    S3Store = _obstore().store.S3Store
    config = json.loads(config_json)
    client = {"connect_timeout": CONNECT_TIMEOUT, "allow_http": _endpoint(config).startswith("http://")}
    retry = {"max_retries": RETRIES, "retry_timeout": RETRY_TIMEOUT}
    try:
        return S3Store(bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry)
    except Exception as exc:   # an unknown key in the storage options, an unparsable value
        raise ConfigError(f"Expected S3 storage options obstore takes ({CONFIG_KEY}: e.g. endpoint, region, "
                          f"access_key_id, or fsspec's key, secret, endpoint_url). Got "
                          f"{_first_line(exc)} instead.") from None


def _store(url: Url, prefix: str | None = None):
    """obstore's ``S3Store`` of ``url``'s bucket with the key ``prefix`` (default: the URL's key)."""
    config = storage_options()
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return _s3(url.bucket, url.key if prefix is None else prefix, json.dumps(config, sort_keys=True, default=str),
               environment)


def zarr_store(location: str, *, read_only: bool = False, strict: bool = False):
    """What zarr opens ``location`` with: a path as it is, a URL as zarr's ``ObjectStore``.
    ``strict`` (a run's inputs, read after the missing-chunk check): an object the store then answers
    "not found" for is an error, not the fill value zarr would read (an eventually consistent store
    that lists an object before it serves it), but for the keys the check found absent
    (``missing-chunks: fill``) just before the read: :func:`expect_absent`."""
    if not is_url(location):
        return location
    from zarr.storage import ObjectStore

    kind = _strict_store_class() if strict else ObjectStore
    return kind(_store(parse(location)), read_only=read_only)


_METADATA = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})
# (id of a strict store, key): the objects the missing-chunk check of the batch being read found
# absent, which read as the fill value. A context variable: set by the task's thread before its
# read, it reaches the coroutines zarr runs for that read on its event loop (asyncio copies the
# caller's context into them), and no other thread, task or run sees it.
_ABSENT: contextvars.ContextVar = contextvars.ContextVar("batchlu_absent", default=frozenset())


def expect_absent(found) -> None:
    """In this thread, until its next call: the strict stores' reads of ``found``, pairs
    ``(store, key)`` (a key from the store's root), are the fill value, not an error: what the
    missing-chunk check found absent before the batch's read (``missing-chunks: fill``; those
    matrices are marked -3). Every check calls it, with nothing found too, so that a batch never
    inherits what an earlier one found."""
    _ABSENT.set(frozenset((id(store), key) for store, key in found))


@functools.cache
def _strict_store_class():
    """zarr's ``ObjectStore`` whose reads of an absent object (but metadata, which zarr probes for)
    raise :class:`ObjectStoreError` (see :func:`zarr_store`)."""
    from zarr.storage import ObjectStore

    def absent(store, key: str) -> ObjectStoreError:
        return ObjectStoreError(f"Expected the object store to serve {key} of s3://{store.store.config.get('bucket')}"
                                f"/{(store.store.prefix or '').strip('/')}, which it listed. Got 'not found' instead "
                                f"(an eventually consistent store?); zarr would read it as the fill value.")

    class StrictObjectStore(ObjectStore):
        strict = True

        def _served(self, key: str, value):
            if (value is None and key.rsplit("/", 1)[-1] not in _METADATA
                    and (id(self), key) not in _ABSENT.get()):
                raise absent(self, key)
            return value

        async def get(self, key, prototype, byte_range=None):
            return self._served(key, await super().get(key, prototype, byte_range))

        async def get_partial_values(self, prototype, key_ranges):
            key_ranges = list(key_ranges)
            values = await super().get_partial_values(prototype, key_ranges)
            return [self._served(key, value) for (key, _), value in zip(key_ranges, values)]

    return StrictObjectStore


# ------------------------------------------------------------------------------------------ the errors
# What obstore's error text says (object_store's Display of the failure, then a "Debug source" dump):
# the request ("Error performing PUT http://host/bucket/key in 1.2ms, after 2 retries ..."), the
# server's status and S3's error code (in the XML body), or the connection's failure
_REQUEST = re.compile(r"Error performing ([A-Z]+) (\S+)")
_STATUS = re.compile(r"status(?: code)?:? ([1-5]\d\d)(?: ([A-Za-z][A-Za-z' -]*[A-Za-z]))?")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_RETRIES = re.compile(r"after (\d+) retries")
_NO_ANSWER = {"Connection refused": "connection refused", "dns error": "the host name does not resolve",
              "timed out": "timed out", "Timeout": "timed out", "tcp connect error": "tcp connect error",
              "error sending request": "the request could not be sent"}


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` is obstore's own error (a request to the object store that failed), which
    :func:`translate` turns into one line."""
    return type(exc).__module__.split(".")[0] == "obstore"


def store_error(exc: BaseException, location: str | None = None) -> ObjectStoreError | None:
    """``exc`` as batchlu's one-line :class:`ObjectStoreError`: itself where it is one, obstore's
    error translated (:func:`translate`), None for any other error."""
    if isinstance(exc, ObjectStoreError):
        return exc
    return translate(exc, location) if is_store_error(exc) else None


def naming_store_failures(func):
    """Decorator of the public calls that read or write object storage (run, verify, generate,
    inspect): obstore's error that reaches their caller (from zarr's reads and writes of an
    ``s3://`` store) is raised as one :class:`ObjectStoreError` line naming the request that failed
    and the store's answer, not as obstore's many lines."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise translate(exc) from None
    return wrapper


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def _request(text: str) -> tuple[str, str] | None:
    """The method (``LIST`` for a listing, ``DELETE`` for S3's DeleteObjects, whose keys are in its
    body: the bucket is named) and the ``s3://`` URL of the object (or prefix listed) of the request
    obstore's error ``text`` names, or None where it names none."""
    import urllib.parse

    match = _REQUEST.search(text)
    if match is None:
        return None
    method, uri = match.groups()
    parts = urllib.parse.urlsplit(uri)
    path = urllib.parse.unquote(parts.path).lstrip("/")
    if str(storage_options().get("virtual_hosted_style_request", "")).lower() == "true":
        bucket, key = (parts.hostname or "").split(".")[0], path   # https://BUCKET.host/KEY
    else:
        bucket, _, key = path.partition("/")                        # http://host/BUCKET/KEY
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    if method == "GET" and "list-type" in query:
        method, key = "LIST", query.get("prefix", [""])[0]
    elif method == "POST" and "delete" in query:   # obstore deletes through S3's DeleteObjects
        method = "DELETE"
    return method, str(Url("s3", bucket, key.strip("/"))) if bucket else uri


def _answer(text: str) -> tuple[str, str | None]:
    """The store's answer in obstore's error ``text``: its HTTP status (with S3's error code, and
    the retries made), or else the error's first line; and S3's error code (None: none given)."""
    status, codes, retries = _STATUS.search(text), _CODE.findall(text), _RETRIES.search(text)
    code = codes[0] if codes else None
    if status is None:
        first = text.split("Debug source:")[0].split("<?xml")[0]
        return " ".join(first.split()).rstrip(" :-")[:300], code
    answer = " ".join(filter(None, status.groups())) + (f" ({code})" if code else "")
    if retries is not None and retries.group(1) != "0":
        answer += f" after {retries.group(1)} retries"
    return answer, code


def translate(exc: BaseException, location: str | None = None, what: str = "the object store") -> ObjectStoreError:
    """obstore's error (many lines, the server's XML) as one :class:`ObjectStoreError` line naming
    the request that failed (its method and object, else ``location``) and the problem: no answer
    from the endpoint, no such bucket, refused credentials, or else the server's status and error
    code (a 5xx: the server failed or throttled the request)."""
    text = str(exc)
    request = _request(text)
    target = request[1] if request and (request[0] != "DELETE" or not location) else location
    asked = f"{request[0]} {target}" if request else (target or what)
    bucket = parse(target).bucket if target and is_url(target) else None
    endpoint = _endpoint(storage_options())
    reasons = [reason for marker, reason in _NO_ANSWER.items() if marker in text]
    if reasons and not _STATUS.search(text):   # a status is an answer, whatever its body says
        return ObjectStoreError(f"Expected an S3 endpoint answering at {endpoint} for {asked}. Got no answer "
                                f"instead ({reasons[0]}); check AWS_ENDPOINT_URL (or the storage options' "
                                f"endpoint).")
    answer, code = _answer(text)
    if code == "NoSuchBucket" or "NoSuchBucket" in text:
        return ObjectStoreError(f"Expected the bucket {bucket} of {target} to exist at {endpoint}. "
                                f"Got no such bucket instead.")
    if type(exc).__name__ in ("PermissionDeniedError", "UnauthenticatedError") or " 403 " in f" {answer} " \
            or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
        return ObjectStoreError(f"Expected credentials that {endpoint} accepts for {asked}. Got access refused "
                                f"({code or '403 Forbidden'}) instead; set AWS_ACCESS_KEY_ID and "
                                f"AWS_SECRET_ACCESS_KEY (or the storage options) to ones allowed there.")
    failed = "; the store failed or throttled the request" if re.match(r"(5\d\d|429)\b", answer) else ""
    return ObjectStoreError(f"Expected the S3 endpoint at {endpoint} to answer {asked}. Got {answer} "
                            f"instead{failed}.")


def _calling(func, location: str, what: str, *args, **kwargs):
    try:
        return func(*args, **kwargs)
    except (ConfigError, ObjectStoreError):
        raise
    except Exception as exc:
        raise translate(exc, location, what) from None


# ------------------------------------------------------------------------------------- the operations
def probe(location: str, what: str = "the object store") -> bool:
    """One listing request below ``location``: whether any object is there. Raises the one-line
    :class:`ObjectStoreError` of a missing bucket, refused credentials or an endpoint that does not
    answer."""
    obstore = _obstore()

    url = parse(location)

    def first():
        for batch in obstore.list(_store(url, ""), prefix=f"{url.key}/" if url.key else None, chunk_size=1):
            if batch:
                return True
        return False

    return _calling(first, location, what)


def head(location: str) -> dict | None:
    """The object's metadata (``size``, ``e_tag``, ``last_modified``), or None where there is none."""
    obstore = _obstore()

    url = parse(location)
    try:
        return obstore.head(_store(url, ""), url.key)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise translate(exc, location) from None


def listing(location: str) -> dict[str, tuple[int, str]]:
    """Every object below ``location`` (``location/...``): its key relative to ``location``, with its
    size and ETag."""
    obstore = _obstore()

    url = parse(location)
    prefix = f"{url.key}/" if url.key else ""

    def walk():
        found = {}
        for batch in obstore.list(_store(url, ""), prefix=prefix or None):
            for meta in batch:
                found[meta["path"][len(prefix):]] = (int(meta["size"]), str(meta.get("e_tag") or ""))
        return found

    return _calling(walk, location, "the object store")


def get(location: str) -> bytes | None:
    """The object's bytes, or None where there is none."""
    obstore = _obstore()

    url = parse(location)
    try:
        return bytes(obstore.get(_store(url, ""), url.key).bytes())
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise translate(exc, location) from None


def put(location: str, data: bytes) -> None:
    obstore = _obstore()

    url = parse(location)
    _calling(obstore.put, location, "the object store", _store(url, ""), url.key, data)


def put_new(location: str, data: bytes) -> bool:
    """Create the object ``location`` holding ``data`` unless one is there (S3's conditional write,
    ``If-None-Match: *``, atomic at the server); False where one was there."""
    obstore = _obstore()
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    url = parse(location)
    try:
        obstore.put(_store(url, ""), url.key, data, mode="create")
        return True
    except (AlreadyExistsError, PreconditionError):
        return False
    except Exception as exc:
        raise translate(exc, location) from None


def delete(location: str) -> None:
    obstore = _obstore()

    url = parse(location)
    _calling(obstore.delete, location, "the object store", _store(url, ""), url.key)


def delete_tree(location: str) -> None:
    """Delete every object below ``location``."""
    obstore = _obstore()

    url = parse(location)
    keys = [f"{url.key}/{name}" if url.key else name for name in listing(location)]
    for i in range(0, len(keys), 1000):
        _calling(obstore.delete, location, "the object store", _store(url, ""), keys[i:i + 1000])
