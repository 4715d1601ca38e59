#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gitops_commit
short_description: Commit files of a GitOps working copy, and push them
version_added: 0.1.0
description:
  - Commits the given O(paths) of a Git working copy (only those paths, whatever else is staged or modified) when
    they differ from the last commit, for example the SealedSecrets written by M(proxtalos.cluster.sealed_secret).
    Nothing to commit means C(changed=false) and no new commit.
  - With O(push=true) it then pushes the branch to O(remote) when the remote branch is not at the local commit
    (so a push that failed on an earlier run is retried), authenticating with HTTP basic auth (O(username) and
    O(password)) handed to git through its environment, never on the command line; for an C(ssh://) remote git uses
    the SSH setup of the user running it.
  - Uses the C(git) command of the controller.
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether a commit (and a push) would be made; writes nothing. When the files are written by an
        earlier task that itself ran in check mode, there is nothing new to see here.
  diff_mode:
    support: none
options:
  repo_dir:
    description: The working copy (a directory inside a Git repository).
    type: path
    required: true
  paths:
    description: The files to commit, relative to O(repo_dir) (or absolute, inside it).
    type: list
    elements: path
    required: true
  commit_message:
    description: The commit message.
    type: str
    required: true
  author_name:
    description: Author and committer name of the commit.
    type: str
    default: proxtalos
  author_email:
    description: Author and committer e-mail of the commit.
    type: str
    default: proxtalos@localhost
  push:
    description: Push the branch to O(remote) after committing.
    type: bool
    default: false
  remote:
    description: The remote to push to.
    type: str
    default: origin
  branch:
    description:
      - The branch to commit to and push (the remote branch of the same name is updated); it must be the one checked
        out in O(repo_dir). Default is the checked-out branch.
    type: str
  username:
    description: HTTP basic auth user for the push (with O(password)).
    type: str
  password:
    description: HTTP basic auth password or token for the push.
    type: str
  ca_cert:
    description:
      - PEM certificate(s) of the CA that signs the remote's HTTPS certificate (a Git server with a private CA). The
        push and the check of the remote branch trust only it (git's C(GIT_SSL_CAINFO) for those commands, which wins
        over the user's git configuration and environment). Default is git's own configuration.
    type: str
seealso:
  - module: proxtalos.cluster.sealed_secret
"""

EXAMPLES = r"""
- name: Commit and push the sealed Secrets
  proxtalos.cluster.gitops_commit:
    repo_dir: "{{ flux_repo_dir }}"
    paths:
      - infrastructure/proxmox-csi/proxmox-csi-plugin.sealedsecret.yaml
    commit_message: "proxtalos: seal proxmox-csi-plugin"
    push: true
    username: git
    password: "{{ vault_git_token }}"
  no_log: true
"""

RETURN = r"""
commit:
  description: The commit id the branch points at afterwards (in check mode, the current one).
  returned: always
  type: str
  sample: 3f0c2d8e9b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d
committed:
  description: The paths the new commit holds changes of (empty when nothing was committed).
  returned: always
  type: list
  elements: str
  sample: [infrastructure/proxmox-csi/proxmox-csi-plugin.sealedsecret.yaml]
pushed:
  description: Whether the branch was (in check mode, would be) pushed.
  returned: always
  type: bool
  sample: false
branch:
  description: The branch committed to.
  returned: always
  type: str
  sample: main
"""

import base64
import contextlib
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _secrets
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError


def argument_spec():
    return dict(
        repo_dir=dict(type='path', required=True),
        paths=dict(type='list', elements='path', required=True),
        commit_message=dict(type='str', required=True),
        author_name=dict(type='str', default='proxtalos'),
        author_email=dict(type='str', default='proxtalos@localhost'),
        push=dict(type='bool', default=False),
        remote=dict(type='str', default='origin'),
        branch=dict(type='str'),
        username=dict(type='str'),
        password=dict(type='str', no_log=True),
        ca_cert=dict(type='str'),
    )


def auth_environment(username, password):
    """Environment giving git an HTTP basic auth header (git >= 2.31 reads GIT_CONFIG_COUNT/KEY/VALUE); {} without a password."""
    if not password:
        return {}
    token = base64.b64encode(('%s:%s' % (username or '', password)).encode('utf-8')).decode('ascii')
    return {'GIT_CONFIG_COUNT': '1', 'GIT_CONFIG_KEY_0': 'http.extraHeader', 'GIT_CONFIG_VALUE_0': 'Authorization: Basic %s' % token}


def relative_paths(repo_dir, top, paths):
    """The paths relative to the repository's top folder; ValidationError for one outside it."""
    out = []
    for position, path in enumerate(paths):
        absolute = os.path.normpath(path if os.path.isabs(path) else os.path.join(repo_dir, path))
        relative = os.path.relpath(absolute, top)
        if relative == '.' or relative.startswith('..' + os.sep) or relative == '..':
            raise ValidationError('paths[%d]' % position, '%s is not inside the repository %s' % (path, top))
        out.append(relative)
    return out


def changed_paths(porcelain):
    """Paths named by `git status --porcelain=v1 -z` output."""
    out = []
    records = porcelain.split('\0')
    index = 0
    while index < len(records):
        record = records[index]
        index += 1
        if len(record) < 4:
            continue
        out.append(record[3:])
        if record[0] in 'RC':  # a rename or copy is followed by its source path
            index += 1
    return out


# The user:password@ part of a URL (RFC 3986 userinfo), which a remote's URL may carry and git's errors repeat
URL_USERINFO = re.compile(r'(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@')


def without_userinfo(text):
    """text with the credentials of every URL in it taken out: a failed push names the remote, not its password."""
    return URL_USERINFO.sub(r'\1', text)


class Git(object):
    """git in one repository through module.run_command (argument lists, a fixed environment)."""

    def __init__(self, module, top, environment):
        self.module = module
        self.top = top
        self.environment = dict(environment, GIT_TERMINAL_PROMPT='0', LC_ALL='C')

    def __call__(self, *args, **kwargs):
        check = kwargs.pop('check', True)
        rc, out, err = self.module.run_command(['git', '-C', self.top] + list(args), environ_update=self.environment, **kwargs)
        if check and rc != 0:
            raise ProxtalosError('git %s failed in %s (rc %d): %s' % (args[0], self.top, rc, without_userinfo((err or out).strip())), rc=rc)
        return rc, out, err


def find_top(module, repo_dir):
    if not os.path.isdir(repo_dir):
        raise ValidationError('repo_dir', '%s is not a directory' % repo_dir)
    rc, out, err = module.run_command(['git', '-C', repo_dir, 'rev-parse', '--show-toplevel'], environ_update={'LC_ALL': 'C'})
    if rc != 0:
        raise ValidationError('repo_dir', '%s is not inside a Git working copy: %s' % (repo_dir, err.strip()))
    return out.strip()


def commit_paths(module):
    params = module.params
    if params['password'] and not params['username']:
        raise ValidationError('username', 'is required with password (HTTP basic auth)')
    environment = auth_environment(params['username'], params['password'])
    _secrets.register(module, environment.get('GIT_CONFIG_VALUE_0'))
    environment.update(GIT_AUTHOR_NAME=params['author_name'], GIT_AUTHOR_EMAIL=params['author_email'],
                       GIT_COMMITTER_NAME=params['author_name'], GIT_COMMITTER_EMAIL=params['author_email'])
    top = find_top(module, params['repo_dir'])
    git = Git(module, top, environment)
    paths = relative_paths(params['repo_dir'], top, params['paths'])
    rc, current, dummy = git('symbolic-ref', '--quiet', '--short', 'HEAD', check=False)
    if rc != 0:
        raise ValidationError('repo_dir', '%s has no branch checked out (detached HEAD); check out the branch to commit to' % top)
    branch = params['branch'] or current.strip()
    if branch != current.strip():
        raise ValidationError('branch', '%s has branch %s checked out, not %s' % (top, current.strip(), branch))
    dummy, porcelain, dummy = git('status', '--porcelain=v1', '-z', '--untracked-files=all', '--', *paths)
    pending = changed_paths(porcelain)
    head = git('rev-parse', '--verify', '--quiet', 'HEAD', check=False)[1].strip()
    result = dict(changed=bool(pending), committed=pending, pushed=False, branch=branch, commit=head)
    if pending and not module.check_mode:
        git('add', '--all', '--', *paths)
        git('commit', '--quiet', '--no-verify', '--no-gpg-sign', '-m', params['commit_message'], '--', *paths)
        result['commit'] = git('rev-parse', 'HEAD')[1].strip()
    if params['push']:
        with remote_ca(git, params['ca_cert']):
            dummy, remote_refs, dummy = git('ls-remote', params['remote'], 'refs/heads/%s' % branch)
            remote_commit = remote_refs.split()[0] if remote_refs.strip() else ''
            if pending or remote_commit != result['commit']:
                result['changed'] = result['pushed'] = True
                if not module.check_mode:
                    git('push', '--quiet', params['remote'], 'HEAD:refs/heads/%s' % branch)
    return result


@contextlib.contextmanager
def remote_ca(git, ca_cert):
    """With ca_cert (PEM): git's GIT_SSL_CAINFO names a private file holding it while the block runs."""
    if not ca_cert:
        yield
        return
    if '-----BEGIN CERTIFICATE-----' not in ca_cert:
        raise ValidationError('ca_cert', 'is not a PEM certificate (no BEGIN CERTIFICATE line)')
    fd, path = tempfile.mkstemp(prefix='proxtalos-git-ca-', suffix='.pem')
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            handle.write(ca_cert if ca_cert.endswith('\n') else ca_cert + '\n')
        git.environment['GIT_SSL_CAINFO'] = path
        yield
    finally:
        git.environment.pop('GIT_SSL_CAINFO', None)
        os.unlink(path)


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if module.get_bin_path('git') is None:
        module.fail_json(msg='the git command is required on the controller (not found on PATH)')
    try:
        result = commit_paths(module)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
