"""Starting (or joining) Ray: embedded on loopback by default, or an existing cluster."""

from __future__ import annotations

import logging
import os
import sys

from executor.phases import phase
from workers.ray_compat import embedded_init_kwargs
from workers.flow import object_store_bytes_for

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def machine_memory_bytes() -> int:
    """This machine's memory (Linux /proc/meminfo, else os.sysconf), 0 where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


# An embedded Ray that cstream starts for itself prints only what the user asked for, unless
# Ray's own messages are asked for (show_ray_messages): its start-up notices (warnings of the
# "ray" logger during ray.init, such as the one saying it turned token authentication on) are
# not shown, and its metrics exporter is off (the embedded cluster has no dashboard to read it,
# and where the exporter agent cannot start every worker prints connection errors). Errors
# still show; a cluster named by address is the user's own, and shows everything.
_show_ray_messages = False


def show_ray_messages(show: bool) -> None:
    """Whether an embedded Ray started from now on prints Ray's own start-up notices and
    metrics-exporter errors (``cstream run/sweep --debug``). A cluster named by address is
    the user's own: its messages are always shown."""
    global _show_ray_messages
    _show_ray_messages = bool(show)


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Make sure Ray is initialised. Returns True when this call started it.

    ``address`` names an existing cluster (the caller resolves ``RAY_ADDRESS``: it is read
    once, in :func:`cstream.backend`); otherwise an embedded Ray is started bound to
    127.0.0.1 with the dashboard off, its object store sized from the machine's memory
    (:func:`workers.flow.object_store_bytes_for`).
    """
    import ray

    if ray.is_initialized():
        return False
    common = dict(
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
        ignore_reinit_error=True,
    )
    with phase("starting Ray"):
        _init(ray, address, num_cpus, common)
    return True


def _init(ray, address, num_cpus, common) -> None:
    if address:
        ray.init(address=address, **common)
    else:
        # workers import the user's modules (input_fn, models) the way this process does. The
        # path goes in the environment the raylet inherits, not in a runtime_env: workers
        # with the default runtime_env are started ahead (Ray's prestarted workers) and the
        # driver and input-worker actors take them, instead of each starting a process of
        # its own once asked for
        paths = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)]
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        quiet = not _show_ray_messages
        ray_logger = logging.getLogger("ray")
        level = ray_logger.level
        if quiet:
            ray_logger.setLevel(logging.ERROR)
        try:
            ray.init(
                address="local",  # start our own; never join a cluster found on this machine
                num_cpus=num_cpus,  # None: Ray sizes it to the machine
                object_store_memory=object_store_bytes_for(machine_memory_bytes()),
                **embedded_init_kwargs(metrics=not quiet),
                **common,
            )
        finally:
            ray_logger.setLevel(level)
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before
