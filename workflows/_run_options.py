"""The options of ``batchlu run``, declared once.

Everything ``batchlu run`` accepts beyond its two paths lives here, in three tables, and
:func:`pipeline_kwargs` turns the parsed values into the keyword arguments of :func:`batchlu.pipeline.run`:

* ``RUN_OPTIONS``     -- what to compute and how to treat an existing output;
* ``CLUSTER_OPTIONS`` -- where to run (an existing scheduler, or the embedded default);
* ``CONFIG_OPTIONS``  -- shortcuts for ``batchlu.*`` keys of ``dask.config``, derived from the settings
  table (:data:`batchlu.pipeline.config._settings.SETTINGS`: a setting with a ``flag`` gets one, with its help
  and a click type from its parser); ``--config KEY=VALUE`` sets any other key. ``OLD_FLAGS``: a
  renamed setting's old flag (its ``old_flag``), hidden, sets its old key (read with a warning).

To add a run or cluster option, add one row to the table it belongs to (and, for a cluster option, one
line in :func:`pipeline_kwargs`); to give a setting a flag, give its field in ``pipeline/config/_settings.py`` a
``flag`` and ``help``. The command in ``cli.py`` never lists options itself.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click
import yaml

from batchlu.pipeline.config import _parsers, _settings
from batchlu.pipeline._ops import OP_TABLE, OPS


class ByteSize(click.ParamType):
    """A size such as ``512MiB``, ``2GB`` or ``1000000`` (bytes), checked with dask's parser."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        from dask.utils import parse_bytes

        if isinstance(value, int):
            size = value
        else:
            try:
                size = parse_bytes(str(value))
            except (ValueError, TypeError):
                self.fail(f"Expected a size such as 512MiB or 2GB. Got {value!r} instead.", param, ctx)
        if size <= 0:
            self.fail(f"Expected a positive size. Got {value!r} instead.", param, ctx)
        return int(size)


@dataclass(frozen=True)
class ConfigOption:
    """A CLI flag that sets one ``dask.config`` key for the duration of the run."""

    flag: str
    key: str
    type: click.ParamType
    help: str | None
    hidden: bool = False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def option(self):
        return click.option(self.flag, self.dest, type=self.type, default=None, help=self.help, hidden=self.hidden)


def _click_type(parse) -> click.ParamType:
    """The click type of a setting's flag, from its parser (:mod:`batchlu.pipeline.config._parsers`); the
    parser checks the value again when the run's Options are built."""
    if isinstance(parse, _parsers.Size):
        return ByteSize()
    if isinstance(parse, _parsers.Integer):
        return click.IntRange(min=parse.minimum)
    if isinstance(parse, _parsers.OneOf):
        return click.Choice(parse.choices)
    if isinstance(parse, _parsers.InputFile):
        return click.Path(dir_okay=False, exists=True)
    if isinstance(parse, _parsers.NewFile):
        return click.Path(dir_okay=False)
    return click.STRING


# One flag per setting of the table that names one (batchlu.pipeline.config._settings.SETTINGS), in its order.
CONFIG_OPTIONS: tuple[ConfigOption, ...] = tuple(
    ConfigOption(row.flag, row.name, _click_type(row.parse), row.help) for row in _settings.SETTINGS if row.flag)
# A renamed setting's old flag: hidden, it sets the old key, which the settings read with a warning.
OLD_FLAGS: tuple[ConfigOption, ...] = tuple(
    ConfigOption(row.old_flag, f"batchlu.{row.old_key}", _click_type(row.parse), None, hidden=True)
    for row in _settings.SETTINGS if row.old_flag)


def _config_pair(ctx, param, values):
    """``--config KEY=VALUE`` (repeatable): VALUE is read as YAML, so 4, 1.5, true and [1, 2] work."""
    pairs = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"Expected KEY=VALUE, e.g. batchlu.memory-budget=256MiB. "
                                     f"Got {item!r} instead.", ctx, param)
        if not key.startswith("batchlu."):
            key = "batchlu." + key
        try:
            pairs[key] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            pairs[key] = raw
    return pairs


RUN_OPTIONS = (
    click.option("--op", type=click.Choice(OPS), required=True,
                 help="What to compute for every matrix."),
    click.option("--array", "array", metavar="NAME", default=None,
                 help="Array inside the input group (same as writing IN.zarr:NAME)."),
    click.option("--rhs", metavar="B.zarr[:ARRAY]", default=None,
                 help="Right-hand sides for --op solve (or ldlt-solve, instead of the sparse batch's "
                      "own rhs): shape (N, n) or (N, n, k)."),
    click.option("--resume", is_flag=True,
                 help="Finish an interrupted run: skip the chunks already complete in OUT."),
    click.option("--overwrite", is_flag=True,
                 help="Replace an existing OUT (a batchlu output; any other Zarr store needs --force)."),
    click.option("--force", is_flag=True,
                 help="With --overwrite: replace OUT even if batchlu run did not write it."),
    click.option("--progress/--no-progress", default=None,
                 help="Show a progress bar (default: when stderr is a terminal)."),
)

CLUSTER_OPTIONS = (
    click.option("--scheduler", metavar="ADDRESS", default=None,
                 help="Address of a running Dask scheduler, e.g. tcp://10.0.0.1:8786; it must answer "
                      f"within batchlu.connect-timeout ({_settings.BY_KEY['connect-timeout'].default:g}s)."),
    click.option("--scheduler-file", type=click.Path(dir_okay=False, exists=True), default=None,
                 help="Scheduler file written by `dask scheduler --scheduler-file`."),
)

