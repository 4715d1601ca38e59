"""Helpers for the Talos module tests: run a module's main() with arguments, read its JSON result."""
import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_module(module, capsys, **args):
    """Run module.main() with args; return (result dict, raw stdout)."""
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    out = capsys.readouterr().out
    return json.loads(out), out


def assert_no_secret(out, secret_values):
    """No secret value (nor its first line, for PEM) appears in the module's stdout."""
    for value in secret_values:
        if not value:
            continue
        text = value.decode('ascii', 'replace') if isinstance(value, bytes) else str(value)
        assert text not in out
        for line in text.splitlines():
            if len(line) > 20 and not line.startswith('-----'):
                assert line not in out, 'a line of a secret value reached the module output'
