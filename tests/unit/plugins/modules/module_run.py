"""Run a module's main() in the test process as Ansible would start it: arguments in, exit code and JSON out."""
import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_main(module, args, capsys, check_mode=False, diff=False):
    """(exit code, result dict, raw stdout) of module.main() with args (check mode and diff as Ansible passes them)."""
    args = dict(args)
    if check_mode:
        args['_ansible_check_mode'] = True
    if diff:
        args['_ansible_diff'] = True
    with patch_module_args(args):
        with pytest.raises(SystemExit) as caught:
            module.main()
    out = capsys.readouterr().out
    return caught.value.code, json.loads(out), out
