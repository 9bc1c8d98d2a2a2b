"""Work over data too large for one machine, on Ray (the optional ``ray`` extra): items in
chunks, handed in turn to workers each made once, results back in the items' order.

The local path never imports Ray; what is run on Ray gives what the local path gives: the
workers are the local code, and what they return is put together in order (or, for
statistics, merged exactly: ``quant.calibrate``'s observers).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from .errors import EqquantError


class _Host:
    """A Ray actor holding one worker (``factory()``, made in the worker's process)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.worker = factory()

    def call(self, method: str, *args):
        return getattr(self.worker, method)(*args)


def on_ray(factory: Callable[[], Any], items: Iterable, chunk: int = 16,
           workers: int | None = None, progress: Callable[[int], None] | None = None,
           finish: str | None = None) -> tuple[list, list]:
    """``worker.feed(chunk_of_items, index_of_its_first)`` for each chunk of ``items``, on
    ``workers`` Ray actors (default: the cluster's CPUs; a cluster is started on this machine
    when none is running, and stopped after), each worker made by ``factory()`` once. Returns
    the feeds' results in order, and each worker's ``finish()`` if ``finish`` names it. At
    most two chunks per worker are in flight: the items stream."""
    try:
        import ray
    except ImportError:
        raise EqquantError("engine='ray' needs Ray: pip install 'eqquant[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False)
    try:
        count = workers or max(int(ray.cluster_resources().get("CPU", 1)), 1)
        host = ray.remote(num_cpus=1)(_Host)
        actors = [host.remote(factory) for _ in range(count)]
        pending: list = []
        results: list = []
        done = [0]

        def collect(keep: int) -> None:           # in order, `keep` left in flight
            while len(pending) > keep:
                size, ref = pending.pop(0)
                results.append(ray.get(ref))
                done[0] += size
                if progress is not None:
                    progress(done[0])
        batch: list = []
        start = sent = 0
        for item in items:
            batch.append(item)
            if len(batch) == chunk:
                pending.append((len(batch), actors[sent % count].call.remote(
                    "feed", batch, start)))
                start, sent, batch = start + len(batch), sent + 1, []
                collect(2 * count)
        if batch:
            pending.append((len(batch), actors[sent % count].call.remote("feed", batch, start)))
        collect(0)
        states = ray.get([a.call.remote(finish) for a in actors]) if finish else []
        return results, states
    except ray.exceptions.RayError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, EqquantError):
            raise cause from None
        raise EqquantError(f"a Ray worker failed: {e}") from None
    finally:
        if started:
            ray.shutdown()
