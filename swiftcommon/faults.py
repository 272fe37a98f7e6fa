"""Whose fault a worker's 5xx is: the rule the worker writes and the gateway reads.

A worker marks an error answer that one request caused (its engine failed on that request
alone, the engine itself is fine) with ``FAULT_HEADER: REQUEST_FAULT``. A router must not
count such an answer against the worker (circuit breaker, health) and need not retry it
elsewhere: another worker would fail the same way. Unmarked 5xx stay the worker's.
"""

FAULT_HEADER = "x-swiftserve-fault"
REQUEST_FAULT = "request"
