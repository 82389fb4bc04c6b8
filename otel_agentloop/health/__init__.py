"""Is the run healthy: training-health signals from each step's metrics, representative validation
generations, and the watchdog that tells hung samples from slow ones while a step runs."""

from ..core._inflight import InflightSample
from ..metrics._table import OverdueSample
from ._training import Alert, HealthKeys, HealthMonitor, HealthSummary, HealthThresholds
from ._validation import ValidationCapture
from ._watchdog import WatchdogSettings

__all__ = [
    "Alert",
    "HealthKeys",
    "HealthMonitor",
    "HealthSummary",
    "HealthThresholds",
    "InflightSample",
    "OverdueSample",
    "ValidationCapture",
    "WatchdogSettings",
]
