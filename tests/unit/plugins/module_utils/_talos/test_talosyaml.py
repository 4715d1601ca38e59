"""talosyaml.load_all: libyaml's parser with TalosLoader's YAML 1.2 scalars gives what PyYAML's own parser gives, and a
text libyaml refuses fails with PyYAML's message."""
import json

import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config, talosyaml

TEXTS = [
    'a: off\nb: 0o755\nc: 0755\nd: 1:20\ne: 2001-12-14\nf: ~\ng: .inf\nh: yes\ni: 08\nj: -0x1f\nk: 1e3\nl: .NaN\n',
    'k: !!timestamp 2001-12-14\nm: !!str 12\n',
    'base: &b {x: 1}\nmerged:\n  <<: *b\n  y: 2\n',
    '---\nfirst: 1\n---\n---\nsecond: [1, "two", {three: 3}]\n',
    'text: |\n  line one\n  line two\nfolded: >\n  a\n  b\n',
    '- x\n-\n',
]

# the last: a lone surrogate, which libyaml's reader cannot even encode (UnicodeEncodeError, not a YAMLError)
BAD = ['a: [1, 2\n', 'a: b: c\n', 'a:\n\t- tab\n', 'key: "unterminated\n', 'a: \udcff']


def _pure(text):
    return [document for document in yaml.load_all(text, Loader=talosyaml.TalosLoader) if document is not None]


def _same(one, two):
    return json.dumps(one, sort_keys=True, default=repr) == json.dumps(two, sort_keys=True, default=repr)


@pytest.mark.skipif(talosyaml.TalosCLoader is None, reason='PyYAML without libyaml')
@pytest.mark.parametrize('text', TEXTS)
def test_libyaml_gives_the_same_data_and_types(text):
    assert _same(talosyaml.load_all(text, 'f'), _pure(text))


def test_a_rendered_machine_config_parses_the_same(bundle):
    cluster = {'name': 'demo', 'endpoint': 'https://10.5.0.10:6443',
               'inline_manifests': [{'name': 'cilium', 'contents': 'apiVersion: v1\nkind: Namespace\n'}]}
    for machine_type in ('controlplane', 'worker'):
        text = config.render_machine_config(bundle, machine_type, cluster, {'hostname': 'n-1', 'ip': '10.5.0.11', 'prefix': 24})
        assert _same(talosyaml.load_all(text, 'f'), _pure(text))


@pytest.mark.parametrize('text', BAD)
def test_errors_are_pyyamls_own(text):
    with pytest.raises(yaml.YAMLError) as pure:
        list(yaml.load_all(text, Loader=talosyaml.TalosLoader))
    with pytest.raises(ValidationError) as ours:
        talosyaml.load_all(text, 'patch')
    assert ours.value.field == 'patch' and ours.value.reason == talosyaml._error_text(pure.value)


def test_a_lone_surrogate_is_the_validation_error_it_was():
    with pytest.raises(ValidationError) as ours:
        talosyaml.load_all('a: \udcff', 'patch')
    assert (ours.value.field, ours.value.reason) == ('patch', 'not valid YAML: ReaderError')   # main's message


@pytest.mark.skipif(talosyaml.TalosCLoader is None, reason='PyYAML without libyaml')
def test_libyaml_accepts_a_tab_after_a_colon_which_pyyamls_parser_refuses():
    # a known leniency of libyaml's scanner (YAML allows a tab as separation there; PyYAML's scanner does not)
    with pytest.raises(yaml.YAMLError):
        _pure('a:\tb\n')
    assert talosyaml.load_all('a:\tb\n', 'patch') == [{'a': 'b'}]
