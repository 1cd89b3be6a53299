"""Where an input worker is in its data, and the one iterator that walks it from there.

The CPU backend, the in-process CSX input side and the Ray input workers all stream a worker's
dataloader through :class:`Source` and describe where they are with one *position* (the
``user_state_dict`` of a :class:`~workers.context.DataLoaderCheckpoint`)::

    {"epoch": e,                 # the epoch being streamed (0-based)
     "batch_in_epoch": k,        # batches of epoch e already streamed
     "loader_state": s,          # the restartable part's state_dict() after them (if any)
     "loader_state_of": name,    # which part that is: "batch_sampler", "sampler", "dataset"...
     "rng": {"generators": {path: str}, "global": str},  # random state at epoch e's start
     "loader_aggregate": a}      # a RestartableDataLoader aggregate to load first (resumed
                                 # runs only: workers.aggregates)

Resuming at a position restores the random state the epoch started with (every
``torch.Generator`` reachable from the loader -- ``RandomSampler(generator=...)``,
``DataLoader(generator=...)``, a sampler's own ``self.generator`` -- and torch's global RNG),
so a shuffle is drawn again exactly as the interrupted run drew it; then the restartable part
is given its saved state, or the first ``k`` batches of the epoch are skipped.
"""

from __future__ import annotations

import base64
import copy
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from workers import torch_compat
from workers.context import DataLoaderCheckpoint, get_worker_info, samples_streamed_this_run
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.positions import RoundRobinOrder, StreamPosition, WorkerPosition, start_position
from workers.wire import leading_dim

POSITION_KEYS = ("epoch", "batch_in_epoch", "loader_state", "loader_state_of", "rng",
                 "loader_aggregate")


class ExhaustedIteratorError(EmptyDataLoaderError):
    """``input_fn`` returned a one-shot iterator (a generator) and the run needs a new epoch."""


class ResumeError(ValueError):
    """A saved position cannot be resumed exactly."""


def check_position(pos: Any, where: str = "the dataloader state") -> dict:
    """``pos`` validated as a position (see the module docstring); raises :class:`ResumeError`."""
    if not isinstance(pos, dict) or any(k not in POSITION_KEYS for k in pos) or any(
            isinstance(pos.get(k), bool) or not isinstance(pos.get(k), int) or pos.get(k) < 0
            for k in ("epoch", "batch_in_epoch")):
        raise ResumeError(
            f"{where}: a worker's position must be a dict with int epoch >= 0 and "
            f"batch_in_epoch >= 0 (and optionally {list(POSITION_KEYS[2:])}), as "
            f"DataLoader.state_dict() writes it, got {pos!r:.200}. Resume from a state saved "
            "by this version of cstream."
        )
    return pos


def _checkpoint(st: Any, where: str) -> DataLoaderCheckpoint:
    if isinstance(st, dict):
        st = DataLoaderCheckpoint(**st)
    if not isinstance(st, DataLoaderCheckpoint):
        raise TypeError(f"{where}: resume_states must hold DataLoaderCheckpoint objects (from "
                        f"worker_states()), got {type(st).__name__}: {st!r}.")
    return st


def _global_key(st: DataLoaderCheckpoint) -> tuple | None:
    """(epoch, loader epoch, next global batch) of a state whose loader keeps its position in
    global-batch units (``ShardedSampler``, ``ParquetDataset``), else None."""
    usd = st.user_state_dict or {}
    ls = usd.get("loader_state")
    if not (isinstance(ls, dict) and "next_global_batch" in ls):
        return None
    return int(usd.get("epoch", 0)), int(ls.get("epoch", 0)), int(ls["next_global_batch"])


