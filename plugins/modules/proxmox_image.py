#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_image
short_description: Make sure an image file (a Talos ISO) is on a Proxmox VE storage, downloaded by PVE from a URL
version_added: 0.1.0
description:
  - Looks for O(filename) in the O(content) folder of O(storage) on O(node). When it is missing, PVE itself
    downloads it from O(url) (C(POST /nodes/{node}/storage/{storage}/download-url)), optionally checking a
    checksum, and the module waits for that task by UPID and then checks the file is listed.
  - The file is identified by its name only; PVE does not report checksums of stored files. Put the version in the
    file name (for example C(talos-v1.13.9-<schematic>-nocloud-amd64.iso)) so that a new image is a new file.
  - For a storage that is not shared, every PVE node that runs VMs from it needs its own copy; call the module
    once per node. On a shared storage the second call finds the file and does nothing.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  node:
    description: PVE node that downloads the file (and whose view of the storage is checked).
    type: str
    required: true
  storage:
    description: PVE storage, for example V(local). It must allow the O(content) type.
    type: str
    required: true
  filename:
    description:
      - File name on the storage, without folder, as PVE will keep it - letters, digits, C(_), C(.) and C(-) only
        (PVE replaces any other character with C(_)), ending in C(.iso)/C(.img) for V(iso) and
        C(.ova)/C(.qcow2)/C(.raw)/C(.vmdk) for V(import). Another name fails naming this option.
    type: str
    required: true
  url:
    description: Where PVE downloads the file from. Required with O(state=present).
    type: str
  content:
    description: Content type (the storage folder).
    type: str
    choices: [iso, import, vztmpl]
    default: iso
  checksum:
    description: Expected checksum of the download; PVE fails the task when it differs.
    type: str
  checksum_algorithm:
    description: Algorithm of O(checksum).
    type: str
    choices: [md5, sha1, sha224, sha256, sha384, sha512]
    default: sha256
  verify_certificates:
    description: Whether PVE verifies the TLS certificate of O(url).
    type: bool
    default: true
  state:
    description: V(present) downloads the file when missing; V(absent) deletes it when present.
    type: str
    choices: [present, absent]
    default: present
  needed_by:
    description:
      - Who needs the file on O(node), for example the VMs that boot from it there; the proxmox_vms role gives
        one entry per VM, the inventory host and the vmid.
      - Only used in messages - a failure ends with C(needed on <node> by <needed_by>), so that a task run once for
        many VMs says which of them wait on it.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - proxtalos.cluster._proxmox_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether the file would be downloaded or deleted; nothing is written.
  diff_mode:
    support: full
    details:
      - Shows whether the file is on the storage before and after.
seealso:
  - module: proxtalos.cluster.proxmox_vm
"""

EXAMPLES = r"""
- name: Talos nocloud ISO with the QEMU guest agent extension on local storage
  proxtalos.cluster.proxmox_image:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    node: pve1
    storage: local
    filename: talos-v1.13.9-ce4c9805-nocloud-amd64.iso
    url: https://factory.talos.dev/image/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515/v1.13.9/nocloud-amd64.iso
    wait_timeout: 1800
"""

RETURN = r"""
volid:
  description: PVE volume id of the file.
  returned: always
  type: str
  sample: local:iso/talos-v1.13.9-ce4c9805-nocloud-amd64.iso
present:
  description: Whether the file is on the storage at the end (in check mode, at the start).
  returned: always
  type: bool
size:
  description: Size in bytes PVE reports for the file, when known.
  returned: always
  type: int
upid:
  description: UPID of the download or delete task, when one ran.
  returned: always
  type: str
elapsed:
  description: Seconds spent.
  returned: always
  type: float
retries:
  description: Transient errors that were met and retried.
  returned: always
  type: list
  elements: dict
needed_by:
  description: O(needed_by), as given.
  returned: always
  type: list
  elements: str
