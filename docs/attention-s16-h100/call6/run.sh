#!/bin/bash
# Call 6 (diagnostic, its example not kept): the forward against f64 per tile with random q and k, with the
# forward's RESCALE threshold replaced through a temporary environment knob: 8 (as built), -1 (a rescale every
# tile) and 1000 (never). Tiles with fewer streamed rows than the block's were wrong in all three: the bug was
# the own rows' load (fixed in call 7), not the rescale.
for f in .gl/*.deb; do dpkg -x $f / >/dev/null; done; ldconfig; export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
mkdir -p $OUT/r; for v in 8.0 -1.0 1000.0; do WGTRAIN_DIAG_RESCALE=$v timeout 100 .carry/tmp_fa128 2>&1 | cut -c1-230 > $OUT/r/diag-$v.txt; done
