# shellcheck shell=bash
# Signalling the processes a shell test started (their pids in PIDS), and
# only those.  A pid that was waited for, or whose process ended and was
# reaped, may already name another process: the kernel recycles pids, fast
# under load, and a signal to it would hit a stranger -- say another test's
# psd, or that test's own shell, whose exit trap then removes its files.
# So every signal goes to a pid that is still one of this shell's running
# jobs at that moment.

# live_pids: the members of PIDS that are running jobs of this shell
live_pids() {
    local run p
    run=" $(jobs -rp | tr '\n' ' ') "
    for p in "${PIDS[@]}"; do [[ $run == *" $p "* ]] && echo "$p"; done
}

# is_live PID: PID is a running job of this shell
is_live() { [[ " $(jobs -rp | tr '\n' ' ') " == *" $1 "* ]]; }

# reap_pid PID TRIES: give a signalled job TRIES tenths of a second to
# exit, SIGKILL it if it still runs, and reap it
reap_pid() {
    for _ in $(seq 1 "$2"); do is_live "$1" || break; sleep 0.1; done
    is_live "$1" && kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

# stop_pids [TRIES]: SIGTERM every live member of PIDS, give each TRIES
# tenths of a second (default 10) to exit (psd checkpoints on SIGTERM),
# then SIGKILL what still runs, and reap them all
stop_pids() {
    local tries=${1:-10} p
    local live=($(live_pids))
    for p in "${live[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${live[@]}"; do reap_pid "$p" "$tries"; done
}
