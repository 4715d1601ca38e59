"""Which Talos a lab node runs, and the two release lines the lab models where they differ: v1.13 and v1.12.

What a node runs is what it booted, as on a real machine:
- booted from the ISO (maintenance mode, or installing): the Talos version of that ISO. The lab's PVE remembers the
  URL a file was downloaded from (`LabPve.file_sources`); an Image Factory URL names the version in its path,
  `/image/<schematic>/<version>/<file>` (siderolabs/image-factory 26b95ca internal/frontend/http/http.go:200).
  A file the lab cannot trace to such a URL runs the lab's default, DEFAULT_VERSION.
- booted from the disk (installed): the version of the installer image the install ran, `machine.install.image` of
  the applied config (Talos runs that image to install: v1alpha1_sequencer_tasks.go:1505 at v1.13.9, :1491 at
  v1.12.11), its tag (`factory.talos.dev/installer/<schematic>:v1.12.11`, `ghcr.io/siderolabs/installer:v1.13.9`).

Only the lines the lab knows are modelled: a version of minor 12 behaves as v1.12.11, anything else as v1.13.9
(the Version RPC still says the version the node runs).
"""

import re

DEFAULT_VERSION = 'v1.13.9'

# Per release line: the tag the lab's sources were read at, that tag's commit (Talos' version.Sha is the short
# commit hash), and whether apid serves maintenance mode (v1.13) or a separate maintenance server does (v1.12).
LINES = {
    'v1.13': {'tag': 'v1.13.9', 'sha': '3ebd10a7', 'maintenance_server': False},
    'v1.12': {'tag': 'v1.12.11', 'sha': '2e80771b', 'maintenance_server': True},
}

_VERSION = re.compile(r'^v?(\d+)\.(\d+)\.(\d+)(?:-[0-9A-Za-z.-]+)?$')
_FACTORY_IMAGE_PATH = re.compile(r'/image/[^/]+/(v[^/]+)/[^/]+$')


def line(version):
    """'v1.12' for a version of minor 12, else 'v1.13'."""
    found = _VERSION.match(str(version or ''))
    if found and found.group(1) == '1' and found.group(2) == '12':
        return 'v1.12'
    return 'v1.13'


def release(version):
    """The LINES entry a node running `version` behaves as."""
    return LINES[line(version)]


def is_version(text):
    return bool(_VERSION.match(str(text or '')))


def from_image_url(url):
    """The Talos version an Image Factory download URL names, or None."""
    path = re.sub(r'[?#].*$', '', str(url or ''))
    found = _FACTORY_IMAGE_PATH.search(path)
    if found and is_version(found.group(1)):
        return found.group(1)
    return None


def from_installer_image(image):
    """The tag of an installer image reference (`registry/path:tag[@digest]`), when it is a version; else None."""
    reference = str(image or '').split('@', 1)[0]
    name, colon, tag = reference.rpartition(':')
    if not colon or '/' in tag:
        return None
    return tag if is_version(tag) else None
