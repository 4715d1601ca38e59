"""The lab: a simulated Proxmox VE + Talos + Kubernetes world on loopback addresses.

`python -m lab up|down|status|faults|fault|clear` (see docs/lab.md). Not part of the collection
build (galaxy.yml ignores lab/). It uses the collection's wait helper, which it imports as
ansible_collections.proxtalos.cluster through the checkout's .collections/ link (`make setup`).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RUN_DIR = os.path.join(ROOT, 'lab', 'run')
REPO_INVENTORY = os.path.join(ROOT, 'inventories', 'lab', 'hosts.yml')

_COLLECTIONS = os.path.join(ROOT, '.collections')
if os.path.isdir(_COLLECTIONS) and _COLLECTIONS not in sys.path:
    sys.path.append(_COLLECTIONS)
