"""Fixtures for the Kubernetes gate tests: real-looking objects from fixtures/*.yaml."""
import copy
import os

import pytest
import yaml

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures')


def _load(filename):
    with open(os.path.join(FIXTURES, filename)) as handle:
        docs = yaml.safe_load(handle)  # one document: a list of objects
    return dict((doc['metadata']['name'], doc) for doc in docs)


class Objects(object):
    """Deep copies of fixture objects by file and name, so a test may change them freely."""

    def __init__(self):
        self._files = {}

    def get(self, filename, name):
        if filename not in self._files:
            self._files[filename] = _load(filename)
        return copy.deepcopy(self._files[filename][name])

    def node(self, name):
        return self.get('nodes.yaml', name)

    def pod(self, name):
        return self.get('pods.yaml', name)

    def workload(self, name):
        return self.get('workloads.yaml', name)

    def crd(self, name):
        return self.get('crds.yaml', name)

    def flux(self, name):
        return self.get('flux.yaml', name)


@pytest.fixture
def k8s_objects():
    return Objects()