class ResumeStates:
    """The saved :class:`~workers.context.DataLoaderCheckpoint` of every input worker of a run
    (one per worker, all CS-Xs): where each stream resumes, checked against its topology, and
    mapped onto another topology (:meth:`remap`)."""

    def __init__(self, states, where: str = "CsxInputStream"):
        self.states = [_checkpoint(st, where) for st in states]

    def checked(self, wse_id: int, num_workers: int) -> StreamPosition:
        """Where CS-X ``wse_id``'s stream resumes: its step count and each local worker's
        position; raises where the states are not one round-robin position of this CS-X with
        ``num_workers`` workers."""
        W, states = num_workers, self.states
        ids = sorted(st.local_worker_id for st in states)
        if ids != list(range(W)):
            raise ValueError(
                f"CsxInputStream: resume_states for CS-X {wse_id} must hold one state per "
                f"worker 0..{W - 1} (num_workers_per_csx={W}), got states for local_worker_ids "
                f"{ids}. Resume with the same CSConfig.num_workers_per_csx the states were saved "
                "with.")
        for st in states:
            if st.num_workers_per_csx != W or st.wse_id != wse_id:
                raise ValueError(
                    f"CsxInputStream: a resume state was saved by CS-X {st.wse_id} with "
                    f"num_workers_per_csx={st.num_workers_per_csx}, but this stream is CS-X "
                    f"{wse_id} with num_workers_per_csx={W}. Pass each CS-X the states its "
                    "own workers saved, with the same CSConfig.")
            if st.worker_step < 0:
                raise ValueError(
                    f"CsxInputStream: resume state of worker {st.local_worker_id} has "
                    f"worker_step={st.worker_step}; it must be >= 0.")
        steps = [0] * W
        for st in states:
            steps[st.local_worker_id] = int(st.worker_step)
        total = sum(steps)
        expected = [RoundRobinOrder(W).batches_of(w, total) for w in range(W)]
        if steps != expected:
            raise ValueError(
                f"CsxInputStream: the resume states' worker_step values {steps} are not one "
                f"round-robin position of CS-X {wse_id} (after {total} steps they would be "
                f"{expected}). Pass the states from one worker_states() call of one stream.")
        workers = [None] * W
        for st in states:
            workers[st.local_worker_id] = checked_position(st, wse_id)
        return StreamPosition(total, tuple(workers))

    def global_position(self) -> WorkerPosition | None:
        """The furthest position among the states when their loaders keep positions in
        global-batch units, else None. Under round-robin the furthest worker
        delivered the step just before the resume step, so its position is where every worker
        resumes under dynamic assignment."""
        best = None
        for st in self.states:
            key = _global_key(st)
            if key is None:
                return None
            if best is None or key > best[0]:
                best = (key, st)
        if best is None:
            return None
        return WorkerPosition.of_checkpoint(copy.deepcopy(best[1]))

    def remap(self, num_csx: int, num_workers: int) -> list[DataLoaderCheckpoint]:
        """The states for a topology of ``num_csx`` CS-Xs of ``num_workers`` workers each.

        States saved with the same topology are used as they are. Otherwise they can be mapped
        only when the workers' loaders keep a position in global-batch units
        (``ShardedSampler``, ``ParquetDataset``): every new worker then starts at the saved
        global batch and the round-robin continues from there.
        """
        states, C, W = self.states, num_csx, num_workers
        saved = {(s.num_csx, s.num_workers_per_csx) for s in states}
        if saved == {(C, W)}:
            return states
        old = sorted(saved)[0]
        positions = []
        # a worker that has delivered nothing is at the start, wherever its loader is
        started = [s for s in states if s.worker_step > 0 or _global_key(s) is not None]
        if not started:
            return [DataLoaderCheckpoint(local_worker_id=w, num_workers_per_csx=W, num_csx=C,
                                         wse_id=c, user_state_dict=start_position())
                    for c in range(C) for w in range(W)]
        for s in started:
            if _global_key(s) is None:
                raise ValueError(
                    f"the dataloader state was saved with num_csx={old[0]}, "
                    f"num_workers_per_csx={old[1]}, and this run has num_csx={C}, "
                    f"num_workers_per_csx={W}; the saved positions are per worker (the input_fn "
                    "does not use cstream.utils.data.ShardedSampler or a ParquetDataset read in "
                    "the input worker's own process), so they cannot be mapped onto another "
                    "topology. Resume with the saved CSConfig, or shard with ShardedSampler.")
            usd = s.user_state_dict
            positions.append((int(usd.get("epoch", 0)), int(usd["loader_state"]["next_global_batch"]),
                              s))
        epoch, nxt, ref = max(positions, key=lambda p: (p[0], p[1]))
        total = sum(s.worker_step for s in states if s.wse_id == ref.wse_id)
        ref_usd = ref.user_state_dict or {}
        part = ref_usd.get("loader_state_of")
        out = []
        for c in range(C):
            for w in range(W):
                usd = {"epoch": epoch, "batch_in_epoch": 1 if nxt else 0,
                       "loader_state": dict(ref_usd["loader_state"], next_global_batch=nxt,
                                            epoch=epoch)}
                if part:
                    usd["loader_state_of"] = part
                if "rng" in ref_usd:  # every worker draws the same global shuffle
                    usd["rng"] = ref_usd["rng"]
                out.append(DataLoaderCheckpoint(
                    local_worker_id=w, num_workers_per_csx=W, num_csx=C, wse_id=c,
                    appliance_step=ref.appliance_step,
                    worker_step=RoundRobinOrder(W).batches_of(w, total),
                    user_state_dict=usd))
        return out


