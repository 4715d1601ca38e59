"""Run a KubeCluster on a background thread with a kubeconfig (lab/kubeconfig.py), for tests and tools.

    with ClusterThread() as api:                 # CA + admin cert generated, free port on 127.0.0.1
        api.kubeconfig                           # path of a 0600 kubeconfig (CN admin, O system:masters)
        api.call(cluster.kubelet_started, 'n1', '127.0.0.1')   # run a function on the lab loop
"""

import asyncio
import os
import tempfile
import threading

from lab import pki
from lab.kubeconfig import write_kubeconfig

from .cluster import KubeCluster


class ClusterThread:  # pylint: disable=too-many-instance-attributes
    """A KubeCluster serving on host:port from its own event loop thread."""

    def __init__(self, host='127.0.0.1', port=0, timing=None, workdir=None):
        self.host = host
        self.port = port
        self.timing = timing
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix='lab-k8s-')
        self.ca_pem, self.ca_key_pem = pki.make_ca()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name='lab-k8s', daemon=True)
        self.cluster = None
        self.kubeconfig = None
        self.requests = []

    def start(self):
        self.thread.start()
        self.call(self._create)
        self.run(self.cluster.start_api([self.host], self.port))
        self.port = self.cluster.server.port
        cert, key = pki.admin_cert(self.ca_pem, self.ca_key_pem)
        self.kubeconfig = write_kubeconfig(os.path.join(self.workdir, 'kubeconfig'), self.url, self.ca_pem, cert, key)
        return self

    def _create(self):
        self.cluster = KubeCluster(self.ca_pem, self.ca_key_pem, timing=self.timing, state_dir=os.path.join(self.workdir, 'pki'),
                                   request_log=self.requests.append)

    @property
    def url(self):
        return 'https://%s:%d' % (self.host, self.port)

    def run(self, coroutine, timeout=30):
        """Run a coroutine on the lab loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, func, *args, **kwargs):
        """Run a plain function on the lab loop (the store is not thread-safe) and return its result."""
        async def wrapper():
            return func(*args, **kwargs)
        return self.run(wrapper())

    def stop(self):
        if self.cluster is not None:
            self.run(self.cluster.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if self._own_dir:
            import shutil  # pylint: disable=import-outside-toplevel
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
