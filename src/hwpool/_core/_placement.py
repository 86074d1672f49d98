"""Placement: which GPUs a demand takes, and which a waiter reserves (rules 2, 3, 12, 13).

:class:`Placement` finds best fit (rule 2) among any set of GPUs: for one GPU, the fitting
GPU with the least left after the grant; for whole GPUs, the completely free GPUs with the
smallest totals, within one group (rule 12) and one per memory (rule 13); ties to the lowest
index. It also picks what a waiter reserves under ``reserve-all`` (rule 3: the most free) and
takes capacity from the books when asked to. It knows no queue: the policies say which GPUs
are open. Rules kept: 2, 3 (the reserving choice), 12 and 13 (placement within groups).
"""

from __future__ import annotations

from collections.abc import Iterable

from ._books import Books
from ._ranking import Ranking
from ._requests import Demand

__all__ = ["Placement"]


class Placement:
    """Best fit and reservation choices over the books' free units."""

    def __init__(self, books: Books) -> None:
        self.books = books

    def fitting(self, demand: Demand) -> list[int]:
        """The GPUs with what ``demand`` needs there free, lowest index first (the
        baselines' placement: no best fit, no groups)."""
        books = self.books
        free = books.free
        if demand.whole or demand.relative or demand.count > 1:
            need = books.need
            return [gpu for gpu in range(books.num_gpus) if free[gpu] >= need(demand, gpu)]
        units = demand.units
        return [gpu for gpu, f in enumerate(free) if f >= units]

    def take(self, demand: Demand, gpus: tuple[int, ...]) -> tuple[int, ...]:
        """Take what ``demand`` needs on each of ``gpus``; return ``gpus``."""
        free, need = self.books.free, self.books.need
        for gpu in gpus:
            free[gpu] -= need(demand, gpu)
        return gpus

    def take_anywhere(self, demand: Demand) -> tuple[int, ...] | None:
        """Best fit over every GPU of one size, taken (nobody waits: the fast path)."""
        books = self.books
        free, units, count = books.free, demand.units, demand.count
        if count == 1:
            least = min(free)
            if least >= units:  # every GPU fits: the least free, lowest index (all in C)
                best = free.index(least)
            else:
                best, best_free = -1, books.units_per_gpu + 1
                for gpu, f in enumerate(free):
                    if units <= f < best_free:
                        best, best_free = gpu, f
                if best < 0:
                    return None
            free[best] -= units
            return (best,)
        fitting = [gpu for gpu, f in enumerate(free) if f == books.units_per_gpu][:count]
        if len(fitting) < count:
            return None
        for gpu in fitting:
            free[gpu] = 0
        return tuple(fitting)

    def take_in(self, ranking: Ranking, count: int, units: int) -> tuple[int, ...] | None:
        """Take best-fit capacity on the unreserved GPUs of ``ranking``, keeping it sorted."""
        free = self.books.free
        if count == 1:
            if ranking.top_free() < units:
                return None
            i = ranking.best_fit(units)
            assert i is not None
            gpu = ranking.gpus[i]
            free[gpu] -= units
            ranking.reposition(i, i + 1)
            return (gpu,)
        if not ranking.full_count_at_least(count, self.books.units_per_gpu):
            return None
        # The first `count` unreserved GPUs are the lowest-indexed completely free ones.
        gpus = tuple(ranking.gpus[ranking.p : ranking.p + count])
        for gpu in gpus:
            free[gpu] = 0
        ranking.reposition(ranking.p, ranking.p + count)
        return gpus

    def fit(
        self, demand: Demand, open_gpus: list[int] | None, *, take: bool
    ) -> tuple[int, ...] | None:
        """Best-fit GPUs for ``demand`` among ``open_gpus`` (None: all), taken if ``take``."""
        books = self.books
        free, totals = books.free, books.totals
        gpus = range(books.num_gpus) if open_gpus is None else open_gpus
        if demand.count > 1 and books.groups is not None:
            return self._fit_grouped(demand.count, gpus, take)
        if demand.whole or demand.count > 1:
            idle = [gpu for gpu in gpus if free[gpu] == totals[gpu]]
            if len(idle) < demand.count:
                return None
            if demand.count > 1 and books.sibling_of:
                idle = books.one_per_memory(idle)
                if len(idle) < demand.count:
                    return None
            chosen = tuple(sorted(sorted(idle, key=totals.__getitem__)[: demand.count]))
            if take:
                for gpu in chosen:
                    free[gpu] = 0
            return chosen
        if demand.relative:
            return self._fit_relative(books.needs_of(demand), gpus, take)
        units, best, best_free = demand.units, -1, books.units_per_gpu + 1  # none fits yet
        for gpu in gpus:
            f = free[gpu]
            if units <= f <= best_free and (f < best_free or gpu < best):
                best, best_free = gpu, f
        if best < 0:
            return None
        if take:
            free[best] -= units
        return (best,)

    def _fit_grouped(self, count: int, gpus: Iterable[int], take: bool) -> tuple[int, ...] | None:
        """Rule 12's placement of ``count`` whole GPUs among ``gpus``: rule 2 within one
        group, the group whose choice has the smallest totals, then the fewest completely
        free GPUs, then the lowest index; taken if ``take``."""
        books = self.books
        free, totals = books.free, books.totals
        idle = {gpu for gpu in gpus if free[gpu] == totals[gpu]}
        best: tuple[tuple[int, int, int], tuple[int, ...]] | None = None
        for members in books.groups or ():
            here = books.one_per_memory(gpu for gpu in members if gpu in idle)
            if len(here) < count:
                continue
            chosen = tuple(sorted(sorted(here, key=totals.__getitem__)[:count]))
            rank = (sum(totals[gpu] for gpu in chosen), len(here), chosen[0])
            if best is None or rank < best[0]:
                best = (rank, chosen)
        if best is None:
            return None
        if take:
            for gpu in best[1]:
                free[gpu] = 0
        return best[1]

    def _fit_relative(
        self, needs: list[int], gpus: Iterable[int], take: bool
    ) -> tuple[int, ...] | None:
        """Best fit (rule 2) for a relative demand needing ``needs[g]`` on GPU ``g``: the
        fitting GPU among ``gpus`` with the least left after the grant, ties lowest index."""
        free = self.books.free
        best, best_left = -1, -1
        for gpu in gpus:
            left = free[gpu] - needs[gpu]
            if left >= 0 and (best < 0 or left < best_left or (left == best_left and gpu < best)):
                best, best_left = gpu, left
        if best < 0:
            return None
        if take:
            free[best] -= needs[best]
        return (best,)

    def reserve(self, demand: Demand, open_gpus: list[int]) -> tuple[int, ...] | None:
        """The GPUs ``demand`` reserves among ``open_gpus`` (rule 3), removed from it."""
        books = self.books
        if demand.count > 1 and books.groups is not None:
            return self._reserve_grouped(demand.count, open_gpus)
        free, totals = books.free, books.totals
        if demand.whole or demand.count > 1:
            if len(open_gpus) < demand.count:
                return None
            ranked = sorted(open_gpus, key=lambda gpu: (totals[gpu] - free[gpu], gpu))
            if demand.count > 1:
                ranked = books.one_per_memory(ranked)
                if len(ranked) < demand.count:
                    return None
            chosen = tuple(sorted(ranked[: demand.count]))
            for gpu in chosen:
                open_gpus.remove(gpu)
            return chosen
        if demand.relative:  # the most free beyond its need (any GPU could hold it)
            needs = books.needs_of(demand)
            best = min(open_gpus, key=lambda gpu: (needs[gpu] - free[gpu], gpu), default=-1)
        else:
            best, best_free = -1, -1  # the most free GPU that could hold it
            for gpu in open_gpus:
                if totals[gpu] >= demand.units:
                    f = free[gpu]
                    if f > best_free or (f == best_free and gpu < best):
                        best, best_free = gpu, f
        if best < 0:
            return None
        open_gpus.remove(best)
        return (best,)

    def _reserve_grouped(self, count: int, open_gpus: list[int]) -> tuple[int, ...] | None:
        """Rule 12 under ``reserve-all``: the ``count`` GPUs of ``open_gpus`` with the fewest
        units in use within one group, the group where those have the fewest in all (ties:
        the lowest index), removed from ``open_gpus``; None if no group has ``count`` open
        GPUs."""
        books = self.books
        free, totals = books.free, books.totals
        open_set = set(open_gpus)
        best: tuple[tuple[int, int], tuple[int, ...]] | None = None
        for members in books.groups or ():
            here = [gpu for gpu in members if gpu in open_set]
            ranked = books.one_per_memory(
                sorted(here, key=lambda gpu: (totals[gpu] - free[gpu], gpu))
            )[:count]
            if len(ranked) < count:
                continue
            chosen = tuple(sorted(ranked))
            rank = (sum(totals[gpu] - free[gpu] for gpu in chosen), chosen[0])
            if best is None or rank < best[0]:
                best = (rank, chosen)
        if best is None:
            return None
        for gpu in best[1]:
            open_gpus.remove(gpu)
        return best[1]

    def single_pass(self, demand: Demand, open_gpus: list[int]) -> tuple[int, int, int]:
        """The walk's one pass for a demand of one GPU (not whole) among ``open_gpus``: its
        best fit (-1: none), the GPU it would reserve (-1: none; rule 3), and what it needs
        on the best fit."""
        books = self.books
        free = books.free
        fit, most = -1, -1
        if demand.relative:  # reserve: the most free beyond its need (any GPU holds it)
            needs = books.needs_of(demand)
            fit_left, most_left = 0, 0
            for gpu in open_gpus:  # in index order, so ties go to the lowest index
                left = free[gpu] - needs[gpu]
                if left >= 0:
                    if fit < 0 or left < fit_left:
                        fit, fit_left = gpu, left
                elif most < 0 or left > most_left:
                    most, most_left = gpu, left
            return fit, most, needs[fit] if fit >= 0 else 0
        units, totals = demand.units, books.totals
        fit_free, most_free = -1, -1
        for gpu in open_gpus:  # in index order, so ties go to the lowest index
            f = free[gpu]
            if f >= units:
                if fit < 0 or f < fit_free:
                    fit, fit_free = gpu, f
            elif f > most_free and totals[gpu] >= units:
                most, most_free = gpu, f
        return fit, most, units
