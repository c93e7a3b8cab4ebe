#!/usr/bin/env bash
# A single-host Slurm cluster on this machine: one node (this host, its real CPUs and memory),
# or SLURM_SH_NODES emulated nodes (one slurmd each on this host), one partition, munge
# authentication. For the harness's opt-in Slurm tests (pytest -m slurm) and
# for trying `srun ... torchrun` by hand. Debian/Ubuntu only (apt-get, Debian's package paths).
#
#   scripts/slurm/single_host.sh [start]   install if needed, write the config, start munged,
#                                          slurmctld and slurmd, wait until the node is idle
#   scripts/slurm/single_host.sh stop      stop slurmd, slurmctld and munged
#   scripts/slurm/single_host.sh status    daemons, sinfo, the proctrack plugin in use
#
# Needs root. Idempotent: re-running `start` leaves running daemons alone when the config it would
# write is unchanged, and restarts them when it changed. The daemons are started directly (no
# systemd: this also works in containers and VMs without an init system), each with its pid file.
#
# Environment (all optional):
#   SLURM_SH_PROCTRACK   auto (default) | cgroup | linuxproc. auto tries proctrack/cgroup (with
#                        task/cgroup) and falls back to proctrack/linuxproc (with task/none) when
#                        no cgroup filesystem is mounted or a probe step (`srun true`) fails under
#                        cgroups; the choice and why are printed and kept in the config's header
#                        (a fallback is kept by later auto runs; delete the config to retry).
#   SLURM_SH_KILLWAIT    KillWait in seconds (default 30, Slurm's own default): the time between
#                        SIGTERM and SIGKILL when a job or step is cancelled or times out.
#   SLURM_SH_PARTITION   partition name (default debug).
#   SLURM_SH_NO_INSTALL  1: never run apt-get; fail naming the missing programs instead.
#   SLURM_SH_FORCE       1: overwrite an /etc/slurm/slurm.conf that this script did not write.
#   SLURM_SH_WAIT        seconds to wait for the nodes to become idle (default 60).
#   SLURM_SH_NODES       nodes (default 1). N > 1: nodes <host>n0 .. <host>n<N-1>, each a slurmd of
#                        its own on this host (slurmd -N, port 17000 + i, its own pid file, spool
#                        and log through %n), each declared with the host's CPUs and memory (they
#                        share them), their names added to /etc/hosts at 127.0.0.1: multi-node srun
#                        (one torchrun agent a node, c10d on the first) without a second machine.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
CGROUP_CONF=$CONF_DIR/cgroup.conf
MARK="# written by scripts/slurm/single_host.sh"
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid
PACKAGES=(munge slurm-client slurmctld slurmd)

PROCTRACK=${SLURM_SH_PROCTRACK:-auto}
KILLWAIT=${SLURM_SH_KILLWAIT:-30}
PARTITION=${SLURM_SH_PARTITION:-debug}
WAIT=${SLURM_SH_WAIT:-60}
NODES=${SLURM_SH_NODES:-1}
NODE_PORT_BASE=17000

