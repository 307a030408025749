"""Settings, declared once: one frozen :class:`Options` object that travels from the CLI to the tasks.

Every setting is one field of :class:`Options` (or of :class:`ClusterOptions`, its ``cluster`` part),
declared with :func:`setting`: its ``batchlu.*`` key, its parser (which checks a value and converts
it), and, where ``batchlu run`` has one, its flag and help text. :data:`SETTINGS` lists them all; the
CLI builds its shortcut flags from it (``batchlu.workflows._run_options``).

Defaults live only in the shipped ``batchlu.yaml``, loaded into ``dask.config``'s ``batchlu``
namespace: a field's default is the YAML's value for its key, through its parser, so ``Options()``
holds the shipped defaults and :func:`options` the current ``dask.config`` plus overrides.

To add a setting, e.g. ``output-layout``:

1. ``batchlu.yaml``: ``  output-layout: auto   # what it means``;
2. here, one field of :class:`Options` (or :class:`ClusterOptions`), with a parser of
   :mod:`._parsers` or a new one there (a callable ``parse(value, key)``; the CLI maps it to a click
   type in ``_click_type``), and its choices, if any, in :mod:`._choices`::

       output_layout: str = setting("output-layout", OneOf(OUTPUT_LAYOUTS), fixed_at_creation="the layout",
                                    flag="--output-layout", help="...")

   (``flag`` / ``help`` only for a ``batchlu run`` shortcut; ``fixed_at_creation`` names what an
   output keeps on ``--resume``, ``embedded_only`` marks the embedded cluster's own settings);
3. README.md's configuration table: one row.

To rename a setting, give its field the new key and flag and keep the old ones as ``old_key`` /
``old_flag``: the old key is still read (from YAML, the environment, ``dask.config.set``, a
``config`` mapping, ``--config``; the old field name from keyword arguments), the old flag is a hidden
alias, each with one ``BatchluWarning`` naming the new name; the old and the new name given with
different values is a :class:`ConfigError` (see :func:`_renamed`).

``tests/pipeline/test_config.py`` checks that the YAML and the fields agree and that no default is
written in Python; ``tests/test_readme.py`` that the README lists every key with its default.
"""

from __future__ import annotations

import dataclasses
import pathlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import dask.config
import yaml

from ..errors import BatchluWarning, ConfigError
from ._choices import (BACKENDS, CODEC_DEVICES, MISSING_CHUNKS, OUTPUT_CHECKSUMS, OUTPUT_LAYOUTS,
                       SPARSE_ORDERINGS)
from ._parsers import (AutoBoolean, AutoInteger, Boolean, Compressor, Duration, GPUs, IOEngine, InputFile, Integer, NewFile,
                       NonNegative, Number, OneOf, Size, Text)

__all__ = ["BY_KEY", "SETTINGS", "TESTING_TASK_DELAY", "ClusterOptions", "Options", "Setting", "check_keys",
           "known_keys", "options", "setting", "task_delay"]

_DEFAULTS = pathlib.Path(__file__).with_name("batchlu.yaml")
with _DEFAULTS.open() as _f:
    _SHIPPED = yaml.safe_load(_f)
dask.config.update_defaults(_SHIPPED)

# Not a product setting, hence outside the ``batchlu`` namespace and absent from batchlu.yaml: seconds
# slept before each batch, for the tests that interrupt a run (``dask.config.set`` or the environment
# variable DASK_BATCHLU_TESTING__TASK_DELAY=0.1).
TESTING_TASK_DELAY = "batchlu-testing.task-delay"


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


