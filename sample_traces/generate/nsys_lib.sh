# Shared by the recording scripts (record_all.sh, record_hf.sh): Nsight Systems on the GPU machine, run so that
# the report holds no environment of processes other than ours, and the step timer. Source it after setting
# G (this folder), W (the work folder) and LIBS (the folder with libdw.so.1 + libelf.so.1).
#   NSYS_CAPTURE=1   limit the capture to cudaProfilerStart/Stop
#   NSYS_EXTRA="…"   more `nsys profile` options (e.g. GPU metrics)
H=/opt/nvidia/nsight-compute/2025.3.1/host
NSYS=$H/target-linux-x64/nsys
QI=$H/linux-desktop-glibc_2_11_3-x64/QdstrmImporter
# nsys stores environments in the report: give it a minimal one (and see nsys_clean below)
CLEAN=(env -i "PATH=$PATH" "HOME=${HOME:-/root}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_ORDER=PCI_BUS_ID)
[ -n "${LD_LIBRARY_PATH:-}" ] && CLEAN+=("LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
[ -n "${TZ+x}" ] && CLEAN+=("TZ=$TZ")
NSYS_OPTS=(profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true)

step() {
  local name=$1; shift; local t0=$SECONDS
  echo "=== [$SECONDS s] $name: $*"
  "$@"; local rc=$?
  echo "=== [$SECONDS s] $name rc=$rc ($((SECONDS - t0)) s)"
  return $rc
}
finish_nsys() {  # $1 = report base path: .qdstrm -> .nsys-rep -> .sqlite (+ nsys stats csv)
  local b=$1
  [ -f "$b.nsys-rep" ] || env LD_LIBRARY_PATH="$LIBS:$H/linux-desktop-glibc_2_11_3-x64" "$QI" -i "$b.qdstrm"
  [ -f "$b.nsys-rep" ] && rm -f "$b.qdstrm"
  "$NSYS" export --type sqlite --force-overwrite=true -o "$b.sqlite" "$b.nsys-rep"
  "$NSYS" stats --force-export=false --report nvtx_sum,cuda_gpu_kern_sum --format csv -o "$b.stats" "$b.nsys-rep" >/dev/null 2>&1
  ls -la "$b".*
}
env_leak() {  # foreign environment blocks (other processes' /proc/PID/environ) in an nsys export?
  python3 - "$1" <<'PYEOF'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
vals = [v for (v,) in c.execute("select value from StringIds") if isinstance(v, str) and "\x00" in v and "=" in v]
# names that only the machine's own processes (image / shell environment) carry, never env -i's
sentinels = ("CONTAINER_NAME=", "OLDPWD=", "TERM=", "UV_", "NV_CUDA_", "PIP_", "SSL_CERT_FILE=", "SHLVL=")
foreign = [v for v in vals if any(p.startswith(sentinels) for p in v.split("\x00"))]
print("env blocks: %d, with variables not set by us: %d" % (len(vals), len(foreign)))
for v in foreign:
    print("   foreign names:", sorted({p.split("=")[0] for p in v.split("\x00") if "=" in p})[:12], "...")
sys.exit(1 if foreign else 0)
PYEOF
}
nsys_clean() {  # $1 = report base; rest = command.
  # nsys stores the environment block of every process it can read (/proc/PID/environ), the machine's
  # own shells included. Run it in its own PID namespace (unshare; only our processes are visible, each
  # with env -i's minimal environment); if that fails or still leaks, as user nobody (cannot read
  # root's /proc/PID/environ).
  local b=$1; shift
  local wrap wr hm
  mkdir -p /tmp/gen/plasmient_report /tmp/nbhome && cp "$G"/*.py /tmp/gen/ &&
    cp "$G/../../plasmient_report/__init__.py" /tmp/gen/plasmient_report/ &&
    cp -r "$G/../../plasmient_report/workloads" /tmp/gen/plasmient_report/ &&  # single_gpu.py's phases, NVML sampler
    chmod -R a+rwX "$W" /tmp/gen /tmp/nbhome
  for wrap in unshare nobody; do
    rm -f "$b".*
    if [ $wrap = unshare ]; then wr=(unshare --pid --fork --kill-child --mount-proc); hm=(HOME=/root)
    else wr=(setpriv --reuid=65534 --regid=65534 --clear-groups); hm=(HOME=/tmp/nbhome); fi
    (cd /tmp/gen && timeout -k 10 200 "${wr[@]}" "${CLEAN[@]}" "${hm[@]}" "$NSYS" "${NSYS_OPTS[@]}" \
       $( [ -n "${NSYS_CAPTURE:-}" ] && echo "--capture-range=cudaProfilerApi --capture-range-end=stop" ) ${NSYS_EXTRA:-} \
       -o "$b" "$@")
    finish_nsys "$b" && env_leak "$b.sqlite" && { echo "nsys report without foreign environments ($wrap)"; return 0; }
    echo "nsys via $wrap: failed or foreign environments in the report"
  done
  return 1
}
