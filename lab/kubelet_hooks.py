"""What both Kubernetes worlds (lab.k8s, lab.k8s_upstream) share of a Talos node's kubelet: the World's VM events
that take it down, and the error its container runtime reports for an image the registry does not have.

A VM that stops, is reset or is deleted takes the Talos node on it down, and its kubelet with it. A class using this
mixin has `self.world` and an `async _kubelet_gone(key)` taking the Talos node key (world.talos.vm_key(vm)).
"""


# What containerd reports when the registry does not have the image (a tag never pushed, a typo), {image} standing for
# the container's image. Not read at containerd's source (not in the lab's module cache): the shape containerd's CRI
# PullImage error takes for a reference the registry answers 404 for.
DEFAULT_PULL_ERROR = ('failed to pull and unpack image "{image}": failed to resolve reference "{image}": '
                      '{image}: not found')


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
