"""Run every module test as a module process runs.

A module's warnings land in its result only when ansible-core does not think it is the controller:
once any test of the session imports controller code (callbacks, lookups, the vault library),
ansible.module_utils._internal.is_controller turns True for the rest of the process and
AnsibleModule.warn sends warnings to Display instead. Each module test gets the module-side view.
"""
import pytest

from ansible.module_utils import _internal


@pytest.fixture(autouse=True)
def module_process(monkeypatch):
    monkeypatch.setattr(_internal, 'is_controller', False)
