# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Template the same variables for many hosts, each template compiled once. PRIVATE to the collection.

Templating a variable for a host compiles each template string it meets anew (ansible-core keeps no compiled
templates between templatings). Reading the same variables for every host of a 96-node inventory - a role's inputs
(proxtalos.cluster.host_values), the hosts' own option values (filter host_arguments) - compiles the same strings 96
times: most of the time of such a read. A compiled template does not depend on the variables it is rendered with, so
compile_once_engines() gives a factory of template engines, one per host, each made over that host's variables (never
switched to another host's: a dict or list value templated inside another template stays a lazy container bound to
its engine, and is rendered later with that engine's variables), that share the templates compiled by any of them,
keyed by the template text, its data tags (origin, trust) and the templating options; every value is still rendered
from the variables of its own engine.

Built on ansible-core's template engine (ansible._internal._templating._engine.TemplateEngine._compile_template,
2.19 to 2.21; tests/unit/plugins/plugin_utils/test_compile_once.py fails when a core stops calling it); on a core
without it, compile_once_engines() returns None and callers template as before (Templar, hostvars[host]).
"""

from __future__ import annotations

from ansible.template import Templar

try:
    from ansible._internal._templating import _engine
    from ansible.module_utils._internal._datatag import AnsibleTagHelper
except ImportError:  # an ansible-core without them: no compile cache
    _engine = AnsibleTagHelper = None


def compile_once_engines(loader):
    """A factory engine(variables) -> a TemplateEngine over those variables; the engines of one factory share their
    compiled templates (see the module docstring). None when this ansible-core has no such hook."""
    if _engine is None or not callable(getattr(_engine.TemplateEngine, '_compile_template', None)):
        return None
    compiled = {}

    class CompileOnceTemplateEngine(_engine.TemplateEngine):
        """TemplateEngine whose compiled templates are kept (compiling is independent of the variables)."""

        def _compile_template(self, template, *args, **kwargs):
            try:
                key = (str(template), frozenset(AnsibleTagHelper.tags(template)), args, frozenset(kwargs.items()))
                hash(key)
            except TypeError:  # a tag or an option that cannot be a key: compile as usual
                return super()._compile_template(template, *args, **kwargs)
            if key not in compiled:
                compiled[key] = super()._compile_template(template, *args, **kwargs)
            return compiled[key]

    def engine(variables):
        return CompileOnceTemplateEngine(loader=loader, variables=variables)

    return engine


def template_with(loader, engines, variables, value):
    """value templated with variables: through an engine of the factory engines (compile_once_engines) when there is
    one, else through a plain Templar."""
    if engines is None:
        return Templar(loader=loader, variables=variables).template(value)
    return engines(variables).template(value)


class HostVariables(object):
    """Hosts' own variables (hostvars: inventory, facts, extra vars) read through one compile-once engine.

    values(host) -> a mapping-like view of the host's variables that templates on access, as hostvars[host] does
    (HostVarsVars: the host's merged variables, templated with themselves as the context)."""

    def __init__(self, hostvars):
        self.hostvars = hostvars
        loader = getattr(hostvars, '_loader', None)
        self.engines = compile_once_engines(loader) if callable(getattr(hostvars, 'raw_get', None)) else None

    def values(self, host):
        if self.engines is None:
            return self.hostvars[host]
        raw = self.hostvars.raw_get(host)
        if not isinstance(raw, dict):
            return self.hostvars[host]  # a host the inventory does not have: hostvars says so, as before
        return _View(self.engines(raw), raw)

    def view(self, raw):
        """A view over variables already read (hostvars.raw_get), or None without the compile-once engine."""
        return _View(self.engines(raw), raw) if self.engines is not None else None


class _View(object):
    """A host's variables, templated on access with themselves as the context (as HostVarsVars), through an engine
    made over them alone."""

    def __init__(self, engine, variables):
        self._engine = engine
        self._vars = variables

    def __contains__(self, name):
        return name in self._vars

    def __getitem__(self, name):
        return self._engine.template(self._vars[name])

    def get(self, name, default=None):
        return self[name] if name in self._vars else default
