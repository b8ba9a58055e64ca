#!/bin/sh
# Runs a test binary under mpirun with N ranks (OpenMPI flags: root allowed, more ranks than cores allowed); exits 77
# (ctest's SKIP_RETURN_CODE for these tests) when mpirun cannot start two processes here. The sanitizer options of
# the environment (ASAN/LSAN/UBSAN_OPTIONS, e.g. the OpenMPI leak suppressions) are exported to every rank.
# Usage: run_mpi.sh MPIEXEC N BINARY [ARGS...]
mpiexec="$1"; np="$2"; shift 2
flags="--allow-run-as-root --oversubscribe"
for var in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS; do
  if eval "[ -n \"\${$var+set}\" ]"; then flags="$flags -x $var"; fi
done
if ! timeout 60 "$mpiexec" -np "$np" $flags true >/dev/null 2>&1; then
  echo "mpirun cannot start $np processes here: skipping"
  exit 77
fi
exec "$mpiexec" -np "$np" $flags "$@"
