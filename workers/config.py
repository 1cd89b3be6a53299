"""CSConfig: how the simulated Wafer-Scale Cluster is laid out."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

from workers.checks import positive_int, positive_number


AUTOMATIC = (0, None, "auto")
"""The values of ``num_workers_per_csx`` that mean: found while the run runs (autoscaling)."""
DUPLICATE_SAMPLES = ("warn", "error", "ignore")
INPUT_ASSIGNMENTS = ("dynamic", "static")


@dataclass(kw_only=True)
class Autoscale:
    """The bounds and target of a run whose input workers are found while it runs
    (``CSConfig(num_workers_per_csx="auto")``): a controller reads each CS-X's figures over a
    window of steps and adds or retires workers (:mod:`executor.autoscale`).

    >>> Autoscale(max_workers_per_csx=8).target_utilisation
    0.95
    """

    min_workers_per_csx: int = 1
    """The fewest workers per CS-X, and where an autoscaled run starts (one worker streams a
    loader alone; each added one is paid for by what the figures show it brings)."""
    max_workers_per_csx: int = 16
    """The most workers per CS-X. 16: past it one node's workers contend for the transport
    (each reply costs the wafer's side 1-2 ms of Ray's per-object work on a 2-core machine), so
    a pipeline that needs more wants cheaper batches or more CS-Xs, not more workers."""
    target_utilisation: float = 0.95
    """The share of its time the wafer must compute; below it, over a window, the CS-X starves
    and gets workers. 0.95: the busy fraction ``cstream sweep`` calls fed, and 5 % leaves room
    for the noise of a shared machine (20-30 % between runs here) without chasing it."""
    window_steps: int = 20
    """Steps per observation (each decision reads the figures of this many steps, all after
    the last change's cool-down). 20: a 20 ms batch on 4 workers is ~100 ms of figures, and one
    slow batch among 20 does not decide."""
    cooldown_steps: int = 20
    """Steps after a change whose figures no decision reads: an added worker's start-up, or the
    buffer draining after a retire, would read as a lasting state. The steps until every worker
    delivered its first batch are left out as well."""
    retire_margin: float = 0.25
    """A worker is retired only when the rest produce at least ``1 + retire_margin`` times the
    rate the wafer takes (hysteresis: a retire that would bring the next window back below the
    target, and an add after it, is not made)."""
    min_gain: float = 0.25
    """An add that raised the CS-X's production by less than this share of what the added
    workers were expected to produce gained nothing: the machine's cores are the limit, and the
    controller adds no more there."""
    required: bool = True
    """Whether a run whose input cannot change its workers (an in-process stream, a loader
    that cannot be re-formed with another worker count) is refused (True: ``"auto"`` or an
    explicit ``Autoscale``). False where ``num_workers_per_csx`` was 0 or None, the Cerebras
    spelling of "chosen automatically" that Model Zoo programs pass by default: such a run
    keeps ``min_workers_per_csx`` fixed and says why in the log and its summary."""

    def __post_init__(self):
        for name in ("min_workers_per_csx", "max_workers_per_csx", "window_steps",
                     "cooldown_steps"):
            positive_int(getattr(self, name), f"CSConfig.autoscale.{name}",
                         fix=f"Set it to 1 or more, e.g. Autoscale({name}=1)." if name != \
                         "max_workers_per_csx" else "An autoscaled CS-X needs room for at least "
                         "one input worker: set it to 1 or more, e.g. "
                         "Autoscale(max_workers_per_csx=16).")
        if self.min_workers_per_csx > self.max_workers_per_csx:
            raise ValueError(
                f"CSConfig.autoscale: min_workers_per_csx={self.min_workers_per_csx} is above "
                f"max_workers_per_csx={self.max_workers_per_csx}; the bounds must satisfy "
                "1 <= min_workers_per_csx <= max_workers_per_csx. Raise max_workers_per_csx to "
                f"{self.min_workers_per_csx} or lower min_workers_per_csx to "
                f"{self.max_workers_per_csx}.")
        t = self.target_utilisation
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:
            raise ValueError(
                f"CSConfig.autoscale.target_utilisation: expected a fraction in (0, 1], got "
                f"{t!r}. It is the share of its time the wafer must compute (0.95 is 95 %); "
                "set it to e.g. 0.95.")
        for name in ("retire_margin", "min_gain"):
            positive_number(getattr(self, name), f"CSConfig.autoscale.{name}", fix="")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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
    num_workers_per_csx: Union[int, str, None] = 1
    """Input workers streaming into each CS-X's input buffer. 0, None or ``"auto"``: found
    while the run runs (as a Cerebras cluster chooses them): the run starts at
    ``autoscale.min_workers_per_csx`` and a controller adds and retires workers within
    :attr:`autoscale`'s bounds, keeping the wafer's sequence of batches exactly a fixed-count
    run's. A count keeps it fixed (with ``autoscale`` given, the run starts there and
    autoscales)."""
    autoscale: Optional[Autoscale] = None
    """The bounds and target of autoscaling (:class:`Autoscale`); None with a fixed count: no
    autoscaling. Set for every autoscaled config (the defaults where
    ``num_workers_per_csx`` alone asked for it)."""
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
        if isinstance(self.autoscale, dict):
            self.autoscale = Autoscale(**self.autoscale)
        if self.autoscale is not None and not isinstance(self.autoscale, Autoscale):
            raise TypeError(
                f"CSConfig.autoscale: expected an Autoscale or None, got "
                f"{type(self.autoscale).__name__}: {self.autoscale!r}. Build it with "
                "cstream.utils.Autoscale(min_workers_per_csx=..., max_workers_per_csx=...).")
        if self.num_workers_per_csx in AUTOMATIC and not isinstance(self.num_workers_per_csx,
                                                                     bool):
            self.autoscale = self.autoscale or Autoscale(
                required=self.num_workers_per_csx == "auto")
            self.num_workers_per_csx = self.autoscale.min_workers_per_csx
        for name in ("num_csx", "num_workers_per_csx", "input_buffer_batches",
                     "batches_per_fetch", "duplicate_check_batches",
                     "input_bytes_in_flight_per_csx"):
            positive_int(getattr(self, name), f"CSConfig.{name}",
                         allow_none=name == "input_bytes_in_flight_per_csx",
                         fix=f"Set {name} to 1 or more, e.g. CSConfig({name}=1)" + (
                             ", or to \"auto\" to find it while the run runs."
                             if name == "num_workers_per_csx" else "."))
        self._check_choices()
        self._check_timing()
        a = self.autoscale
        if a is not None and not (a.min_workers_per_csx <= self.num_workers_per_csx
                                  <= a.max_workers_per_csx):
            raise ValueError(
                f"CSConfig: num_workers_per_csx={self.num_workers_per_csx} is where the "
                f"autoscaled run starts, and it lies outside autoscale's bounds "
                f"[{a.min_workers_per_csx}, {a.max_workers_per_csx}]. Start inside them, or "
                "give num_workers_per_csx=\"auto\" to start at min_workers_per_csx.")

    @property
    def autoscaling(self) -> bool:
        """True when the input workers are found while the run runs (:attr:`autoscale`)."""
        return self.autoscale is not None

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
        if self.autoscale is not None:
            out["autoscale"] = self.autoscale.to_dict()
        if hasattr(out["debug_args"], "to_dict"):
            out["debug_args"] = out["debug_args"].to_dict()
        return out
