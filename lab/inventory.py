"""The inventory of a lab's planned nodes: <run-dir>/hosts.yml (and inventories/lab/hosts.yml).

Control planes get static addresses (.11, .12, ...) given to their VMs by cloud-init; workers
get none and are discovered through the guest agent (DHCP, .100 and up).

VM ids: control plane i (1-based) is 1010+i for i <= 9 and 1100+i above (1110, 1111, ...);
worker j is 1020+j for j <= 9 and 2000+j above (2010, 2011, ...). PVE nodes are used round robin.
"""

import json
import os
import re

from lab.addresses import DHCP_FIRST_HOST, DHCP_LAST_HOST, FIRST_STATIC_HOST, LAST_STATIC_HOST, PREFIX_LENGTH
from lab.pve import PVE_PORT, PVE_USER, TOKEN_NAME, write_file

MAX_CONTROL_PLANES = LAST_STATIC_HOST - FIRST_STATIC_HOST + 1
MAX_WORKERS = DHCP_LAST_HOST - DHCP_FIRST_HOST + 1


def control_plane_vmid(index):
    return 1010 + index if index <= 9 else 1100 + index


def worker_vmid(index):
    return 1020 + index if index <= 9 else 2000 + index


def plan_nodes(net, control_planes, workers, pve_nodes):
    """The planned nodes: [{'name', 'group', 'vm_id', 'vm_pve_node', 'node_ip'?...}], control planes first."""
    if not 1 <= control_planes <= MAX_CONTROL_PLANES:
        raise ValueError('control_planes must be 1-%d (static addresses .%d-.%d), got %r'
                         % (MAX_CONTROL_PLANES, FIRST_STATIC_HOST, LAST_STATIC_HOST, control_planes))
    if not 0 <= workers <= MAX_WORKERS:
        raise ValueError('workers must be 0-%d (DHCP pool .%d-.%d), got %r'
                         % (MAX_WORKERS, DHCP_FIRST_HOST, DHCP_LAST_HOST, workers))
    if not pve_nodes:
        raise ValueError('pve_nodes must name at least one PVE node')
    nodes = []
    for i in range(1, control_planes + 1):
        nodes.append({'name': 'lab-cp-%d' % i, 'group': 'controlplane', 'vm_id': control_plane_vmid(i),
                      'vm_pve_node': pve_nodes[(i - 1) % len(pve_nodes)], 'node_ip': net.static_host(i),
                      'node_prefix': PREFIX_LENGTH, 'node_gateway': net.gateway})
    for j in range(1, workers + 1):
        nodes.append({'name': 'lab-w-%d' % j, 'group': 'worker', 'vm_id': worker_vmid(j),
                      'vm_pve_node': pve_nodes[(control_planes + j - 1) % len(pve_nodes)]})
    return nodes


PLAIN = re.compile(r'^[A-Za-z0-9_./@!:+-]+$')


def _scalar(value):
    """A YAML scalar: plain when it is safe, else double-quoted (JSON strings are YAML)."""
    text = str(value)
    return text if isinstance(value, int) or PLAIN.match(text) else json.dumps(text)


def _flow(values):
    return '{' + ', '.join('%s: %s' % (k, _scalar(v)) for k, v in values.items()) + '}'


def render(net, run_dir, control_planes, workers, pve_nodes, extra_vars=None):
    """The hosts.yml text; extra_vars (name -> value) are added to the cluster group's vars."""
    nodes = plan_nodes(net, control_planes, workers, pve_nodes)
    if "'" in run_dir or '"' in run_dir:
        raise ValueError('run dir must not contain quotes (it goes into a Jinja lookup), got %r' % run_dir)
    lines = ['# Written by `python -m lab up` (%d control plane%s, %d worker%s, net %s). Do not edit.'
             % (control_planes, '' if control_planes == 1 else 's', workers, '' if workers == 1 else 's', net),
             '---', 'cluster:', '  children:']
    for group in ('controlplane', 'worker'):
        members = [n for n in nodes if n['group'] == group]
        if not members:
            lines += ['    %s: {}' % group]
            continue
        lines += ['    %s:' % group, '      hosts:']
        for node in members:
            values = dict((k, v) for k, v in node.items() if k not in ('name', 'group'))
            lines.append('        %s: %s' % (node['name'], _flow(values)))
    token_file = os.path.join(run_dir, 'pve-token')
    lines += [
        '  vars:',
        '    lab_net: %s' % net,
        '    lab_run_dir: %s' % _scalar(run_dir),
        '    pve_api_host: %s' % net.pve_host,
        '    pve_api_port: %d' % PVE_PORT,
        '    pve_api_user: %s' % PVE_USER,
        '    pve_api_token_id: %s' % TOKEN_NAME,
        '    pve_api_token_secret: "{{ lookup(\'ansible.builtin.file\', \'%s\') }}"' % token_file,
        '    pve_ca_path: %s' % _scalar(os.path.join(run_dir, 'pve-ca.pem')),
        '    cluster_endpoint_host: %s' % net.endpoint_host,
    ]
    lines += ['    %s: %s' % (name, _scalar(value)) for name, value in (extra_vars or {}).items()]
    return '\n'.join(lines) + '\n'


def write(path, text):
    """Write the inventory (0644: it holds paths, not secrets)."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    write_file(path, text, 0o644)
