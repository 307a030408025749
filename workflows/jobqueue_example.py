"""batchlu on a batch-scheduled GPU cluster through dask-jobqueue (SLURM here; PBS, LSF, ... alike).

    pip install dask-jobqueue
    python workflows/jobqueue_example.py /scratch/a.zarr /scratch/inv.zarr --op inv --jobs 4

Each job is one node running ``dask cuda worker`` (one worker process per GPU); this script is the
client: it reads only metadata and schedules, so it can run on a login node without a GPU, and it
never creates a CUDA context. Interrupted? Run it again with ``--resume``.
"""

from __future__ import annotations

import argparse


def make_cluster(jobs: int, gpus_per_node: int, threads: int, walltime: str, queue: str | None,
                 account: str | None):
    from dask_jobqueue import SLURMCluster

    cluster = SLURMCluster(
        queue=queue,
        account=account,
        cores=gpus_per_node * threads,     # CPU cores of the job
        processes=gpus_per_node,           # one worker process per GPU ...
        memory=f"{64 * gpus_per_node}GB",
        walltime=walltime,
        job_extra_directives=[f"--gpus-per-node={gpus_per_node}"],
        # ... started by dask-cuda, which pins each worker to its GPU and to the cores near it
        worker_command="dask cuda worker",
        worker_extra_args=["--nthreads", str(threads)],
        scheduler_options={"dashboard_address": "127.0.0.1:8787"},
    )
    cluster.scale(jobs=jobs)
    return cluster


def main(argv=None):
    from batchlu.pipeline import OPS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--op", default="inv", choices=OPS)
    parser.add_argument("--rhs", default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--jobs", type=int, default=2, help="nodes (SLURM jobs)")
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="threads per GPU worker")
    parser.add_argument("--walltime", default="02:00:00")
    parser.add_argument("--queue", default=None)
    parser.add_argument("--account", default=None)
    args = parser.parse_args(argv)

    from distributed import Client

    from batchlu import pipeline

    with make_cluster(args.jobs, args.gpus_per_node, args.threads, args.walltime, args.queue,
                      args.account) as cluster, Client(cluster) as client:
        print("dashboard:", client.dashboard_link, flush=True)
        client.wait_for_workers(args.jobs * args.gpus_per_node, timeout=3600)
        report = pipeline.run(args.input, args.output, op=args.op, rhs=args.rhs, resume=args.resume,
                              backend="gpu", client=client)
        print(report)
    verify = pipeline.verify(args.input, args.output, rhs=args.rhs, sample=10_000)
    print(verify.summary())
    return 0 if verify.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