def checked_position(state: DataLoaderCheckpoint, wse_id: int) -> WorkerPosition:
    """The worker position a saved checkpoint describes, its loader position checked."""
    pos = check_position(dict(state.user_state_dict or start_position()),
                         f"the resume state of CS-X {wse_id}, worker {state.local_worker_id}")
    return WorkerPosition(int(state.worker_step), int(state.samples_streamed), pos)


# ---------------------------------------------------------------------------------------------
# The parts of a loader: set_epoch, state_dict, random generators
# ---------------------------------------------------------------------------------------------

def _candidates(loader) -> list:
    """The loader and the parts of it that may carry ``set_epoch`` / ``state_dict``."""
    objs = [loader]
    for name in ("batch_sampler", "sampler", "dataset"):
        objs.append(getattr(loader, name, None))
    objs.append(getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    seen, out = set(), []
    for o in objs:
        if o is not None and id(o) not in seen:
            seen.add(id(o))
            out.append(o)
    return out


def restartable_part(loader):
    """``(name, object)`` of the first part of ``loader`` with ``state_dict`` and
    ``load_state_dict`` (the loader itself, its batch_sampler, sampler or dataset), or None.
    The dataset of a torch DataLoader with worker processes does not count: each process
    iterates its own copy, so the one here never moves (the position counts batches instead)."""
    names = {id(loader): "loader"}
    for name in ("batch_sampler", "sampler", "dataset"):
        o = getattr(loader, name, None)
        if o is not None:
            names.setdefault(id(o), name)
    bs = getattr(loader, "batch_sampler", None)
    if getattr(bs, "sampler", None) is not None:
        names.setdefault(id(bs.sampler), "batch_sampler.sampler")
    copied = getattr(loader, "dataset", None) if getattr(loader, "num_workers", 0) else None
    for o in _candidates(loader):
        if o is copied:
            continue
        if callable(getattr(o, "state_dict", None)) and callable(
                getattr(o, "load_state_dict", None)):
            return names.get(id(o), type(o).__name__), o
    return None


def set_epoch(loader, epoch: int) -> None:
    """Tell every part of ``loader`` that has ``set_epoch`` (sampler, batch_sampler, ...)."""
    for o in _candidates(loader):
        fn = getattr(o, "set_epoch", None)
        if callable(fn):
            fn(epoch)


_MAX_DEPTH = 5
_SKIP_TYPES = (torch.Tensor, str, bytes, int, float, bool, type(None), list, tuple, dict, set)


def find_generators(loader) -> dict[str, torch.Generator]:
    """Every ``torch.Generator`` reachable through the attributes of ``loader`` (a few levels
    deep: ``batch_sampler.data_source.sampler.generator`` ...), keyed by that path. The same
    ``input_fn`` builds the same structure in every run, so the paths name the same
    generators in a resumed run."""
    found: dict[str, torch.Generator] = {}
    seen: set[int] = set()

    def walk(obj, path: str, depth: int) -> None:
        if id(obj) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(obj))
        attrs = getattr(obj, "__dict__", None)
        if not isinstance(attrs, dict):
            return
        for name, value in sorted(attrs.items(), key=lambda kv: str(kv[0])):
            if isinstance(value, torch.Generator):
                if id(value) not in seen and value.device.type == "cpu":
                    seen.add(id(value))
                    found[f"{path}.{name}" if path else name] = value
            elif not isinstance(value, _SKIP_TYPES) and not callable(value) \
                    and not isinstance(value, Iterator):
                walk(value, f"{path}.{name}" if path else name, depth + 1)

    walk(loader, "", 0)
    return found


