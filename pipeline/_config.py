"""Settings: defaults shipped in ``batchlu.yaml`` under ``dask.config``'s ``batchlu`` namespace, and
one frozen :class:`Options` object built from them that travels from the CLI to the tasks."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes

from ._io_engines import check as _io_engine
from ._missing import POLICIES as MISSING_CHUNKS
from .errors import ConfigError

_DEFAULTS = pathlib.Path(__file__).with_name("batchlu.yaml")
with _DEFAULTS.open() as _f:
    _SHIPPED = yaml.safe_load(_f)
dask.config.update_defaults(_SHIPPED)

BACKENDS = ("auto", "cpu", "gpu")
# Not a product setting, hence outside the ``batchlu`` namespace and absent from batchlu.yaml: seconds
# slept before each batch, for the tests that interrupt a run (``dask.config.set`` or the environment
# variable DASK_BATCHLU_TESTING__TASK_DELAY=0.1).
TESTING_TASK_DELAY = "batchlu-testing.task-delay"


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """How the embedded LocalCluster is sized; ignored when a client or scheduler is given."""

    n_workers: int | None = None
    threads_per_worker: int | None = None
    processes: bool = True
    host: str = "127.0.0.1"
    dashboard_address: str = "127.0.0.1:8787"
    log_file: str | None = None        # the embedded cluster's worker log; None: see pipeline._cluster
    gpus: str | None = None            # GPU backend: "0,1"; None: CUDA_VISIBLE_DEVICES or all
    rmm_pool_size: int | None = None   # GPU backend: RMM pool bytes per GPU; None: CuPy's pool
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


@dataclasses.dataclass(frozen=True)
class Options:
    """The run's settings, checked once; built by :func:`options`."""

    backend: str = "auto"
    memory_budget: int = 256 * 2**20
    output_compressor: str = "zstd"
    chunk: int | None = None
    max_tasks: int = 20000
    progress: bool = True
    connect_timeout: float = 30.0      # seconds to reach a scheduler given by address or file
    io_processes: int | None = None    # I/O processes per worker; None: auto (see pipeline._io_pool.io_settings)
    io_threads: int | None = None      # threads per I/O process; None: auto
    io_engine: str = "auto"            # Zarr codec pipeline of the host I/O (pipeline._io_engines)
    missing_chunks: str = "error"      # a chunk missing from the input: "error", or "fill" (info -3)
    generate_chunk_bytes: int = 32 * 2**20
    verify_threshold: float = 30.0
    verify_block_bytes: int = 64 * 2**20
    performance_report: str | None = None
    cluster: ClusterOptions = dataclasses.field(default_factory=ClusterOptions)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict, recorded in the output's provenance."""
        return dataclasses.asdict(self)

    def replace(self, **changes) -> Options:
        return dataclasses.replace(self, **changes)


def task_delay() -> float:
    """The test-only delay before each batch (see ``TESTING_TASK_DELAY``); 0 unless a test sets it."""
    value = dask.config.get(TESTING_TASK_DELAY, 0) or 0
    try:
        delay = float(value)
    except (TypeError, ValueError):
        delay = -1.0
    if not delay >= 0:
        raise ConfigError(f"Expected {TESTING_TASK_DELAY} to be a number of seconds >= 0. "
                          f"Got {value!r} instead.")
    return delay


def known_keys() -> list[str]:
    """Every ``batchlu.*`` key the shipped YAML declares (sections included), dashed."""
    return sorted(f"batchlu.{key}" for key in _flatten(_SHIPPED["batchlu"], sections=True))


def check_keys(keys) -> None:
    """Refuse a ``batchlu`` key that no default declares: a typo would otherwise be ignored."""
    known = set(known_keys())
    for key in keys:
        name = key if key.startswith("batchlu.") else f"batchlu.{key}"
        if name.replace("_", "-") not in known:
            raise ConfigError(f"Expected a batchlu setting, one of {', '.join(sorted(known))}. "
                              f"Got {name!r} instead.")


def _flatten(mapping: Mapping, prefix: str = "", *, sections: bool = False) -> dict[str, Any]:
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if sections:
                flat[name] = value
            flat.update(_flatten(value, name + ".", sections=sections))
        else:
            flat[name] = value
    return flat


