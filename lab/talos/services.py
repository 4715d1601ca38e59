"""Talos services as machined reports them through ServiceList: state, events, health.

A service's state is the state of its last event. Event states are Talos' own
(internal/app/machined/pkg/system/events): Initialized, Starting, Preparing, Waiting, Running,
Stopping, Finished, Failed, Skipped. Talos keeps the last 64 events per service, oldest first;
timestamps are the real time the simulated transition happened. Talos' health check calls a
service healthy when its last event is Running and health.healthy is true.
"""

import datetime

MAX_EVENTS = 64


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


class Service(object):
    """One service of one node."""

    def __init__(self, service_id):
        self.id = service_id
        self.events = []
        self.health_known = False
        self.healthy = False
        self.health_message = ''
        self.health_changed = None

    @property
    def state(self):
        return self.events[-1][1] if self.events else 'Initialized'

    @property
    def last_message(self):
        return self.events[-1][0] if self.events else ''

    def event(self, state, message):
        """Record a transition; repeated identical events are not duplicated."""
        if self.events and self.events[-1][:2] == (message, state):
            return
        self.events.append((message, state, _now()))
        del self.events[:-MAX_EVENTS]

    def set_health(self, healthy, message=''):
        if not self.health_known or self.healthy != healthy or self.health_message != message:
            self.health_changed = _now()
        self.health_known = True
        self.healthy = healthy
        self.health_message = message

    def clear_health(self):
        self.health_known = False
        self.healthy = False
        self.health_message = ''

    @property
    def is_healthy(self):
        return self.state == 'Running' and self.health_known and self.healthy

    def to_proto(self, message_class):
        """A machine.ServiceInfo."""
        info = message_class(id=self.id, state=self.state)
        for text, state, when in self.events:
            event = info.events.events.add(msg=text, state=state)
            event.ts.FromDatetime(when)
        info.health.unknown = not self.health_known
        info.health.healthy = self.healthy
        info.health.last_message = self.health_message
        if self.health_changed is not None:
            info.health.last_change.FromDatetime(self.health_changed)
        return info

    def summary(self):
        health = 'unknown' if not self.health_known else ('healthy' if self.healthy else 'unhealthy')
        return '%s/%s' % (self.state, health)
