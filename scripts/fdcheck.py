"""Finds double closes in a test run. Usage:

    strace -f -qq -o trace.txt -e trace=close,open,openat,socket,socketpair,accept,accept4,pipe,pipe2,\
        dup,dup2,dup3,eventfd2,epoll_create1,timerfd_create,memfd_create,inotify_init1,signalfd4,fcntl,\
        clone,clone3,vfork,fork,execve,close_range,pidfd_open \
        .build/debug/broadcastPackageTests.xctest --testing-library swift-testing --filter SUITES
    python3 scripts/fdcheck.py trace.txt

Reads the `strace -f -o` output; tracks the root process's descriptor table (threads share it via
CLONE_FILES) and reports closes of descriptors believed closed: a successful one (a double close
that hit a reused number we did not see created) or EBADF (a double close that hit nothing)."""
import re, sys
lines = open(sys.argv[1], errors="replace").read().split("\n")
pending = {}
table_of = {}
root = None
CREATE = {"open","openat","socket","accept","accept4","dup","dup2","dup3","eventfd2","epoll_create1","timerfd_create","memfd_create","inotify_init1","signalfd4","pidfd_open"}
state = {}   # table -> {fd: ('open'|'closed', lineno, text)}
reports = []
def tab(tid):
    return table_of.setdefault(tid, tid)
rx = re.compile(r'^(\d+) +(.*)$')
for no, line in enumerate(lines):
    m = rx.match(line)
    if not m: continue
    tid, rest = int(m.group(1)), m.group(2)
    if root is None: root = tid; table_of[tid] = tid
    if rest.endswith("<unfinished ...>"):
        pending[tid] = rest[:-len("<unfinished ...>")]
        cm = re.match(r'^close\((\d+)', rest)
        if cm:
            # The number is free from the call's start: apply the close now, not at its return.
            rest = "close(" + cm.group(1) + ") = 0 (early)"
            pending[tid] = None
        else:
            continue
    else:
        r = re.match(r'^<\.\.\. (\w+) resumed>(.*)$', rest)
        if r:
            head = pending.pop(tid, r.group(1) + "(")
            if head is None: continue
            rest = head + r.group(2)
    c = re.match(r'^(\w+)\((.*)\)\s+= (-?\d+|\?)(.*)$', rest)
    if not c: continue
    name, args, ret, tail = c.group(1), c.group(2), c.group(3), c.group(4)
    t = tab(tid)
    fds = state.setdefault(t, {})
    if name in ("clone", "clone3", "vfork", "fork"):
        if ret.isdigit() and int(ret) > 0:
            child = int(ret)
            if "CLONE_FILES" in args: table_of[child] = t
            else: table_of[child] = child
        continue
    if name == "execve": continue
    if ret == "?" : continue
    rv = int(ret)
    if name in CREATE and rv >= 0:
        fds[rv] = ("open", no, line)
        continue
    if name in ("pipe", "pipe2", "socketpair") and rv == 0:
        for n in re.findall(r'\[(\d+), (\d+)\]', args)[:1]:
            for x in n: fds[int(x)] = ("open", no, line)
        continue
    if name == "fcntl" and ("F_DUPFD" in args) and rv >= 0:
        fds[rv] = ("open", no, line); continue
    if name == "close":
        fd = int(args.split(",")[0])
        prev = fds.get(fd)
        if t == root and prev and prev[0] == "closed":
            reports.append((no, line, prev))
        elif t == root and rv < 0 and "EBADF" in tail and fd >= 0:
            reports.append((no, line, prev))
        fds[fd] = ("closed", no, line)
print("root", root, "lines", len(lines), "suspect closes:", len(reports))
for no, line, prev in reports[:40]:
    print(f"line {no}: {line}\n   before: {prev[2] if prev else None} (line {prev[1] if prev else '-'})")