def _int(value, what: str, *, minimum: int, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    try:
        number = int(value)
        if number != value and not isinstance(value, str):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"Expected batchlu.{what} to be an integer >= {minimum}"
                          f"{' or null' if allow_none else ''}. Got {value!r} instead.") from None
    if number < minimum:
        raise ConfigError(f"Expected batchlu.{what} >= {minimum}. Got {number} instead.")
    return number


def _bytes(value, what: str) -> int:
    try:
        number = parse_bytes(value) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number <= 0:
        raise ConfigError(f"Expected batchlu.{what} to be a positive size such as '256MiB'. "
                          f"Got {value!r} instead.")
    return number


ZSTD_LEVELS = range(-(1 << 17), 23)  # Zstandard's levels: ZSTD_minCLevel() to ZSTD_maxCLevel()


def _compressor(value) -> str:
    text = "none" if value is None or value is False else str(value).strip().lower()
    name, _, level = text.partition(":")
    if name == "none" and not level:
        return text
    if name == "zstd" and (not level or (level.lstrip("-").isdigit() and int(level) in ZSTD_LEVELS)):
        return text
    raise ConfigError(f"Expected batchlu.output-compressor to be zstd, zstd:LEVEL with LEVEL from "
                      f"{ZSTD_LEVELS[0]} to {ZSTD_LEVELS[-1]}, or none. Got {value!r} instead.")


def _seconds(value, what: str) -> float:
    """A duration: seconds as a number, or text dask understands (``30s``, ``2 minutes``)."""
    from dask.utils import parse_timedelta

    try:
        seconds = parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError):
        seconds = None
    if seconds is None or isinstance(value, bool) or not seconds > 0:
        raise ConfigError(f"Expected batchlu.{what} to be a positive duration such as 30s. "
                          f"Got {value!r} instead.")
    return float(seconds)


def _new_file(value, what: str) -> str | None:
    """A file a run writes (report, log): its folder must exist (a run never creates folders)."""
    path = _path(value, what)
    if path is None:
        return None
    target = pathlib.Path(path).expanduser().absolute()
    if target.is_dir():
        raise ConfigError(f"Expected batchlu.{what} to be a file path. Got the folder {target} instead.")
    if not target.parent.is_dir():
        raise ConfigError(f"Expected the folder of batchlu.{what} {target} to exist. Got no folder "
                          f"{target.parent} instead.")
    return str(target)


