"""A run's input on the wafer's side: one input stream per CS-X, the feed that fills the
input buffers from them, the input checks' findings, and -- where the run autoscales -- the
controller that changes the streams' workers.

:func:`open_run_input` is what :meth:`executor.driver.WaferDriver.open_input` does: it
starts the streams (on Ray, or in this process), waits for their first batches' sample keys,
checks them for duplicates, and decides once whether the run can autoscale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from executor.wafer import autoscaler as autoscale
from executor.wafer.autoscaler import RunAutoscaler
from executor.wafer.feed import InputFeed
from workers.duplicates import check_streams
from workers.errors import AutoscaleError
from workers.flow import FlowPolicy


@dataclass
class RunInput:
    feed: InputFeed
    cs_config: object
    """The run's layout as it runs: autoscaling switched off where it was not possible."""
    duplicates: Optional[dict]
    """The duplicate check's report (:mod:`workers.duplicates`), or None."""
    autoscaler: Optional[RunAutoscaler]
    autoscale_not_possible: Optional[str]
    """Why a run asked for 0 or None workers per CS-X keeps a fixed count (None: it did not)."""


def open_run_input(dataloader, cs_config, resume_states, policy: FlowPolicy, workers_ahead,
                   use_ray_workers: bool) -> RunInput:
    if use_ray_workers:
        from workers.stream import configured_stream as Stream
    else:
        workers_ahead = None  # in-process streams start no workers
        from workers.local_stream import LocalInputStream as Stream
    not_possible = None
    if cs_config.autoscaling:
        try:
            autoscale.check_stream_kind(use_ray_workers)
        except AutoscaleError as refusal:
            cs_config = autoscale.fixed_where_unchangeable(cs_config, refusal)
            not_possible = str(refusal)
    autoscale_state = None
    if cs_config.autoscaling:
        autoscale_state = (getattr(dataloader, "resume_state", None) or {}).get("autoscale")
    streams = []
    try:
        for c, (cfg, states) in enumerate(autoscale.start_layouts(cs_config, resume_states)):
            streams.append(Stream(dataloader, cfg, c, resume_states=states, zero_copy=True,
                                  policy=policy,
                                  workers_ahead=None if workers_ahead is None
                                  else workers_ahead[c]))
        feed = InputFeed(streams, policy, cs_config)
        feed.wait_for_sample_keys()
        report = check_streams(streams, dataloader.input_fn_name, cs_config.duplicate_samples)
        if cs_config.autoscaling:
            try:
                autoscale.check_reformable(streams, dataloader.input_fn_name)
            except AutoscaleError as refusal:
                cs_config = autoscale.fixed_where_unchangeable(cs_config, refusal)
                not_possible = str(refusal)
        autoscaler = None
        if cs_config.autoscaling:
            autoscaler = RunAutoscaler(cs_config, [s.active_workers() for s in streams],
                                       policy.input_buffer_batches,
                                       cluster_cpus=autoscale.cluster_cpus,
                                       state=autoscale_state)
            feed.autoscaler = autoscaler
    except BaseException:
        for s in streams:
            s.close()
        raise
    return RunInput(feed=feed, cs_config=cs_config,
                    duplicates=None if report is None else report.to_dict(),
                    autoscaler=autoscaler, autoscale_not_possible=not_possible)
