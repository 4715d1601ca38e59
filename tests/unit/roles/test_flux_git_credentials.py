"""The flux role's Git credentials Secret for an https:// Git server with a private CA: the CA goes under key ca.crt,
which source-controller reads with the basic-auth keys (github.com/fluxcd/pkg/git v0.52.0 options.go:47 dataKeyCACert,
104-124: ca.crt, else caFile, into AuthOptions.CAFile; source-controller v1.9.5 requires that version). Without it
the real source-controller cannot fetch from such a server (x509: certificate signed by unknown authority) - the lab's
upstream Flux world showed it. The role's expressions are evaluated by Ansible's own templating."""
import base64
import os

import pytest
import yaml

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLES = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'roles')
CA = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n'
BASIC = {'flux_git_username': 'flux', 'flux_git_password': 'pw', 'flux_git_ssh_identity': '', 'flux_git_ssh_known_hosts': ''}


def task(name, prefix):
    with open(os.path.join(ROLES, 'flux', 'tasks', name), encoding='utf-8') as handle:
        return [t for t in yaml.safe_load(handle) if t['name'].startswith(prefix)][0]


def evaluate(expression, **variables):
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


def secret_data(**variables):
    definition = task('credentials.yml', 'The Git credentials Secret')['kubernetes.core.k8s']['definition']
    return {key: base64.b64decode(value).decode() for key, value in evaluate(definition['data'], **variables).items()}


def test_the_secret_carries_the_git_servers_ca_under_the_key_source_controller_reads():
    assert secret_data(flux_git_ca_cert=CA, **BASIC) == {'username': 'flux', 'password': 'pw', 'ca.crt': CA}


def test_without_a_ca_the_secret_holds_the_basic_auth_keys_only():
    assert secret_data(flux_git_ca_cert='', **BASIC) == {'username': 'flux', 'password': 'pw'}


def test_the_default_is_no_ca():
    with open(os.path.join(ROLES, 'flux', 'defaults', 'main.yml'), encoding='utf-8') as handle:
        assert yaml.safe_load(handle)['flux_git_ca_cert'] == ''


@pytest.mark.parametrize('url, ca, usable', [
    ('https://git.example/r.git', CA, True),
    ('https://git.example/r.git', '', True),
    ('https://git.example/r.git', 'not a certificate', False),
    ('http://git.example/r.git', CA, False),
])
def test_the_settings_check_takes_a_ca_only_with_https_and_a_pem_certificate(url, ca, usable):
    check = task('settings.yml', 'Check the Flux settings')['ansible.builtin.assert']['that']
    variables = dict(BASIC, flux_git_url=url, flux_git_ca_cert=ca, flux_install_method='manifest', flux_namespace='flux-system')
    assert all(evaluate('{{ %s }}' % condition, **variables) for condition in check) is usable
