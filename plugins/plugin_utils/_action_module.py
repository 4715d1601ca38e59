# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module's run(module) inside Ansible's worker process, on ansible-core's public interfaces. PRIVATE.

Every module of the collection has one skeleton (docs/development.md): `module_kwargs()` returns the keyword arguments
of AnsibleModule (argument_spec, supports_check_mode and the constraints), `run(module)` does the work, and `main()`
is `run(AnsibleModule(**module_kwargs()))`. run() uses only this part of AnsibleModule: params, check_mode, _diff,
no_log_values (through module_utils/_secrets.register), exit_json, fail_json, warn, run_command and get_bin_path.

ModuleFacade is that part of AnsibleModule built on public interfaces, for the action plugin to call run() in the
worker process it already runs in (plugin_utils/_vault_inputs.py decides when): the arguments validated by
ansible.module_utils.common.arg_spec.ArgumentSpecValidator with the module's constraints; the values of no_log options
(suboptions included) collected from the spec; exit_json and fail_json end run() with ModuleExit; the result passes
ansible.module_utils.common.parameters.remove_values with the no_log values and those run() registered; a result
naming an existing path or dest gets the file details AnsibleModule adds (add_path_info). As
community.crypto's action-side module facade does for its *_pipe modules.

run_module() runs one module that way: exit handlers (atexit) registered while run() runs are run when it ends (a
forked worker leaves with os._exit and would never run them; the kubernetes package removes the temporary files
holding a kubeconfig's client key in one); an exception escaping run() becomes a failed result with its traceback
under `exception`, as a module process reports it; what run() prints is dropped, as Ansible drops a module's output
around its JSON.
"""

from __future__ import annotations

import atexit
import contextlib
import grp
import io
import json
import os
import pwd
import stat
import subprocess
import traceback
from collections.abc import Mapping

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.json import Direction, get_module_decoder, get_module_encoder
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.common.process import get_bin_path
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.module_utils.errors import UnsupportedError
from ansible.utils.display import Display

display = Display()

# The AnsibleModule keyword arguments the facade knows (anything else in a module's module_kwargs() is refused).
CONSTRAINTS = ('mutually_exclusive', 'required_together', 'required_one_of', 'required_if', 'required_by')
KNOWN_KWARGS = frozenset(('argument_spec', 'supports_check_mode') + CONSTRAINTS)

# How arguments travel to a module process and its result back (a module without METADATA uses the legacy profile):
# the same round trip here, so run() sees plain values, as in a module process, and returns only what JSON carries.
PROFILE = 'legacy'


class ModuleExit(BaseException):
    """exit_json or fail_json: the end of run() with its result (BaseException, as AnsibleModule's SystemExit: an
    `except Exception` of the module does not catch it)."""

    def __init__(self, result):
        super().__init__('module exit')
        self.result = result


def _leaves(value):
    """The scalar values in value as strings (AnsibleModule masks every leaf of a no_log option's value)."""
    if isinstance(value, (str, bytes)):
        text = to_text(value, errors='surrogate_or_strict')
        return [text] if text else []
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [str(value)]
    if isinstance(value, Mapping):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [str(value)]


def no_log_values(argument_spec, params):
    """The values of the options marked no_log=True in params, suboptions included (walked here, from the spec)."""
    found = set()
    if not isinstance(params, Mapping):
        return found
    for name, spec in argument_spec.items():
        value = params.get(name)
        if value is None:
            continue
        if spec.get('no_log') and value:
            # as AnsibleModule: a false value (0, '', an empty list) is not masked everywhere in the result
            found.update(_leaves(value))
        suboptions = spec.get('options')
        if suboptions:
            for item in (value if isinstance(value, list) else [value]):
                found.update(no_log_values(suboptions, item))
    return found


def add_path_info(result):
    """result with what AnsibleModule adds to the result of a module that returns an existing `path` (or `dest`): uid,
    gid, owner, group, mode, state and size (AnsibleModule.add_path_info; its SELinux context is not added)."""
    path = result.get('path', result.get('dest'))
    if not isinstance(path, (str, bytes)):
        return result
    b_path = to_bytes(path, errors='surrogate_or_strict')
    if not os.path.exists(b_path):
        return result
    st = os.lstat(os.path.expanduser(os.path.expandvars(b_path)))
    result['uid'], result['gid'] = st.st_uid, st.st_gid
    try:
        result['owner'] = pwd.getpwuid(st.st_uid)[0]
    except KeyError:
        result['owner'] = str(st.st_uid)
    try:
        result['group'] = grp.getgrgid(st.st_gid)[0]
    except KeyError:
        result['group'] = str(st.st_gid)
    st = os.lstat(b_path)
    result['mode'] = '0%03o' % stat.S_IMODE(st.st_mode)
    if os.path.islink(b_path):
        result['state'] = 'link'
    elif os.path.isdir(b_path):
        result['state'] = 'directory'
    elif os.stat(b_path).st_nlink > 1:
        result['state'] = 'hard'
    else:
        result['state'] = 'file'
    result['size'] = st.st_size
    return result


def round_trip(value, direction):
    """value as it comes out of JSON the way Ansible sends it in that direction (plain lists, dicts and scalars)."""
    return json.loads(json.dumps(value, cls=get_module_encoder(PROFILE, direction)), cls=get_module_decoder(PROFILE, direction))


class ModuleFacade(object):
    """The part of AnsibleModule the collection's modules use, for run(module) in the worker process."""

    def __init__(self, module_kwargs, args, check_mode=False, diff=False, name='module'):
        unknown = set(module_kwargs) - KNOWN_KWARGS
        if unknown:
            raise ValueError('%s: AnsibleModule keyword arguments the worker facade does not handle: %s' % (name, ', '.join(sorted(unknown))))
        self.argument_spec = module_kwargs['argument_spec']
        self.supports_check_mode = bool(module_kwargs.get('supports_check_mode'))
        self.check_mode = bool(check_mode)
        self._diff = bool(diff)
        self._name = name
        self.warnings = []
        self.no_log_values = set()
        self.params = {}
        validator = ArgumentSpecValidator(self.argument_spec, **dict((key, module_kwargs[key]) for key in CONSTRAINTS if module_kwargs.get(key)))
        validation = validator.validate(args)
        self.params = validation.validated_parameters
        # the given values of no_log options are masked even when the arguments are refused
        self.no_log_values.update(no_log_values(self.argument_spec, args))
        self.no_log_values.update(no_log_values(self.argument_spec, self.params))
        self.validation_error = None
        if validation.error_messages:
            # as AnsibleModule words it
            msg = validation.errors.msg
            if isinstance(validation.errors[0], UnsupportedError):
                msg = 'Unsupported parameters for (%s) module: %s' % (name, msg)
            self.validation_error = msg

    # ---- results

    def exit_json(self, **kwargs):
        raise ModuleExit(add_path_info(kwargs))

    def fail_json(self, msg, **kwargs):
        kwargs.update(failed=True, msg=str(msg))
        exception = kwargs.get('exception')
        if isinstance(exception, BaseException):
            kwargs['exception'] = ''.join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        elif exception is not None and not isinstance(exception, str):
            kwargs['exception'] = str(exception)
        raise ModuleExit(add_path_info(kwargs))

    def warn(self, warning):
        if isinstance(warning, str):
            self.warnings.append(warning)
        else:
            raise TypeError('warn requires a string not a %s' % type(warning))

    # ---- commands

    def get_bin_path(self, arg, required=False, opt_dirs=None):
        try:
            return get_bin_path(arg, opt_dirs=opt_dirs)
        except ValueError as exc:
            if required:
                self.fail_json(msg=str(exc))
            return None

    def run_command(self, args, check_rc=False, data=None, binary_data=False, cwd=None, environ_update=None,
                    encoding='utf-8', errors='surrogate_or_strict', expand_user_and_vars=True):
        """AnsibleModule.run_command for an argument list (no shell): (rc, stdout, stderr)."""
        if not isinstance(args, (list, tuple)):
            self.fail_json(rc=257, cmd=args, msg='run_command in the worker takes an argument list')
        if expand_user_and_vars:
            argv = [to_bytes(os.path.expanduser(os.path.expandvars(arg)), errors='surrogate_or_strict') for arg in args if arg is not None]
        else:
            argv = [to_bytes(arg, errors='surrogate_or_strict') for arg in args if arg is not None]
        env = os.environ.copy()
        env.update(environ_update or {})
        stdin = None
        if data:
            if not binary_data:
                data += '\n'
            stdin = to_bytes(data) if isinstance(data, str) else data
        kwargs = {}
        if cwd:
            cwd = os.path.abspath(os.path.expanduser(cwd))
            if not os.path.isdir(cwd):
                self.fail_json(msg='Provided cwd is not a valid directory: %s' % cwd)
            kwargs['cwd'] = cwd
        cmd = ' '.join(to_text(arg, errors='surrogate_or_strict') for arg in argv)
        try:
            process = subprocess.run(argv, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL, capture_output=True,
                                     env=env, close_fds=True, check=False, **kwargs)
        except OSError as exc:
            self.fail_json(rc=2, stdout='', stderr='', msg=str(exc), cmd=cmd)
        rc, stdout, stderr = process.returncode, process.stdout, process.stderr
        if rc != 0 and check_rc:
            self.fail_json(cmd=cmd, rc=rc, stdout=to_text(stdout, errors='surrogate_or_strict'),
                           stderr=to_text(stderr, errors='surrogate_or_strict'), msg=to_text(stderr, errors='surrogate_or_strict').rstrip())
        if encoding is not None:
            return rc, to_text(stdout, encoding=encoding, errors=errors), to_text(stderr, encoding=encoding, errors=errors)
        return rc, stdout, stderr


@contextlib.contextmanager
def exit_handlers_run_at_the_end():
    """atexit handlers registered inside the block are run, last first, when it ends (see the module docstring)."""
    registered = []
    register, unregister = atexit.register, atexit.unregister

    def register_for_the_end(func, *args, **kwargs):
        registered.append((func, args, kwargs))
        return func

    def unregister_for_the_end(func):
        registered[:] = [entry for entry in registered if entry[0] != func]
        unregister(func)

    atexit.register, atexit.unregister = register_for_the_end, unregister_for_the_end
    try:
        yield
    finally:
        atexit.register, atexit.unregister = register, unregister
        for func, args, kwargs in reversed(registered):
            try:
                func(*args, **kwargs)
            except Exception as exc:  # pylint: disable=broad-exception-caught
                display.warning('an exit handler of the module failed: %s: %s' % (type(exc).__name__, exc))


def run_module(collection_module, args, check_mode=False, diff=False, inject_invocation=False, name=None):
    """The result of collection_module.run(module) with the task's arguments, as a module process would report it
    (name: the module's name in messages, the task's action)."""
    name = name or collection_module.__name__.rpartition('.')[2]
    args = round_trip(dict(args), Direction.CONTROLLER_TO_MODULE)
    module = ModuleFacade(collection_module.module_kwargs(), args, check_mode=check_mode, diff=diff, name=name)
    if module.validation_error:
        result = {'failed': True, 'msg': module.validation_error}
    elif check_mode and not module.supports_check_mode:
        result = {'skipped': True, 'msg': 'remote module (%s) does not support check mode' % name}
    else:
        sink = io.StringIO()
        with exit_handlers_run_at_the_end(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            try:
                collection_module.run(module)
            except ModuleExit as exit_request:
                result = exit_request.result
            except Exception as exc:  # pylint: disable=broad-exception-caught
                # Exception, not BaseException: a task timeout and Ctrl-C go through, as out of a module process
                result = {'failed': True, 'msg': 'Unhandled exception in the module %s: %s: %s' % (name, type(exc).__name__, exc),
                          'exception': traceback.format_exc()}
            else:
                result = {'failed': True, 'msg': 'the module %s returned without reporting a result (exit_json or fail_json)' % name}
    if inject_invocation and 'invocation' not in result:
        result['invocation'] = {'module_args': module.params}
    if module.warnings:
        result['warnings'] = list(result.get('warnings') or []) + module.warnings
    # as AnsibleModule: the top-level booleans and None (changed, failed...) are kept whatever the no_log values are
    preserved = dict((key, value) for key, value in result.items() if value is None or isinstance(value, bool))
    result = remove_values(result, module.no_log_values)
    result.update(preserved)
    return round_trip(result, Direction.MODULE_TO_CONTROLLER)
