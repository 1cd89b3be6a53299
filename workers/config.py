"""CSConfig: how the simulated Wafer-Scale Cluster is laid out."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from workers.checks import positive_int, positive_number


AUTOMATIC_WORKERS_PER_CSX = 1
"""Input workers per CS-X when ``num_workers_per_csx`` is 0 or None (automatic)."""
DUPLICATE_SAMPLES = ("warn", "error", "ignore")
INPUT_ASSIGNMENTS = ("dynamic", "static")


@dataclass(kw_only=True)
class CSConfig:
    """Layout of the simulated Wafer-Scale Cluster.

    >>> cfg = CSConfig(num_csx=2, num_workers_per_csx=4)
    >>> cfg.total_num_workers
    8
    """

    num_csx: Optional[int] = 1
    """Number of CS-X systems; the global batch is split across them (data parallel). None
    (a Cerebras run configuration without ``num_csx``): 1."""
    num_workers_per_csx: Optional[int] = 1
    """Input workers streaming into each CS-X's input buffer. 0 or None: chosen automatically,
    as on a Cerebras cluster; cstream chooses :data:`AUTOMATIC_WORKERS_PER_CSX`."""
    wafer_samples_per_sec: Optional[float] = None
    """Simulated compute speed of one CS-X in samples/s: each step takes at least
    ``samples_on_this_csx / wafer_samples_per_sec`` seconds. None: as fast as the step runs."""
    wafer_seconds_per_step: Optional[float] = None
    """Alternative to ``wafer_samples_per_sec``: each step takes at least this long."""
    input_buffer_batches: int = 4
    """Capacity of each CS-X's input buffer, in batches (the bounded look-ahead of the input side)."""
    batches_per_fetch: int = 4
    """Batches an input worker sends per transfer (one Ray call and one object): more amortises
    Ray's per-transfer cost; each worker then runs up to this many times further ahead."""
    input_bytes_in_flight_per_csx: Optional[int] = None
    """The most bytes of batches in flight between one CS-X's input workers and its input
    buffer (produced and waiting in the workers, in replies on their way, received and not yet
    in the buffer), split equally over its workers; each worker always has at least one batch
    in flight. None: a quarter of the Ray object store, shared by the CS-Xs (see
    :meth:`workers.flow.FlowPolicy.input_bytes_per_worker`)."""
    max_worker_restarts: int = 3
    """How many times a crashed input worker is restarted before the run fails."""
    straggler_timeout_s: float = 60.0
    """A worker that produces nothing for this long is reported as a straggler."""
    input_stall_timeout_s: Optional[float] = None
    """The longest the wafer waits for a step's input, in seconds; past it the run stops with
    :class:`cstream.InputStallError`, which names the CS-X, the workers that owe the step's
    batches and what their threads are doing (see :mod:`workers.stall`). None: derived from
    the batch costs seen so far, ``max(600 s, 20 x the slowest batch any worker of this run
    has produced)``, so a slow batch never stops a run, a stuck one does (the wait for the
    first batch includes building the loader). A wait shorter than the bound changes nothing."""
    duplicate_samples: str = "warn"
    """What to do when input workers stream the same samples (an ``input_fn`` that does not
    shard): ``"warn"`` (an ``UnshardedInputWarning`` in the user's process, recorded in the
    run's profile), ``"error"`` (the run stops with ``UnshardedInputError`` before its first
    step) or ``"ignore"`` (no check)."""
    input_assignment: str = "dynamic"
    """Which input worker produces which global batch. ``"dynamic"``: each worker takes the next
    global batch number from its CS-X's coordinator as it becomes free (holding at most
    ``FlowPolicy.assigned_batches_per_worker``, or about 5 ms of its work where its batches are
    cheaper), and the wafer side puts the batches back into global order in a bounded reorder
    window, so the other workers go on while one is busy with a slow batch, and a slow worker
    produces fewer batches; the wafer still sees exactly the single-process sequence of global
    batches. ``"static"``: worker ``s % num_workers_per_csx`` produces step ``s`` (round-robin),
    so a slow worker caps the stream at ``num_workers_per_csx`` x its rate. Only loaders that
    draw their batches from :class:`cstream.utils.data.ShardedSampler` or read them from a
    :class:`cstream.utils.data.ParquetDataset` can be assigned dynamically; other iterable
    datasets and samplers keep the round-robin, and the run's profile says which mode ran and
    why. The default is ``"dynamic"``, from
    ``benchmarks/stragglers.py`` (4 workers, lognormal read costs with p99 = 10x the median,
    medians of 3 rounds on a 2-core machine): with one worker persistently 2x slower, dynamic
    delivered 98% of the sum of the workers' rates and static 63% (capped by the slowest
    worker); with the heavy tail alone and the wafer held to 85% of the workers' capacity, the
    wafer's utilisation was 98% dynamic and 95% static (static's default look-ahead absorbs most
    of that tail). Both keep the order.
    Choose ``"static"`` for uniform costs on a machine short of CPU."""
    duplicate_check_batches: int = 2
    """How many of each worker's first batches are compared across all workers of all CS-Xs
    (by sample id where the sampler gives them, by content otherwise)."""

    # The Cerebras cluster's settings (``cerebras.pytorch.utils.CSConfig``): accepted, kept in
    # the run's profile (``cs_config``) and without effect -- the simulated cluster has no
    # weight or activation servers, management service, job scheduler or compiler to tune.
    max_wgt_servers: Optional[int] = None
    max_act_per_csx: Optional[int] = None
    mgmt_address: Optional[str] = None
    mgmt_namespace: Optional[str] = None
    credentials_path: Optional[str] = None
    debug_args: Any = None
    mount_dirs: Optional[list] = None
    python_paths: Optional[list] = None
    transfer_processes: Optional[int] = None
    job_labels: Optional[list] = None
    job_priority: Optional[str] = None
    job_time_sec: Optional[int] = None
    disable_version_check: bool = False
    fabric_type_blacklist: Optional[list] = None
    precision_opt_level: Optional[int] = None

    def __post_init__(self):
        if self.num_csx is None:
            self.num_csx = 1
        self.workers_chosen_automatically = self.num_workers_per_csx in (None, 0)
        if self.workers_chosen_automatically:
            self.num_workers_per_csx = AUTOMATIC_WORKERS_PER_CSX
        for name in ("num_csx", "num_workers_per_csx", "input_buffer_batches",
                     "batches_per_fetch", "duplicate_check_batches",
                     "input_bytes_in_flight_per_csx"):
            positive_int(getattr(self, name), f"CSConfig.{name}",
                         allow_none=name == "input_bytes_in_flight_per_csx",
                         fix=f"Set {name} to 1 or more, e.g. CSConfig({name}=1).")
        self._check_choices()
        self._check_timing()

    def _check_choices(self) -> None:
        if self.input_assignment not in INPUT_ASSIGNMENTS:
            raise ValueError(
                f"CSConfig.input_assignment: expected one of {INPUT_ASSIGNMENTS}, got "
                f"{self.input_assignment!r}. \"dynamic\" balances the global batches over the "
                "input workers as they become free; \"static\" assigns them round-robin."
            )
        if self.duplicate_samples not in DUPLICATE_SAMPLES:
            raise ValueError(
                f"CSConfig.duplicate_samples: expected one of {DUPLICATE_SAMPLES}, got "
                f"{self.duplicate_samples!r}."
            )

    def _check_timing(self) -> None:
        for name in ("wafer_samples_per_sec", "wafer_seconds_per_step"):
            positive_number(getattr(self, name), f"CSConfig.{name}", allow_none=True, fix="")
        if self.wafer_samples_per_sec is not None and self.wafer_seconds_per_step is not None:
            raise ValueError(
                "CSConfig: set either wafer_samples_per_sec or wafer_seconds_per_step, not both "
                f"(got {self.wafer_samples_per_sec!r} and {self.wafer_seconds_per_step!r})."
            )
        if isinstance(self.max_worker_restarts, bool) or not isinstance(
            self.max_worker_restarts, int
        ) or self.max_worker_restarts < 0:
            raise ValueError(
                f"CSConfig.max_worker_restarts: expected an int >= 0, got {self.max_worker_restarts!r}."
            )
        positive_number(self.input_stall_timeout_s, "CSConfig.input_stall_timeout_s",
                        allow_none=True, unit="seconds",
                        fix="None derives it from the batch costs.")
        positive_number(self.straggler_timeout_s, "CSConfig.straggler_timeout_s", fix="")

    @property
    def total_num_workers(self) -> int:
        return self.num_csx * self.num_workers_per_csx

    def min_step_seconds(self, samples_per_csx: int) -> float:
        """The simulated wafer's floor on one step's compute time."""
        if self.wafer_seconds_per_step is not None:
            return float(self.wafer_seconds_per_step)
        if self.wafer_samples_per_sec is not None:
            return samples_per_csx / float(self.wafer_samples_per_sec)
        return 0.0

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if hasattr(out["debug_args"], "to_dict"):
            out["debug_args"] = out["debug_args"].to_dict()
        return out