def draws_from_global_rng(loader) -> str | None:
    """The path of a sampler of ``loader`` that shuffles with torch's global RNG (a
    ``RandomSampler`` / ``SubsetRandomSampler`` / ``WeightedRandomSampler`` without a
    generator), or None."""
    from torch.utils.data import RandomSampler, SubsetRandomSampler, WeightedRandomSampler

    kinds = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)
    stack, seen = [(loader, "loader", 0)], set()
    while stack:
        obj, path, depth = stack.pop()
        if id(obj) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, kinds) and getattr(obj, "generator", None) is None:
            return path
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            for name, value in attrs.items():
                if not isinstance(value, _SKIP_TYPES) and not callable(value) \
                        and not isinstance(value, (Iterator, torch.Generator)):
                    stack.append((value, f"{path}.{name}", depth + 1))
    return None


def _sample_ids(index) -> list[int] | None:
    """The sample ids of one batch as its index sampler gave them, when they are ints."""
    if isinstance(index, int) and not isinstance(index, bool):
        return [index]
    if isinstance(index, torch.Tensor) and not index.is_floating_point():
        return [int(i) for i in index.reshape(-1).tolist()]
    if isinstance(index, (list, tuple)) and index and all(
            isinstance(i, int) and not isinstance(i, bool) for i in index):
        return list(index)
    return None


# ---------------------------------------------------------------------------------------------
# Iterating one loader
# ---------------------------------------------------------------------------------------------

def lean_iter(loader) -> Iterator:
    """``iter(loader)``; for a torch ``DataLoader`` with ``num_workers=0``, an iterator that takes
    the same steps as the loader's own ``__next__`` but leaves out its per-batch profiler
    annotation while no profiler runs (entered fresh after each wait for data, that annotation
    costs ~0.15 ms a batch: as much as the rest of a worker's per-batch work), and keeps the
    sample indices of the last batch (:class:`workers.torch_compat.LeanLoaderIter`)."""
    it = iter(loader)
    return torch_compat.LeanLoaderIter(it) if torch_compat.single_process_iter(it) else it


