"""The appliance client's error classes, under the names Cerebras programs catch.

They exist so that ``except`` clauses in Cerebras programs name real classes. cstream's
simulated cluster raises none of them: it has no appliance to fail (a NaN loss is computed and
returned, as on the CPU backend).
"""


class ApplianceClientException(Exception):
    """Base of the appliance client's errors."""


class ApplianceUnknownError(ApplianceClientException):
    pass


class ApplianceCorruptionError(ApplianceClientException):
    pass


class ApplianceDeadlockError(ApplianceClientException):
    pass


class ApplianceHealthPollException(ApplianceCorruptionError):
    pass


class ApplianceNanError(ApplianceClientException):
    """A NaN was found in the run's results."""


class ApplianceTensorDropped(ApplianceClientException):
    pass


class ApplianceDropModeComplete(ApplianceClientException):
    pass


class ApplianceRequestCancelled(ApplianceClientException):
    pass


class ApplianceCompilationError(ApplianceClientException):
    pass


class ApplianceRuntimeServerError(ApplianceClientException):
    pass


class ApplianceServiceInterrupted(ApplianceClientException):
    pass


class ApplianceRuntimeJobTimeoutError(ApplianceClientException):
    pass


class ApplianceVersionError(ApplianceClientException):
    pass


class ApplianceResourceExhausted(ApplianceClientException):
    pass


class ClusterJobCancelledByCsctl(ApplianceClientException):
    pass


class ClusterJobScheduleError(ApplianceClientException):
    pass


class ClusterJobInitError(ApplianceClientException):
    pass
