# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Error types raised by the collection's helpers. PRIVATE to the collection.

Helpers raise these; only a module's main() turns them into fail_json. Each error carries a
message meant for the user (what failed, where, why) and a dict of details that goes into the
module result unchanged, so a failed task shows what was observed.
"""

from __future__ import annotations


class ProxtalosError(Exception):
    """Base class: message for humans, details for the result."""

    def __init__(self, message, **details):
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self):
        return self.message


class ValidationError(ProxtalosError):
    """An input value is wrong; `field` names it."""

    def __init__(self, field, reason, **details):
        super().__init__("%s: %s" % (field, reason), field=field, **details)
        self.field = field
        self.reason = reason


class ApiError(ProxtalosError):
    """A remote API (PVE, Talos, Kubernetes) answered with an error."""

    def __init__(self, message, service=None, status=None, **details):
        super().__init__(message, service=service, status=status, **details)
        self.service = service
        self.status = status


class TransientApiError(ApiError):
    """An API error worth retrying: 5xx, lock timeouts, connection resets, Unavailable."""


class TaskFailed(ApiError):
    """A remote task (a PVE UPID) ended in error."""


class WaitTimeout(ProxtalosError):
    """A wait ran out of time; `result` is the last WaitResult, with what was observed."""

    def __init__(self, message, result, **details):
        super().__init__(message, elapsed=round(result.elapsed, 3), attempts=result.attempts,
                         last_observation=result.observation, **details)
        self.result = result
