# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""YAML read and written the way Talos does. PRIVATE to the collection.

Talos decodes YAML with Go's yaml.v3, which follows YAML 1.2: only true/false are booleans
(`auto: off` is the string "off"), `0o755` and `0755` are octal integers, and timestamps stay
strings. PyYAML's SafeLoader follows YAML 1.1 (`off`/`no`/`yes` become booleans, `1:20` an
integer), so a patch read by it could mean something else than it means to Talos. `load_all`
uses a loader with YAML 1.2 core-schema scalars, over libyaml's parser when PyYAML has it (a machine config parses in
about a tenth of the time: the apply and the render read every node's config); a text libyaml refuses is parsed again
by PyYAML's own parser, whose error is the one reported.

`dump_all` writes deterministic text: keys in insertion order, two-space indents with
indented sequences, no line wrapping, multi-line strings as literal blocks. The same data
always gives the same bytes, so "unchanged" is a byte comparison.

YAML errors never quote the document: the message carries the problem and the line/column
only, because the document may hold keys and tokens.
"""

from __future__ import annotations

import re

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError

try:
    import yaml
    HAS_YAML = True
    YAML_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by the sanity import test
    yaml = None
    HAS_YAML = False
    YAML_IMPORT_ERROR = exc


_BOOL_RE = re.compile(r'^(?:true|True|TRUE|false|False|FALSE)$')
_INT_RE = re.compile(r'^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$')
_FLOAT_RE = re.compile(r'^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$')
_NULL_RE = re.compile(r'^(?:~|null|Null|NULL|)$')


def _construct_bool(loader, node):
    return loader.construct_scalar(node) in ('true', 'True', 'TRUE')


def _construct_int(loader, node):
    text = loader.construct_scalar(node)
    sign = 1
    if text[:1] in '+-':
        sign = -1 if text[0] == '-' else 1
        text = text[1:]
    if text.startswith('0o'):
        return sign * int(text[2:], 8)
    if text.startswith('0x'):
        return sign * int(text[2:], 16)
    if len(text) > 1 and text.startswith('0'):
        # yaml.v3 parses a leading zero as octal (Go strconv base 0); 08/09 are not octal.
        try:
            return sign * int(text, 8)
        except ValueError:
            return sign * int(text, 10)
    return sign * int(text, 10)


def _construct_float(loader, node):
    text = loader.construct_scalar(node)
    lowered = text.lower()
    if lowered.endswith('.inf'):
        return float('-inf') if lowered.startswith('-') else float('inf')
    if lowered == '.nan':
        return float('nan')
    return float(text)


if HAS_YAML:
    class TalosLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
        """SafeLoader with YAML 1.2 core-schema scalars (what Go's yaml.v3 reads)."""

    # Start from no implicit resolvers, then add the YAML 1.2 core schema ones.
    TalosLoader.yaml_implicit_resolvers = {}
    TalosLoader.add_implicit_resolver('tag:yaml.org,2002:bool', _BOOL_RE, list('tTfF'))
    TalosLoader.add_implicit_resolver('tag:yaml.org,2002:int', _INT_RE, list('-+0123456789'))
    TalosLoader.add_implicit_resolver('tag:yaml.org,2002:float', _FLOAT_RE, list('-+0123456789.'))
    TalosLoader.add_implicit_resolver('tag:yaml.org,2002:null', _NULL_RE, ['~', 'n', 'N', ''])
    TalosLoader.add_implicit_resolver('tag:yaml.org,2002:merge', re.compile(r'^(?:<<)$'), ['<'])
    TalosLoader.add_constructor('tag:yaml.org,2002:bool', _construct_bool)
    TalosLoader.add_constructor('tag:yaml.org,2002:int', _construct_int)
    TalosLoader.add_constructor('tag:yaml.org,2002:float', _construct_float)
    # An explicit !!timestamp stays text, as in Talos.
    TalosLoader.add_constructor('tag:yaml.org,2002:timestamp', yaml.SafeLoader.construct_yaml_str)

    if getattr(yaml, 'CSafeLoader', None) is not None:
        class TalosCLoader(yaml.CSafeLoader):  # pylint: disable=too-many-ancestors
            """TalosLoader's resolvers and constructors over libyaml's parser (the same data, several times faster)."""

        TalosCLoader.yaml_implicit_resolvers = dict((first, list(resolvers)) for first, resolvers
                                                    in TalosLoader.yaml_implicit_resolvers.items())
        TalosCLoader.yaml_constructors = dict(TalosLoader.yaml_constructors)
    else:  # PyYAML built without libyaml
        TalosCLoader = None

    class TalosDumper(yaml.SafeDumper):  # pylint: disable=too-many-ancestors
        """SafeDumper that indents sequences under their key and keeps key order."""

        def increase_indent(self, flow=False, indentless=False):
            return super(TalosDumper, self).increase_indent(flow, False)

        def ignore_aliases(self, data):
            return True

    def _represent_str(dumper, data):
        data = str(data)
        if '\n' in data:
            return dumper.represent_scalar('tag:yaml.org,2002:str', data, style='|')
        return dumper.represent_scalar('tag:yaml.org,2002:str', data)

    def _represent_dict(dumper, data):
        return dumper.represent_mapping('tag:yaml.org,2002:map', list(data.items()))

    def _represent_list(dumper, data):
        return dumper.represent_sequence('tag:yaml.org,2002:seq', list(data))

    for _type, _representer in ((str, _represent_str), (dict, _represent_dict), (list, _represent_list),
                                (tuple, _represent_list)):
        # Exact types first (they win over multi-representers), then subclasses.
        TalosDumper.add_representer(_type, _representer)
        TalosDumper.add_multi_representer(_type, _representer)
else:  # pragma: no cover
    TalosLoader = None
    TalosCLoader = None
    TalosDumper = None


def require_yaml():
    """Raise a clear error when PyYAML is missing (modules call missing_required_lib first)."""
    if not HAS_YAML:
        raise ImportError('PyYAML is required: %s' % (YAML_IMPORT_ERROR,))


def _error_text(exc):
    """Problem and position of a YAML error, without the snippet of the document."""
    problem = getattr(exc, 'problem', None) or getattr(exc, 'context', None) or exc.__class__.__name__
    mark = getattr(exc, 'problem_mark', None) or getattr(exc, 'context_mark', None)
    if mark is not None:
        return 'not valid YAML: %s (line %d, column %d)' % (problem, mark.line + 1, mark.column + 1)
    return 'not valid YAML: %s' % (problem,)


def load_all(text, field):
    """Parse every YAML document in text (str or bytes) with YAML 1.2 scalars.

    Returns a list of documents; empty documents (a lone `---`) are dropped. A syntax error
    raises ValidationError naming `field`, without quoting the text.
    """
    require_yaml()
    if isinstance(text, bytes):
        try:
            text = text.decode('utf-8')
        except UnicodeDecodeError:
            raise ValidationError(field, 'not UTF-8 text')
    documents = None
    if TalosCLoader is not None:
        try:
            documents = list(yaml.load_all(text, Loader=TalosCLoader))  # nosec: safe loader subclass
        except Exception:  # pylint: disable=broad-except
            # libyaml refuses the text (a YAMLError) or fails on it otherwise (a lone surrogate: UnicodeEncodeError):
            # the pure-Python parser below parses it or says why, in its words, as before
            documents = None
    if documents is None:
        try:
            documents = list(yaml.load_all(text, Loader=TalosLoader))  # nosec: safe loader subclass
        except yaml.YAMLError as exc:
            raise ValidationError(field, _error_text(exc))
    return [document for document in documents if document is not None]


def load(text, field):
    """Parse exactly one YAML document; none or several raise ValidationError naming `field`."""
    documents = load_all(text, field)
    if len(documents) != 1:
        raise ValidationError(field, 'expected one YAML document, found %d' % len(documents))
    return documents[0]


def dump(document):
    """Deterministic YAML text of one document (str, ends with a newline)."""
    return dump_all([document])


def dump_all(documents):
    """Deterministic multi-document YAML text; documents are separated by `---`."""
    require_yaml()
    return yaml.dump_all(list(documents), Dumper=TalosDumper, sort_keys=False, indent=2,
                         width=1 << 30, default_flow_style=False, allow_unicode=True,
                         explicit_start=False)
