"""Label and field selectors, parsed the way the API server parses them."""

import re

from .errors import ApiError

_KEY = r'[A-Za-z0-9][-A-Za-z0-9_./]*'
_SET_RE = re.compile(r'^\s*(!?)\s*(%s)\s*(?:(notin|in)\s*\(([^)]*)\)|(==|=|!=)\s*([^,\s]*))?\s*$' % _KEY)


def _split_top(text):
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == '(':
            depth += 1
        elif char == ')':
            depth -= 1
        if char == ',' and depth == 0:
            parts.append(''.join(current))
            current = []
        else:
            current.append(char)
    parts.append(''.join(current))
    return [part for part in parts if part.strip()]


class LabelSelector:
    """A parsed labelSelector: equality- and set-based requirements, all of which must hold."""

    def __init__(self, text):
        self.text = text or ''
        self.requirements = []
        for part in _split_top(self.text):
            match = _SET_RE.match(part)
            if not match:
                raise ApiError(400, 'BadRequest', 'unable to parse requirement: %r' % part.strip())
            negate, key, set_op, values, eq_op, value = match.groups()
            if negate and (set_op or eq_op):
                raise ApiError(400, 'BadRequest', 'unable to parse requirement: %r' % part.strip())
            if set_op:
                self.requirements.append((key, set_op, {v.strip() for v in values.split(',') if v.strip()}))
            elif eq_op:
                self.requirements.append((key, '!=' if eq_op == '!=' else '=', value))
            else:
                self.requirements.append((key, '!' if negate else 'exists', None))

    def matches(self, labels):
        labels = labels or {}
        for key, op, value in self.requirements:
            present = key in labels
            if op == '=' and labels.get(key) != value:
                return False
            if op == '!=' and present and labels[key] == value:
                return False
            if op == 'in' and (not present or labels[key] not in value):
                return False
            if op == 'notin' and present and labels[key] in value:
                return False
            if op == 'exists' and not present:
                return False
            if op == '!' and present:
                return False
        return True

    def __bool__(self):
        return bool(self.requirements)


def match_label_selector(selector, labels):
    """A metav1.LabelSelector object (matchLabels/matchExpressions) against labels."""
    labels = labels or {}
    if selector is None:
        return False
    for key, value in (selector.get('matchLabels') or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get('matchExpressions') or ():
        key, op, values = expr.get('key'), expr.get('operator'), expr.get('values') or []
        if op == 'In' and labels.get(key) not in values:
            return False
        if op == 'NotIn' and key in labels and labels[key] in values:
            return False
        if op == 'Exists' and key not in labels:
            return False
        if op == 'DoesNotExist' and key in labels:
            return False
    return True


def field_value(obj, path):
    """The value a field selector compares: dotted path, bools as 'true'/'false', missing as ''."""
    value = obj
    for part in path.split('.'):
        if not isinstance(value, dict):
            return ''
        value = value.get(part)
    if value is None:
        return ''
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return str(value)


class FieldSelector:
    """A parsed fieldSelector (=, ==, != on the fields the resource supports)."""

    def __init__(self, text, rtype):
        self.text = text or ''
        self.requirements = []
        allowed = {'metadata.name', 'metadata.namespace'} | set(rtype.selectable if rtype else ())
        for part in _split_top(self.text):
            match = re.match(r'^\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*$', part)
            if not match:
                raise ApiError(400, 'BadRequest', 'invalid selector: %r; can\'t understand %r' % (self.text, part))
            key, op, value = match.groups()
            if key not in allowed:
                raise ApiError(400, 'BadRequest', 'field label not supported: %s' % key)
            self.requirements.append((key, op != '!=', value))

    def matches(self, obj):
        for key, equal, value in self.requirements:
            if (field_value(obj, key) == value) != equal:
                return False
        return True

    def __bool__(self):
        return bool(self.requirements)
