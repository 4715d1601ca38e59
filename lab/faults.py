"""The fault registry: every simulation registers its faults here; `lab fault` and `lab clear` use it.

A fault has a name, a description, the kind of target it takes (a VM id, a node, an operation,
...) and its parameters with types and defaults. `apply(target, **params)` makes it happen and
`clear(target)` undoes it; both may be coroutines. An applied fault stays active until it is
cleared, or until its implementation calls `expire()` (a fault that ends by itself: N failed
calls, a lock held for a while).

    world.faults.register(
        'talos-unreachable', 'the node stops answering on port 50000', 'talos-node',
        apply=fleet.make_unreachable, clear=fleet.make_reachable)
"""

import inspect

TYPES = {'int': int, 'float': float, 'str': str, 'bool': bool}
KIND_NAMES = {int: 'an integer', float: 'a number', str: 'a string', bool: 'a boolean (true or false)'}
TRUE = ('1', 'true', 'yes', 'on')
FALSE = ('0', 'false', 'no', 'off')


class FaultError(Exception):
    """A fault request the lab refuses: unknown name, missing target, bad parameter."""


class Param(object):
    """One parameter of a fault: name, type (int, float, str, bool), default and help text."""

    def __init__(self, name, kind=str, default=None, help=''):  # pylint: disable=redefined-builtin
        if kind not in TYPES.values():
            raise ValueError('parameter %s: type must be int, float, str or bool' % name)
        self.name = name
        self.kind = kind
        self.default = default
        self.help = help

    def convert(self, fault, value):
        """The value as this parameter's type, or FaultError naming the fault, parameter and value."""
        if value is None:
            return None
        try:
            if self.kind is bool:
                if isinstance(value, bool):
                    return value
                text = str(value).strip().lower()
                if text in TRUE:
                    return True
                if text in FALSE:
                    return False
                raise ValueError(value)
            if self.kind is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return self.kind(value)
        except (TypeError, ValueError):
            raise FaultError('fault %s: parameter %s must be %s, got %r'
                             % (fault, self.name, KIND_NAMES[self.kind], value)) from None

    def describe(self):
        return {'name': self.name, 'type': self.kind.__name__, 'default': self.default, 'help': self.help}


class Fault(object):
    """A registered fault."""

    def __init__(self, name, description, target_kind, apply, clear, params=(), target_required=None):
        self.name = name
        self.description = description
        self.target_kind = target_kind
        self.target_required = bool(target_kind) if target_required is None else target_required
        self.apply = apply
        self.clear = clear
        self.params = dict((p.name, p) for p in params)

    def usage(self):
        target = ''
        if self.target_kind:
            target = (' %s' if self.target_required else ' [%s]') % self.target_kind.upper()
        params = ''.join(' [%s=%s]' % (p.name, '' if p.default is None else p.default) for p in self.params.values())
        return self.name + target + params

    def describe(self):
        return {'name': self.name, 'description': self.description, 'target_kind': self.target_kind,
                'target_required': self.target_required, 'params': [p.describe() for p in self.params.values()],
                'usage': self.usage()}


async def _call(function, *args, **kwargs):
    result = function(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class FaultRegistry(object):
    """Faults by name, and the ones active now, keyed by (name, target)."""

    def __init__(self, clock=None):
        self.faults = {}
        self.active = {}
        self._clock = clock

    def register(self, name, description, target_kind, apply, clear, params=(), target_required=None):
        """Register a fault. target_kind: None (no target) or a word naming what TARGET is ('vmid', 'node', ...).

        apply(target, **params) and clear(target) may be plain functions or coroutines; apply may
        raise FaultError for a target that does not exist. params: Param objects.
        """
        if name in self.faults:
            raise ValueError('fault %r is registered already' % name)
        self.faults[name] = Fault(name, description, target_kind, apply, clear, params, target_required)

    def describe(self):
        """Every fault, sorted by name, with the active instances."""
        out = []
        for name in sorted(self.faults):
            item = self.faults[name].describe()
            item['active'] = [dict(a) for key, a in self.active.items() if key[0] == name]
            out.append(item)
        return out

    def _fault(self, name):
        fault = self.faults.get(name)
        if fault is None:
            raise FaultError('unknown fault %r; known faults: %s' % (name, ', '.join(sorted(self.faults)) or 'none'))
        return fault

    def _params(self, fault, given):
        unknown = sorted(set(given) - set(fault.params))
        if unknown:
            raise FaultError('fault %s has no parameter %s; it takes: %s' % (
                fault.name, ', '.join(unknown), ', '.join(sorted(fault.params)) or 'no parameters'))
        values = {}
        for name, param in fault.params.items():
            values[name] = param.convert(fault.name, given[name]) if name in given else param.default
        return values

    async def apply(self, name, target=None, params=None):
        """Apply a fault; returns the active record {name, target, params, since, detail}."""
        fault = self._fault(name)
        target = None if target in (None, '') else str(target)
        if fault.target_required and target is None:
            raise FaultError('fault %s needs a target: %s' % (name, fault.usage()))
        if not fault.target_kind and target is not None:
            raise FaultError('fault %s takes no target, got %r: %s' % (name, target, fault.usage()))
        values = self._params(fault, dict(params or {}))
        detail = await _call(fault.apply, target, **values)
        record = {'name': name, 'target': target, 'params': values,
                  'since': round(self._clock(), 3) if self._clock else None}
        if detail is not None:
            record['detail'] = detail
        self.active[(name, target)] = record
        return dict(record)

    async def clear(self, name=None, target=None):
        """Clear active faults: all, all of one name, or one (name, target). Returns the cleared records.

        Clearing a fault that is not active is not an error (nothing to do); an unknown name is.
        """
        if name is not None:
            self._fault(name)
        target = None if target in (None, '') else str(target)
        cleared = []
        for key in list(self.active):
            if (name is None or key[0] == name) and (target is None or key[1] == target):
                record = self.active.pop(key)
                await _call(self.faults[key[0]].clear, key[1])
                cleared.append(record)
        return cleared

    def expire(self, name, target=None):
        """A fault ended by itself (its implementation already undid it): drop it from the active list."""
        return self.active.pop((name, None if target in (None, '') else str(target)), None)

    def is_active(self, name, target=None):
        return (name, None if target in (None, '') else str(target)) in self.active
