#!/usr/bin/env bash
# Copies this machine's Open MPI 4.1 (Debian packages, external PMIx 4) into gpu-deps/mpi/ as a
# relocatable bundle for the GPU machine, which has no MPI: mpirun/orted, libmpi and every shared
# library they need except glibc's, the MCA plugins that load without hardware libraries (no UCX,
# libfabric, verbs, PSM, OpenSHMEM: one host needs only shared memory and TCP), PMIx with its
# plugins, help files, mpi.h, a pkg-config file and env.sh. On the device:
#
#   . gpu-deps/mpi/env.sh          # PATH, LD_LIBRARY_PATH, OPAL_*/PMIX_* dirs, PKG_CONFIG_PATH
#   make ... MPI_HOME=$G5_MPI_HOME # or pkg-config ompi-c through PKG_CONFIG_PATH
#   mpirun -np 2 build/dev/gpu/bin/glm5-run ...
#
# The install directories are compiled into libopen-pal and libpmix as absolute paths; env.sh
# points each one the bundle needs at the bundle (OPAL_PREFIX alone would not move Debian's
# pkglibdir, and PMIx's prefix is /usr/lib/x86_64-linux-gnu/pmix2, not /usr). Called by
# scripts/gpu-deps.sh when mpirun is installed here.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=$(gcc -print-multiarch)
ompi=/usr/lib/$arch/openmpi
pmix=/usr/lib/$arch/pmix2
M=gpu-deps/mpi
[ -x /usr/bin/orterun ] && [ -f "$ompi/include/mpi.h" ] && [ -d "$pmix/lib" ] || {
  echo "gpu-mpi: no Open MPI 4 + PMIx here (apt-get install libopenmpi-dev openmpi-bin)" >&2
  exit 1
}
rm -rf "$M"
mkdir -p "$M/bin" "$M/lib/openmpi" "$M/lib/pmix" "$M/lib/pkgconfig" "$M/include" \
  "$M/share/openmpi" "$M/share/pmix" "$M/etc"

# Plugins that need hardware or OpenSHMEM libraries stay behind; the device would fail to load them.
skip='lib(uc[tspm]|oshmem|psm|infinipath|ibverbs|rdmacm|fabric|efa|nl-|numa|uuid|atomic|mca_common_(ucx|ofi|verbs))'
elfs=(/usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info "/usr/lib/$arch/libmpi.so.40" "$pmix/lib/libpmix.so.2")
for p in "$ompi"/lib/openmpi3/mca_*.so; do
  deps=$(ldd "$p")
  if grep -qE "$skip" <<<"$deps"; then continue; fi
  cp "$p" "$M/lib/openmpi/"; elfs+=("$p")
done
for p in "$pmix"/lib/pmix/*.so; do cp "$p" "$M/lib/pmix/"; elfs+=("$p"); done
# glibc (and the kernel's vdso) is the device's own; every other library is copied under its soname.
glibc='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil)\.so'
ldd "${elfs[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ $name =~ $glibc ]] && continue
    cp -L "$path" "$M/lib/$name"
  done
cp /usr/bin/orterun "$M/bin/mpirun"
cp /usr/bin/orted /usr/bin/ompi_info "$M/bin/"
cp "$ompi/include/mpi.h" "$ompi/include/mpi_portable_platform.h" "$M/include/"
cp /usr/share/openmpi/help-*.txt "$M/share/openmpi/"
cp "$pmix"/share/pmix/help-*.txt "$M/share/pmix/"

# Debian's exclusions, plus: no load warnings for the plugins left behind, and no single-copy
# (CMA) in the shared-memory transport: containers often forbid process_vm_readv.
cat >"$M/etc/openmpi-mca-params.conf" <<'EOF'
mca_base_component_show_load_errors = 0
btl_base_warn_component_unused = 0
btl_vader_single_copy_mechanism = none
mtl = ^ofi
btl = ^uct,openib,ofi
pml = ^ucx
osc = ^ucx,pt2pt
EOF
: >"$M/share/pmix-mca-params.conf"

# ${pcfiledir} keeps the file valid wherever the checkout lies; -l:libmpi.so.40 needs no
# libmpi.so symlink (the carry copies plain files), and rpath-link lets ld find libmpi's own
# dependencies in the bundle.
cat >"$M/lib/pkgconfig/ompi-c.pc" <<'EOF'
prefix=${pcfiledir}/../..
libdir=${prefix}/lib
includedir=${prefix}/include

Name: Open MPI
Description: Open MPI 4.1 bundle (scripts/gpu-mpi.sh)
Version: 4.1.4
Libs: -L${libdir} -Wl,-rpath-link,${libdir} -Wl,-rpath,${libdir} -l:libmpi.so.40
Cflags: -I${includedir}
EOF

cat >"$M/env.sh" <<'EOF'
# Source this (bash) to use the Open MPI bundle in this folder (scripts/gpu-mpi.sh made it).
G5_MPI_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export G5_MPI_HOME
export PATH=$G5_MPI_HOME/bin:$PATH
export LD_LIBRARY_PATH=$G5_MPI_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$G5_MPI_HOME/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export OPAL_PREFIX=$G5_MPI_HOME OPAL_EXEC_PREFIX=$G5_MPI_HOME OPAL_BINDIR=$G5_MPI_HOME/bin
export OPAL_LIBDIR=$G5_MPI_HOME/lib OPAL_PKGLIBDIR=$G5_MPI_HOME/lib/openmpi
export OPAL_INCLUDEDIR=$G5_MPI_HOME/include OPAL_DATADIR=$G5_MPI_HOME/share
export OPAL_DATAROOTDIR=$G5_MPI_HOME/share OPAL_PKGDATADIR=$G5_MPI_HOME/share/openmpi
export OPAL_SYSCONFDIR=$G5_MPI_HOME/etc
export PMIX_PREFIX=$G5_MPI_HOME PMIX_LIBDIR=$G5_MPI_HOME/lib PMIX_PKGLIBDIR=$G5_MPI_HOME/lib/pmix
export PMIX_DATADIR=$G5_MPI_HOME/share PMIX_PKGDATADIR=$G5_MPI_HOME/share/pmix
export PMIX_SYSCONFDIR=$G5_MPI_HOME/share
export PMIX_MCA_mca_base_component_path=$G5_MPI_HOME/lib/pmix
# One host, one user: PMIx's own credentials; munge (tried first) has no daemon there.
export PMIX_MCA_psec=native
EOF
du -sh "$M"
