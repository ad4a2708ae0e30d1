#!/usr/bin/env bash
# A throwaway single-node Slurm cluster on this host, for the Slurm tests (test/slurm).
#
#   slurm_cluster.sh start DIR     # DIR: an empty directory (e.g. from mktemp -d); prints the
#                                  # SLURM_CONF line to export; exit 77 when Slurm/munge are absent
#   export SLURM_CONF=DIR/etc/slurm.conf; sbatch ...; squeue ...
#   slurm_cluster.sh stop DIR      # cancels jobs, stops every daemon started in DIR, removes DIR
#
# Everything lives in DIR: a freshly generated munge key and munged with its own socket, pid and
# seed files; slurm.conf generated for this host (its short name, nproc CPUs, memory from
# /proc/meminfo, one stand-in GPU GRES so that the scripts' --gres=gpu:1 can be honoured);
# state, spool and logs. The host's /etc/munge and /etc/slurm are neither read nor changed, and
# the ports are picked among the free ones, so it can run next to a real installation.
#
# It must run as root, as CI does: slurmd starts job steps as the submitting user, which needs
# root, and slurmctld/slurmd run as SlurmUser=root. No cgroups (proctrack/linuxproc, task/none),
# no accounting, no slurmdbd. Debian 12's slurm-wlm 22.05 and munge 0.5.15 are what it is tested
# with (.notes/slurm.md).
set -euo pipefail

die() { echo "slurm_cluster: $*" >&2; exit 1; }

