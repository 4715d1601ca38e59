"""Kubeconfig files for the lab's Kubernetes API servers (lab/k8s_upstream's kube-apiserver, lab/k8s's own).

    write_kubeconfig(path, 'https://127.0.0.1:6443', ca_pem, cert_pem, key_pem)   # a 0600 file, returns path
"""

import base64
import os

import yaml


def write_kubeconfig(path, server, ca_pem, cert_pem, key_pem, name='lab'):  # pylint: disable=too-many-arguments
    """A kubeconfig like the one talos_kubeconfig fetches: cluster CA, client cert and key, written 0600; returns path."""

    def b64(text):
        return base64.b64encode(text.encode()).decode()

    config = {
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'admin@%s' % name, 'preferences': {},
        'clusters': [{'name': name, 'cluster': {'server': server, 'certificate-authority-data': b64(ca_pem)}}],
        'users': [{'name': 'admin@%s' % name, 'user': {'client-certificate-data': b64(cert_pem), 'client-key-data': b64(key_pem)}}],
        'contexts': [{'name': 'admin@%s' % name, 'context': {'cluster': name, 'user': 'admin@%s' % name, 'namespace': 'default'}}],
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(config, handle)
    return path
