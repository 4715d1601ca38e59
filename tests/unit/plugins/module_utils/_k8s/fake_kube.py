"""An in-memory stand-in for KubeClient that a fake clock (tests/helpers.py FakeClock) moves through scripted states.

FakeKube serves the same narrow interface the gates use (list/get/resource/readyz, `requests`,
`deadline`). Its objects can change with time: `at(seconds, change)` runs `change(fake)` once the
fake clock passes that time, so a test can say "the Cilium pod on w-2 becomes Ready after 6 s".
"""
import copy
import os

import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import objects

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures')


_PARSED = {}


def fixture(filename, name):
    """A deep copy of the fixture object with that name (files are parsed once)."""
    if filename not in _PARSED:
        with open(os.path.join(FIXTURES, filename)) as handle:
            _PARSED[filename] = yaml.safe_load(handle)  # one document: a list of objects
    for doc in _PARSED[filename]:
        if doc['metadata']['name'] == name:
            return copy.deepcopy(doc)
    raise KeyError('%s has no object named %s' % (filename, name))


class FakeKube(object):
    """Objects by (apiVersion, kind); served kinds; scripted changes and failures."""

    def __init__(self, clock=None):
        self.store = {}
        self.served = dict(k8s_client.KNOWN_RESOURCES)
        self.requests = 0
        self.deadline = None
        self.readyz_answers = [(200, 'ok')]
        self.verbose_readyz = (200, 'ok')
        self.fail_next = []  # exceptions raised by the next requests, in order
        self.script = []
        self.calls = []
        if clock is not None:
            clock.listeners.append(self._advance)

    # --- set-up -----------------------------------------------------------------------------

    def add(self, *objs):
        for obj in objs:
            key = (obj.get('apiVersion'), obj.get('kind'))
            self.store.setdefault(key, []).append(obj)
        return self

    def serve(self, api_version, kind, plural, namespaced=True):
        self.served[(api_version, kind)] = (plural, namespaced)

    def at(self, seconds, change):
        self.script.append([seconds, change, False])
        return self

    def find(self, kind, name):
        for (unused_version, stored_kind), objs in self.store.items():
            if stored_kind == kind:
                for obj in objs:
                    if objects.name(obj) == name:
                        return obj
        raise KeyError(name)

    def remove(self, kind, name):
        for (unused_version, stored_kind), objs in self.store.items():
            if stored_kind == kind:
                objs[:] = [obj for obj in objs if objects.name(obj) != name]

    def _advance(self, elapsed):
        for entry in self.script:
            if not entry[2] and elapsed >= entry[0]:
                entry[2] = True
                entry[1](self)

    # --- the KubeClient interface ------------------------------------------------------------

    def _request(self, what):
        self.requests += 1
        self.calls.append(what)
        if self.fail_next:
            raise self.fail_next.pop(0)

    def resource(self, api_version, kind):
        self._request(('resource', api_version, kind))
        return self.served.get((api_version, kind))

    def _check_served(self, api_version, kind):
        if (api_version, kind) not in self.served:
            raise k8s_client.NotServed(api_version, kind)

    def list(self, api_version, kind, namespace=None, label_selector=None, field_selector=None):
        self._request(('list', kind, namespace, label_selector, field_selector))
        self._check_served(api_version, kind)
        result = []
        for obj in self.store.get((api_version, kind), []):
            meta = objects.metadata(obj)
            if namespace and meta.get('namespace') != namespace:
                continue
            if label_selector and not _equality_selector_matches(label_selector, objects.labels(obj)):
                continue
            if field_selector:
                key, value = field_selector.split('=', 1)
                if key == 'spec.nodeName' and objects.pod_node(obj) != value:
                    continue
            result.append(copy.deepcopy(obj))
        return result

    def get(self, api_version, kind, name, namespace=None):
        self._request(('get', kind, namespace, name))
        self._check_served(api_version, kind)
        for obj in self.store.get((api_version, kind), []):
            meta = objects.metadata(obj)
            if meta.get('name') == name and (namespace is None or meta.get('namespace') == namespace):
                return copy.deepcopy(obj)
        return None

    def readyz(self, verbose=False):
        self._request(('readyz', verbose))
        if verbose:
            return self.verbose_readyz
        if len(self.readyz_answers) > 1:
            return self.readyz_answers.pop(0)
        return self.readyz_answers[0]


def _equality_selector_matches(selector, labels):
    for part in selector.split(','):
        part = part.strip()
        if '!=' in part:
            key, value = part.split('!=', 1)
            if labels.get(key) == value:
                return False
        elif '=' in part:
            key, value = part.split('=', 1)
            if labels.get(key) != value:
                return False
        elif labels.get(part) is None:
            return False
    return True


def transient(text='connection refused'):
    return _errors.TransientApiError('Kubernetes API at https://127.0.0.1:6443 unreachable: %s' % text,
                                     service='Kubernetes API')
