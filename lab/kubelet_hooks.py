"""The World's VM events that take a Talos node's kubelet down, for the Kubernetes simulations (lab.k8s, lab.k8s_upstream).

A VM that stops, is reset or is deleted takes the Talos node on it down, and its kubelet with it. A class using this
mixin has `self.world` and an `async _kubelet_gone(key)` taking the Talos node key (world.talos.vm_key(vm)).
"""


class KubeletVmHooks:
    """on_vm_stopped / on_vm_reset / on_vm_deleted -> self._kubelet_gone(the Talos node key of the VM)."""

    world = None

    async def _kubelet_gone(self, key):
        raise NotImplementedError

    def _vm_key(self, vm):
        talos = getattr(self.world, 'talos', None)
        return talos.vm_key(vm) if talos is not None else getattr(vm, 'vmid', vm)

    async def on_vm_stopped(self, vm):
        await self._kubelet_gone(self._vm_key(vm))

    async def on_vm_reset(self, vm, address):
        del address
        await self._kubelet_gone(self._vm_key(vm))

    async def on_vm_deleted(self, vm):
        await self._kubelet_gone(self._vm_key(vm))
