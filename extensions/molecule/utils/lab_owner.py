"""Print the process id of the Molecule process this runs under (the nearest ancestor whose command is molecule).

The Molecule scenarios start the lab with `--owner-pid <that id>`: the lab stops by itself when Molecule ends, so a
Molecule run that is killed before its destroy step leaves no lab behind. Prints nothing when there is no such
ancestor (the lab then lives until `python -m lab down`, which destroy.yml runs).
"""

import os


def command_of(pid):
    with open('/proc/%d/cmdline' % pid, 'rb') as handle:
        return [part.decode('utf-8', 'replace') for part in handle.read().split(b'\0') if part]


def parent_of(pid):
    with open('/proc/%d/stat' % pid, encoding='ascii', errors='replace') as handle:
        return int(handle.read().rsplit(')', 1)[1].split()[1])


def molecule_ancestor(pid):
    while pid > 1:
        try:
            command = command_of(pid)
        except OSError:
            return None
        if any(os.path.basename(part) == 'molecule' for part in command[:2]):
            return pid
        pid = parent_of(pid)
    return None


if __name__ == '__main__':
    OWNER = molecule_ancestor(os.getppid())
    if OWNER:
        print(OWNER)
