"""The one fan-out over the nodes of a hostfile: the same action on every node at once, answers in host order.

Why one: every multi-node step (checking nodes before an install, a launch's preparation and clean-up,
doctor's probes) asks every node the same thing over ssh, and the cost of a large hostfile must be a few
round trips, not one per node. The callers differ only in what a node's failure means, so that is a
parameter: `catch` names the exceptions that are a node's answer (the others still get asked), anything
else ends the run (nodes not asked yet are not asked; the first such failure in host order is raised,
so the node named is the first that could not take part).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar, overload

from mlstack_ds.cluster.remote import MAX_PARALLEL_NODES
from mlstack_ds.runner import kill_child_sessions

T = TypeVar("T")
R = TypeVar("R")


@overload
def on_each(items: Sequence[T], fn: Callable[[T], R], *, done: Callable[[T, R], None] | None = None,
            in_order: bool = False) -> list[R]: ...
@overload
def on_each(items: Sequence[T], fn: Callable[[T], R], *, catch: type[Exception] | tuple[type[Exception], ...],
            done: Callable[[T, R | Exception], None] | None = None, in_order: bool = False,
            kill_on_interrupt: bool = False) -> list[R | Exception]: ...
def on_each(items: Sequence[T], fn: Callable[[T], R], *,
            catch: type[Exception] | tuple[type[Exception], ...] = (),
            done: Callable[[T, Any], None] | None = None,
            in_order: bool = False, kill_on_interrupt: bool = False) -> list[Any]:
    """`fn(item)` for every item, up to MAX_PARALLEL_NODES at once; the answers in `items`' order, a
    caught exception (`catch`) standing for its item's answer.

    `done(item, answer)` runs in the caller's thread as each item finishes (a status line per node as it
    answers), or, with `in_order`, once it and every item before it have finished (lines in hostfile
    order). On an exception not in `catch` (or Ctrl-C), the items not started are cancelled, the running
    ones waited for, and the first failure in `items`' order is raised, after `done` for the items
    before it when `in_order`. With `kill_on_interrupt` (read-only work such as probes), Ctrl-C kills
    the commands the running ones started instead: the interpreter would wait for them at exit, up to
    their time-outs (minutes, for a node whose torch import hangs)."""
    items = list(items)
    if not items:
        return []
    answers: dict[int, R | Exception] = {}
    failures: dict[int, BaseException] = {}
    shown = 0  # with in_order: the items before this one had their `done`

    def report(finished: Sequence[int]) -> None:
        nonlocal shown
        if done is None:
            return
        if not in_order:
            for index in finished:
                if index in answers:
                    done(items[index], answers[index])
            return
        while shown in answers:  # stops at a node still running, and at a failure
            done(items[shown], answers[shown])
            shown += 1

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_NODES, len(items))) as pool:
        futures: dict[Future[R], int] = {pool.submit(fn, item): index for index, item in enumerate(items)}
        pending = set(futures)
        try:
            while pending and not failures:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                indices = sorted(futures[f] for f in finished)
                for future in finished:
                    _collect(future, futures[future], catch, answers, failures)
                report(indices)
            if failures:
                pool.shutdown(wait=False, cancel_futures=True)
                running = [f for f in pending if not f.cancelled()]  # a cancelled one never counts as done
                for future in wait(running).done:  # an earlier node than the failed one may fail too
                    _collect(future, futures[future], catch, answers, failures)
                if in_order:
                    report(())
        except BaseException as exc:
            pool.shutdown(wait=False, cancel_futures=True)
            if kill_on_interrupt and isinstance(exc, KeyboardInterrupt):  # only this thread heard it
                kill_child_sessions()  # the threads' commands end, so they return and the pool exits at once
            raise
    if failures:
        raise failures[min(failures)]
    return [answers[index] for index in range(len(items))]


def _collect(future: Future[R], index: int, catch: type[Exception] | tuple[type[Exception], ...],
             answers: dict[int, R | Exception], failures: dict[int, BaseException]) -> None:
    try:
        answers[index] = future.result()
    except catch as exc:
        answers[index] = exc
    except Exception as exc:
        failures[index] = exc
