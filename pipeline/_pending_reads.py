"""zarr's reads still in flight after one of them failed: :func:`settle_reads` lets them finish, so that
an error raised from a failed read is the only thing the process prints."""

from __future__ import annotations

__all__ = ["SETTLE_SECONDS", "settle_reads"]

SETTLE_SECONDS = 30.0   # at most, for the reads still in flight after one failed


def settle_reads() -> None:
    """Let the reads zarr still has in flight finish, after one of them failed.

    zarr reads a selection's chunks as tasks of its event loop (``asyncio.gather``): when one chunk
    fails to decode, the error reaches us while the others are still pending. Raised at once, the
    error ends the process with them pending, and Python prints "Task was destroyed but it is
    pending!" for each (and "cannot schedule new futures after interpreter shutdown" for a decode
    that starts then): a dozen to hundreds of lines after the one-line error. So wait for them
    (their results are dropped; ``SETTLE_SECONDS`` at most, should a task of some other caller of
    that loop never end)."""
    import asyncio

    from zarr.core.sync import sync

    async def rest() -> None:
        me = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not me]
        if others:
            done, _ = await asyncio.wait(others, timeout=SETTLE_SECONDS)
            for task in done:   # their errors are the same damage, or another: the first one is raised
                if not task.cancelled():
                    task.exception()

    try:
        sync(rest())
    except Exception:
        pass   # a loop already closed: nothing is pending there
