"""``cerebras.appliance`` in cstream: the appliance client's modules that Cerebras programs import.

There is no appliance here: the simulated cluster runs on this machine. These modules give the
names their local meaning: :mod:`.environment` (variables that reach the input workers'
processes), :mod:`.errors` (the error classes programs catch), :mod:`.run_utils` (debug args,
recorded and otherwise without effect), :mod:`.log` (the cluster servers' loggers, recorded) and
:mod:`.utils` (file and unit helpers). See docs/modelzoo.md.
"""

from cstream.appliance import cluster, environment, errors, log, run_utils, storage, utils
from cstream.appliance.log import logger

__all__ = ["cluster", "environment", "errors", "log", "logger", "run_utils", "storage", "utils"]
