"""``ClusterConfig`` (``cerebras.pytorch.distributed.ClusterConfig``, Release 2.3 on): the cluster
a CSX backend runs on, ``cstream.backend("CSX", cluster_config=ClusterConfig(...))``.

``num_csx`` and ``num_workers_per_csx`` lay out the simulated cluster: a DataExecutor made
without a ``cs_config`` takes them from the backend's ``cluster.config``. The rest (the
management server, credentials, job labels and priority, mounts, images, notifications) are for
a real cluster's scheduler: checked, kept and without effect.

>>> c = ClusterConfig(num_csx=2, num_workers_per_csx=4)
>>> c.num_csx, c.job_priority, c.mount_dirs
(2, 'p3', [])
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass, field
from typing import List, Optional

from cstream.unsupported import UnsupportedFeatureError

log = logging.getLogger("cstream")

JOB_PRIORITIES = ("p1", "p2", "p3")
LAYOUT_FIELDS = ("num_csx", "num_workers_per_csx")


def _non_negative_int(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a non-negative integer or None. Got {value}")


@dataclass
class ClusterConfig:
    mgmt_address: Optional[str] = None
    mgmt_namespace: Optional[str] = None
    credentials_path: Optional[str] = None
    num_csx: int = 1
    max_wgt_servers: int = 0
    max_act_per_csx: int = 0
    num_workers_per_csx: int = 1
    cbcore_image: Optional[str] = None
    job_labels: List[str] = field(default_factory=list)
    job_priority: str = "p3"
    job_time_sec: Optional[int] = None
    mount_dirs: list = field(default_factory=list)
    python_paths: List[str] = field(default_factory=list)
    automount: bool = True
    mount_all: bool = True
    disable_mount_check: bool = True
    disable_version_check: bool = False
    workflow_id: Optional[str] = None
    notifications: list = field(default_factory=list)

    def __setattr__(self, name, value):
        if name in ("num_csx", "max_wgt_servers", "max_act_per_csx", "num_workers_per_csx"):
            _non_negative_int(name, value)
        elif name == "job_time_sec" and value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"job_time_sec must be a positive integer or None. Got {value}")
        elif name == "job_priority" and value not in JOB_PRIORITIES:
            raise ValueError(
                f"Invalid job priority value: {value} (should be one of {list(JOB_PRIORITIES)})")
        elif name == "job_labels":
            for label in value or ():
                if not isinstance(label, str) or "=" not in label:
                    raise ValueError(f"job_labels: each label is 'key=value', got {label!r}")
        super().__setattr__(name, value)

    def __hash__(self):
        return hash(repr(dataclasses.asdict(self)))

    def without_effect(self) -> dict:
        """The fields set away from their defaults that do not lay out the simulated cluster."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in LAYOUT_FIELDS and getattr(self, f.name) != _DEFAULTS[f.name]}


_DEFAULTS = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
             for f in dataclasses.fields(ClusterConfig)}


class Cluster:
    """``backend.cluster`` of a CSX backend: its :class:`ClusterConfig` as ``.config``;
    ``client`` (the cluster management client) is None: there is no management service.

    A workflow (the Cerebras cluster's reservation of systems across a run's compile and
    execute jobs) is started and stopped as there: its id is ``config.workflow_id`` while it
    runs. The simulated cluster has nothing to reserve, so starting one always succeeds."""

    def __init__(self, config: ClusterConfig):
        self.config = config
        self.client = None
        self._started_id: Optional[str] = None

    @property
    def workflow_id(self) -> Optional[str]:
        return self.config.workflow_id

    def start_workflow(self, lock_resources: bool = True) -> bool:
        """Start a workflow; True if one was started, False if one runs already."""
        if self.workflow_id is not None:
            log.info("Workflow is already initialized with id: %s. Stop the current workflow "
                     "before starting a new one.", self.workflow_id)
            return False
        self._started_id = self.config.workflow_id = f"wf-cstream-{uuid.uuid4().hex[:12]}"
        log.info("Successfully initialized workflow with id: %s", self.workflow_id)
        return True

    def stop_workflow(self) -> None:
        """Stop the workflow :meth:`start_workflow` started (an id given in the config stays)."""
        if self._started_id is not None and self.config.workflow_id == self._started_id:
            self.config.workflow_id = None
        self._started_id = None

    def check_storage_connectivity(self) -> None:
        """The Cerebras cluster checks it can reach an S3 checkpoint root; here no cluster
        reaches S3, so a checkpoint folder must be a local path."""
        raise UnsupportedFeatureError(
            "checkpoints in S3 storage: cstream writes checkpoints to local folders; set the "
            "checkpoint folder (model_dir / checkpoint root) to a local path.")

    @property
    def config(self) -> ClusterConfig:
        return self._config

    @config.setter
    def config(self, config: ClusterConfig):
        if not isinstance(config, ClusterConfig):
            raise TypeError(f"cluster_config: expected cstream.distributed.ClusterConfig, got "
                            f"{type(config).__name__}.")
        self._config = config


def attach_cluster(backend, config: ClusterConfig) -> None:
    """Give a CSX backend its ``cluster`` and record the settings without effect."""
    backend.cluster = Cluster(config)
    backend.accepted_without_effect.update(
        {f"cluster_config.{k}": v for k, v in config.without_effect().items()})