say() { printf '[single_host] %s\n' "$*"; }
die() { printf '[single_host] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $NODES =~ ^[1-9][0-9]*$ ]] || die "SLURM_SH_NODES must be a whole number >= 1 (got '$NODES')"

node_names() {  # the nodes' names, one a line: this host's short name, or <host>n0 .. (emulated)
    local host i
    host=$(hostname -s)
    if ((NODES == 1)); then echo "$host"; return; fi
    for ((i = 0; i < NODES; i++)); do echo "${host}n$i"; done
}

node_list() { node_names | paste -sd,; }

slurmd_pid() {  # slurmd_pid NODE: its pid file (SlurmdPidFile, %n expanded for emulated nodes)
    if ((NODES == 1)); then echo "$SLURMD_PID"; else echo "/run/slurmd.$1.pid"; fi
}

slurmd_log() {  # slurmd_log NODE: its log (SlurmdLogFile, %n expanded for emulated nodes)
    if ((NODES == 1)); then echo "$LOG_DIR/slurmd.log"; else echo "$LOG_DIR/slurmd.$1.log"; fi
}

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root (installs packages, writes $CONF_DIR, starts daemons)"; }

alive() {  # alive PIDFILE: the pid in it is a live process
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE: SIGTERM, wait up to 20 s, then SIGKILL
    local name=$1 file=$2 pid i
    if ! alive "$file"; then say "$name: not running"; rm -f "$file"; return 0; fi
    pid=$(cat "$file")
    say "$name: SIGTERM to pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then say "$name: still alive after 20 s, SIGKILL"; kill -KILL "$pid" || true; fi
    rm -f "$file"
}

# ---------------------------------------------------------------------------------------------
install_packages() {
    local missing=() p
    for p in munged:munge sinfo:slurm-client srun:slurm-client slurmctld:slurmctld slurmd:slurmd; do
        command -v "${p%%:*}" >/dev/null 2>&1 || missing+=("${p%%:*} (package ${p#*:})")
    done
    if ((${#missing[@]} == 0)); then say "packages: already installed ($(slurmd -V 2>/dev/null || echo '?'))"; return; fi
    [[ ${SLURM_SH_NO_INSTALL:-0} == 1 ]] && die "missing: ${missing[*]}; SLURM_SH_NO_INSTALL=1 forbids apt-get"
    command -v apt-get >/dev/null || die "missing: ${missing[*]}; and no apt-get to install them (this script knows Debian/Ubuntu only)"
    say "packages: installing ${PACKAGES[*]} with apt-get (missing: ${missing[*]})"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${PACKAGES[@]}" >/tmp/single_host_apt.log 2>&1 || {
        say "apt-get install failed; trying apt-get update first"
        apt-get update -q >>/tmp/single_host_apt.log 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${PACKAGES[@]}" >>/tmp/single_host_apt.log 2>&1 \
            || { tail -20 /tmp/single_host_apt.log >&2; die "apt-get install ${PACKAGES[*]} failed (log: /tmp/single_host_apt.log)"; }
    }
    say "packages: installed $(slurmd -V)"
}

# ---------------------------------------------------------------------------------------------
start_munge() {
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "munge: no /etc/munge/munge.key, creating one (mungekey)"
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
    fi
    if alive "$MUNGE_PID" && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        say "munge: already running (pid $(cat "$MUNGE_PID"))"; return
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    say "munge: starting munged as user munge"
    runuser -u munge -- /usr/sbin/munged || die "munged did not start (see /var/log/munge/munged.log)"
    local i
    for ((i = 0; i < 50; i++)); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || die "munge does not work: 'munge -n | unmunge' fails (see /var/log/munge/munged.log)"
    say "munge: running (pid $(cat "$MUNGE_PID")), 'munge -n | unmunge' works"
}

# ---------------------------------------------------------------------------------------------
write_config() {  # write_config PROCTRACK(cgroup|linuxproc) WHY; sets CONFIG_CHANGED=1 when it changed
    local pt=$1 why=$2 host hw cpus boards sockets cores threads mem task new_conf new_cgroup
    host=$(hostname -s)
    hw=$(slurmd -C | head -1)   # NodeName=... CPUs=.. Boards=.. SocketsPerBoard=.. CoresPerSocket=.. ThreadsPerCore=.. RealMemory=..
    field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$hw"; }
    cpus=$(field CPUs); boards=$(field Boards); sockets=$(field SocketsPerBoard)
    cores=$(field CoresPerSocket); threads=$(field ThreadsPerCore); mem=$(field RealMemory)
    [[ -n $cpus && -n $mem ]] || die "cannot read this host's CPUs and memory from 'slurmd -C' (got: $hw)"
    if [[ $pt == cgroup ]]; then task=task/cgroup; else task=task/none; fi
    local hwline="CPUs=$cpus Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem State=UNKNOWN"
    local pidfile=$SLURMD_PID spool=$STATE_DIR/slurmd dlog=$LOG_DIR/slurmd.log nodes="" i=0 name
    if ((NODES == 1)); then
        nodes="NodeName=$host NodeAddr=127.0.0.1 $hwline"
    else  # emulated nodes: slurmd -N NAME expands %n to NAME
        pidfile=/run/slurmd.%n.pid spool=$STATE_DIR/slurmd.%n dlog=$LOG_DIR/slurmd.%n.log
        for name in $(node_names); do
            nodes+="${nodes:+$'\n'}NodeName=$name NodeHostname=$host NodeAddr=127.0.0.1 Port=$((NODE_PORT_BASE + i)) $hwline"
            i=$((i + 1))
        done
    fi
    new_conf=$(cat <<EOF
$MARK
# proctrack: proctrack/$pt ($why)
# host $host: $hw
ClusterName=singlehost
SlurmctldHost=$host(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/$pt
TaskPlugin=$task
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$pidfile
SlurmdSpoolDir=$spool
StateSaveLocation=$STATE_DIR/slurmctld
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$dlog
SlurmctldDebug=info
SlurmdDebug=info
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
KillWait=$KILLWAIT
InactiveLimit=0
MinJobAge=300
Waittime=0
$nodes
PartitionName=$PARTITION Nodes=$(node_list) Default=YES MaxTime=INFINITE State=UP
EOF
)
    new_cgroup=$(cat <<EOF
$MARK
CgroupPlugin=autodetect
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
)
    if [[ -e $CONF ]] && ! grep -qF "$MARK" "$CONF" && [[ ${SLURM_SH_FORCE:-0} != 1 ]]; then
        die "$CONF exists and was not written by this script; move it away or set SLURM_SH_FORCE=1"
    fi
    CONFIG_CHANGED=0
    install -d -m 0755 "$CONF_DIR"
    if [[ ! -e $CONF ]] || [[ $(cat "$CONF") != "$new_conf" ]]; then
        printf '%s\n' "$new_conf" >"$CONF"; CONFIG_CHANGED=1
        say "config: wrote $CONF (nodes $(node_list): CPUs=$cpus RealMemory=${mem}MB each, partition $PARTITION, proctrack/$pt, $task, KillWait=$KILLWAIT)"
    else
        say "config: $CONF unchanged (proctrack/$pt)"
    fi
    if [[ ! -e $CGROUP_CONF ]] || [[ $(cat "$CGROUP_CONF") != "$new_cgroup" ]]; then
        printf '%s\n' "$new_cgroup" >"$CGROUP_CONF"; CONFIG_CHANGED=1
        say "config: wrote $CGROUP_CONF (used only by proctrack/cgroup and task/cgroup)"
    fi
}

start_daemons() {  # returns 1 (with the log's last lines) when a daemon does not start
    install -d -o slurm -g slurm -m 0755 "$LOG_DIR" "$STATE_DIR" "$STATE_DIR/slurmctld"
    if alive "$CTLD_PID"; then say "slurmctld: already running (pid $(cat "$CTLD_PID"))"
    else
        say "slurmctld: starting (log $LOG_DIR/slurmctld.log)"
        if ! slurmctld; then
            say "slurmctld failed to start; last log lines:"; tail -6 $LOG_DIR/slurmctld.log | sed 's/^/[single_host]   /'
            return 1
        fi
    fi
    local name args
    for name in $(node_names); do
        if alive "$(slurmd_pid "$name")"; then say "slurmd $name: already running (pid $(cat "$(slurmd_pid "$name")"))"; continue; fi
        if ((NODES == 1)); then args=(); install -d -m 0755 "$STATE_DIR/slurmd"
        else args=(-N "$name"); install -d -m 0755 "$STATE_DIR/slurmd.$name"; fi
        say "slurmd $name: starting (log $(slurmd_log "$name"))"
        if ! slurmd "${args[@]}"; then
            say "slurmd $name failed to start; last log lines:"; tail -6 "$(slurmd_log "$name")" | sed 's/^/[single_host]   /'
            return 1
        fi
    done
}

all_slurmd_alive() {
    local name
    for name in $(node_names); do alive "$(slurmd_pid "$name")" || return 1; done
}

resolve_nodes() {  # emulated nodes' names resolve to 127.0.0.1 (srun's nodes; the harness's c10d store is on the first)
    local name missing=()
    ((NODES == 1)) && return 0
    for name in $(node_names); do getent hosts "$name" >/dev/null || missing+=("$name"); done
    ((${#missing[@]} == 0)) && return 0
    echo "127.0.0.1 ${missing[*]}  $MARK" >>/etc/hosts
    say "/etc/hosts: added ${missing[*]} at 127.0.0.1"
}

running_slurmd_pidfiles() {  # every slurmd's pid file that names a live process, whatever SLURM_SH_NODES was
    local f
    for f in "$SLURMD_PID" /run/slurmd.*.pid; do alive "$f" && echo "$f"; done
    return 0
}

stop_daemons() {  # every slurmd this script may have started (also those of another SLURM_SH_NODES), then slurmctld
    local f
    for f in $(running_slurmd_pidfiles); do stop_pidfile "slurmd ($f)" "$f"; done
    stop_pidfile slurmctld "$CTLD_PID"
}

node_state() {  # idle when every node is idle, else the first other state
    local states
    states=$(sinfo -h -N -n "$(node_list)" -o '%T' 2>/dev/null | sort -u)
    if [[ $states == idle ]]; then echo idle; else grep -vx idle <<<"$states" | head -1; fi
}

wait_idle() {  # returns 1 (with the reason and log lines) when the node is not idle in time
    local i st=""
    for ((i = 0; i < WAIT * 2; i++)); do
        st=$(node_state || true)
        case $st in
            idle) say "nodes $(node_list): idle"; return 0 ;;
            down*|drain*|fail*)
                if ((i % 10 == 0)); then
                    say "nodes $(node_list): $st, reason: $(sinfo -h -N -n "$(node_list)" -o '%E' | sort -u | paste -sd' '); resuming"
                    scontrol update NodeName="$(node_list)" State=RESUME 2>/dev/null || true
                fi ;;
        esac
        if ! all_slurmd_alive; then
            say "a slurmd died; last log lines:"; tail -8 $LOG_DIR/slurmd*.log | sed 's/^/[single_host]   /'; return 1
        fi
        if ! alive "$CTLD_PID"; then
            say "slurmctld died; last log lines:"; tail -8 $LOG_DIR/slurmctld.log | sed 's/^/[single_host]   /'; return 1
        fi
        sleep 0.5
    done
    say "nodes $(node_list) not idle after ${WAIT}s (state: '${st:-none}'); logs: $LOG_DIR/slurmctld.log, $LOG_DIR/slurmd*.log"
    return 1
}

probe_step() {  # a step of one task a node must run: proves that the proctrack/task plugins work here
    local out
    out=$(timeout 60 srun -N"$NODES" -n"$NODES" -t 1 --job-name=single_host_probe true 2>&1) && return 0
    say "probe step failed: $out"
    tail -5 $LOG_DIR/slurmd.log | sed 's/^/[single_host]   slurmd.log: /'
    return 1
}

configured_proctrack() { sed -n 's/^ProctrackType=proctrack\///p' "$CONF" 2>/dev/null || true; }
proctrack_why() { sed -n 's/^# proctrack: proctrack\/[a-z]* (\(.*\))$/\1/p' "$CONF" 2>/dev/null || true; }

cmd_start() {
    need_root
    install_packages
    start_munge
    local first why
    case $PROCTRACK in
        auto)
            # keep an earlier run's fallback (the config's header says so), else try cgroup first
            if [[ $(proctrack_why) == fallback* ]]; then first=linuxproc; why=$(proctrack_why)
            else first=cgroup; why="auto: a probe step runs under it"; fi ;;
        cgroup|linuxproc) first=$PROCTRACK; why="SLURM_SH_PROCTRACK=$PROCTRACK" ;;
        *) die "SLURM_SH_PROCTRACK must be auto, cgroup or linuxproc (got '$PROCTRACK')" ;;
    esac
    if [[ $first == cgroup ]]; then
        if ! grep -qE '^[^ ]+ /sys/fs/cgroup[/ ]' /proc/mounts; then
            say "cgroups: nothing mounted at or under /sys/fs/cgroup"
            [[ $PROCTRACK == cgroup ]] && die "SLURM_SH_PROCTRACK=cgroup but this host has no usable cgroup filesystem"
            first=linuxproc; why="fallback: no cgroup filesystem mounted"
        fi
    fi
    write_config "$first" "$why"
    resolve_nodes
    if ((CONFIG_CHANGED)); then
        if alive "$CTLD_PID" || running_slurmd_pidfiles | grep -q .; then
            say "config changed: restarting slurmctld and slurmd (jobs now queued or running: $(squeue -h 2>/dev/null | wc -l))"
        fi
        stop_daemons
    fi
    if ((!CONFIG_CHANGED)) && alive "$CTLD_PID" && all_slurmd_alive; then
        # nothing to change: no probe step (it would queue behind running jobs, and a timeout must
        # not look like a cgroup failure); just report
        say "ready (unchanged): nodes $(node_list) $(node_state), proctrack/$(configured_proctrack) ($(proctrack_why)), KillWait=$KILLWAIT"
        sinfo
        return 0
    fi
    if ! start_daemons || ! wait_idle || ! probe_step; then
        if [[ $first == cgroup && $PROCTRACK == auto ]]; then
            say "proctrack/cgroup does not work here; falling back to proctrack/linuxproc"
            stop_daemons
            write_config linuxproc "fallback: Slurm did not run a probe step under proctrack/cgroup"
            start_daemons || die "the daemons do not start with proctrack/linuxproc either"
            wait_idle || die "Slurm does not come up with proctrack/linuxproc either"
            probe_step || die "a one-task step fails with proctrack/linuxproc too; see $LOG_DIR/slurmd.log"
        else
            die "Slurm does not run a one-task step with proctrack/$first (above); see $LOG_DIR/slurmd.log"
        fi
    fi
    wait_idle >/dev/null || die "the node did not return to idle after the probe step"
    say "ready: partition $PARTITION, nodes $(node_list), proctrack/$(configured_proctrack) ($(proctrack_why)), KillWait=$KILLWAIT"
    sinfo
}

cmd_stop() {
    need_root
    stop_daemons
    stop_pidfile munged "$MUNGE_PID"
}

cmd_status() {
    local rc=0
    for d in munged:$MUNGE_PID slurmctld:$CTLD_PID $(for n in $(node_names); do echo "slurmd_$n:$(slurmd_pid "$n")"; done); do
        if alive "${d#*:}"; then say "${d%%:*}: running (pid $(cat "${d#*:}"))"; else say "${d%%:*}: not running"; rc=1; fi
    done
    [[ -e $CONF ]] && say "config: $CONF, proctrack/$(configured_proctrack) ($(proctrack_why))"
    ((rc == 0)) && sinfo
    return $rc
}

case ${1:-start} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) die "unknown command '$1' (start, stop, status)" ;;
esac
