# Shared by the device scripts that run glm5-run on the oracle (tests/gpu/run_device.sh,
# mpi_device.sh): source it from the repository root. Sets, keeping what the environment gives:
#   GLM5_SHARED  the oracle (default $PWD/oracle-carry), exported
#   CC           /opt/gcc/bin/gcc when present, else gcc
#   B            the build directory (default build/dev)
# and always: GGUF (the oracle's model), P1 (prompt 1's ids, comma-separated), GREEDY (the
# oracle's 24 greedy ids after P1), NCCL_NVLS_ENABLE=0 (exported: NVLink multicast stays off).
export NCCL_NVLS_ENABLE=0
# The GPU machines have no network and no Debian -dev packages (gpu-deps/ stands in): the
# Makefile's dependency probe (scripts/deps.sh --if-missing) must not try to install them there.
export G5_NO_DEPS=1
: "${GLM5_SHARED:=$PWD/oracle-carry}"
export GLM5_SHARED
CC=${CC:-$( [ -x /opt/gcc/bin/gcc ] && echo /opt/gcc/bin/gcc || echo gcc )}
B=${B:-build/dev}
GGUF=$GLM5_SHARED/oracle/glm5-tiny/glm5-tiny-UD-Q4_K_XL.gguf
P1=958,523,83,303,279,530,309,1624,578,1571,1040,299,350,387,71,25,277,640,488,304,384,713,643,468,11,277,1013,290,870,468,1316,65,496,840,11,277,1646,82,468,405,74,292,11,337,277,1117,1963,468,1713,439,817,292,337,1362,1342,13,1357,346,266,281,77,64,363,71,384,379,266,1351,1805,2012,1244,1326,599,277,288,1097,83,72,262,379,1294,2014,280,1035,85,352,986,1314,388,1841,1717,13
GREEDY="1865 1374 1431 481 521 271 1021 1291 265 174 57 775 1630 486 1990 739 564 1374 466 1290 1584 544 436 121"
