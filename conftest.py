"""pytest: make the collection importable as ansible_collections.proxtalos.cluster.

`make setup` links .collections/ansible_collections/proxtalos/cluster to this checkout; the
lab package (lab/) is importable from the repository root.
"""
import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(ROOT, '.collections'), ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)