def _lookup(cfg: Mapping, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of the dotted ``key`` in the nested ``cfg`` (dashes or underscores)."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return False, None
        for name in (part, part.replace("-", "_")):
            if name in node:
                node = node[name]
                break
        else:
            return False, None
    return True, node



# --------------------------------------------------------------------------------------- the table
@dataclasses.dataclass(frozen=True)
class Setting:
    """One row of the settings table: a ``batchlu.*`` key and the :class:`Options` field it fills."""

    key: str                                 # under ``batchlu``, dashed and dotted: "cluster.n-workers"
    parse: Callable[[Any, str], Any]         # checks and converts a value: parse(value, key)
    flag: str | None = None                  # ``batchlu run``'s shortcut for it, e.g. "--workers"
    help: str | None = None                  # the flag's help
    fixed_at_creation: str | None = None     # what the output keeps on resume, e.g. "the chunking"
    embedded_only: bool = False              # sets up the embedded cluster only (no use with --scheduler)
    old_key: str | None = None               # its key before a rename, still read (with a warning)
    old_flag: str | None = None              # its flag before a rename, a hidden alias (with a warning)
    field: str = ""                          # the Options field, dotted: "cluster.n_workers"

    @property
    def name(self) -> str:
        """The full ``dask.config`` key: ``batchlu.<key>``."""
        return f"batchlu.{self.key}"

    @property
    def default(self) -> Any:
        """The shipped YAML's value for this key, parsed."""
        return self.parse(_lookup(_SHIPPED["batchlu"], self.key)[1], self.key)


_ROW = "batchlu-setting"  # the dataclass field metadata entry holding the field's Setting


def setting(key: str, parse: Callable[[Any, str], Any], **row) -> Any:
    """Declare a field of :class:`Options` or :class:`ClusterOptions` as the setting ``batchlu.<key>``:
    its default is the shipped ``batchlu.yaml``'s value for ``key``, through ``parse``; ``row`` holds
    the rest of its :class:`Setting` (``flag``, ``help``, ``fixed_at_creation``, ``embedded_only``,
    ``old_key``, ``old_flag``)."""
    row = Setting(key, parse, **row)
    found, _ = _lookup(_SHIPPED["batchlu"], key)
    if not found:
        raise ConfigError(f"Expected {_DEFAULTS.name} to ship a default for batchlu.{key}. "
                          f"Got none instead: add it there.")
    return dataclasses.field(default=row.default, metadata={_ROW: row})


class _Unset:
    """A setting not given (None is a value: null)."""

    def __repr__(self) -> str:
        return "<not given>"


_UNSET: Any = _Unset()


def _named(key: str, flag: str | None) -> str:
    return f"batchlu.{key}" + (f" ({flag})" if flag else "")


def _old_value(row: Setting, old, new=_UNSET):
    """The value of ``row``'s setting given under its old name (``row.old_key``) as ``old``, and under
    its own as ``new`` (_UNSET: not given there): one BatchluWarning that the old name is deprecated;
    the two names with different values are a ConfigError (raised before any warning: one line)."""
    old = row.parse(old, row.old_key)
    if new is not _UNSET and row.parse(new, row.key) != old:
        raise ConfigError(f"Expected one value for {_named(row.key, row.flag)}, given under its old name "
                          f"{_named(row.old_key, row.old_flag)} too. Got {row.key} {row.parse(new, row.key)!r} "
                          f"and {row.old_key} {old!r} instead: give batchlu.{row.key} only.")
    warnings.warn(f"{_named(row.old_key, row.old_flag)} is deprecated: use {_named(row.key, row.flag)}, "
                  f"which takes the same values.", BatchluWarning, stacklevel=3)
    return old


def _renamed(values: Mapping[str, Any], *, fields: bool = False) -> dict[str, Any]:
    """``values`` (``batchlu`` keys, or with ``fields`` :class:`Options` fields; dashes or underscores)
    with each setting's old name replaced by its own, through :func:`_old_value`."""
    out = dict(values)
    for row in SETTINGS:
        if row.old_key is None:
            continue
        olds = [name for name in out if name.replace("_", "-") == row.old_key]
        if not olds:
            continue
        old = [out.pop(name) for name in olds][-1]
        news = [name for name in out if name.replace("_", "-") == row.key]
        name = news[0] if news else row.field if fields else row.key
        out[name] = _old_value(row, old, out[name] if news else _UNSET)
    return out


def _parse_fields(obj) -> None:
    """Parse every setting field of the (frozen) dataclass ``obj`` in place."""
    for f in dataclasses.fields(obj):
        row = f.metadata.get(_ROW)
        if row is not None:
            object.__setattr__(obj, f.name, row.parse(getattr(obj, f.name), row.key))


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """The cluster's settings: how the embedded cluster is made (ignored when a client or scheduler
    is given), how GPU workers allocate memory, and TLS."""

    n_workers: int | None = setting(
        "cluster.n-workers", Integer(minimum=1, optional=True), embedded_only=True,
        flag="--workers", help="Number of workers of the embedded local CPU cluster (threads of this "
                                "process unless batchlu.cluster.processes is true).")
    threads_per_worker: int | None = setting(
        "cluster.threads-per-worker", Integer(minimum=1, optional=True), embedded_only=True,
        flag="--threads-per-worker", help="Threads per worker of the embedded local cluster.")
    processes: bool | None = setting("cluster.processes", AutoBoolean(), embedded_only=True)  # None: auto
    host: str = setting("cluster.host", Text(), embedded_only=True)
    dashboard_address: str = setting("cluster.dashboard-address", Text(), embedded_only=True)
    log_file: str | None = setting("cluster.log-file", NewFile(), embedded_only=True)
    gpus: str | None = setting(
        "cluster.gpus", GPUs(), embedded_only=True,
        flag="--gpus", help="GPUs of the embedded GPU cluster, one worker each, e.g. 0,1 (default: "
                            "CUDA_VISIBLE_DEVICES, else all).")
    rmm_pool_size: int | None = setting(
        "cluster.rmm-pool-size", Size(optional=True),
        flag="--rmm-pool-size", help="Give each GPU worker an RMM memory pool of this size (needs rmm), "
                                     "e.g. 30GiB.")
    tls_ca_file: str | None = setting(
        "tls.ca-file", InputFile(),
        flag="--tls-ca-file", help="CA certificate (PEM): talk TLS to the scheduler and workers "
                                   "(distributed's Security).")
    tls_cert: str | None = setting(
        "tls.cert", InputFile(),
        flag="--tls-cert", help="Certificate (PEM) of this client (and of the embedded cluster).")
    tls_key: str | None = setting(
        "tls.key", InputFile(),
        flag="--tls-key", help="Private key (PEM) of --tls-cert, unless the certificate file holds it.")

    def __post_init__(self):
        _parse_fields(self)


@dataclasses.dataclass(frozen=True)
class Options:
    """The run's settings, each checked by its parser whenever an Options is built; build one from
    ``dask.config`` with :func:`options`."""

    backend: str = setting(
        "backend", OneOf(BACKENDS),
        flag="--backend", help="cpu: SciPy/LAPACK; gpu: batchlu's CUDA kernels; auto (default): gpu where "
                               "the workers have one.")
    memory_budget: int = setting(
        "memory-budget", Size(),
        flag="--memory-budget", help="Memory one task may use for its batch (input, outputs and workspace), "
                                     "e.g. 256MiB.")
    chunk: int | None = setting(
        "chunk", Integer(minimum=1, optional=True), fixed_at_creation="the chunking",
        flag="--chunk", help="Output chunk length along N, in matrices (default: the input's, capped by the "
                             "budget). Fixed when OUT is created: --resume keeps OUT's.")
    chunk_bytes: int = setting("chunk-bytes", Size())   # with chunk null: output chunks gather input chunks up to this
    max_tasks: int = setting("max-tasks", Integer(minimum=1))
    cluster: ClusterOptions = dataclasses.field(default_factory=ClusterOptions)
    performance_report: str | None = setting(
        "performance-report", NewFile(),
        flag="--report", help="Save Dask's performance report of the run to this HTML file (its folder "
                              "must exist).")
    output_codec: str = setting(
        "output-codec", Compressor(), fixed_at_creation="the codec",
        flag="--output-codec", help="Codec of the output arrays: auto (default: none for floating-point "
                                    "results, which do not compress, zstd for the others), zstd, "
                                    "zstd:LEVEL (LEVEL up to 22), lz4 or none. Fixed when OUT is created: "
                                    "--resume keeps OUT's.",
        old_key="output-compressor", old_flag="--output-compressor")
    codec_device: str = setting(
        "codec-device", OneOf(CODEC_DEVICES),
        flag="--codec-device", help="GPU runs: where Zarr chunks are decoded and encoded. auto (default): on "
                                    "the GPU where nvCOMP is installed and the codec allows it, but large "
                                    "compressed frames on the host; gpu: every frame on the GPU; cpu. The "
                                    "report says where, per array, and why.")
    device_batch_bytes: int = setting("device-batch-bytes", Size())
    output_layout: str = setting(
        "output-layout", OneOf(OUTPUT_LAYOUTS), fixed_at_creation="the layout",
        flag="--output-layout", help="chunks (default): one Zarr chunk per output chunk; sharded: one shard "
                                     "per output chunk, of inner chunks of about 256 KiB (the fastest for "
                                     "the GPU codecs). Fixed when OUT is created.")
    output_checksum: str = setting("output-checksum", OneOf(OUTPUT_CHECKSUMS), fixed_at_creation="the checksum")
    missing_chunks: str = setting(
        "missing-chunks", OneOf(MISSING_CHUNKS),
        flag="--missing-chunks", help="A chunk missing from the input or right-hand side store: error "
                                      "(default: name it and stop), or fill (go on; its matrices get "
                                      "info -3 and NaN results).")
    io_processes: int | None = setting("io-processes", AutoInteger(minimum=0))   # None: auto
    io_threads: int | None = setting("io-threads", AutoInteger(minimum=1))       # None: auto
    io_engine: str = setting("io-engine", IOEngine())   # the host's Zarr codec pipeline (pipeline.store._io_engines)
    progress: bool = setting("progress", Boolean())
    connect_timeout: float = setting("connect-timeout", Duration())              # seconds
    generate_chunk_bytes: int = setting("generate.chunk-bytes", Size())
    verify_threshold: float = setting("verify.threshold", Number())
    verify_block_bytes: int = setting("verify.block-bytes", Size())
    # the sparse LDL^T ops (ldlt-solve, ldlt-inertia)
    sparse_ordering: str = setting("sparse.ordering", OneOf(SPARSE_ORDERINGS))
    sparse_refine: int = setting("sparse.refine", Integer(minimum=0))
    sparse_pivot_tol: float | None = setting("sparse.pivot-tol", NonNegative(optional=True))  # None: sqrt(eps)
    sparse_perturb: bool = setting("sparse.perturb", Boolean())
    # output_codec's name before its rename, still taken (with a warning): Options(output_compressor="lz4")
    output_compressor: dataclasses.InitVar[Any] = _UNSET

    def __post_init__(self, output_compressor):
        if not isinstance(self.cluster, ClusterOptions):
            raise ConfigError(f"Expected cluster to be a ClusterOptions. Got {self.cluster!r} instead.")
        _parse_fields(self)
        if output_compressor is not _UNSET:   # output_codec at its default counts as not given
            row = self.__dataclass_fields__["output_codec"].metadata[_ROW]
            given = _UNSET if self.output_codec == row.default else self.output_codec
            object.__setattr__(self, "output_codec", _old_value(row, output_compressor, given))

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict, recorded in the output's provenance."""
        return dataclasses.asdict(self)

    def replace(self, **changes) -> Options:
        return dataclasses.replace(self, **_renamed(changes, fields=True))


def _rows(cls, prefix: str = "") -> list[Setting]:
    rows = []
    for f in dataclasses.fields(cls):
        if _ROW in f.metadata:
            rows.append(dataclasses.replace(f.metadata[_ROW], field=prefix + f.name))
        elif f.name == "cluster":
            rows += _rows(ClusterOptions, "cluster.")
    return rows


SETTINGS: tuple[Setting, ...] = tuple(_rows(Options))
"""Every setting, in the order of :class:`Options`' fields (the ``cluster`` ones where it sits)."""
BY_KEY: dict[str, Setting] = {row.key: row for row in SETTINGS}
"""The rows by key (``"cluster.n-workers"``)."""


# ---------------------------------------------------------------------------------- keys and building
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
    """Refuse a ``batchlu`` key that no default declares: a typo would otherwise be ignored. The old
    name of a renamed setting passes (it is read, with a warning)."""
    known = known_keys()
    accepted = set(known) | {f"batchlu.{row.old_key}" for row in SETTINGS if row.old_key}
    for key in keys:
        name = key if key.startswith("batchlu.") else f"batchlu.{key}"
        if name.replace("_", "-") not in accepted:
            raise ConfigError(f"Expected a batchlu setting, one of {', '.join(known)}. "
                              f"Got {name!r} instead.")


def _from_config(cfg: Mapping, given: frozenset[str] = frozenset()) -> Options:
    """An :class:`Options` of the ``batchlu`` mapping ``cfg``; a key it lacks keeps the shipped default.

    An old name in ``cfg`` (from a YAML file, ``DASK_BATCHLU__...`` or ``dask.config.set``) sets its
    setting, unless the run's own overrides set it (``given``: their dashed keys): there a new key at
    its shipped default counts as not given, since the defaults sit in ``cfg`` too."""
    top, cluster = {}, {}
    for row in SETTINGS:
        found, value = _lookup(cfg, row.key)
        had_old, old = _lookup(cfg, row.old_key) if row.old_key else (False, None)
        if had_old and row.key in given:   # the run's own value wins; the old name is still reported
            _old_value(row, old)
        elif had_old:
            new = value if found and row.parse(value, row.key) != row.default else _UNSET
            found, value = True, _old_value(row, old, new)
        if found:
            section, _, name = row.field.rpartition(".")
            (cluster if section == "cluster" else top)[name] = value
    return Options(**top, cluster=ClusterOptions(**cluster))


def options(overrides: Mapping | Options | None = None, **changes) -> Options:
    """Build the run's :class:`Options` from ``dask.config`` plus ``overrides``.

    ``overrides`` is an :class:`Options` (used as is) or a mapping of ``batchlu`` keys, nested or
    dotted, with dashes or underscores: ``{"memory-budget": "64MiB", "cluster.n-workers": 2}``.
    Keyword ``changes`` (Options fields) that are not None win over both (e.g. ``backend="cpu"``).
    """
    changes = _renamed({k: v for k, v in changes.items() if v is not None}, fields=True)
    if isinstance(overrides, Options):
        base = overrides
    else:
        if overrides is not None and not isinstance(overrides, Mapping):
            raise ConfigError(f"Expected config to be a mapping of batchlu settings or an Options. "
                              f"Got {type(overrides).__name__} instead.")
        flat = _flatten(overrides or {})
        flat = {k[len("batchlu."):] if k.startswith("batchlu.") else k: v for k, v in flat.items()}
        check_keys(flat)
        flat = _renamed(flat)
        with dask.config.set({f"batchlu.{k}": v for k, v in flat.items()}):
            base = _from_config(dask.config.get("batchlu"), frozenset(k.replace("_", "-") for k in flat))
    return dataclasses.replace(base, **changes) if changes else base