"""

import re
import time
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors, _proxmox, _wait


def argument_spec():
    return _argspec.spec(
        _argspec.PROXMOX_AUTH_SPEC, _argspec.WAIT_SPEC,
        node=dict(type='str', required=True),
        storage=dict(type='str', required=True),
        filename=dict(type='str', required=True),
        url=dict(type='str'),
        content=dict(type='str', choices=['iso', 'import', 'vztmpl'], default='iso'),
        checksum=dict(type='str'),
        checksum_algorithm=dict(type='str', choices=['md5', 'sha1', 'sha224', 'sha256', 'sha384', 'sha512'],
                                default='sha256'),
        verify_certificates=dict(type='bool', default=True),
        state=dict(type='str', choices=['present', 'absent'], default='present'),
        needed_by=dict(type='list', elements='str', default=[]),
    )


def validate(params):
    name = params['filename']
    if '/' in name or name in ('.', '..') or not name.strip():
        raise _errors.ValidationError('filename', '%r must be a plain file name, without folders' % name)
    # PVE stores a download under a normalised name: every character but a-z, A-Z, 0-9, _, . and - becomes _
    # (pve-storage 9.1.7 src/PVE/Storage.pm:2483-2491, used by download-url at src/PVE/API2/Storage/Status.pm:831);
    # the module would then never find the file under the name given.
    normalised = re.sub(r'[^a-zA-Z0-9_.-]', '_', name)
    if normalised != name:
        raise _errors.ValidationError('filename', '%r has characters PVE replaces (it would store the file as %r); '
                                                  'use %r' % (name, normalised, normalised))
    if params['content'] == 'import' and not re.search(r'\.(ova|qcow2|raw|vmdk)$', name):
        raise _errors.ValidationError('filename', '%r must end in .ova, .qcow2, .raw or .vmdk for content import '
                                                  '(PVE refuses other names)' % name)
    if params['content'] == 'iso' and not name.lower().endswith(('.iso', '.img')):
        raise _errors.ValidationError('filename', '%r must end in .iso or .img for content iso (PVE refuses other '
                                                  'names)' % name)
    if params['state'] == 'present':
        url = params.get('url') or ''
        if not url.startswith(('http://', 'https://')):
            raise _errors.ValidationError('url', 'an http:// or https:// URL is required with state=present, got %r'
                                          % url)


def volid_of(params):
    return '%s:%s/%s' % (params['storage'], params['content'], params['filename'])


class ImageStore(object):
    def __init__(self, client, params):
        self.client = client
        self.params = params
        self.node = params['node']
        self.storage = params['storage']
        self.volid = volid_of(params)
        self.subject = '%s on node %s' % (self.volid, self.node)
        self.upid = None

    def find(self):
        """The storage content entry of the file, or None."""
        items = self.client.get('nodes/%s/storage/%s/content' % (self.node, self.storage),
                                'list %s content' % self.params['content'], self.subject,
                                content=self.params['content']) or []
        for item in items:
            if item.get('volid') == self.volid:
                return item
        return None

    def download(self, timeout, interval):
        body = dict(url=self.params['url'], filename=self.params['filename'], content=self.params['content'])
        body['verify-certificates'] = 1 if self.params['verify_certificates'] else 0
        if self.params.get('checksum'):
            body['checksum'] = self.params['checksum']
            body['checksum-algorithm'] = self.params['checksum_algorithm']
        self.upid = self.client.run_task('post', 'nodes/%s/storage/%s/download-url' % (self.node, self.storage),
                                         self.node, 'download from %s' % self.params['url'], self.subject,
                                         timeout, interval, params=body)

    def delete(self, timeout, interval):
        path = 'nodes/%s/storage/%s/content/%s' % (self.node, self.storage, self.volid)
        self.upid = self.client.run_task('delete', path, self.node, 'delete', self.subject, timeout, interval)


def ensure(store, params, deadline, check_mode, clock=time.monotonic, sleep=time.sleep):
    """Observe, act when needed (not in check mode), and verify; returns the module result."""
    want_present = params['state'] == 'present'
    item = store.find()
    changed = (item is None) == want_present
    result = dict(changed=changed, volid=store.volid, present=item is not None,
                  size=(item or {}).get('size'), upid=None,
                  diff=dict(before={'present': item is not None}, after={'present': want_present}))
    if check_mode or not changed:
        return result
    timeout, interval = _argspec.wait_params(params)
    if not params['wait']:
        (store.download if want_present else store.delete)(0, interval)
        result['upid'] = store.upid
        return result

    def step():
        found = store.find()
        if (found is not None) == want_present:
            return True, found
        (store.download if want_present else store.delete)(timeout, interval)
        found = store.find()
        if (found is not None) == want_present:
            return True, found
        return False, 'the task ended OK but %s is %s' % (store.volid, 'not listed' if want_present else 'still listed')

    last = {}

    def remember(observation, elapsed, attempts):
        last['observation'] = observation

    wait = _wait.wait_for(step, timeout=deadline.remaining(), interval=interval, backoff=1.5,
                          max_interval=max(interval, 10.0), transient=(_errors.TransientApiError,),
                          progress=_wait.Progress.from_environment(note=remember), clock=clock, sleep=sleep)
    if not wait.ok:
        raise _errors.WaitTimeout('%s: %s did not complete within %.0f s (last seen: %s)' % (
            store.subject, 'download' if want_present else 'delete', wait.elapsed, wait.observation), wait)
    found = wait.observation if isinstance(wait.observation, dict) else None
    result.update(present=found is not None, size=(found or {}).get('size'), upid=store.upid)
    return result


def failure_message(exc, params):
    """The error's message, ending with who waits on the file there (needed_by), when given."""
    message = str(exc).rstrip()
    if params.get('needed_by'):
        message = '%s; needed on %s by %s' % (message.rstrip('.'), params['node'], ', '.join(params['needed_by']))
    return message


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        required_if=[('state', 'present', ('url',))], **_argspec.PROXMOX_AUTH_CONSTRAINTS,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    params = module.params
    if not _proxmox.HAS_PROXMOXER:
        module.fail_json(msg='proxmoxer and requests are required on the controller', exception=_proxmox.PROXMOXER_IMPORT_ERROR)
    started = time.monotonic()
    try:
        validate(params)
        deadline = _wait.Deadline(max(params['wait_timeout'], 0))
        client = _proxmox.PveClient(lambda: _proxmox.connect(params, module.warn), deadline,
                                    interval=min(params['wait_sleep'] or 1.0, _proxmox.FIRST_RETRY))
        result = ensure(ImageStore(client, params), params, deadline, module.check_mode)
    except _errors.ProxtalosError as exc:
        failure = dict(exc.details)
        failure.setdefault('elapsed', round(time.monotonic() - started, 3))
        failure['needed_by'] = params['needed_by']
        module.fail_json(msg=failure_message(exc, params), exception=traceback.format_exc(), **failure)
    diff = result.pop('diff')
    if module._diff:  # pylint: disable=protected-access
        result['diff'] = diff
    result['retries'] = client.retried
    result['needed_by'] = params['needed_by']
    result['elapsed'] = round(time.monotonic() - started, 3)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
