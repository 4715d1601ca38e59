"""plugins/plugin_utils/_compile_once.py: engines, one per host, that share their compiled templates.

The compile cache rests on a private hook of ansible-core (TemplateEngine._compile_template): the first test fails when
a core no longer calls it, so that CI says so instead of the collection silently getting slower. The fallbacks (no
hook: a plain Templar, hostvars[host]) are forced and give the same values.
"""
import pytest

from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.hostvars import HostVars
from ansible.vars.manager import VariableManager

from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _compile_once

HOSTS = (('h1', 1), ('h2', 5), ('h3', 7))
VALUE = {'name': '{{ inventory_hostname }}', 'size': '{{ base | int * 2 }}', 'list': ['{{ inventory_hostname }}', '{{ base }}']}


def expected(host, base):
    return {'name': host, 'size': base * 2, 'list': [host, base]}


def trusted(value):
    """Variables as the inventory gives them: strings trusted as templates."""
    from ansible.template import trust_as_template
    if isinstance(value, dict):
        return dict((key, trusted(item)) for key, item in value.items())
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return trust_as_template(value) if isinstance(value, str) else value


def host_variables(host, base):
    return {'inventory_hostname': host, 'base': base, 'value': trusted(VALUE), 'whole': trusted('{{ value }}')}


def test_the_compile_hook_is_active_on_this_ansible_core(monkeypatch):
    engines = _compile_once.compile_once_engines(DataLoader())
    assert engines is not None, 'ansible-core has no TemplateEngine._compile_template: no compile cache'
    calls = []
    real = _compile_once._engine.TemplateEngine._compile_template

    def counting(self, template, *args, **kwargs):
        calls.append(str(template))
        return real(self, template, *args, **kwargs)

    monkeypatch.setattr(_compile_once._engine.TemplateEngine, '_compile_template', counting)
    for host, base in HOSTS:
        assert engines(host_variables(host, base)).template(trusted('{{ value }}')) == expected(host, base)
    # every template compiled once for the three hosts (0 calls: the core no longer compiles through the hook)
    assert sorted(calls) == sorted(set(calls)) and '{{ inventory_hostname }}' in calls, calls


def test_the_hook_passes_a_changed_signature_through(monkeypatch):
    # a core whose _compile_template takes another argument: passed through, and part of the cache key
    seen = []

    def compile_template(self, template, options, extra=None, **kwargs):
        seen.append((str(template), extra, kwargs))
        return lambda variables: '%s/%s' % (extra, variables['inventory_hostname'])

    monkeypatch.setattr(_compile_once._engine.TemplateEngine, '_compile_template', compile_template)
    engine = _compile_once.compile_once_engines(DataLoader())({'inventory_hostname': 'h1'})
    options = _compile_once._engine.TemplateOptions.DEFAULT
    for extra in ('a', 'b', 'a'):
        assert engine._compile_template(trusted('{{ x }}'), options, extra, more=1)(engine.available_variables) == extra + '/h1'
    assert seen == [('{{ x }}', 'a', {'more': 1}), ('{{ x }}', 'b', {'more': 1})]


@pytest.mark.parametrize('hook', [True, False])
def test_template_with_gives_each_host_its_own_values(monkeypatch, hook):
    if not hook:
        monkeypatch.setattr(_compile_once, '_engine', None)
    loader = DataLoader()
    engines = _compile_once.compile_once_engines(loader)
    assert (engines is not None) is hook
    for host, base in HOSTS:
        variables = host_variables(host, base)
        assert _compile_once.template_with(loader, engines, variables, variables['value']) == expected(host, base)
        assert _compile_once.template_with(loader, engines, variables, variables['whole']) == expected(host, base)


def test_an_engine_does_not_see_another_engines_variables():
    engines = _compile_once.compile_once_engines(DataLoader())
    first = engines(host_variables('h1', 1))
    engines(host_variables('h2', 5)).template(trusted('{{ value }}'))
    assert first.available_variables['inventory_hostname'] == 'h1'
    assert first.template(trusted('{{ value }}')) == expected('h1', 1)


@pytest.fixture
def hostvars():
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[])
    manager.groups['all'].set_variable('value', trusted(VALUE))
    for host, base in HOSTS:
        manager.add_host(host, group='all')
        manager.get_host(host).set_variable('base', base)
    return HostVars(inventory=manager, variable_manager=VariableManager(loader=loader, inventory=manager), loader=loader)


class WithoutRawGet(object):
    """hostvars of a core without raw_get: hostvars[host] only."""

    def __init__(self, hostvars):
        self._loader = hostvars._loader
        self._hostvars = hostvars

    def __getitem__(self, host):
        return self._hostvars[host]


@pytest.mark.parametrize('fallback', [None, 'no hook', 'no raw_get'])
def test_host_variables_are_hostvars_values_also_on_the_fallbacks(monkeypatch, hostvars, fallback):
    if fallback == 'no hook':
        monkeypatch.setattr(_compile_once, '_engine', None)
    reader = _compile_once.HostVariables(WithoutRawGet(hostvars) if fallback == 'no raw_get' else hostvars)
    assert (reader.engines is None) is (fallback is not None)
    views = [(host, base, reader.values(host)) for host, base in HOSTS]
    for host, base, view in views:
        assert 'value' in view and view.get('absent') is None
        assert view['value'] == expected(host, base) == hostvars[host]['value']