class Source:
    """Iterates one worker's loader forever from a position, epoch after epoch.

    Args:
        dataloader: the recipe (for its name in messages).
        loader: what ``input_fn`` returned for this worker.
        position: where to start (see the module docstring); None: the beginning.
        owns_global_rng: True where torch's global RNG belongs to the input pipeline alone (an
            input worker's process): it is restored at a resumed epoch's start and left to run
            on. False in a process that shares it with the model (CPU backend, in-process
            CSX): it is restored only while the resumed epoch draws its shuffle.

    Each epoch is announced with ``set_epoch``; the random state is recorded just before the
    epoch's iterator is created. When an epoch ends the next one starts; an epoch that yields
    nothing raises :class:`EmptyDataLoaderError`, or :class:`ExhaustedIteratorError` when the
    loader is a one-shot iterator that an earlier epoch used up.
    """

    def __init__(self, dataloader: DataLoader, loader, position: dict | None = None, *,
                 owns_global_rng: bool = False):
        pos = check_position(dict(position or start_position()))
        self.dataloader = dataloader
        self.loader = loader
        self.epoch = pos["epoch"]
        self.batch_in_epoch = pos["batch_in_epoch"]
        self.restartable = restartable_part(loader)
        self.one_shot = isinstance(loader, Iterator)
        self.owns_global_rng = owns_global_rng
        self.generators = find_generators(loader)
        self.batches_in_first_epoch: int | None = None
        self._loader_state = pos.get("loader_state")
        # a RestartableDataLoader aggregate the run resumes from (workers.aggregates)
        self._aggregate = pos.get("loader_aggregate")
        self._resume_rng = pos.get("rng")
        self._rng: dict = {}
        self._it: Iterator | None = None
        self._first: Any = None  # a batch drawn ahead by _start_epoch, or _END
        self.samples_this_run = 0  # what get_worker_state().samples_streamed says to the loader
        # parts that draw index batches and describe their position after the batches the
        # loader produced (ShardedSampler): told of every batch, since a loader with worker
        # processes draws ahead of what it yields
        self._producers = [o for o in _candidates(loader)
                           if callable(getattr(o, "track_production", None))
                           and callable(getattr(o, "batch_produced", None))]
        for o in self._producers:
            o.track_production()

    # -- random state --------------------------------------------------------------------
    def _record_rng(self) -> None:
        self._rng = {"generators": {p: _encode_state(g.get_state()) for p, g in
                                    self.generators.items()},
                     "global": _encode_state(torch.get_rng_state())}

    def _restore_rng(self, saved: dict) -> None:
        gens = saved.get("generators", {})
        missing = sorted(set(gens) - set(self.generators))
        if missing:
            raise ResumeError(
                f"input_fn {self.dataloader.input_fn_name}: the saved position holds the state "
                f"of random generator(s) {missing}, which the dataloader built now does not "
                f"have (it has {sorted(self.generators)}). The shuffle of epoch {self.epoch} "
                "cannot be drawn again as the interrupted run drew it: resume with the same "
                "input_fn and arguments."
            )
        for p, state in gens.items():
            self.generators[p].set_state(_byte_tensor(state))
        if "global" in saved:
            torch.set_rng_state(_byte_tensor(saved["global"]))

    def rng_state(self) -> dict:
        """The random state recorded at the start of the current epoch."""
        return self._rng

    # -- epochs --------------------------------------------------------------------------
    def _empty(self) -> EmptyDataLoaderError:
        name = self.dataloader.input_fn_name
        if self.one_shot and self.epoch > 0:
            n = self.batches_in_first_epoch
            return ExhaustedIteratorError(
                f"input_fn {name} returned a one-shot iterator "
                f"({type(self.loader).__name__}), which was used up after "
                f"{'its' if n is None else n} batches, and the run needs more: epoch "
                f"{self.epoch} would start it over, but a generator cannot start over. Return "
                "something that can be iterated again (a list, a torch DataLoader, or a class "
                "whose __iter__ starts over), make the generator endless, or lower num_steps "
                "to what one pass yields."
            )
        return EmptyDataLoaderError(
            f"input_fn {name} returned a dataloader that yields no batch"
            + (f" (epoch {self.epoch})" if self.epoch else "") + ". Check that the data set "
            "is not empty and that batch_size is not larger than the data set with "
            "drop_last=True (use a smaller batch_size or drop_last=False)."
        )

    def _start_epoch(self, resumed: bool) -> None:
        if self.epoch > 0:
            set_epoch(self.loader, self.epoch)
        saved_rng = self._resume_rng if resumed else None
        self._resume_rng = None
        if saved_rng is not None and not self.owns_global_rng:
            user_rng = torch.get_rng_state()
        if saved_rng is not None:
            self._restore_rng(saved_rng)
        elif resumed and self.epoch > 0 and not self.one_shot:
            path = draws_from_global_rng(self.loader)
            if path is not None:
                raise ResumeError(
                    f"input_fn {self.dataloader.input_fn_name}: {path} shuffles with torch's "
                    f"global random generator, and the saved position (epoch {self.epoch}) does "
                    "not hold its state, so epoch "
                    f"{self.epoch} cannot be drawn again as the interrupted run drew it. Give "
                    "the sampler its own generator, e.g. RandomSampler(data, "
                    "generator=torch.Generator().manual_seed(seed)), and resume from a "
                    "checkpoint saved with it."
                )
        self._record_rng()
        skip = 0
        try:
            if resumed and self._aggregate is not None:
                self._load_aggregate()
            elif resumed and self.batch_in_epoch:
                if self.restartable is not None and self._loader_state is not None:
                    self.restartable[1].load_state_dict(self._state_to_load(),
                                                        **self._strict_kwargs())
                else:
                    skip, self.batch_in_epoch = self.batch_in_epoch, 0
            self._it = lean_iter(self.loader)
            self._skip(skip)
            if saved_rng is not None and not self.owns_global_rng:
                # the shuffle is drawn when the first batch is asked for: draw it now, while
                # the restored global state is in place
                try:
                    self._first = self._pull()
                except StopIteration:
                    self._first = _END
        finally:
            if saved_rng is not None and not self.owns_global_rng:
                torch.set_rng_state(user_rng)

    def _pull(self) -> Any:
        """The loader's next batch (raises StopIteration at the epoch's end)."""
        batch = next(self._it)
        for o in self._producers:
            o.batch_produced()
        return batch

    def _skip(self, skip: int) -> None:
        while skip:
            try:
                self._pull()
            except StopIteration:
                # the epoch is shorter than the saved position: go on into the next epoch
                if self.batch_in_epoch == 0:
                    raise self._empty() from None
                self.epoch += 1
                self.batch_in_epoch = 0
                set_epoch(self.loader, self.epoch)
                self._record_rng()
                self._it = lean_iter(self.loader)
                continue
            self.batch_in_epoch += 1
            skip -= 1

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._start_epoch(resumed=True)
        while True:
            try:
                batch, self._first = self._first, None
                if batch is None:
                    batch = self._pull()
                elif batch is _END:
                    raise StopIteration
            except StopIteration:
                if self.batch_in_epoch == 0 and not _skipped_epoch(self.loader):
                    raise self._empty() from None
                if self.batches_in_first_epoch is None:
                    self.batches_in_first_epoch = self.batch_in_epoch
                self.epoch += 1
                self.batch_in_epoch = 0
                self._start_epoch(resumed=False)
                continue
            self.batch_in_epoch += 1
            self.samples_this_run += leading_dim(batch)
            return batch

    def _state_to_load(self) -> Any:
        """The saved state as the restartable part loads it. A part with
        ``aggregate_state_dict`` / ``deaggregate_state_dict`` (the Cerebras
        ``RestartableDataLoader`` protocol) loads what its deaggregation of the workers'
        aggregated states gives: here the one worker's state, aggregated and deaggregated."""
        state = copy.deepcopy(self._loader_state)
        part = self.restartable[1]
        aggregate = getattr(part, "aggregate_state_dict", None)
        deaggregate = getattr(part, "deaggregate_state_dict", None)
        if not (callable(aggregate) and callable(deaggregate)):
            return state
        workers = get_worker_info().total_num_workers
        if workers > 1:
            raise ResumeError(
                f"input_fn {self.dataloader.input_fn_name}: its {type(part).__name__} "
                "aggregates the states of all input workers (aggregate_state_dict) and each "
                f"worker resumes from that aggregate; cstream resumes each of the {workers} "
                "workers from its own state, so this loader resumes only with one input worker "
                "in all: set num_csx=1 and num_workers_per_csx=1 for the resumed run.")
        return deaggregate(aggregate([state]), **self._strict_kwargs())

    def _load_aggregate(self) -> None:
        """Load this worker's ``deaggregate_state_dict()`` of the aggregate the run resumes from
        into its loader, as each input worker does on the Cerebras stack."""
        aggregate, self._aggregate = self._aggregate, None
        part = self.restartable[1] if self.restartable is not None else None
        if part is None or not callable(getattr(part, "deaggregate_state_dict", None)):
            raise ResumeError(
                f"input_fn {self.dataloader.input_fn_name}: the run resumes from a "
                "RestartableDataLoader aggregate (DataLoader.load_state_dict), but the loader "
                f"this worker built ({type(self.loader).__name__}) has no state_dict, "
                "load_state_dict and deaggregate_state_dict to load it with. Return the same "
                "kind of loader from input_fn on every worker.")
        load_aggregate(part, aggregate, self.dataloader)

    def _strict_kwargs(self) -> dict:
        return strict_kwargs(self.restartable[1], self.dataloader)

    def last_sample_ids(self) -> list[int] | None:
        """The sample ids of the batch just returned, where the loader's sampler gave ints."""
        return _sample_ids(getattr(self._it, "last_index", None))

    def loader_state(self) -> Any:
        """The restartable part's ``state_dict()`` now (a private copy), or None."""
        if self.restartable is None:
            return None
        with samples_streamed_this_run(self.samples_this_run):
            return copy_state(self.restartable[1].state_dict())

    def position(self) -> dict:
        """The position right after the batch just returned (a fresh dict)."""
        pos = {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}
        state = self.loader_state()
        if state is not None:
            pos["loader_state"] = state
            pos["loader_state_of"] = self.restartable[0]
        if self._rng:
            pos["rng"] = self._rng
        return pos

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if callable(close):
            close()
        self._it = None


