#!/usr/bin/env python3
"""Groups heaptrack's peak heap by what allocated it.

Input: heaptrack_print's flamegraph stacks (`-F FILE --flamegraph-cost-type peak`), one line
per call stack, root first, frames as "function (file)", its bytes at the peak last.
Output: a Markdown table, one row per part (the first rule a stack matches, checked in the
order below), then the largest stacks left in "other", so that nothing is hidden.
Usage: group.py STACKS CONNECTIONS
"""
import re
import sys
from collections import Counter

# (part, pattern searched in the whole stack). Order matters: the first match wins.
PARTS = [
    ("hyper: a connection's read buffer", r"poll_read_from_io"),
    ("hyper: a connection's state and write buffer", r"serve_connection"),
    ("a connection's task (tokio)", r"bind_new_task"),
    ("axum: the router, per connection", r"with_state<> \(path_router\.rs\)|with_state<> \(mod\.rs\)"),
    ("axum: a request's handler and middleware futures", r"\(oneshot\.rs\)|\(from_fn\.rs\)|\(boxed_clone_sync\.rs\)|\(route\.rs\)"),
    ("Redis client (commands queued, replies)", r"\(connection_manager\.rs\)|\(script\.rs\)|\(multiplexed_connection\.rs\)|redis"),
    ("librdkafka", r"rd_kafka|\(rd[a-z_]*\.[ch]\)"),
    ("tracing (spans, log lines)", r"\(span\.rs\)|\(fmt_layer\.rs\)|\(registry|tracing"),
    ("sqlx (pool, statements, rows)", r"sqlx|\(pool\.rs\)|\(statement|\(row\.rs\)"),
]

# Frames that only say "an allocation happened": skipped when naming what is left over.
PLUMBING = re.compile(r"alloc|malloc|grow|reserve|RawVec|with_capacity|_RNv|Box|box_new|new_uninit|heaptrack")


def main(path, connections):
    parts = Counter()
    other = Counter()
    total = 0
    with open(path) as stacks:
        for line in stacks:
            stack, _, cost = line.rstrip("\n").rpartition(" ")
            cost = int(cost)
            total += cost
            for name, pattern in PARTS:
                if re.search(pattern, stack):
                    parts[name] += cost
                    break
            else:
                frames = [f for f in reversed(stack.split(";")) if not PLUMBING.search(f)]
                other[" <- ".join(frames[:3])] += cost
    mib = 1024 * 1024
    print("| part | at the peak | per connection |")
    print("|---|---|---|")
    for name, _ in PARTS:
        if parts[name]:
            print(f"| {name} | {parts[name] / mib:.2f} MiB | {parts[name] / connections / 1024:.1f} KiB |")
    rest = sum(other.values())
    print(f"| other | {rest / mib:.2f} MiB | {rest / connections / 1024:.1f} KiB |")
    print(f"| **all** | **{total / mib:.2f} MiB** | |")
    print()
    print("Largest stacks in \"other\" (innermost frames first):")
    print()
    for stack, cost in other.most_common(5):
        print(f"- {cost / mib:.2f} MiB: `{stack[:160]}`")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
