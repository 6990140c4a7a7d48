#!/usr/bin/env python3
"""Disassembles the machine code in the Vulkan pipeline cache data that
examples/shader_stats.rs writes (SHADER_DUMP=DIR): for each DIR/N.cache, DIR/N.sass.

What the NVIDIA driver (580) puts there, as read from its bytes (no documentation): the
32-byte Vulkan cache header, an entry whose payload is one zstd frame, and in that frame
a blob starting "NVDANVVMNVuc" with a table of sections. Section type 1 holds the SASS;
its first 8 bytes are not code. The rest (NVVM bitcode, the SPIR-V) is left alone.

Needs `zstd` (the command) and `nvdisasm` (a CUDA toolkit's, e.g. /usr/local/cuda/bin,
or PATH).

Usage: python3 scripts/sass_from_cache.py DIR [SM90]
"""
import glob
import os
import shutil
import struct
import subprocess
import sys


def tool(name):
    return shutil.which(name) or next(
        (p for p in glob.glob(f"/usr/local/cuda*/bin/{name}") if os.access(p, os.X_OK)), None
    )


def code_of(blob):
    """The SASS bytes of an NVuc blob, or None."""
    if not blob.startswith(b"NVDANVVMNVuc"):
        return None
    # Section entries of 0x20 bytes from 0x48: type (u32), size (u32), offset (u64), ...
    for at in range(0x28, 0x180, 8):
        typ, size = struct.unpack_from("<II", blob, at)
        off = struct.unpack_from("<Q", blob, at + 8)[0]
        if typ == 1 and 0 < off < len(blob) and off + size <= len(blob) and size > 64:
            n = (size - 8) // 16 * 16
            return blob[off + 8: off + 8 + n]
    return None


def main():
    d = sys.argv[1]
    arch = sys.argv[2] if len(sys.argv) > 2 else "SM90"
    zstd, nvdisasm = tool("zstd"), tool("nvdisasm")
    if not (zstd and nvdisasm):
        sys.exit(f"needs zstd ({zstd}) and nvdisasm ({nvdisasm})")
    for cache in sorted(glob.glob(os.path.join(d, "*.cache")), key=lambda p: (len(p), p)):
        data = open(cache, "rb").read()
        at = data.find(b"\x28\xb5\x2f\xfd")
        stem = cache[: -len(".cache")]
        if at < 0:
            print(f"{cache}: no zstd frame")
            continue
        blob = subprocess.run([zstd, "-dc"], input=data[at:], capture_output=True).stdout
        code = code_of(blob)
        if code is None:
            print(f"{cache}: no code section in {len(blob)} bytes")
            continue
        open(f"{stem}.code", "wb").write(code)
        r = subprocess.run([nvdisasm, "-b", arch, f"{stem}.code"], capture_output=True, text=True)
        open(f"{stem}.sass", "w").write(r.stdout + r.stderr)
        os.remove(f"{stem}.code")
        print(f"{cache}: {len(code) // 16} instructions")


if __name__ == "__main__":
    main()