GENERIC_CONFIG_OPTION = click.option(
    "--config", "config_pairs", metavar="KEY=VALUE", multiple=True, callback=_config_pair,
    help="Set any batchlu.* config key for this run (repeatable); overrides YAML and DASK_BATCHLU__*.")


def run_options(command):
    """Apply every ``batchlu run`` option to ``command`` (in help order)."""
    options = RUN_OPTIONS + CLUSTER_OPTIONS + tuple(o.option() for o in CONFIG_OPTIONS + OLD_FLAGS) \
        + (GENERIC_CONFIG_OPTION,)
    for option in reversed(options):
        command = option(command)
    return command


def stderr_is_terminal() -> bool:
    """Whether a progress bar on stderr would be seen by a person (not a pipe, file or test runner)."""
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


def _exclusive(params: dict, *names: str) -> None:
    given = [n for n in names if params.get(n) not in (None, False)]
    if len(given) > 1:
        flags = " and ".join("--" + n.replace("_", "-") for n in given)
        raise click.UsageError(f"{flags} cannot be used together: pick one.")


def join_array(path: str, array: str | None) -> str:
    """``PATH`` plus ``--array NAME`` -> ``PATH:NAME``; refuses a name given twice."""
    if not array:
        return path
    if _has_array_suffix(path):
        raise click.UsageError(f"Expected the array name once. Got both {path!r} and --array {array!r}.")
    return f"{path}:{array}"


def _has_array_suffix(path: str) -> bool:
    head, sep, tail = path.rpartition(":")
    # "C:\\x" style drive letters and URLs ("s3://...") are not array suffixes.
    return bool(sep) and len(head) > 1 and bool(tail) and not tail.startswith("//")


def config_overrides(params: dict) -> dict:
    """The ``dask.config`` keys set on the command line (flags win over ``--config``)."""
    config = dict(params.get("config_pairs") or {})
    _check_known(config)
    for option in CONFIG_OPTIONS + OLD_FLAGS:
        value = params.get(option.dest)
        if value is not None:
            config[option.key] = value
    return config


def _check_known(config: dict) -> None:
    """Refuse ``--config`` keys that no default declares: a typo would otherwise be ignored silently."""
    if not config:
        return
    from batchlu.pipeline.errors import ConfigError

    try:
        _settings.check_keys(config)
    except ConfigError as exc:
        raise click.UsageError(f"--config: {exc}") from None


# Settings of the embedded cluster only: with --scheduler / --scheduler-file the cluster's own workers
# run the tasks, and these would be ignored.
EMBEDDED_ONLY = tuple(row.name for row in _settings.SETTINGS if row.embedded_only)
# Settings fixed when the output is created: --resume keeps the output's own (their old keys too).
FIXED_AT_CREATION = {key: row.fixed_at_creation for row in _settings.SETTINGS if row.fixed_at_creation
                     for key in (row.name, f"batchlu.{row.old_key}" if row.old_key else None) if key}


def _given_as(params: dict, key: str) -> str | None:
    """How the command line set ``key``: its flag, ``--config KEY``, or None when it did not."""
    for option in CONFIG_OPTIONS + OLD_FLAGS:
        if option.key == key and params.get(option.dest) is not None:
            return option.flag
    pairs = {k.replace("_", "-") for k in params.get("config_pairs") or {}}
    return f"--config {key[len('batchlu.'):]}" if key in pairs else None


def _check_context(params: dict) -> None:
    """Refuse options the context would ignore; warn where ignoring them is what the user wants."""
    if params.get("force") and not params.get("overwrite"):
        raise click.UsageError("--force only goes with --overwrite: add --overwrite, or drop --force.")
    remote = "--scheduler" if params.get("scheduler") else "--scheduler-file" if params.get("scheduler_file") \
        else None
    if remote:
        ignored = [flag for flag in (_given_as(params, key) for key in EMBEDDED_ONLY) if flag]
        if ignored:
            flags = ", ".join(ignored)
            verb = "set" if len(ignored) > 1 else "sets"
            raise click.UsageError(f"{flags} only {verb} up the embedded local cluster; with {remote} the "
                                   f"scheduler's own workers run the tasks. Drop {flags}.")
    if params.get("resume"):
        for key, what in FIXED_AT_CREATION.items():
            flag = _given_as(params, key)
            if flag:
                click.echo(f"Warning: {flag} is ignored with --resume: the output keeps {what} it was "
                           f"created with.", err=True)


def pipeline_kwargs(params: dict) -> dict:
    """Check the option combination and map the parsed options onto ``batchlu.pipeline.run``'s keywords."""
    _exclusive(params, "resume", "overwrite")
    _exclusive(params, "scheduler", "scheduler_file")
    op = params["op"]
    if params.get("rhs") and not OP_TABLE[op].needs_rhs:
        raise click.UsageError(f"--rhs is only used by --op solve and ldlt-solve. Got --op {op} instead.")
    if OP_TABLE[op].needs_rhs and not OP_TABLE[op].sparse and not params.get("rhs"):
        raise click.UsageError(f"--op {op} needs the right-hand sides: add --rhs B.zarr.")
    config = config_overrides(params)
    _check_context(params)
    progress = params.get("progress")
    if progress is None:
        progress = stderr_is_terminal()
    return dict(
        op=op,
        rhs=params.get("rhs"),
        resume=bool(params.get("resume")),
        overwrite=bool(params.get("overwrite")),
        force=bool(params.get("force")),
        scheduler=params.get("scheduler"),
        scheduler_file=params.get("scheduler_file"),
        progress=bool(progress),
        config=config or None,
    )
