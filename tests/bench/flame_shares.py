"""Shares of a folded perf profile (inferno-collapse-perf output) by what each stack is doing
where it ends: the frame nearest the leaf that names a known activity decides, so a task
switch inside a send counts as switching and yrs under tokio's scheduler counts as yrs.
Usage: python3 flame_shares.py FOLDED > shares.md"""
import collections
import sys

GROUPS = [
    ("send system calls and the kernel's TCP stack below them",
     ("sendto", "__send", "tcp_sendmsg", "sock_sendmsg", "__sys_sendto", "tcp_write_xmit")),
    ("receiving (recv and the read side of the sockets)",
     ("recvfrom", "__recv", "tcp_recvmsg", "sock_recvmsg", "__sys_recvfrom")),
    ("SQLite (the log's commits, the checkpointer)", ("sqlite3", "walChecksum", "pcache1")),
    ("fsync and the disk below it", ("fsync", "fdatasync", "ext4_sync", "jbd2")),
    ("yrs (decoding, applying and encoding updates)", ("yrs::",)),
    ("task switching and waking (the scheduler, futexes, epoll)",
     ("finish_task_switch", "__schedule", "futex", "epoll_wait", "try_to_wake_up", "park")),
    ("memory allocation", ("malloc", "_int_free", "cfree", "__rdl_alloc", "realloc")),
]


def group_of(stack):
    frames = stack.split(";")
    for frame in reversed(frames):
        for name, keys in GROUPS:
            if any(k in frame for k in keys):
                return name
    return "other (tokio tasks and channels, WebSocket framing, the rest of the server)"


def main(path):
    share = collections.Counter()
    total = 0
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        share[group_of(stack)] += int(n)
    print("| where the server's CPU went (decided by the frame nearest each stack's leaf) | share |")
    print("|---|---|")
    for name, n in share.most_common():
        print(f"| {name} | {100 * n / max(total, 1):.1f}% |")
    print(f"\nCPU time sampled: {total / 1e9:.2f} s of the server's threads over 5 s of a 12 s run"
          " (perf's `cpu-clock` at 997 Hz). The graph:"
          " [`docs/flamegraph-fanout.svg`](flamegraph-fanout.svg).")


if __name__ == "__main__":
    main(sys.argv[1])