_END = object()


def _skipped_epoch(loader) -> bool:
    """A part of ``loader`` yielded nothing this epoch on purpose: under dynamic assignment
    (:class:`workers.sharding.ShardedSampler`, :class:`workers.parquet.ParquetDataset`) a
    worker may be given no batch of an epoch, and a ``ParquetDataset`` with fewer global
    batches an epoch than workers gives some workers none under round-robin too."""
    return any(getattr(o, "skipped_epoch", False) is True for o in _candidates(loader))


def _encode_state(state: torch.Tensor) -> str:
    """A generator's state as base64 text: it travels in JSON, HDF5 and pickles alike."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _byte_tensor(state: str) -> torch.Tensor:
    try:
        raw = base64.b64decode(state.encode("ascii"), validate=True)
    except (AttributeError, ValueError):
        raise ResumeError(
            f"a saved random-generator state is not base64 text as cstream writes it "
            f"({state!r:.60}); resume from a state DataLoader.state_dict() returned."
        ) from None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


_ATOMS = (int, float, str, bool, bytes, type(None))


def copy_state(x: Any) -> Any:
    """A private copy of a loader state: fast for the usual dicts/lists of numbers and
    strings, ``copy.deepcopy`` for anything else."""
    if isinstance(x, _ATOMS):
        return x
    if type(x) is dict:
        return {k: copy_state(v) for k, v in x.items()}
    if type(x) is list:
        return [copy_state(v) for v in x]
    if type(x) is tuple:
        return tuple(copy_state(v) for v in x)
    return copy.deepcopy(x)


def load_aggregate(part, aggregate: Any, dataloader: DataLoader) -> None:
    """``part.load_state_dict(part.deaggregate_state_dict(aggregate))``: a RestartableDataLoader
    (``part``) loads its own share of an aggregate of every worker's state."""
    kwargs = strict_kwargs(part, dataloader)
    part.load_state_dict(part.deaggregate_state_dict(copy.deepcopy(aggregate), **kwargs),
                         **kwargs)


def strict_kwargs(part, dataloader: DataLoader) -> dict:
    """``{"strict": ...}`` (the ``strict`` of ``dataloader.load_state_dict``) for a restartable
    part whose ``load_state_dict`` and ``deaggregate_state_dict`` take ``strict`` (Release 2.5's
    protocol), else nothing."""
    methods = [m for m in (getattr(part, "load_state_dict", None),
                           getattr(part, "deaggregate_state_dict", None)) if callable(m)]
    takes = [_takes_strict(m) for m in methods]
    if not any(takes):
        return {}
    if not all(takes):
        raise TypeError(
            f"input_fn {dataloader.input_fn_name}: its {type(part).__name__} takes "
            "`strict` in one of load_state_dict and deaggregate_state_dict but not the "
            "other; give both methods the argument, or neither.")
    return {"strict": getattr(dataloader, "load_strict", True)}


def _takes_strict(method) -> bool:
    try:
        return "strict" in inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
