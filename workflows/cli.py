"""``batchlu``: the command line over :mod:`pipeline`.

    batchlu generate OUT.zarr --count N --size n [--dtype ...] [--chunk C] [--kind ...] [--seed S]
                              [--rhs-out B.zarr --rhs-columns K] [--overwrite [--force]]
    batchlu generate OUT.zarr --count N --kind fem-poisson|fem-elasticity|saddle|power-grid|kkt
                              (--size n | --nodes M) [--dim 2|3] [--delta D] [--rhs-columns K] [...]
    batchlu run IN.zarr OUT.zarr --op lu|inv|solve|slogdet|ldlt-solve|ldlt-inertia [...]
                              (options: workflows/_run_options.py)
    batchlu verify IN.zarr OUT.zarr [--sample K] [--rhs B.zarr]
    batchlu inspect STORE.zarr
    batchlu demo

User errors (bad paths, bad arrays, refused runs, ...) end in one line ``Error: ...`` on stderr and exit
status 1; a bad command line exits 2. ``batchlu --traceback ...`` shows the full traceback instead.
A command whose stdout's reader has gone (``| head``) exits 141 with nothing on stderr.
Singular or non-finite matrices are results, not failures: they are counted in the report.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import tempfile
import warnings

import click

from batchlu.kernels._validate import SUPPORTED_DTYPES
from batchlu.pipeline._ops import OP_TABLE
from batchlu.pipeline.config._choices import OUTPUT_LAYOUTS
from batchlu.testing.matrices import KINDS as DENSE_KINDS
from batchlu.testing.sparse import KINDS as SPARSE_KINDS

from . import _console
from ._run_options import join_array, pipeline_kwargs, run_options, stderr_is_terminal

DTYPES = tuple(d.name for d in SUPPORTED_DTYPES)
KINDS = DENSE_KINDS + SPARSE_KINDS
DEMO_OP = "inv"
_AGAIN = "generate it again with --overwrite"   # after a full device (a store marked incomplete)


def _process_age() -> float:
    """Seconds since this process started (Linux: its start in ``/proc/self/stat`` against
    ``/proc/uptime``, both counted from boot, to 0.01 s); 0 where that cannot be read. The command's
    own time only where the console entry started the process."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime", encoding="ascii") as f:
            return max(0.0, float(f.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the input or the request is wrong", not "batchlu is broken"."""
    from batchlu.pipeline.errors import BatchluError  # imported late: ``batchlu --help`` stays quick

    return (BatchluError, ValueError, TypeError, OSError)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _show_warning(message, category, filename, lineno, file=None, line=None,
                  _default=warnings.showwarning):
    """batchlu's own warnings as one line ``Warning: ...`` on stderr; others as Python shows them."""
    from batchlu.pipeline.errors import BatchluWarning

    if issubclass(category, BatchluWarning):
        click.echo(f"Warning: {_one_line(message)}", err=True)
    else:
        _default(message, category, filename, lineno, file, line)


# A command whose stdout's reader has gone exits as a Unix tool killed by SIGPIPE reports (128 + 13),
# as SIGTERM's exit is 128 + 15: the shell's convention, which a script can tell from a failure (1)
SIGPIPE_EXIT = 128 + 13


def _reader_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is a write to stdout failing because its reader has gone (``batchlu run ... |
    head``): EPIPE, with stdout a pipe whose reading end is closed (``poll`` says POLLERR). EPIPE
    from another pipe (an I/O process's) is the run's own failure. False where it cannot be told
    (no ``poll``, a stdout without a file descriptor)."""
    if not isinstance(exc, BrokenPipeError):
        return False
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _exit_quietly() -> None:
    """Stdout's reader has gone: no error line, no traceback, and the exit status of a tool that
    SIGPIPE ended. Stdout goes to devnull, as Python's signal docs advise ("Note on SIGPIPE"): the
    interpreter's last flush of what is still buffered would fail again, with a message on stderr."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    raise SystemExit(SIGPIPE_EXIT)


class _Commands(click.Group):
    """Turns a user error raised anywhere below into ``Error: <message>`` and exit status 1; a
    reader of stdout that has gone into a quiet exit (:func:`_exit_quietly`): the command's work is
    done (a run's output recorded complete before its report is printed), only its printing is cut."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except Exception as exc:
            if _reader_gone(exc):
                _exit_quietly()
            if ctx.obj and ctx.obj.get("traceback"):
                raise
            if isinstance(exc, _user_errors()):
                raise click.ClickException(_one_line(exc)) from None
            raise


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="batchlu", prog_name="batchlu")
@click.option("--traceback", is_flag=True, help="Show the full traceback of an error (for bug reports).")
@click.pass_context
def cli(ctx, traceback):
    """batchlu: LU, inverse, solve and log-determinant of many small dense matrices stored in Zarr."""
    ctx.obj = {"traceback": traceback}
    warnings.showwarning = _show_warning


def _target(path: str):
    """A store named on the command line: an ``s3://`` URL as given, a path made absolute."""
    from batchlu.pipeline.store._object_store import is_url

    return path if is_url(path) else pathlib.Path(path).expanduser().resolve()


# --------------------------------------------------------------------------------------------- generate
@cli.command(short_help="Write random test matrices (and right-hand sides) to Zarr.")
@click.argument("out", metavar="OUT.zarr")
@click.option("--count", "-N", type=click.IntRange(min=1), required=True, help="Number of matrices N.")
@click.option("--size", "-n", type=click.IntRange(min=1), default=None,
              help="Matrix order n (sparse kinds: about n unknowns; or give --nodes).")
@click.option("--nodes", type=click.IntRange(min=4), default=None,
              help="Sparse kinds: mesh nodes (FEM) or buses (power-grid) instead of --size.")
@click.option("--dim", type=click.Choice(("2", "3")), default="2", show_default=True,
              help="Sparse FEM kinds: 2-D or 3-D mesh.")
@click.option("--delta", type=click.FloatRange(min=0.0), default=None,
              help="--kind kkt: the regularization delta of the constraint block [[K, B^T], [B, -delta I]] "
                   "(default 1e-8; the tests cover 1e-4, 1e-6, 1e-8 and 1e-10).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float64", show_default=True)
@click.option("--chunk", type=click.IntRange(min=1), default=None,
              help="Matrices per Zarr chunk (default: chosen from the matrix size).")
@click.option("--kind", type=click.Choice(KINDS), default="random", show_default=True,
              help="random; illcond (condition ~1e12 in double precision); singular-mix (some exactly "
                   "singular, zero, NaN and Inf matrices mixed in). Sparse batches (a Zarr group with "
                   "the pattern, values and rhs, for --op ldlt-solve / ldlt-inertia): fem-poisson, "
                   "fem-elasticity (SPD), saddle, power-grid, kkt (symmetric indefinite).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Same seed, same matrices (any chunk can be regenerated alone).")
@click.option("--rhs-out", metavar="B.zarr", default=None,
              help="Also write right-hand sides for `batchlu run --op solve --rhs B.zarr`.")
@click.option("--rhs-columns", "-k", type=click.IntRange(min=1), default=1, show_default=True,
              help="Columns per right-hand side: 1 gives B of shape (N, n), k > 1 gives (N, n, k).")
@click.option("--layout", type=click.Choice(OUTPUT_LAYOUTS), default="chunks", show_default=True,
              help="chunks: one Zarr chunk per --chunk matrices; sharded: one shard per --chunk matrices, "
                   "in inner chunks of about 256 KiB (what the GPU codecs decode fastest).")
@click.option("--overwrite", is_flag=True,
              help="Replace OUT.zarr (and B.zarr) if they exist and batchlu generate wrote them.")
@click.option("--force", is_flag=True,
              help="With --overwrite: replace them even if batchlu generate did not write them.")
def generate(out, count, size, nodes, dim, delta, dtype, chunk, kind, seed, rhs_out, rhs_columns, layout,
             overwrite, force):
    """Write N random n x n matrices to OUT.zarr (a Zarr v3 array of shape (N, n, n)), or for a sparse
    kind a sparse batch (a Zarr group: indptr, indices, values (N, nnz), rhs)."""
    from batchlu import pipeline
    from batchlu.pipeline.store._files import check_replaceable, naming_full_device, refuse_occupied

    if force and not overwrite:
        raise click.UsageError("--force only goes with --overwrite: add --overwrite, or drop --force.")
    if delta is not None and kind != "kkt":
        raise click.UsageError(f"--delta only goes with --kind kkt. Got --kind {kind} instead.")
    if kind in SPARSE_KINDS:
        if (size is None) == (nodes is None):
            raise click.UsageError(f"--kind {kind} needs exactly one of --size and --nodes.")
        if rhs_out:
            raise click.UsageError(f"--kind {kind} writes its right-hand sides into OUT.zarr (array rhs): "
                                   f"drop --rhs-out.")
        if not overwrite:
            refuse_occupied(str(pathlib.Path(out).expanduser().resolve()), "pass --overwrite to replace it", name=out)
        with naming_full_device(out, _AGAIN):
            where = pipeline.generate(out, count=count, size=size, nodes=nodes, dim=int(dim), dtype=dtype,
                                      chunk=chunk, kind=kind, seed=seed, rhs_columns=rhs_columns,
                                      overwrite=overwrite, force=force, layout=layout, delta=delta)
        import zarr

        group = zarr.open_group(where, mode="r")
        info = dict(group.attrs["batchlu_generate"])
        click.echo(f"Wrote {count} {kind} {dtype} matrices (n {info['n']:,}, nnz {info['nnz']:,} in the lower "
                   f"triangle; {info['description']}) with right-hand sides to {where}")
        return
    if size is None:
        raise click.UsageError(f"--kind {kind} needs --size.")
    if nodes is not None:
        raise click.UsageError(f"--nodes only goes with a sparse kind ({', '.join(SPARSE_KINDS)}).")
    if rhs_out:
        a, b = (_target(p) for p in (out, rhs_out))
        if a == b or str(b).startswith(f"{a}/") or str(a).startswith(f"{b}/"):
            raise click.UsageError(f"Expected --rhs-out apart from OUT.zarr. Got the same or a nested "
                                   f"path instead: {a} and {b}.")
    for path in filter(None, (out, rhs_out)):  # both checked before either is written
        target = str(_target(path))
        if not overwrite:
            refuse_occupied(target, "pass --overwrite to replace it", name=path)
        check_replaceable(target, writer="generate", force=force)

    with naming_full_device(out, _AGAIN):
        where = pipeline.generate(out, count=count, size=size, dtype=dtype, chunk=chunk, kind=kind, seed=seed,
                                  overwrite=overwrite, force=force, layout=layout)
    click.echo(f"Wrote {count} {kind} {dtype} matrices of size {size}x{size} to {where}")
    if rhs_out:
        with naming_full_device(rhs_out, _AGAIN):
            where = pipeline.generate_rhs(rhs_out, count=count, size=size, k=rhs_columns, dtype=dtype,
                                          chunk=chunk, seed=seed, overwrite=overwrite, force=force,
                                          layout=layout)
        shape = (count, size) if rhs_columns == 1 else (count, size, rhs_columns)
        click.echo(f"Wrote right-hand sides of shape {shape} to {where}")


# ------------------------------------------------------------------------------------------------- run
def _outputs_per_op() -> str:
    """The arrays each op writes, one line per op, from the op table (the README's table of outputs
    quotes the same lines)."""
    width = max(len(name) for name in OP_TABLE)
    lines = [f"{name:<{width}} -> {op.describe_outputs()}" for name, op in OP_TABLE.items()]
    return "\n".join(["Outputs per op:"] + [f"  {line}" for line in lines])


_RUN_HELP = f"""Compute --op for every matrix of IN.zarr and write the results to the Zarr group OUT.zarr.

\b
{_outputs_per_op()}

The ldlt ops read a sparse batch (batchlu generate --kind fem-poisson ...): IN.zarr is its group, and
ldlt-solve takes the group's rhs unless --rhs is given. Without --scheduler/--scheduler-file, runs on a
local cluster sized to this machine."""


@cli.command(short_help="LU-factor, invert, solve or slogdet every matrix of a store.", help=_RUN_HELP)
@click.argument("input", metavar="IN.zarr[:ARRAY]")
@click.argument("output", metavar="OUT.zarr")
@run_options
def run(input, output, **params):
    """``batchlu run``: its help is :data:`_RUN_HELP`, the arrays each op writes from the op table."""
    from batchlu import pipeline

    kwargs = pipeline_kwargs(params)
    imports = _process_age() if _console.started else 0.0   # not a notebook's or a test runner's age
    if _console.started:   # the process ends with the command
        from batchlu.pipeline.cluster._stops import hold_stops_to_exit

        hold_stops_to_exit()
    report = pipeline.run(join_array(input, params.get("array")), output, **kwargs)
    report.imports = imports   # the report's time line then covers the command from its start
    click.echo(report)
    if params.get("report"):
        click.echo(f"Performance report: {pathlib.Path(params['report']).expanduser().absolute()}")


# ---------------------------------------------------------------------------------------------- verify
@cli.command(short_help="Check a run's output with LAPACK test ratios (exit 1 if > 30).")
@click.argument("input", metavar="IN.zarr[:ARRAY]")
@click.argument("output", metavar="OUT.zarr")
@click.option("--array", metavar="NAME", default=None, help="Array inside the input group.")
@click.option("--rhs", metavar="B.zarr[:ARRAY]", default=None,
              help="Right-hand sides of a solve run (default: the ones recorded in OUT.zarr).")
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="Check K matrices drawn at random instead of all of them.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the --sample draw.")
def verify(input, output, array, rhs, sample, seed):
    """Recompute LAPACK's test ratios of OUT.zarr against IN.zarr; exit 1 if any exceeds 30.

    dget01 for lu, dget03 for inv, dget02 for solve and, for slogdet, the errors of logabsdet and
    sign in units of n eps, against float64/complex128. Singular and non-finite matrices are counted,
    not failed, but info must be right and their outputs must follow the info conventions. An
    incomplete output is never OK. The error line says what failed.
    """
    from batchlu import pipeline
    from batchlu.pipeline.output._group import read_provenance
    from batchlu.pipeline.store._object_store import is_url

    if rhs:
        op = (read_provenance(output if is_url(output) else os.path.abspath(output)) or {}).get("op")
        if isinstance(op, str) and op in OP_TABLE and not OP_TABLE[op].needs_rhs:   # any other: verify names it
            raise click.UsageError(f"--rhs is only used to verify a solve output. Got an output of "
                                   f"--op {op} instead: drop --rhs.")
    result = pipeline.verify(join_array(input, array), output, rhs=rhs, sample=sample, seed=seed)
    click.echo(result.summary())
    if not result.ok:
        raise click.ClickException("verification failed: " + "; ".join(result.problems()) + ".")


# --------------------------------------------------------------------------------------------- inspect
@cli.command(short_help="Show shapes, chunks, progress and info counts of a store.")
@click.argument("store", metavar="STORE.zarr[:ARRAY]")
def inspect(store):
    """Print the arrays of an input or output store: shapes, dtypes, chunks, progress, info counts."""
    from batchlu import pipeline

    click.echo(pipeline.inspect(store))


# ------------------------------------------------------------------------------------------------ demo
@cli.command(short_help="Generate, invert and verify a small store in a temporary folder.")
@click.option("--count", "-N", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option("--size", "-n", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="Write the demo stores into this folder and keep them (default: a temporary folder).")
def demo(count, size, keep):
    """Generate a small store, invert every matrix on a local cluster, verify, print the report."""
    from batchlu import pipeline

    with tempfile.TemporaryDirectory(prefix="batchlu-demo-") as scratch:
        root = keep or scratch
        os.makedirs(root, exist_ok=True)
        source = os.path.join(root, "a.zarr")
        target = os.path.join(root, f"{DEMO_OP}.zarr")
        chunk = max(1, count // 8)
        click.echo(f"1/3 generate: {count} random float64 matrices of size {size}x{size} -> {source}")
        pipeline.generate(source, count=count, size=size, chunk=chunk, overwrite=keep is not None)
        click.echo(f"2/3 run --op {DEMO_OP} on the local cluster -> {target}")
        report = pipeline.run(source, target, op=DEMO_OP, overwrite=keep is not None,
                              progress=stderr_is_terminal())
        click.echo(report)
        click.echo("3/3 verify (LAPACK dget03 ratios, threshold 30)")
        result = pipeline.verify(source, target)
        click.echo(result.summary())
        if not result.ok:
            raise click.ClickException("demo: verification failed.")
        if keep:
            click.echo(f"Stores kept in {root}")


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM: it unwinds the command as Ctrl-C does (a run records
    its failure, ``Terminated: SIGTERM``, and gives its output's lock back), then exits 128 + 15."""

    def __str__(self) -> str:
        return "SIGTERM"


def _exit_on_sigterm() -> None:
    """SIGTERM (``kill``, a SLURM time limit) ends the command as Ctrl-C does (only SIGKILL leaves
    a stale lock). A SIGTERM the process was started to ignore stays ignored."""
    def handler(signum, frame):
        raise Terminated(128 + signum)

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, handler)


def _ignore_from_here() -> None:
    """The command has ended (its output recorded or its stop done, its last line printed): the
    interpreter's exit ignores Ctrl-C and SIGTERM. Python's teardown puts the default handlers back
    in place of its own, and a Ctrl-C pressed then ended the command by SIGINT (status 130),
    multiprocessing's traceback under its line; the exit waits for nothing long (the closes are
    done)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def main(argv=None) -> None:
    """Console entry point ``batchlu``."""
    _exit_on_sigterm()
    try:
        cli.main(args=argv, prog_name="batchlu")
    except Terminated as exc:   # one line, as click's "Aborted!" after Ctrl-C
        click.echo("Aborted! (SIGTERM)", err=True)
        sys.exit(exc.code)
    finally:
        _ignore_from_here()


if __name__ == "__main__":
    main(sys.argv[1:])
