"""The cstream DataLoader: a recipe (``input_fn`` + arguments) that each input worker runs.

A worker cannot share a PyTorch dataloader with other workers, so cstream ships the recipe
instead: every worker calls ``input_fn(*args, **kwargs)`` inside its own worker context and
iterates what comes back.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import torch
from collections.abc import Mapping
from typing import Any, Callable, Iterable

from workers import environ
from workers.context import DataLoaderCheckpoint, WorkerInfo, get_worker_info, worker_context

STATE_FORMAT = "cstream.dataloader/1"


class EmptyDataLoaderError(ValueError):
    """``input_fn`` produced a dataloader that yields no batch."""


_LOADER_IDS = itertools.count()


class DataLoader:
    """Distribute an input pipeline across input workers.

    Args:
        input_fn: a callable returning a ``torch.utils.data.DataLoader`` or any iterable of
            (nested) tensors. Each worker calls it with its own deep copy of ``*args`` and
            ``**kwargs``; :func:`cstream.distributed.get_worker_info` tells it which shard it owns.

    >>> import torch, cstream
    >>> def input_fn(n):
    ...     return [torch.ones(2, 3) * i for i in range(n)]
    >>> loader = cstream.utils.data.DataLoader(input_fn, 4)
    >>> len(loader)
    4
    """

    def __init__(self, input_fn: Callable[..., Iterable], *args: Any, **kwargs: Any):
        if isinstance(input_fn, DataLoader):
            raise TypeError(
                "DataLoader was given a cstream DataLoader as its input_fn; to run steps over a "
                "DataLoader, build an executor: cstream.utils.data.DataExecutor(dataloader, "
                "num_steps=..., cs_config=...)."
            )
        if not callable(input_fn):
            raise TypeError(
                f"DataLoader expects input_fn to be a callable that returns a "
                f"torch.utils.data.DataLoader (or any iterable of batches), got "
                f"{type(input_fn).__name__}: {repr(input_fn)[:80]}. Each input worker calls input_fn to "
                f"build its own dataloader, so pass the function itself, e.g. "
                f"cstream.utils.data.DataLoader(input_fn, batch_size=64), not input_fn(...)."
            )
        self.id = next(_LOADER_IDS)
        """A number of its own in this process (the Cerebras Trainer keys its validation
        loaders by it)."""
        self.input_fn = input_fn
        self.input_fn_name = getattr(input_fn, "__qualname__", repr(input_fn))
        try:
            self.args = copy.deepcopy(args)
            self.kwargs = copy.deepcopy(kwargs)
        except Exception as e:  # pragma: no cover - message path
            raise TypeError(
                f"DataLoader could not deep-copy the arguments for {self.input_fn_name}: {e}. "
                "Every worker receives its own copy of the arguments, so they must be copyable; "
                "pass paths or settings instead of open handles."
            ) from e
        self._client_loader = None
        self.load_strict = True
        """``strict`` of the last :meth:`load_state_dict`, for the input_fn loader's own."""
        self._len = None
        self._resume = None
        self._resume_states = None
        self._resume_aggregate = None
        self._state_provider = None
        self.worker_env: dict[str, str] = {}  # set when sent to a worker: workers.environ
        self.client_rng_state: torch.Tensor | None = None
        """torch's global random state on the client when the run started (input workers start
        from it); None before a run."""
        self.batch_size: int | None = None
        """The global batch size: samples in the run's first step (None before it ends)."""

    # -- building --------------------------------------------------------------------------
    def build(self, info: WorkerInfo | None = None):
        """Call ``input_fn`` as the given worker (default: the current context) and return its
        dataloader. The arguments are deep-copied again so that workers never share state."""
        info = info or get_worker_info()
        args = copy.deepcopy(self.args)
        kwargs = copy.deepcopy(self.kwargs)
        with worker_context(info):
            loader = self.input_fn(*args, **kwargs)
        if loader is None or not hasattr(loader, "__iter__"):
            raise TypeError(
                f"input_fn {self.input_fn_name} returned {type(loader).__name__}, which is not "
                "iterable. input_fn must return a torch.utils.data.DataLoader or another "
                "iterable of batches."
            )
        return loader

    def client_loader(self):
        """The dataloader as worker 0 of 1 sees it (built once, cached)."""
        if self._client_loader is None:
            self._client_loader = self.build(WorkerInfo())
        return self._client_loader

    @property
    def dataloader(self):
        """The dataloader ``input_fn`` returns, as the client builds it (worker 0 of 1)."""
        return self.client_loader()

    def __len__(self) -> int:
        if self._len is None:
            loader = self.client_loader()
            try:
                self._len = len(loader)
            except TypeError:
                raise TypeError(
                    f"the dataloader returned by {self.input_fn_name} "
                    f"({type(loader).__name__}) has no len(); pass num_steps to DataExecutor."
                ) from None
        return self._len

    def has_len(self) -> bool:
        try:
            len(self)
            return True
        except TypeError:
            return False

    # -- restartable state -------------------------------------------------------------------
    @property
    def is_restartable(self) -> bool:
        """True: every cstream DataLoader can save and resume its position (a loader with
        ``state_dict``/``load_state_dict`` -- the real stack's RestartableDataLoader protocol --
        by its own state, any other by the batches it streamed)."""
        return True

    def state_dict(self) -> dict:
        """The input side's position at the current checkpoint step: every worker's state.

        Call it inside a ``@cstream.checkpoint_closure`` and save it with the checkpoint; a new
        run that calls :meth:`load_state_dict` first streams exactly the samples the
        uninterrupted run would have streamed next.

        Where ``input_fn``'s loader is a Cerebras ``RestartableDataLoader`` (it has
        ``aggregate_state_dict`` and ``deaggregate_state_dict``), the state is what that loader
        aggregates from every worker's ``state_dict()``, and nothing else, as on the Cerebras
        stack: a checkpoint of either reads in the other, and each worker of the resumed run
        loads its own ``deaggregate_state_dict()`` of it.
        """
        if self._state_provider is None:
            raise RuntimeError(
                "DataLoader.state_dict() reads the workers' positions at a checkpoint step: call "
                "it inside a @cstream.checkpoint_closure during the run."
            )
        state = self._state_provider()
        positions = [w.get("user_state_dict", {}) for w in state["workers"]]
        if any(p.get("loader_state_of") != "loader" for p in positions):
            return state  # the loader itself keeps no state: nothing to aggregate
        # the client's loader is built only for a loader that keeps its state (or before the
        # first step, an initial checkpoint, where only the loader itself can say)
        client = self.client_loader()
        aggregate = getattr(client, "aggregate_state_dict", None)
        if not (callable(aggregate) and callable(getattr(client, "deaggregate_state_dict", None))):
            return state
        if positions:
            loader_states = [copy.deepcopy(p["loader_state"]) for p in positions]
        elif self._resume_aggregate is not None:  # before the first step of a resumed run
            return copy.deepcopy(self._resume_aggregate)
        else:  # before the first step: the loader as it starts
            loader_states = [client.state_dict()]
        return aggregate(loader_states)

    def bind_state_provider(self, provider: Callable[[], dict] | None) -> None:
        """Set by the executor running this DataLoader (None when the run ends): the callable
        :meth:`state_dict` returns the workers' positions from.

        As a run starts it also records torch's global random state: each input worker process
        starts from it, as the client's own loader does on the CPU backend, so a loader that
        shuffles with torch's global generator draws the same order on CSX as on CPU."""
        self._state_provider = provider
        if provider is not None:
            self.client_rng_state = torch.get_rng_state()

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """Resume every worker from ``state_dict`` (from :meth:`state_dict`) in the next run.

        ``strict`` is passed on to an input_fn's loader whose ``load_state_dict`` and
        ``deaggregate_state_dict`` take it (the Cerebras RestartableDataLoader protocol since
        Release 2.5); a loader without it ignores it."""
        if not isinstance(strict, bool):
            raise TypeError(f"DataLoader.load_state_dict(strict={strict!r}): expected True or "
                            "False.")
        self.load_strict = strict
        self._resume = self._resume_states = self._resume_aggregate = None
        if not (isinstance(state_dict, Mapping) and state_dict.get("format") == STATE_FORMAT):
            if callable(getattr(self.client_loader(), "deaggregate_state_dict", None)):
                # a RestartableDataLoader's aggregate (this stack's or the Cerebras stack's):
                # every worker of the next run starts by loading its deaggregation of it
                self._resume_aggregate = copy.deepcopy(state_dict)
                return
            raise ValueError(
                "DataLoader.load_state_dict expects what DataLoader.state_dict() returned inside "
                f"a checkpoint closure (a dict with format 'cstream.dataloader/1', or the "
                "aggregate of a loader with aggregate_state_dict and deaggregate_state_dict), got "
                f"{type(state_dict).__name__}"
                + (f" with keys {sorted(map(str, state_dict))[:8]}"
                   if isinstance(state_dict, Mapping) else "")
                + f", and input_fn {self.input_fn_name}'s loader has no deaggregate_state_dict."
            )
        if not state_dict["workers"]:  # saved before the run started: start from the beginning
            return
        self._resume = dict(state_dict)
        self._resume_states = [DataLoaderCheckpoint(**w) for w in state_dict["workers"]]

    @property
    def resume_state(self) -> dict | None:
        """The state given to :meth:`load_state_dict` that the next run resumes from; None:
        the next run starts from the beginning."""
        return self._resume

    @property
    def resume_aggregate(self) -> Any:
        """The RestartableDataLoader aggregate given to :meth:`load_state_dict` that every worker
        of the next run starts from (by its ``deaggregate_state_dict``); None: none."""
        return self._resume_aggregate

    @property
    def resume_states(self) -> list[DataLoaderCheckpoint] | None:
        """Every worker's position in :attr:`resume_state`, in worker order; None: none."""
        return self._resume_states

    def __getstate__(self) -> dict:
        # workers receive the recipe, not the client's run
        state = dict(self.__dict__)
        state["_state_provider"] = None
        state["_client_loader"] = None
        state["worker_env"] = environ.snapshot()
        return state

    def resume_topology(self):
        r = self._resume
        return None if r is None else (r["num_csx"], r["num_workers_per_csx"])

    def __iter__(self):
        raise TypeError(
            "a cstream DataLoader is not iterated directly: wrap it in "
            "cstream.utils.data.DataExecutor(dataloader, num_steps=...) and iterate the executor."
        )

    def __repr__(self) -> str:
        sig = ""
        try:
            sig = str(inspect.signature(self.input_fn))
        except (TypeError, ValueError):
            pass
        return f"DataLoader({self.input_fn_name}{sig})"