# The processes of the cluster in DIR: the daemons started here carry HK_SLURM_CLUSTER=DIR in
# their environment; slurmstepd starts with an empty environment but keeps slurmd's log (under
# DIR) open. Job processes are found as their descendants (with_descendants).
marked_pids() {
  local dir=$1 p fd
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] || [ "${p#/proc/}" = "$BASHPID" ] && continue
    if { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qxF "HK_SLURM_CLUSTER=$dir"; then
      echo "${p#/proc/}"
      continue
    fi
    for fd in "$p"/fd/*; do
      if [[ "$(readlink "$fd" 2>/dev/null)" == "$dir"/* ]]; then
        echo "${p#/proc/}"
        break
      fi
    done
  done
}

# These pids and all their descendants (job processes under a slurmstepd).
with_descendants() {
  local -A keep=()
  local p changed=1 stat ppid
  for p in "$@"; do keep[$p]=1; done
  while [ $changed -eq 1 ]; do
    changed=0
    for p in /proc/[0-9]*; do
      stat=$(cat "$p/stat" 2>/dev/null) || continue
      ppid=${stat##*) }; ppid=${ppid#* }; ppid=${ppid%% *}
      if [ -n "${keep[$ppid]:-}" ] && [ -z "${keep[${p#/proc/}]:-}" ]; then
        keep[${p#/proc/}]=1
        changed=1
      fi
    done
  done
  echo "${!keep[@]}"
}

# terminate TENTHS PID...: TERM, up to TENTHS tenths of a second, then KILL.
terminate() {
  local tenths=$1 p alive
  shift
  local pids=("$@")
  [ ${#pids[@]} -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq "$tenths"); do
    alive=()
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    [ ${#alive[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "${alive[@]}" 2>/dev/null || true
}

# The pid recorded in a pid file of DIR/run, only while that process still carries DIR's mark (a
# pid reused by an unrelated process after the daemon died is never signalled).
pid_of() {
  local file=$1 dir pid
  dir=$(dirname "$(dirname "$file")")
  pid=$(cat "$file" 2>/dev/null) || return 0
  if { tr '\0' '\n' < "/proc/$pid/environ"; } 2>/dev/null | grep -qxF "HK_SLURM_CLUSTER=$dir"; then
    echo "$pid"
  fi
}

# A child started here that has exited stays a zombie until this script ends: not alive.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

stop() {
  local dir=$1
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd -P)
  [ -f "$dir/cluster.marker" ] || die "$dir is not a cluster directory of this script (no cluster.marker); not touching it"
  if [ -f "$dir/etc/slurm.conf" ] && [ -n "$(pid_of "$dir/run/slurmctld.pid")" ]; then
    # Cancel what is still queued or running so that slurmd ends its steps cleanly.
    export SLURM_CONF=$dir/etc/slurm.conf
    timeout 5 scancel --quiet --user=root 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  # Both Slurm daemons at once (each takes a second or two to shut down), then whatever slurmd
  # left behind (slurmstepd, job processes), then munged, which the others need until the end.
  local munged_pid
  munged_pid=$(pid_of "$dir/run/munged.pid")
  # shellcheck disable=SC2046
  terminate 50 $(pid_of "$dir/run/slurmd.pid") $(pid_of "$dir/run/slurmctld.pid")
  # Leftovers of a cluster whose controller died: no clean shutdown to wait for.
  # shellcheck disable=SC2046
  terminate 10 $(with_descendants $(marked_pids "$dir" | grep -vxF -e "${munged_pid:-none}" || true))
  [ -n "$munged_pid" ] && terminate 50 "$munged_pid"
  # Anything else still marked (should be none).
  # shellcheck disable=SC2046
  terminate 10 $(marked_pids "$dir")
  rm -rf "$dir"
}

# A free TCP port: random, below Linux's ephemeral range (32768+) so that no outgoing connection
# takes it meanwhile, not in use on this host (/proc/net/tcp{,6}), and not one of $*.
free_port() {
  local used="" local_addr port
  while read -r _ local_addr _; do
    [[ $local_addr == *:* ]] && used+=" $(( 16#${local_addr##*:} ))"
  done < <(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  used+=" "
  for _ in $(seq 200); do
    port=$(( 20000 + RANDOM % 12000 ))
    if [[ $used != *" $port "* ]] && [[ " $* " != *" $port "* ]]; then
      echo "$port"
      return 0
    fi
  done
  die "no free TCP port found"
}

start() {
  local dir=$1
  for tool in munged mungekey munge slurmctld slurmd sinfo sbatch scontrol scancel srun; do
    if ! command -v "$tool" >/dev/null && [ ! -x "/usr/sbin/$tool" ]; then
      echo "slurm_cluster: $tool is not installed (Debian packages slurm-wlm and munge)" >&2
      exit 77
    fi
  done
  [ "$(id -u)" -eq 0 ] || die "must run as root (slurmd launches jobs as the submitting user)"
  [ -d "$dir" ] || die "$dir: no such directory"
  [ -z "$(ls -A "$dir")" ] || die "$dir: not empty"
  export PATH=$PATH:/usr/sbin
  dir=$(cd "$dir" && pwd -P)   # physical: compared with /proc/PID/fd links
  touch "$dir/cluster.marker"
  # Any failure from here on (set -e or die) stops what was started and removes DIR.
  trap 'echo "slurm_cluster: start failed; last log lines:" >&2; tail -n 20 "$dir"/log/* >&2 2>/dev/null || true; stop "$dir"' EXIT
  mkdir -p "$dir"/{etc,munge,run,log,state,spool}
  # munged wants its socket's directories searchable by all, and none writable by others.
  chmod 0755 "$dir" "$dir/munge"
  export HK_SLURM_CLUSTER=$dir

  # ---- munge: own key, own socket; the host's munged (if any) is left alone
  mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
  chmod 0400 "$dir/munge/munge.key"
  local sock=$dir/munge/munge.socket
  munged --foreground --socket="$sock" --key-file="$dir/munge/munge.key" --pid-file="$dir/run/munged.pid.own" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" </dev/null >>"$dir/log/munged.log" 2>&1 &
  echo $! > "$dir/run/munged.pid"
  for _ in $(seq 100); do
    [ -S "$sock" ] && munge -n -S "$sock" 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1 && break
    alive "$(cat "$dir/run/munged.pid")" || die "munged exited: $(tail -n 3 "$dir/log/munged.log")"
    sleep 0.1
  done
  [ -S "$sock" ] || die "munged did not create $sock"

  # ---- slurm.conf for this host
  local host cpus mem_mb ctld_port slurmd_port p
  host=$(hostname -s)
  cpus=$(nproc)
  # slurmd reports a little less than MemTotal; config_overrides keeps the node from being
  # drained over the difference, and 95% leaves room for it anyway.
  mem_mb=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.95 }' /proc/meminfo)
  ctld_port=$(free_port)
  slurmd_port=$(free_port "$ctld_port")
  : > "$dir/etc/plugstack.conf"   # not the host's /etc/slurm/plugstack.conf
  # Slurm 22.05 drops a GPU without a device file (count-only) and wants a character device:
  # DIR/dev/nvidia0 is a link to /dev/null. Jobs get the GPU GRES, and no GPU.
  mkdir -p "$dir/dev"
  ln -s /dev/null "$dir/dev/nvidia0"
  cat > "$dir/etc/gres.conf" <<EOF
NodeName=$host Name=gpu File=$dir/dev/nvidia0
EOF
  cat > "$dir/etc/slurm.conf" <<EOF
# Generated by test/slurm/slurm_cluster.sh for a throwaway single-node cluster.
ClusterName=hktest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid.own
SlurmdPidFile=$dir/run/slurmd.pid.own
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
InactiveLimit=0
MailProg=/bin/true
# Start jobs as soon as they are submitted or resources free up (defaults wait up to 3 s).
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MinJobAge=300
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$dir/etc/slurm.conf

  # ---- daemons, in the foreground of background jobs so that their pids are known here
  slurmctld -D -c -i -f "$SLURM_CONF" </dev/null >>"$dir/log/slurmctld.out" 2>&1 &
  echo $! > "$dir/run/slurmctld.pid"
  slurmd -D -f "$SLURM_CONF" </dev/null >>"$dir/log/slurmd.out" 2>&1 &
  echo $! > "$dir/run/slurmd.pid"

  local state="" deadline=$(( SECONDS + 30 ))
  while [ $SECONDS -lt $deadline ]; do
    state=$(timeout 5 sinfo -h -N -n "$host" -o '%T' 2>/dev/null || true)
    [ "$state" = idle ] && break
    case $state in
      inval*|drain*) die "node $host is $state: $(scontrol show node "$host" 2>/dev/null | grep -o 'Reason=.*')" ;;
    esac
    for p in slurmctld slurmd; do
      alive "$(cat "$dir/run/$p.pid")" || die "$p exited: $(tail -n 5 "$dir/log/$p.log" "$dir/log/$p.out" 2>/dev/null)"
    done
    sleep 0.1
  done
  [ "$state" = idle ] || die "node $host not idle after 30 s (state '${state:-none}')"
  trap - EXIT
  echo "SLURM_CONF=$SLURM_CONF"
}

case ${1:-} in
  start) [ $# -eq 2 ] || die "usage: $0 start DIR"; start "$2" ;;
  stop)  [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
  *) echo "usage: $0 start DIR | stop DIR" >&2; exit 2 ;;
esac