def _auto_int(value, what: str, *, minimum: int) -> int | None:
    """``auto`` (or null) -> None, else an integer >= ``minimum``."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        number = int(value)
        if isinstance(value, bool) or (number != value and not isinstance(value, str)):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"Expected batchlu.{what} to be auto or an integer >= {minimum}. "
                          f"Got {value!r} instead.") from None
    if number < minimum:
        raise ConfigError(f"Expected batchlu.{what} to be auto or an integer >= {minimum}. "
                          f"Got {number} instead.")
    return number


def _path(value, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, (str, pathlib.PurePath)):
        raise ConfigError(f"Expected batchlu.{what} to be a file path. Got {value!r} instead.")
    return str(value)


def _choice(value, what: str, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower() if isinstance(value, str) else value
    if text not in choices:
        raise ConfigError(f"Expected batchlu.{what} to be one of {', '.join(choices)}. "
                          f"Got {value!r} instead.")
    return text


def _bool(value, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ConfigError(f"Expected batchlu.{what} to be true or false. Got {value!r} instead.")


def options(overrides: Mapping | Options | None = None, **changes) -> Options:
    """Build the run's :class:`Options` from ``dask.config`` plus ``overrides``.

    ``overrides`` is an :class:`Options` (used as is) or a mapping of ``batchlu`` keys, nested or
    dotted, with dashes or underscores: ``{"memory-budget": "64MiB", "cluster.n-workers": 2}``.
    Keyword ``changes`` that are not None win over both (e.g. ``backend="cpu"``).
    """
    changes = {k: v for k, v in changes.items() if v is not None}
    if isinstance(overrides, Options):
        base = overrides
    else:
        if overrides is not None and not isinstance(overrides, Mapping):
            raise ConfigError(f"Expected config to be a mapping of batchlu settings or an Options. "
                              f"Got {type(overrides).__name__} instead.")
        flat = _flatten(overrides or {})
        flat = {k[len("batchlu."):] if k.startswith("batchlu.") else k: v for k, v in flat.items()}
        check_keys(flat)
        with dask.config.set({f"batchlu.{k}": v for k, v in flat.items()}):
            base = _from_mapping(dask.config.get("batchlu"))
    opts = dataclasses.replace(base, **changes) if changes else base
    return _checked(opts)


def _get(cfg: Mapping, key: str, default=None):
    for name in (key, key.replace("-", "_")):
        if name in cfg:
            return cfg[name]
    return default


def _from_mapping(cfg: Mapping) -> Options:
    cluster = _get(cfg, "cluster", {}) or {}
    generate = _get(cfg, "generate", {}) or {}
    verify = _get(cfg, "verify", {}) or {}
    tls = _get(cfg, "tls", {}) or {}
    rmm_pool = _get(cluster, "rmm-pool-size")
    gpus = _get(cluster, "gpus")
    return Options(
        backend=_get(cfg, "backend", "auto"),
        memory_budget=_bytes(_get(cfg, "memory-budget", "256MiB"), "memory-budget"),
        output_compressor=_compressor(_get(cfg, "output-compressor", "zstd")),
        chunk=_int(_get(cfg, "chunk"), "chunk", minimum=1, allow_none=True),
        max_tasks=_int(_get(cfg, "max-tasks", 20000), "max-tasks", minimum=1),
        progress=_bool(_get(cfg, "progress", True), "progress"),
        connect_timeout=_seconds(_get(cfg, "connect-timeout", "30s"), "connect-timeout"),
        io_processes=_auto_int(_get(cfg, "io-processes", "auto"), "io-processes", minimum=0),
        io_threads=_auto_int(_get(cfg, "io-threads", "auto"), "io-threads", minimum=1),
        io_engine=_io_engine(_get(cfg, "io-engine", "auto")),
        missing_chunks=_choice(_get(cfg, "missing-chunks", "error"), "missing-chunks", MISSING_CHUNKS),
        generate_chunk_bytes=_bytes(_get(generate, "chunk-bytes", "32MiB"), "generate.chunk-bytes"),
        verify_threshold=float(_get(verify, "threshold", 30)),
        verify_block_bytes=_bytes(_get(verify, "block-bytes", "64MiB"), "verify.block-bytes"),
        performance_report=_new_file(_get(cfg, "performance-report"), "performance-report"),
        cluster=ClusterOptions(
            n_workers=_int(_get(cluster, "n-workers"), "cluster.n-workers", minimum=1,
                           allow_none=True),
            threads_per_worker=_int(_get(cluster, "threads-per-worker"),
                                    "cluster.threads-per-worker", minimum=1, allow_none=True),
            processes=_bool(_get(cluster, "processes", True), "cluster.processes"),
            host=str(_get(cluster, "host", "127.0.0.1")),
            dashboard_address=str(_get(cluster, "dashboard-address", "127.0.0.1:8787")),
            log_file=_new_file(_get(cluster, "log-file"), "cluster.log-file"),
            gpus=None if gpus is None else ",".join(str(g) for g in gpus) if isinstance(gpus, (list, tuple))
            else str(gpus),
            rmm_pool_size=None if rmm_pool is None else _bytes(rmm_pool, "cluster.rmm-pool-size"),
            tls_ca_file=_path(_get(tls, "ca-file"), "tls.ca-file"),
            tls_cert=_path(_get(tls, "cert"), "tls.cert"),
            tls_key=_path(_get(tls, "key"), "tls.key"),
        ),
    )


def _checked(opts: Options) -> Options:
    if opts.backend not in BACKENDS:
        raise ConfigError(f"Expected backend to be one of {', '.join(BACKENDS)}. "
                          f"Got {opts.backend!r} instead.")
    if opts.missing_chunks not in MISSING_CHUNKS:
        raise ConfigError(f"Expected batchlu.missing-chunks to be one of {', '.join(MISSING_CHUNKS)}. "
                          f"Got {opts.missing_chunks!r} instead.")
    return opts
