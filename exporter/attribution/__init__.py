"""Attribution: which pod owns which GPU (kubelet pod-resources) and which process (procfs cgroups)."""
