"""Issue 21: the collection reaches ansible-core through public interfaces only.

What is shipped (galaxy.yml's build_ignore leaves plugins, roles, playbooks, meta, site.yml and the docs) must not
import ansible-core's private packages nor use the private module and template engine attributes the collection once
relied on (docs/adr/0001-modules-in-the-worker-process.md, docs/adr/0002-templates-compiled-once-across-hosts.md).
The documentation may name them (the ADRs tell their history); code and playbooks may not."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED_CODE = ('plugins', 'roles', 'playbooks', 'meta', 'site.yml')
SUFFIXES = ('.py', '.yml', '.yaml', '.j2', '.json')

FORBIDDEN = (
    # ansible-core's private packages
    'ansible._internal',
    'module_utils._internal',
    # a module run inside the worker: AnsiballZ's argument globals and exception result
    '_ANSIBLE_ARGS',
    '_ANSIBLE_PROFILE',
    '_ansiballz',
    # AnsibleModule's and ArgumentSpecValidator's internals the worker facade (plugin_utils/_action_module.py) must not
    # lean on: the validation result's private fields, the module-side warning store, the parameter loading
    '._no_log_values',
    '._aliases',
    '._warnings',
    '._deprecations',
    '._unsupported_parameters',
    '._validated_parameters',
    '_global_warnings',
    '_load_params',
    '_PARSED_MODULE_ARGS',
    # ActionBase internals around a module's arguments and output
    '_update_module_args',
    '_parse_returned_data',
    '_compute_environment_string',
    # the template engine's compile step, and engine access behind hostvars
    '_compile_template',
    'TemplateEngine',
    'HostVarsVars',
    'hostvars._loader',
    # the data loader's vault (the vault_password lookup reads VaultSecretsContext)
    "'_vault'",
    '._vault.',
)


def shipped_files():
    for top in SHIPPED_CODE:
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            yield path
            continue
        for folder, _dirs, files in os.walk(path):
            for name in files:
                if name.endswith(SUFFIXES):
                    yield os.path.join(folder, name)


def test_the_scan_covers_the_plugins():
    scanned = list(shipped_files())
    assert os.path.join(ROOT, 'plugins', 'plugin_utils', '_vault_inputs.py') in scanned
    assert os.path.join(ROOT, 'plugins', 'plugin_utils', '_action_module.py') in scanned
    assert len([path for path in scanned if os.sep + 'plugins' + os.sep in path]) > 40


def test_no_private_ansible_core_interface_is_used():
    pattern = re.compile('|'.join(re.escape(name) for name in FORBIDDEN))
    found = []
    for path in shipped_files():
        with open(path, encoding='utf-8', errors='replace') as handle:
            for number, line in enumerate(handle, 1):
                match = pattern.search(line)
                if match:
                    found.append('%s:%d: %s' % (os.path.relpath(path, ROOT), number, match.group(0)))
    assert not found, 'private ansible-core interfaces (issue 21):\n' + '\n'.join(found)
