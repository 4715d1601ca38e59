"""Private key material in files: PEM private keys in clear, or base64-encoded PEM (how the Talos bundle, a talosconfig,
a kubeconfig and Kubernetes Secrets carry them). A vault envelope holds neither in clear."""
import base64
import os
import re

PEM_KEY = re.compile(r'-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----')
# base64 of "-----BEGIN" where a base64 field starts with it (a PEM file encoded whole)
B64_PEM = re.compile(r'LS0tLS1CRUdJTi[A-Za-z0-9+/=]+')


def private_keys(data):
    """The PEM private key headers in a file's bytes, in clear or base64-encoded."""
    text = data.decode('utf-8', 'replace')
    found = PEM_KEY.findall(text)
    for blob in B64_PEM.findall(text):
        decoded = base64.b64decode(blob + '=' * (-len(blob) % 4)).decode('utf-8', 'replace')
        found.extend(PEM_KEY.findall(decoded))
    return found


def files_with_private_keys(folder, skip=()):
    """{path relative to folder: octal mode} of every file under folder (symlinked folders not followed) whose bytes
    hold a private key in clear; folders under any of `skip` are left out."""
    found = {}
    for current, dummy, names in os.walk(str(folder)):
        if any(current == str(path) or current.startswith(str(path) + os.sep) for path in skip):
            continue
        for name in names:
            path = os.path.join(current, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, 'rb') as handle:
                if private_keys(handle.read()):
                    found[os.path.relpath(path, str(folder))] = oct(os.stat(path).st_mode & 0o777)
    return found
