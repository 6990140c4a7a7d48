# Sourced by the scripts that run on the GPU machine (scripts/gpu_session.sh,
# scripts/gpu_tests.sh): its image has NVIDIA's Vulkan driver but not the loader, so the
# loader and the glvnd libraries it needs are unpacked from the packages in .gl/ (fetched
# by `scripts/gpu_session.sh prepare`; the workspace's GPU guide), and the loader is
# pointed at NVIDIA's driver manifest.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
