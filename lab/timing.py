"""Simulated time: delay profiles, the time scale, and the record of every delay imposed.

A delay kind (vm_boot, talos_install_reboot, ...) has a duration in the `realistic` profile, in
seconds of the simulated world: a number, or a (low, high) range drawn with the lab's seeded
random generator. The `instant` profile makes every delay zero. The real time a delay takes is
its profile value times the time scale (`--time-scale`): 0 for tests, 1 for real-world pace,
0.1 for a ten times faster benchmark.

Every delay the lab imposes is recorded (kind, target, start, duration) so a benchmark can
rebuild the critical path; `python -m lab delays` and the control op `delays` show them.

Other simulations add their own kinds with Timing.register() when they are installed.
"""

import asyncio
import random
import time

PROFILES = ('instant', 'realistic')

# kind -> (realistic seconds, or (low, high), what the delay stands for)
DEFAULT_DELAYS = {
    'vm_boot': (20.0, 'a VM from power-on (start or reset) until its guest agent and OS answer'),
    'talos_install_reboot': (60.0, 'a Talos node installing to disk and rebooting after its first config'),
    'talos_reboot': (30.0, 'a configured Talos node rebooting'),
    'etcd_bootstrap': (20.0, 'etcd forming on the first control plane after bootstrap'),
    'image_pull': ((10.0, 30.0), 'a container image pull on a node'),
    'pod_ready': ((10.0, 30.0), 'a started container becoming Ready'),
}
MAX_RECORDS = 100000


class Timing(object):
    """The lab's clock: profile, time scale, seeded draws and the delay record."""

    def __init__(self, profile='realistic', scale=0.0, seed=None, clock=time.monotonic):
        if profile not in PROFILES:
            raise ValueError('profile must be one of %s, got %r' % (', '.join(PROFILES), profile))
        try:
            scale = float(scale)
        except (TypeError, ValueError):
            raise ValueError('time scale must be a number of real seconds per simulated second, got %r'
                             % (scale,)) from None
        if scale < 0:
            raise ValueError('time scale must be zero or more, got %r' % (scale,))
        self.profile = profile
        self.scale = scale
        self.seed = seed
        self._random = random.Random(seed)
        self._clock = clock
        self.origin = clock()
        self.kinds = {}
        self.records = []
        self._seq = 0
        for kind, (realistic, description) in DEFAULT_DELAYS.items():
            self.register(kind, realistic, description)

    # ------------------------------------------------------------------ kinds

    def register(self, kind, realistic, description=''):
        """Add a delay kind: `realistic` is seconds or a (low, high) range. Re-registering replaces it."""
        if isinstance(realistic, (tuple, list)):
            low, high = (float(x) for x in realistic)
            if not 0 <= low <= high:
                raise ValueError('delay %s: range must be 0 <= low <= high, got %r' % (kind, realistic))
            value = (low, high)
        else:
            value = float(realistic)
            if value < 0:
                raise ValueError('delay %s: seconds must be zero or more, got %r' % (kind, realistic))
        self.kinds[kind] = {'realistic': value, 'description': description}

    def describe(self):
        """Every kind with its realistic value, description, and the real seconds it takes now."""
        out = {}
        for kind, info in sorted(self.kinds.items()):
            realistic = info['realistic']
            out[kind] = {'realistic': list(realistic) if isinstance(realistic, tuple) else realistic,
                         'description': info['description'],
                         'scaled': self._scaled_text(realistic)}
        return out

    def _scaled_text(self, realistic):
        if self.profile == 'instant' or not self.scale:
            return 0.0
        if isinstance(realistic, tuple):
            return [realistic[0] * self.scale, realistic[1] * self.scale]
        return realistic * self.scale

    # ------------------------------------------------------------------ values

    @property
    def pve_time_scale(self):
        """fakepve's own time scale (real seconds per PVE second): the lab's scale, 0 in the instant profile."""
        return 0.0 if self.profile == 'instant' else self.scale

    def now(self):
        """Seconds since the lab started, on the monotonic clock."""
        return self._clock() - self.origin

    def nominal(self, kind):
        """Simulated seconds of one delay of this kind in the current profile (a range is drawn)."""
        try:
            realistic = self.kinds[kind]['realistic']
        except KeyError:
            raise KeyError('unknown delay kind %r; known: %s' % (kind, ', '.join(sorted(self.kinds)))) from None
        if self.profile == 'instant':
            return 0.0
        if isinstance(realistic, tuple):
            return self._random.uniform(*realistic)
        return realistic

    def seconds(self, kind):
        """Real seconds of one delay of this kind: nominal() times the time scale."""
        return self.nominal(kind) * self.scale

    # --------------------------------------------------------------- recording

    def begin(self, kind, target, nominal, seconds):
        """Record a delay starting now; returns the record for end()."""
        self._seq += 1
        record = {'seq': self._seq, 'kind': kind, 'target': target, 'start': round(self.now(), 6),
                  'nominal': round(nominal, 6), 'planned': round(seconds, 6), 'duration': None, 'outcome': 'running'}
        self.records.append(record)
        if len(self.records) > MAX_RECORDS:
            del self.records[:len(self.records) - MAX_RECORDS]
        return record

    def end(self, record, outcome='done'):
        """Close a record: duration is the real time it took; outcome done, cancelled or failed."""
        record['duration'] = round(self.now() - record['start'], 6)
        record['outcome'] = outcome
        return record

    async def sleep(self, kind, target):
        """Impose one delay of this kind on target (a VM name, node, pod, ...): record it and sleep.

        Returns the record. A cancelled sleep is recorded as cancelled and the cancellation goes on.
        """
        nominal = self.nominal(kind)
        seconds = nominal * self.scale
        record = self.begin(kind, target, nominal, seconds)
        try:
            if seconds > 0:
                await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.end(record, 'cancelled')
            raise
        return self.end(record)

    def query(self, since=0, kind=None, target=None):
        """Records with seq > since, optionally of one kind or target."""
        return [dict(r) for r in self.records
                if r['seq'] > since and (kind is None or r['kind'] == kind) and (target is None or r['target'] == target)]
