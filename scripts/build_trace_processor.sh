#!/usr/bin/env bash
# Builds Perfetto's trace_processor_shell from a Perfetto source tree with Debian's
# toolchain and libraries, for scripts/check_trace_perfetto.py on machines that cannot
# reach get.perfetto.dev (where the perfetto Python package downloads its binary) or
# the hosts of Perfetto's own build dependencies (tools/install-build-deps).
#
#   scripts/build_trace_processor.sh PERFETTO_SRC [OUT_DIR]
#
# PERFETTO_SRC needs .gn, BUILD.gn, gn/, buildtools/ (its BUILD files), build_overrides/,
# include/, protos/, src/, test/ (without test/data) and tools/. Debian 12's SQLite (3.40)
# is older than trace processor accepts (3.41.2), so a newer amalgamation is taken from
# the npm registry (the better-sqlite3 package bundles one) and installed as a static
# library under /usr/local. Optional importers that need sources outside Debian (re2,
# zstd, open_csd, expat, llvm's demangler, linenoise) are left out; the JSON importer,
# which reads `wgtrain profile --trace` files, is in, and so is the `query` command that
# scripts/check_trace_perfetto.py uses (the HTTP server that the perfetto Python package
# talks to is not). Takes about an hour on 2 cores.
set -euo pipefail
SRC=$(realpath "$1")
OUT=${2:-$SRC/out/tp}
apt-get install -y -q generate-ninja ninja-build clang libprotobuf-dev protobuf-compiler \
    libprotoc-dev zlib1g-dev curl >/dev/null

# SQLite >= 3.41.2, with the options Perfetto's own build gives it, and its percentile
# functions built in (SQLITE_ENABLE_PERCENTILE, SQLite >= 3.51). Perfetto registers them
# through sqlite3_percentile_init (ext/misc/percentile.c, not in the amalgamation), so a
# one-line stand-in that registers nothing goes into the library too.
lib=/usr/local/lib/x86_64-linux-gnu/libsqlite3.a
have=$(awk '/define SQLITE_VERSION_NUMBER/ {print $3}' /usr/local/include/sqlite3.h 2>/dev/null || true)
if [ "${have:-0}" -lt 3051000 ] || [ ! -f $lib ]; then
    tmp=$(mktemp -d)
    url=$(curl -fsS https://registry.npmjs.org/better-sqlite3/latest |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["dist"]["tarball"])')
    curl -fsS "$url" | tar xz -C "$tmp" package/deps/sqlite3
    defs=$(sed -n '/config("sqlite_config")/,/^}/p' "$SRC/buildtools/BUILD.gn" |
        grep -o '"-DSQLITE[^"]*"' | tr -d '"' | grep -v OMIT_AUTOINIT | tr '\n' ' ')
    # shellcheck disable=SC2086
    clang -O2 -fPIC $defs -DSQLITE_ENABLE_PERCENTILE -c "$tmp/package/deps/sqlite3/sqlite3.c" -o "$tmp/sqlite3.o"
    cat > "$tmp/percentile.c" <<'C'
#include "sqlite3.h"
int sqlite3_percentile_init(sqlite3 *db, char **err, const void *api) {
  (void)db; (void)err; (void)api;
  return SQLITE_OK;
}
C
    clang -O2 -fPIC -I"$tmp/package/deps/sqlite3" -c "$tmp/percentile.c" -o "$tmp/percentile.o"
    mkdir -p /usr/local/include "$(dirname $lib)"
    rm -f $lib
    ar rcs $lib "$tmp/sqlite3.o" "$tmp/percentile.o"
    cp "$tmp"/package/deps/sqlite3/sqlite3.h "$tmp"/package/deps/sqlite3/sqlite3ext.h /usr/local/include/
    rm -rf "$tmp"
fi
# Link that library rather than Debian's libsqlite3.so, which the compiler driver's
# search paths would find first.
sed -i "s|    libs = \[ \"sqlite3\" \]|    libs = [ \"$lib\" ]|" "$SRC/buildtools/BUILD.gn"

# Debian's clang and ld: no -Werror (newer warnings than Perfetto's pinned clang), no
# debug info, no --icf (an lld option), and the strip step's llvm-objcopy from Debian.
sed -i 's/cflags += \[ "-Werror" \]/cflags += []/; s/^      "-g",$//; s/"-Wl,--icf=all",//' \
    "$SRC/gn/standalone/BUILD.gn"
mkdir -p "$SRC/buildtools/linux64/clang/bin"
ln -sf "$(command -v llvm-objcopy || echo /usr/bin/llvm-objcopy-14)" "$SRC/buildtools/linux64/clang/bin/llvm-objcopy"

cd "$SRC"
gn gen "$OUT" --args='is_debug=false is_system_compiler=true is_clang=true use_custom_libcxx=false
  perfetto_use_system_protobuf=true perfetto_use_system_sqlite=true perfetto_use_system_zlib=true
  skip_buildtools_check=true enable_perfetto_ui=false
  enable_perfetto_trace_processor_linenoise=false enable_perfetto_trace_processor_httpd=false
  enable_perfetto_re2=false enable_perfetto_zstd=false enable_perfetto_llvm_demangle=false
  enable_perfetto_trace_processor_mac_instruments=false enable_perfetto_etm_importer=false'
ninja -C "$OUT" trace_processor_shell
echo "$OUT/trace_processor_shell"
