"""The runner: PID 1 of every sandbox container. Standard library only.

The host starts it as root (six capabilities, see below) with `python3 -I -c
<this file's source> '{"preload": [...], "warmup": "...", "nproc": N}'`:
modules imported and warm-up code run once, so forked calls share them. It
speaks one JSON object per line over stdin/stdout (the docker attach stream),
written with `ensure_ascii` so the stream never holds a control byte that
docker could read as its detach keys.

Requests (each carries "id" and "op"; every request gets one reply with "id"):
    hello {}                                     -> pid, python, preloaded, uid range
    ping {}                                      -> ok (the host's check that the runner lives)
    run {code, timeout, print_last, limits, sid} -> the call's result
    open {sid, limits}                           -> a fresh empty session
    fork {sid, new}                              -> session `new` = a copy of `sid`
    close {sid}                                  -> the session's processes die

Threat model
------------
The code a call runs ("user code") is hostile and may know this file. It may
use every system call the container allows, run every program in the image,
fork, start threads, read /proc, send signals, use SysV and POSIX IPC and
sockets on the container's loopback, and fill every resource it is given.
An *episode* is one stateless call, or one opened session together with the
sessions forked from it. User code may never:
  1. read or change another episode's code, output, variables or files;
  2. signal, trace or change the limits of the runner, the zygote or another
     episode's processes, or write into their pipes;
  3. run after its call has answered: no process, no thread, no signal
     handler or timer of a session runs between its calls;
  4. leave anything to a later call: processes, files, /dev/shm entries,
     message queues, SysV segments;
  5. answer for a call it does not run, or take the container down;
  6. take all of a shared resource (processes, IPC memory) from the others.

How each boundary is enforced
-----------------------------
- One uid per episode (1, 2). The runner is root with CHOWN, DAC_OVERRIDE,
  FOWNER, KILL, SETGID and SETUID only, under no-new-privileges. Every
  stateless call and every opened session gets a fresh uid drawn at random
  from the uids the container maps, no supplementary groups, and no
  capabilities (the kernel clears them when every uid of a process turns
  non-zero; no-new-privileges keeps setuid binaries and file capabilities
  from giving any back). Linux lets one process signal, ptrace, prlimit or
  open /proc/<pid>/{fd,mem,environ} of another only under the same uid (or
  with capabilities): the runner and the zygote are root, every other
  episode is another uid. RLIMIT_NPROC ("nproc") counts per uid, so it
  bounds one episode's processes and threads without touching the others'.
- Directories (1). /work is root's with mode 0711 (no listing); each episode
  works in /work/<name>, owned by its uid, mode 0700, which is also HOME and
  TMPDIR. The cwd is not on sys.path (`-I`), so nothing in a directory is
  imported by name. User code runs with umask 077.
- No shared place (1). A name that every episode can make is a channel even
  when each entry is private: one episode makes it first, world-writable (a
  file, a link, a directory), and another writes into it. So /work/<name> is
  the only place an episode can make a name. Every shared filesystem place
  of the container, and how it is kept from user code:
    /               read-only (the host mounts the image read-only), and with
                    it /tmp, /var/tmp, /run, /run/lock and every other
                    directory of the image;
    /dev/shm        a tmpfs the runner makes root's 1755 at start: no POSIX
                    shared memory or semaphores (shm_open, sem_open) for user
                    code;
    /dev/mqueue     the same, 0755: no POSIX message queue can be created (and
                    the host sets fs.mqueue.queues_max = 0);
    /dev, /dev/pts  root's 0755 tmpfs and devpts: only the device nodes
                    (/dev/null, /dev/ptmx, ...) are writable, and they store
                    nothing;
    /etc/hosts, /etc/hostname, /etc/resolv.conf  read-only bind mounts;
    /proc, /sys     no entry can be made.
  At start the runner takes group and other write off every directory and
  file on each writable mount but /work (`close_shared_places`), so an image
  that ships a world-writable place on one still has none. SysV keys are one
  namespace too: the host sets kernel.shmmni, msgmni and sem to 0, so no SysV
  segment, queue or semaphore exists (a private IPC namespace per episode
  would need CAP_SYS_ADMIN).
- A clean template (1). The runner holds every request and every output, so
  no process that runs user code is forked from it. The *zygote* is forked
  from the runner right after warm-up, before the first request; it only
  ever reads "spawn uid U in directory D" orders with pipe fds, and forks
  the processes of stateless calls and the heads of new sessions, each of
  which drops to its uid before it reads a byte of its code.
- End of a call (3, 4). A stateless call ends with kill(-1) sent as its uid
  (ruid = euid = the call's uid, saved uid 0 to come back): one system call
  that reaches every process and thread of it, forks in flight included
  (the kernel aborts a fork whose parent has SIGKILL pending). Its SysV
  segments are removed before the reply (a segment a dying process still
  holds is waited for); its directory, /dev/shm and /dev/mqueue entries and
  other SysV objects right after; every pass removes those of any uid no
  call or session holds (none can exist, see above: a second lock).
  Removal cannot be starved or recursed: what nothing holds is removed
  before the next call's directory is made (a call that filled /work or its
  inodes leaves room for the next), trees are removed without recursion and
  through directory fds (any depth, any path length), and if /work stays
  full while nothing holds it the runner exits, so the host replaces the
  container like a dead one.
- Sessions (3). A head process holds the variables; each cell runs in a fork
  of the head (a cell that is killed leaves the state as it was), and the
  fork becomes the head when the cell ends: if the cell left threads, a
  fork of it (which copies only the calling thread) becomes the head. The
  runner checks from /proc that the new head is one thread of the session's
  uid, kills every other process the cell left (found by parent links; one
  that detached is killed as soon as no call of its episode is in flight,
  when every process of the uid but the heads dies), and stops the idle head
  with SIGSTOP: no thread, timer or signal handler of a session runs
  between its calls. Before it resumes a head it checks that it is still
  one thread of the session's uid; a head that is not is killed ("session
  lost").
- Control messages (5). A head talks to the runner over a socketpair that
  user code can reach (the head ran user code). The runner therefore trusts
  only what the kernel says about a message (its sender's pid and uid, with
  SO_PASSCRED), checks every field's type, and lets a message speak only for
  its own session: "done" makes its sender the head (and stops it), "died"
  counts only from the head. A cell that forges "done" answers its own call
  early and is frozen with the rest of it killed. The runner reads at most
  CTRL_BATCH messages from a socket per wake-up, so a flood cannot hold the
  loop from the other sessions or the host's ping, and a session that sends
  more than CTRL_FLOOD messages for one call (a call needs one or two) is
  ended: the flooder loses its session, its neighbours lose nothing.
- Numbers from the host (5). A call's timeout is clamped to a day (an
  infinite one would overflow select()); the loop wakes at least every
  MAX_WAIT_S.
- Shared resources (6). The per-uid process limit (the container's pids
  limit is sized for `nproc` times the episodes it holds), no SysV or POSIX
  IPC, RLIMIT_AS per process; user code runs at nice 5 so the runner keeps
  CPU to enforce deadlines under a CPU hog. /work's bytes and inodes are
  capped per container (its tmpfs): a stateless container runs one call at a
  time, so that is the call's budget, cleaned before the next call.

What this does not cover
------------------------
- Forks of a session share its uid: a fork is a copy of a process that ran
  the session's code, only a privileged process can change its uid, and no
  process that ran user code may hold a privilege. That code could anyway
  leave a channel into every fork (an inherited fd, shared memory), so a
  session and its forks (the branches of one episode) are one trust domain.
- Episodes in one container share its CPU, memory (the OOM killer takes
  the largest process) and /work's space: one can slow another or make its
  writes fail, never read or change it. (Per-uid tmpfs quotas would bound
  each session's share of /work; Docker 20.10 refuses their mount options.)
- /proc shows every process's command line to every uid (hiding it needs
  CAP_SYS_ADMIN): code passed as an argument (`python3 -c CODE`) is visible
  to other episodes while that program runs.
- Loopback ports and abstract unix sockets are names shared by the
  container (a private network namespace per episode needs CAP_SYS_ADMIN):
  an episode that listens on a port first receives the connections another
  episode meant for a server of its own whose bind then failed.
- No /dev/shm means no POSIX semaphores: `multiprocessing` pools and locks
  raise PermissionError (threads work).
"""

import ast
import builtins
import ctypes
import fcntl
import gc
import io
import json
import linecache
import os
import random
import resource
import selectors
import shutil
import signal
import socket
import stat
import struct
import sys
import time
import traceback

WORK = "/work"
CELL = "<cell>"
F_SETPIPE_SZ = 1031
PIPE_SIZE = 1 << 20
MSG_MAX = 1 << 16
STATUS_MAX = 1 << 16  # a call's status line is small; more is a flood, not a status
HANDED_OVER = 86  # a cell's exit status when a single-threaded fork of it became the head
RECOVER_S = 1.5  # a session whose cell was killed must report within this, or it is lost
FORK_S = 30.0  # a session fork (it copies the files) must report within this
MAX_CALL_S = 86400.0  # the longest timeout a call may have (the host's config allows no more)
MAX_WAIT_S = 60.0  # the loop wakes at least this often
CTRL_BATCH = 8  # messages read from one session's control socket per wake-up: the others get their turn
CTRL_FLOOD = 64  # messages a session may send per call or fork it was given; one more ends the session
STANDBY_RETRY_S = 1.0  # how long a full /work is cleaned and retried before the runner gives up
CRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
IPC_RMID = 0
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


# ----------------------------------------------------------------------------
# Pure helpers (the host's unit tests import these).


def compile_cell(code, print_last=True):
    """Compiles `code`; returns (body, last_expr or None) as code objects.

    When `print_last` and the last statement is an expression, it is split off
    so its value can be printed, as a notebook does.
    """
    tree = ast.parse(code, CELL, "exec")
    last = None
    if print_last and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, CELL, "exec")
    expr = compile(last, CELL, "eval") if last is not None else None
    return body, expr


def run_cell(code, ns, print_last=True):
    """Runs `code` in namespace `ns`; returns (exit_code, short_error or None).

    Exceptions print a traceback (frames of the cell only) to stderr.
    """
    linecache.cache[CELL] = (len(code), None, code.splitlines(True), CELL)
    try:
        body, expr = compile_cell(code, print_last)
        exec(body, ns)
        if expr is not None:
            value = eval(expr, ns)
            if value is not None:
                print(repr(value))
        return 0, None
    except SystemExit as e:
        if e.code is None or e.code == 0:
            return 0, None
        if isinstance(e.code, int):
            return e.code, "SystemExit: %d" % e.code
        print(e.code, file=sys.stderr)
        return 1, "SystemExit: %s" % short(str(e.code))
    except BaseException as e:  # the agent's exception: a result, never a crash
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
            tb = tb.tb_next
        try:
            traceback.print_exception(type(e), e, tb)
        except Exception:
            print("%s: <unprintable>" % type(e).__name__, file=sys.stderr)
        return 1, short(error_line(e))


def error_line(e):
    try:
        text = str(e)
    except Exception:
        text = "<unprintable>"
    if isinstance(e, SyntaxError) and e.lineno:
        text = "%s (line %d)" % (e.msg, e.lineno)
    return "%s: %s" % (type(e).__name__, text) if text else type(e).__name__


def short(text, n=300):
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


class Capture:
    """Keeps the first `head` and the last `tail` bytes of a stream, counts all."""

    def __init__(self, head, tail):
        self.head_max, self.tail_max = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data):
        self.total += len(data)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_max:
            self.tail += data
            if len(self.tail) > 2 * self.tail_max:  # trim in batches, not per read
                del self.tail[: len(self.tail) - self.tail_max]

    def text(self):
        tail = self.tail[-self.tail_max :] if self.tail_max else b""
        cut = self.total - len(self.head) - len(tail)
        if cut <= 0:
            return (bytes(self.head) + bytes(tail)).decode("utf-8", "replace")
        return "%s\n[... %d bytes cut ...]\n%s" % (
            bytes(self.head).decode("utf-8", "replace"),
            cut,
            bytes(tail).decode("utf-8", "replace"),
        )


def checked_status(msg):
    """(exit_code, error) from a status a call's process wrote: it ran user code, so
    any field of the wrong type is dropped rather than passed on to the host."""
    exit_code = msg.get("exit") if isinstance(msg, dict) else None
    error = msg.get("error") if isinstance(msg, dict) else None
    if not isinstance(exit_code, int) or isinstance(exit_code, bool) or not -(1 << 31) <= exit_code < (1 << 31):
        exit_code = None
    error = short(error) if isinstance(error, str) else None
    if exit_code is None and error is None:
        error = "the call's process sent a malformed status"
    return exit_code, error


# ----------------------------------------------------------------------------
# Processes, uids and what they own.


def oom_kills():
    """The container's OOM-kill counter (cgroup v1 or v2), or None."""
    for path, key in (
        ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
        ("/sys/fs/cgroup/memory.events", "oom_kill"),
    ):
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
        except (OSError, ValueError):
            continue
    return None


def uid_range():
    """The uids episodes are drawn from: inside what this container maps, far from
    system and login uids. Without a user namespace that is [2^20, 2^30)."""
    best = (0, 0)
    with open("/proc/self/uid_map") as f:
        for line in f:
            inside, _, count = (int(v) for v in line.split())
            lo, hi = max(inside, 10000), min(inside + count, 1 << 30) - 2  # not 65535 / -1 style ids
            if inside + count > 1 << 20:
                lo = max(lo, 1 << 20)
            if hi - lo > best[1] - best[0]:
                best = (lo, hi)
    if best[1] - best[0] < 1024:
        raise RuntimeError("the container maps too few uids for one uid per call: %r" % (best,))
    return best


def proc_status(pid):
    """(ppid, uid, threads, state) of `pid` from /proc, or None when it is gone."""
    try:
        fd = os.open("/proc/%d/status" % pid, os.O_RDONLY)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    ppid = uid = threads = None
    state = b"?"
    for line in data.split(b"\n"):
        if line.startswith(b"State:"):
            state = line.split()[1]
        elif line.startswith(b"PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith(b"Uid:"):
            uid = int(line.split()[1])  # the real uid: what RLIMIT_NPROC and kill(-1) go by
        elif line.startswith(b"Threads:"):
            threads = int(line.split()[1])
            break
    if ppid is None or uid is None or threads is None:
        return None
    return ppid, uid, threads, state.decode()


def processes():
    """{pid: (ppid, uid, threads, state)} of every process but PID 1."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1":
            st = proc_status(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def kill_uid(uid):
    """SIGKILL to every process of `uid`, in one system call.

    kill(-1) reaches every process the caller may signal: with ruid = euid =
    `uid` that is exactly the processes of `uid` (the runner keeps saved uid
    0 to come back; meanwhile no user process may prlimit or trace it, for
    that needs all three uids to match, and PID 1 takes no signal it does
    not handle)."""
    os.setresuid(uid, uid, 0)
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass  # ESRCH: none left
    finally:
        os.setresuid(0, 0, 0)


_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def sysv_objects(kinds=("shm", "msg", "sem")):
    """[(kind, id, creator uid)] of the container's SysV segments, queues and semaphores
    (a segment removed while attached is listed until its last process detaches)."""
    out = []
    for kind in kinds:
        try:
            with open("/proc/sysvipc/" + kind) as f:
                header = f.readline().split()
                rows = [line.split() for line in f]
        except OSError:
            continue
        try:
            i_id, i_cuid = header.index({"shm": "shmid", "msg": "msqid", "sem": "semid"}[kind]), header.index("cuid")
        except ValueError:
            continue
        out += [(kind, int(r[i_id]), int(r[i_cuid])) for r in rows if len(r) > max(i_id, i_cuid)]
    return out


def remove_sysv(kind, ident, cuid):
    """IPC_RMID needs the creator's euid (or CAP_SYS_ADMIN, which the runner lacks)."""
    os.seteuid(cuid)
    try:
        if kind == "shm":
            libc().shmctl(ident, IPC_RMID, None)
        elif kind == "msg":
            libc().msgctl(ident, IPC_RMID, None)
        else:
            libc().semctl(ident, 0, IPC_RMID)
    finally:
        os.seteuid(0)


def drop_sysv(uid, wait_s=0.5):
    """Removes the SysV segments `uid` created, and waits (only if one is still attached by
    a dying process, at most `wait_s`) until the kernel has freed them: till then another
    uid could still attach one by its id, if its mode allowed. (Queues and semaphores go
    at once, with the other leftovers in `clean_shared`.)"""
    end = time.monotonic() + wait_s
    while True:
        mine = [obj for obj in sysv_objects(("shm",)) if obj[2] == uid]
        if not mine or time.monotonic() > end:
            return
        for kind, ident, cuid in mine:
            try:
                remove_sysv(kind, ident, cuid)
            except OSError:
                pass
        time.sleep(0.001)


def make_dir(name, uid):
    """/work/<name>, owned by `uid`, mode 0700: no other uid lists, reads or writes it."""
    path = os.path.join(WORK, name)
    remove_path(path)
    os.mkdir(path, 0o700)
    os.chown(path, uid, uid)
    return path


def remove_path(path):
    """Removes a file, a link or a whole tree (never following a link); errors are ignored."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            remove_tree(path)
        else:
            os.unlink(path)
    except OSError:
        pass


def remove_tree(path):
    """Removes the directory `path` and everything below it, however deep or wide: without
    recursion (a tree 3,000 deep would pass Python's recursion limit), through directory fds
    with one open at a time (a deep tree's paths pass PATH_MAX, and its depth the fd limit),
    each directory listed once. The walk back up checks each parent by device and inode, so
    a tree that changed under it is left, never a directory outside it removed."""
    fd = os.open(path, DIR_FLAGS)
    levels = []  # per directory above `fd`: its (dev, ino), its subdirectories left, the name of `fd`'s
    try:
        subs = clear_dir(fd)
        while True:
            if subs:
                name = subs.pop()
                try:
                    os.rmdir(name, dir_fd=fd)  # an empty one goes without a descent
                    continue
                except OSError:
                    pass
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    return
                st = os.fstat(fd)
                levels.append(((st.st_dev, st.st_ino), subs, name))
                os.close(fd)
                fd = child
                subs = clear_dir(fd)
                continue
            if not levels:  # `path` itself is empty now
                break
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            ident, subs, name = levels.pop()
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != ident:
                return  # moved under us: stop rather than walk somewhere else
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError:
                return  # not empty after all (something still writes there): the next pass retries
    finally:
        os.close(fd)
    os.rmdir(path)


def clear_dir(fd):
    """Unlinks every entry of directory `fd` but its subdirectories; returns their names."""
    subs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subs.append(entry.name)
            else:
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except OSError:
                    pass
    return subs


def close_shared_places(keep=(WORK,), most=20000):
    """Takes group and other write off every directory and regular file of the container's
    writable mounts but `keep` (and /proc, /sys): names there are shared by every episode
    (/dev/shm, /dev/mqueue, a /tmp), so one episode could plant a file, a link or a
    world-writable directory where another writes. Returns the paths it changed."""
    changed = []
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    points = set()
    for m in mounts:
        point = m[4].encode().decode("unicode_escape")  # mountinfo writes a space as \040
        if "rw" in m[5].split(",") and point != "/" and not point.startswith(("/proc", "/sys")):
            points.add(point)
    seen = 0
    for point in sorted(points):
        if any(point == k or point.startswith(k + "/") for k in keep):
            continue
        for root, dirs, files in os.walk(point):
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in keep]
            for path in [root] + [os.path.join(root, name) for name in files]:
                seen += 1
                try:
                    st = os.lstat(path)
                    if (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and st.st_mode & 0o022:
                        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
                        changed.append(path)
                except OSError:
                    pass
            if seen > most:
                return changed
    return changed


def reap(wake_fd):
    """Empties a SIGCHLD wake-up pipe; returns [(pid, status)] of the children that exited."""
    try:
        while os.read(wake_fd, 4096):
            pass
    except BlockingIOError:
        pass
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        out.append((pid, status))
    return out


def decode_status(status):
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def set_comm(name):
    """Names the process in /proc (tests and `ps` tell the parts apart by it)."""
    try:
        libc().prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass


def set_not_dumpable():
    """No process may ptrace us or open /proc/1/fd (our host stream); root and
    different uids already keep user code out, this is the second lock."""
    try:
        libc().prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


# ----------------------------------------------------------------------------
# Plumbing shared by every child.


def close_fds_except(keep):
    keep = sorted(set(keep) | {0, 1, 2})
    lo = 0
    for fd in keep + [1 << 16]:
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1


def limit_address_space(limits):
    """Caps virtual memory so a huge allocation fails at once with MemoryError
    instead of thrashing up to the container's memory limit and an OOM kill."""
    try:
        n = int((limits or {}).get("address_space", 0))
        if n > 0:
            resource.setrlimit(resource.RLIMIT_AS, (n, n))
    except (AttributeError, TypeError, ValueError, OSError):
        pass


def attach_stdio(out_fd, err_fd):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), "utf-8", "backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), "utf-8", "backslashreplace", line_buffering=True)


def null_stdio(keep_stderr=False):
    """Points fds 0-2 at /dev/null (only the runner holds the host stream)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1) if keep_stderr else (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def detach_stdio():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def fresh_ns():
    return {"__name__": "__main__", "__builtins__": builtins}


def send_msg(sock, msg, fds=()):
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks)


def feed(fd, data, helpers):
    """Writes `data` into pipe `fd` and closes it; what the pipe cannot hold now a
    helper process writes as the reader reads (the runner never blocks on a pipe)."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, max(len(data) + 1, 4096))
    except OSError:
        pass
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except BlockingIOError:
        pid = os.fork()
        if pid == 0:
            close_fds_except((fd,))
            os.set_blocking(fd, True)
            try:
                write_all(fd, view)
            finally:
                os._exit(0)
        helpers.add(pid)
    except OSError:
        pass  # the reader died: its call reports that
    os.close(fd)


# ----------------------------------------------------------------------------
# The zygote and the processes it forks (they run user code).


def zygote_main(sock, nproc):
    """Forks the processes that run user code. It holds nothing of any call: it was
    forked from the runner before the first request and reads only spawn orders."""
    set_comm("sandbox-zygote")
    null_stdio(keep_stderr=True)
    os.chdir("/")
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fd == wake_r:
                for pid, status in reap(wake_r):
                    send_msg(sock, {"exit": pid, "status": status})
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, MSG_MAX, 8)
            except OSError:
                os._exit(0)
            if not data:
                os._exit(0)  # the runner is gone
            order = json.loads(data)
            try:
                pid = os.fork()
            except OSError as e:
                send_msg(sock, {"n": order["n"], "error": short("could not start a process: %s" % e)})
                pid = None
            if pid == 0:
                spawned(order, fds, nproc)  # never returns
            for fd in fds:
                os.close(fd)
            if pid is not None:
                send_msg(sock, {"n": order["n"], "pid": pid})


def spawned(order, fds, nproc):
    """A zygote's child: drops to its episode's uid, then serves its call or session."""
    code = 70
    try:
        set_comm("sandbox-idle" if order["kind"] == "job" else "sandbox-head")
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        close_fds_except(fds)
        null_stdio()  # the zygote's stderr is the host stream
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # the OOM killer takes user code, never the runner or the zygote
        os.nice(5)  # the runner keeps CPU to enforce deadlines while user code hogs it
        os.umask(0o077)  # what user code creates (in /dev/shm too) is its own unless it says otherwise
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))  # per uid: this episode only
        uid, cwd = order["uid"], order["dir"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        with open("/proc/self/status") as f:
            caps = [line.split()[1] for line in f if line.startswith(("CapPrm", "CapEff"))]
        if os.getresuid() != (uid, uid, uid) or any(int(c, 16) for c in caps):
            os._exit(71)  # never run user code with a privilege left
        # The uid change made us non-dumpable (our /proc files root's, even to us); an
        # ordinary process is dumpable, and that opens nothing to another uid.
        libc().prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
        os.chdir(cwd)
        os.environ.update(HOME=cwd, TMPDIR=cwd, USER="sandbox", LOGNAME="sandbox")
        sys.argv = [""]
        if order["kind"] == "job":
            code = job_main(*fds)
        else:
            limit_address_space(order.get("limits"))
            head_main(socket.socket(fileno=fds[0]), cwd)
    except BaseException:
        pass
    os._exit(code & 0xFF if isinstance(code, int) else 1)


def job_main(req_r, out_w, err_w, status_w):
    """A stateless call's process: waits (as "sandbox-idle") for its call, runs it."""
    req = json.loads(read_all(req_r))
    set_comm("sandbox-call")
    limit_address_space(req.get("limits"))
    attach_stdio(out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    exit_code, error = run_cell(req["code"], fresh_ns(), req.get("print_last", True))
    detach_stdio()
    try:  # the code may have filled or broken this pipe: then our exit status answers instead
        os.set_blocking(status_w, False)
        os.write(status_w, json.dumps({"exit": exit_code, "error": error}).encode())
    except OSError:
        pass
    return exit_code


def head_main(ctrl, cwd):
    """A session head: owns the variables, forks per cell and per session fork."""
    null_stdio()
    ns = fresh_ns()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctrl, MSG_MAX, 4)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # the runner closed the session
        msg = json.loads(data)
        kind = msg.get("t")
        if kind == "run":
            ctrl = head_cell(ctrl, ns, msg, fds)
        elif kind == "fork":
            ctrl, cwd = head_fork(ctrl, cwd, msg, fds[0])
        else:
            os._exit(0)


def head_cell(ctrl, ns, msg, fds):
    """Runs one cell in a fork; the fork reports "done" and is the head from then on,
    or dies and this process reports "died" and stays the head."""
    code_fd, out_fd, err_fd = fds
    rid = msg.get("rid")  # echoed, so the runner never takes one cell's message for another's
    code = read_all(code_fd).decode("utf-8", "replace")
    try:
        pid = os.fork()
    except OSError as e:
        for fd in (out_fd, err_fd):
            os.close(fd)
        send_msg(ctrl, {"t": "died", "rid": rid, "error": short("could not start the cell: %s" % e)})
        return ctrl
    if pid == 0:
        # A session of its own: once it is the head and stopped, the death of the old
        # head can never make its process group an orphan that the kernel sends SIGHUP.
        os.setsid()
        set_comm("sandbox-cell")
        attach_stdio(out_fd, err_fd)
        os.close(out_fd)
        os.close(err_fd)
        exit_code, error = run_cell(code, ns, msg.get("print_last", True))
        detach_stdio()
        become_head(ctrl, {"t": "done", "rid": rid, "exit": exit_code, "error": error})
        return ctrl
    for fd in (out_fd, err_fd):
        os.close(fd)
    _, status = os.waitpid(pid, 0)  # the runner kills us once the cell is the head
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == HANDED_OVER:
        os._exit(0)
    send_msg(ctrl, {"t": "died", "rid": rid, "status": status})
    return ctrl


def become_head(ctrl, done):
    """Sends `done` from a single-threaded process holding the cell's variables: this
    one, or, if the cell left threads, a fork of it (fork copies only this thread)."""
    if len(os.listdir("/proc/self/task")) > 1:
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            pid = -1  # the runner sees the threads and rolls the cell back
        if pid > 0:
            os.close(w)
            os.read(r, 1)  # "done" is out before we exit, so the old head never reports "died"
            os._exit(HANDED_OVER)
        os.close(r)
        if pid == 0:
            os.setsid()
        send_msg(ctrl, done)
        try:
            os.write(w, b"x")
        except OSError:
            pass  # the runner may have stopped us and killed it in between: it has the message
        os.close(w)
    else:
        send_msg(ctrl, done)
    set_comm("sandbox-head")


def head_fork(ctrl, cwd, msg, new_ctrl_fd):
    """Forks the head: the child serves the new session over `new_ctrl_fd`."""
    try:
        pid = os.fork()
    except OSError as e:
        os.close(new_ctrl_fd)
        send_msg(ctrl, {"t": "fork_failed", "error": short("could not fork the session: %s" % e)})
        return ctrl, cwd
    if pid == 0:
        ctrl.close()
        new_ctrl = socket.socket(fileno=new_ctrl_fd)
        os.setsid()
        new_cwd = msg["dir"]  # made by the runner, owned by our uid
        try:
            shutil.copytree(cwd, new_cwd, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error):
            pass
        os.chdir(new_cwd)
        os.environ["HOME"] = os.environ["TMPDIR"] = new_cwd
        send_msg(new_ctrl, {"t": "forked"})
        return new_ctrl, new_cwd
    os.close(new_ctrl_fd)
    return ctrl, cwd


# ----------------------------------------------------------------------------
# The runner loop (PID 1).


class Run:
    """One execution in flight: a stateless call or a session cell."""

    def __init__(self, req, sid, uid):
        limits = req.get("limits") if isinstance(req.get("limits"), dict) else {}
        self.req = req
        self.id = req["id"]
        self.sid = sid
        self.uid = uid
        self.t0 = time.monotonic()
        self.deadline = self.t0 + call_timeout(req.get("timeout"))
        self.limit = int(limits.get("output_limit", 16 << 20))
        self.out = Capture(int(limits.get("head", 4096)), int(limits.get("tail", 4096)))
        self.err = Capture(int(limits.get("head", 4096)), int(limits.get("tail", 4096)))
        self.fds = {}  # read end -> Capture
        self.killed = None  # "timeout" | "output"
        self.kill_time = None
        self.status = b""  # the job's {"exit", "error"} as read so far
        self.status_fd = None
        self.oom0 = oom_kills()
        self.dir = None

    def ended(self, exit_code):
        """(exit_code, error) of a job whose process ended or is being killed: the status it
        wrote wins over `exit_code`. The zygote's word of the exit can be read before the
        status pipe (both are ready in one batch of events), so what is left is read now."""
        if self.status_fd is not None:
            try:
                self.status += os.read(self.status_fd, STATUS_MAX + 1)
            except OSError:  # nothing written: a process it forked may still hold the pipe
                pass
        if not self.status or len(self.status) > STATUS_MAX:  # none, or a flood
            return exit_code, None
        try:
            written, error = checked_status(json.loads(self.status))
        except ValueError:  # cut short by the kill
            return exit_code, None
        return (exit_code if written is None else written), error

    def reply(self, exit_code, sig, error):
        oom = False
        if sig == signal.SIGKILL and self.killed is None:
            now = oom_kills()
            oom = now is not None and self.oom0 is not None and now > self.oom0
        return {
            "id": self.id,
            "ok": True,
            "exit": exit_code,
            "signal": sig,
            "timed_out": self.killed == "timeout",
            "output_limit": self.killed == "output",
            "oom": oom,
            "error": error,
            "stdout": self.out.text(),
            "stderr": self.err.text(),
            "stdout_bytes": self.out.total,
            "stderr_bytes": self.err.total,
            "duration": time.monotonic() - self.t0,
        }


class Standby:
    """A stateless call's process (uid, directory, pipes) ordered from the zygote ahead
    of its call; `pid` arrives with the zygote's answer."""

    def __init__(self, uid, cwd, req_w, out_r, err_r, status_r):
        self.uid, self.dir, self.pid = uid, cwd, None
        self.req_w, self.out_r, self.err_r, self.status_r = req_w, out_r, err_r, status_r


class Family:
    """A session and the sessions forked from it: one uid, one trust domain."""

    def __init__(self, uid):
        self.uid = uid
        self.members = set()
        self.dirty = False  # a call ended while another was in flight: orphans may be left

    def busy(self):
        return any(m.state in ("busy", "starting") for m in self.members)


class Session:
    def __init__(self, sid, family, ctrl, cwd):
        self.sid = sid
        self.family = family
        self.ctrl = ctrl  # the runner's end of a SOCK_SEQPACKET pair, with SO_PASSCRED
        self.head = None  # pid of the process holding the variables
        self.dir = cwd
        self.state = "starting"  # starting | ready | busy | lost
        self.stopped = False  # the head was sent SIGSTOP (idle)
        self.queue = []
        self.cell = None  # the Run of the cell in flight
        self.child = None  # the session a fork in flight creates
        self.parent = None  # for a session being forked: the session it copies
        self.theirs = None  # for a session being forked: the head's end of `ctrl`, not yet sent
        self.reply_to = None  # the `open`/`fork` request answered once the head exists
        self.deadline = None  # of a fork in flight
        self.messages = 0  # control messages read since the last call or fork was sent
        family.members.add(self)


class Runner:
    def __init__(self, preloaded, zsock, zpid):
        self.preloaded = preloaded
        self.uids = uid_range()
        self.sel = selectors.DefaultSelector()
        self.jobs = {}  # uid -> Run (stateless calls in flight)
        self.sessions = {}  # sid -> Session
        self.pipes = {}  # fd -> Run
        self.inbuf = bytearray()
        self.standby = None  # the next stateless call's process, ordered ahead
        self.helpers = set()  # our own short-lived processes (pipe writers)
        self.zsock, self.zpid = zsock, zpid
        self.orders = {}  # order number -> callback(pid or None, error)
        self.order_n = 0
        self.zchildren = {}  # pid -> uid of a job the zygote forked
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        os.set_blocking(0, False)
        zsock.setblocking(False)
        self.sel.register(0, selectors.EVENT_READ, ("stdin", None))
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        self.sel.register(zsock.fileno(), selectors.EVENT_READ, ("zygote", None))
        self.ensure_standby()

    # -- output to the host -------------------------------------------------

    def send(self, msg):
        data = (json.dumps(msg, ensure_ascii=True) + "\n").encode()
        view = memoryview(data)
        while view:
            try:
                n = os.write(1, view)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            except BrokenPipeError:
                os._exit(0)
            view = view[n:]

    def fail(self, req_id, why):
        self.send({"id": req_id, "ok": False, "fail": why})

    # -- main loop ----------------------------------------------------------

    def serve(self):
        while True:
            for key, _ in self.sel.select(self.next_timeout()):
                # An earlier event of this batch may have closed this fd, and a new pipe may
                # have taken its number: reading it as the old one's would be wrong.
                if self.sel.get_map().get(key.fd) is not key:
                    continue
                kind, obj = key.data
                try:
                    if kind == "stdin":
                        self.on_stdin()
                    elif kind == "wake":
                        self.on_wake()
                    elif kind == "zygote":
                        self.on_zygote()
                    elif kind == "pipe":
                        self.on_pipe(key.fd, obj)
                    elif kind == "status":
                        self.on_status(obj)
                    elif kind == "ctrl":
                        self.on_ctrl(obj)
                except Exception:  # a bug must not take PID 1 (and the container) down
                    traceback.print_exc()
            try:
                self.on_timers()
            except Exception:
                traceback.print_exc()

    def next_timeout(self):
        now = time.monotonic()
        times = [r.deadline for r in self.runs() if r.killed is None]
        times += [r.kill_time + RECOVER_S for r in self.runs() if r.kill_time is not None and r.sid is not None]
        times += [s.deadline for s in self.sessions.values() if s.deadline is not None]
        # Bounded: select() raises OverflowError past ~2^31 ms, and a deadline is at most a day.
        return min(max(0.0, min(times) - now), MAX_WAIT_S) if times else MAX_WAIT_S

    def runs(self):
        return list(self.jobs.values()) + [s.cell for s in self.sessions.values() if s.cell is not None]

    def on_stdin(self):
        while True:
            try:
                data = os.read(0, 1 << 20)
            except BlockingIOError:
                break
            if not data:
                self.shutdown()
            self.inbuf += data
        while True:
            i = self.inbuf.find(b"\n")
            if i < 0:
                break
            line = bytes(self.inbuf[:i])
            del self.inbuf[: i + 1]
            if line.strip():
                self.handle(line)

    def shutdown(self, code=0):
        for s in list(self.sessions.values()):
            self.kill_session(s)
        os._exit(code)

    def handle(self, line):
        try:
            req = json.loads(line)
            req_id = req["id"]
        except (ValueError, KeyError, TypeError):
            print("runner: bad request line %r" % line[:200], file=sys.stderr)
            return
        op = req.get("op")
        try:
            if op == "hello":
                self.send(
                    {
                        "id": req_id,
                        "ok": True,
                        "pid": os.getpid(),
                        "uid": os.getuid(),
                        "python": sys.version.split()[0],
                        "preloaded": self.preloaded,
                        "oom_counter": oom_kills() is not None,
                        "uid_range": list(self.uids),
                    }
                )
            elif op == "ping":
                self.send({"id": req_id, "ok": True})
            elif op == "run" and req.get("sid") is None:
                self.start_job(req)
            elif op == "open":
                self.open_session(req)
            elif op in ("run", "fork"):
                s = self.sessions.get(req["sid"])
                if s is None or s.state == "lost":
                    self.fail(req_id, "session lost")
                elif op == "fork" and (not valid_sid(req["new"]) or req["new"] in self.sessions):
                    self.fail(req_id, "bad or existing session id %r" % (req["new"],))
                else:
                    if op == "fork":
                        # The child exists at once, so calls to it queue behind the fork.
                        mine, theirs = self.ctrl_pair()
                        child = Session(req["new"], s.family, mine, make_dir("s-" + req["new"], s.family.uid))
                        child.reply_to, child.parent, child.theirs = req, s, theirs
                        self.register_session(child)
                        req["_child"] = child
                    s.queue.append(req)
                    self.pump(s)
            elif op == "close":
                s = self.sessions.get(req["sid"])
                if s is not None:
                    self.kill_session(s, "session closed")
                self.send({"id": req_id, "ok": True})
            else:
                self.fail(req_id, "unknown op %r" % op)
        except Exception as e:
            traceback.print_exc()
            self.fail(req_id, "runner error: %s" % short(str(e)))

    # -- the zygote -----------------------------------------------------------

    def order(self, kind, uid, cwd, fds, done, limits=None):
        """Asks the zygote for a process of `uid` in `cwd`; `done(pid, error)` follows."""
        self.order_n += 1
        self.orders[self.order_n] = done
        msg = {"n": self.order_n, "kind": kind, "uid": uid, "dir": cwd, "limits": limits}
        try:
            send_msg(self.zsock, msg, fds)
        except OSError as e:
            self.orders.pop(self.order_n)
            done(None, "the zygote did not take the order (%s)" % e)

    def on_zygote(self):
        while True:
            try:
                data = self.zsock.recv(MSG_MAX)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.zygote_died()
            msg = json.loads(data)
            if "exit" in msg:
                self.on_exit(msg["exit"], msg["status"])
            else:
                done = self.orders.pop(msg["n"], None)
                if done is not None:
                    done(msg.get("pid"), msg.get("error"))

    def zygote_died(self):
        # No clean process is left to fork calls from: exit, and the host replaces the container.
        print("runner: the zygote died; exiting so that the host replaces this container", file=sys.stderr)
        self.shutdown()

    def on_exit(self, pid, status):
        """A process the zygote forked exited (a job's, or a session's first head)."""
        uid = self.zchildren.pop(pid, None)
        run = self.jobs.get(uid)
        if run is not None:
            exit_code, sig = decode_status(status)
            exit_code, error = run.ended(exit_code)
            self.finish_job(run, exit_code, error, sig)
        self.head_exited(pid)

    def head_exited(self, pid):
        for s in list(self.sessions.values()):
            if s.head == pid and s.state != "lost" and s.cell is None:
                self.lose_session(s, "session lost: its process died")

    # -- uids and cleaning ----------------------------------------------------

    def owners(self):
        """{uid: "job" or its Family} of every uid in use; any other uid must own nothing."""
        owners = {s.family.uid: s.family for s in self.sessions.values()}
        owners.update((uid, "job") for uid in self.jobs)
        if self.standby is not None:
            owners[self.standby.uid] = "job"
        return owners

    def new_uid(self):
        owners = self.owners()
        while True:
            uid = random.randrange(*self.uids)
            if uid not in owners:
                return uid

    def heads(self):
        return {s.head for s in self.sessions.values() if s.head}

    def tidy(self, family=None, roots=(), keep=()):
        """Kills what may not live now: every process of a uid nothing holds; in an idle
        `family` every process but its heads; in a busy one what descends from `roots`
        (a cell's leftovers; the walk up stops at other heads, whose trees are theirs)."""
        killed = set()
        owners, heads = self.owners(), self.heads()
        idle = family is not None and not family.busy()
        if family is not None:
            family.dirty = not idle  # a busy family's orphans can only be told apart once it is idle
        for _ in range(20):  # until a pass finds no new one (a fork bomb is killed in a few)
            procs = processes()
            new = []
            for pid, (_, uid, _, _) in procs.items():
                if uid == 0 or pid in keep or pid in killed:
                    continue
                owner = owners.get(uid)
                if owner is None:
                    new.append(pid)
                elif owner is family and ((idle and pid not in heads) or descends(pid, roots, heads, procs)):
                    new.append(pid)
            if not new:
                return
            for pid in new:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            killed.update(new)

    def clean_shared(self):
        """Removes the files, queues and SysV objects of every uid nothing holds."""
        owners = self.owners()
        for base in ("/dev/shm", "/dev/mqueue"):
            try:
                names = os.listdir(base)
            except OSError:
                continue
            for name in names:
                path = os.path.join(base, name)
                try:
                    uid = os.lstat(path).st_uid
                except OSError:
                    continue
                if uid != 0 and uid not in owners:
                    remove_path(path)
        for kind, ident, cuid in sysv_objects():
            if cuid != 0 and cuid not in owners:
                try:
                    remove_sysv(kind, ident, cuid)
                except OSError:
                    pass
        keep = {os.path.basename(s.dir) for s in self.sessions.values()}
        keep |= {os.path.basename(r.dir) for r in self.jobs.values()}
        if self.standby is not None:
            keep.add(os.path.basename(self.standby.dir))
        try:
            names = os.listdir(WORK)
        except OSError:
            return
        for name in names:
            if name not in keep:
                remove_path(os.path.join(WORK, name))

    # -- stateless calls ------------------------------------------------------

    def make_standby(self):
        """Orders the next stateless call's process now, so a call does not wait for a fork."""
        if self.standby is not None:
            return
        uid = self.new_uid()
        cwd = make_dir(str(uid), uid)
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        for fd in (out_r, err_r, status_r):
            os.set_blocking(fd, False)  # the loop never blocks on a child's pipe, stale event or not
        sb = Standby(uid, cwd, req_w, out_r, err_r, status_r)
        self.standby = sb

        def spawned(pid, error):
            if pid is not None:
                sb.pid = pid
                self.zchildren[pid] = uid
                return
            run = self.jobs.get(uid)
            if run is not None:
                self.finish_job(run, None, error)
            elif self.standby is sb:
                self.drop_standby()

        self.order("job", uid, cwd, (req_r, out_w, err_w, status_w), spawned)
        for fd in (req_r, out_w, err_w, status_w):
            os.close(fd)

    def ensure_standby(self):
        """Makes sure the next stateless call has its process; None, or why it cannot.

        No room in /work is retried, once the processes of the calls that filled it have
        died (their open files hold space until then) and what nothing holds is removed.
        If /work stays full with no session or call holding any of it, nothing ever will
        free it: the runner exits, and the host replaces the container as a dead one."""
        end = time.monotonic() + STANDBY_RETRY_S
        while True:
            try:
                self.make_standby()
                return None
            except OSError as e:
                why = "no room for the call in /work (%s)" % e
            if self.sessions or self.jobs:
                return why  # a session holds the space: its calls fail, its neighbours' run on
            if time.monotonic() > end:
                self.give_up(why)
            time.sleep(0.02)
            self.tidy()
            self.clean_shared()

    def give_up(self, why):
        print("runner: unrecoverable: %s; exiting so that the host replaces this container" % why, file=sys.stderr)
        self.shutdown(1)

    def drop_standby(self):
        sb, self.standby = self.standby, None
        if sb is None:
            return
        kill_uid(sb.uid)
        for fd in (sb.req_w, sb.out_r, sb.err_r, sb.status_r):
            os.close(fd)
        remove_path(sb.dir)

    def start_job(self, req):
        why = self.ensure_standby()
        if why is not None:
            self.fail(req["id"], why)
            return
        sb, self.standby = self.standby, None
        run = Run(req, None, sb.uid)
        run.dir = sb.dir
        self.watch_pipes(run, sb.out_r, sb.err_r)
        run.status_fd = sb.status_r
        self.sel.register(sb.status_r, selectors.EVENT_READ, ("status", run))
        self.jobs[sb.uid] = run
        data = {"code": req["code"], "print_last": req.get("print_last", True), "limits": req.get("limits")}
        feed(sb.req_w, json.dumps(data).encode(), self.helpers)

    def on_status(self, run):
        try:
            data = os.read(run.status_fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # died without a word: its exit status (from the zygote) answers the call
            self.close_status(run)
            return
        run.status += data
        if len(run.status) > STATUS_MAX:
            self.close_status(run)  # a flood: the exit status answers instead
            return
        try:
            status = json.loads(run.status)
        except ValueError:
            return  # not all of it yet
        if self.jobs.get(run.uid) is run:
            self.finish_job(run, *checked_status(status))

    def close_status(self, run):
        fd, run.status_fd = run.status_fd, None
        if fd is not None:
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)

    def finish_job(self, run, exit_code, error, sig=None):
        """Answers a stateless call (once): every process of its uid dies first."""
        self.jobs.pop(run.uid, None)
        self.close_status(run)
        kill_uid(run.uid)
        drop_sysv(run.uid)
        self.drain(run)
        self.send(run.reply(exit_code, sig, error))
        # Clean first: the call may have filled /work, and the next call's directory needs room.
        self.clean_shared()
        self.ensure_standby()  # the zygote forks the next call's process while the host reads this reply

    # -- sessions -------------------------------------------------------------

    def ctrl_pair(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the kernel names each sender
        return mine, theirs

    def open_session(self, req):
        sid = req["sid"]
        if not valid_sid(sid) or sid in self.sessions:
            self.fail(req["id"], "bad or existing session id %r" % (sid,))
            return
        family = Family(self.new_uid())
        mine, theirs = self.ctrl_pair()
        s = Session(sid, family, mine, make_dir("s-" + sid, family.uid))
        s.reply_to = req
        self.register_session(s)

        def spawned(pid, error):
            if s.state == "lost":
                return
            if pid is None:
                self.lose_session(s, error or "could not start the session")
                return
            s.head, s.state, s.reply_to = pid, "ready", None
            self.send({"id": req["id"], "ok": True})
            self.pump(s)

        self.order("head", family.uid, s.dir, (theirs.fileno(),), spawned, req.get("limits"))
        theirs.close()

    def register_session(self, s):
        s.ctrl.setblocking(False)
        self.sessions[s.sid] = s
        self.sel.register(s.ctrl.fileno(), selectors.EVENT_READ, ("ctrl", s))

    def pump(self, s):
        if s.state != "ready" or not s.queue or not self.resume(s):
            return
        req = s.queue.pop(0)
        s.state = "busy"
        s.messages = 0
        if req["op"] == "run":
            run = Run(req, s.sid, s.family.uid)
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            self.watch_pipes(run, out_r, err_r)
            code_r, code_w = os.pipe()
            feed(code_w, req["code"].encode("utf-8", "surrogatepass"), self.helpers)
            s.cell = run
            fds = (code_r, out_w, err_w)
            msg = {"t": "run", "rid": run.id, "print_last": req.get("print_last", True)}
        else:
            child = s.child = req["_child"]
            child.deadline = time.monotonic() + FORK_S
            theirs, child.theirs = child.theirs, None
            fds = (theirs.detach(),)
            msg = {"t": "fork", "dir": child.dir}
        try:
            send_msg(s.ctrl, msg, fds)
        except OSError as e:
            self.lose_session(s, "session lost: its process died (%s)" % e.__class__.__name__)
        finally:
            for fd in fds:
                os.close(fd)

    def resume(self, s):
        """Continues a stopped head, if it is still one thread of its uid. (A head that has
        not stopped yet was not scheduled since: SIGCONT cancels the pending stop.)"""
        if not s.stopped:
            return True
        st = proc_status(s.head)
        if st is None or st[1] != s.family.uid or st[2] != 1 or st[3] in ("Z", "X"):
            why = "its process died" if st is None or st[3] in ("Z", "X") else "it ran threads between calls"
            self.lose_session(s, "session lost: %s" % why)
            return False
        os.kill(s.head, signal.SIGCONT)
        s.stopped = False
        return True

    def idle(self, s):
        """Stops a head with nothing to do: no code of the session runs between calls."""
        if s.state == "ready" and not s.queue and s.head and not s.stopped:
            try:
                os.kill(s.head, signal.SIGSTOP)
                s.stopped = True
            except OSError:
                self.lose_session(s, "session lost: its process died")

    def can_be_head(self, pid, s):
        """One thread of the session's uid, and nobody else's head."""
        st = proc_status(pid) if isinstance(pid, int) and pid > 1 else None
        others = self.heads() - {s.head}
        if st is None or st[1] != s.family.uid or pid in others or st[3] in ("Z", "X"):
            return "its process is gone or not its own"
        if st[2] != 1:
            return "the cell left %d threads running" % st[2]
        return None

    def on_ctrl(self, s):
        """Reads at most CTRL_BATCH messages (the selector calls again while more wait), so a
        session that floods its socket cannot hold the loop; one that sends more than a call
        ever needs is ended."""
        for _ in range(CTRL_BATCH):
            if s.state == "lost" or self.sessions.get(s.sid) is not s:
                return
            try:
                data, anc, _, _ = s.ctrl.recvmsg(MSG_MAX, socket.CMSG_SPACE(CRED.size))
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.lose_session(s, "session lost: its process died")
                return
            s.messages += 1
            if s.messages > CTRL_FLOOD:
                self.lose_session(s, "session lost: it flooded its control socket")
                return
            pid = uid = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= CRED.size:
                    pid, uid, _ = CRED.unpack(payload[: CRED.size])
            try:
                msg = json.loads(data)
            except ValueError:
                continue
            if isinstance(msg, dict) and uid == s.family.uid:
                self.on_message(s, msg, pid)

    def on_message(self, s, msg, sender):
        kind = msg.get("t")
        run = s.cell
        if kind in ("done", "died") and (run is None or msg.get("rid") != run.id):
            return  # a late message of a finished cell, or a forged one
        if kind == "done" and run.killed:
            return  # we killed the cell: its head reports how it died
        if kind == "done":
            why = self.can_be_head(sender, s)
            if why is not None:
                why = "the cell could not become the session's state: %s" % why
                self.finish_cell(s, None, None, why, (s.head,), rolled_back=True)
                return
            old, s.head = s.head, sender
            exit_code, error = checked_status(msg)
            self.finish_cell(s, exit_code, None, error, (old, sender))
        elif kind == "died" and sender == s.head:
            status = msg.get("status")
            if isinstance(status, int) and not isinstance(status, bool) and 0 <= status < 1 << 16:
                exit_code, sig = decode_status(status)
                error = None
            else:
                exit_code, sig, error = None, None, checked_status(msg)[1]
            self.finish_cell(s, exit_code, sig, error, (s.head,), rolled_back=True)
        elif kind == "fork_failed" and sender == s.head and s.child is not None:
            self.lose_session(s.child, checked_status(msg)[1])
        elif kind == "forked" and s.state == "starting" and s.parent is not None:
            why = self.can_be_head(sender, s)
            if why is not None:
                self.lose_session(s, "could not fork the session: %s" % why)
                return
            s.head, s.state, s.deadline = sender, "ready", None
            req, s.reply_to = s.reply_to, None
            self.send({"id": req["id"], "ok": True})
            self.fork_settled(s)
            self.idle(s)
            self.pump(s)

    def fork_settled(self, child):
        """The parent stays busy (its processes protected) until its fork child reports."""
        parent, child.parent = child.parent, None
        if parent is not None and parent.child is child:
            parent.child = None
            if parent.state == "busy":
                parent.state = "ready"
            self.idle(parent)
            if parent.family.dirty:
                self.tidy(parent.family)
            self.pump(parent)

    def finish_cell(self, s, exit_code, sig, error, roots, rolled_back=False):
        """Answers a cell once what it left is dead: the processes below `roots` but the
        head, or, when no call of its family is in flight, every process but the heads."""
        run, s.cell = s.cell, None
        s.state = "ready"
        self.tidy(s.family, roots=roots, keep={s.head})
        self.drain(run)
        reply = run.reply(exit_code, sig, error)
        if rolled_back:
            reply["rolled_back"] = True
        self.idle(s)
        self.send(reply)
        self.pump(s)

    def lose_session(self, s, why):
        """The session's process is gone or broken: fail what it owed, forget it."""
        if s.state != "lost":
            self.kill_session(s, why)

    def kill_session(self, s, why="session closed"):
        s.state = "lost"
        head = s.head
        try:
            self.sel.unregister(s.ctrl.fileno())
        except (KeyError, ValueError):
            pass
        s.ctrl.close()
        self.sessions.pop(s.sid, None)
        s.family.members.discard(s)
        if not s.family.members:
            kill_uid(s.family.uid)
            drop_sysv(s.family.uid)
        elif head:
            self.tidy(s.family, roots=(head,))
        if s.cell is not None:
            run, s.cell = s.cell, None
            self.drain(run)
            reply = run.reply(None, None, why)
            reply["session_lost"] = True
            self.send(reply)
        if s.child is not None:
            self.lose_session(s.child, why)
        if s.reply_to is not None:
            self.fail(s.reply_to["id"], why)
            s.reply_to = None
        if s.parent is not None:
            self.fork_settled(s)
        for req in s.queue:
            if "_child" in req:
                self.lose_session(req["_child"], why)
            else:
                self.fail(req["id"], why)
        s.queue = []
        if s.theirs is not None:
            s.theirs.close()
            s.theirs = None
        self.clean_shared()

    # -- pipes, timers, children ----------------------------------------------

    def watch_pipes(self, run, out_r, err_r):
        run.fds = {out_r: run.out, err_r: run.err}
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, ("pipe", run))
            self.pipes[fd] = run

    def on_pipe(self, fd, run):
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close_pipe(fd, run)
            return
        run.fds[fd].add(data)
        if run.out.total + run.err.total > run.limit and run.killed is None:
            self.stop(run, "output")

    def stop(self, run, why):
        """Kills a call: a stateless one answers at once; a cell's head reports the kill
        ("died"), or the session is lost after RECOVER_S."""
        run.killed, run.kill_time = why, time.monotonic()
        if run.sid is None:
            exit_code, error = run.ended(None)
            self.finish_job(run, exit_code, error, signal.SIGKILL)
            return
        s = self.sessions.get(run.sid)
        if s is not None and s.cell is run:
            self.tidy(s.family, roots=(s.head,), keep={s.head})

    def close_pipe(self, fd, run):
        """Closes `run`'s pipe `fd` (fd numbers are reused: only if it is still `run`'s)."""
        if self.pipes.get(fd) is run:
            del self.pipes[fd]
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)

    def drain(self, run):
        """Reads what the pipes still hold without waiting for writers that linger."""
        for fd, cap in list(run.fds.items()):
            if self.pipes.get(fd) is not run:
                continue
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                if cap.total < run.limit:
                    cap.add(data)
            self.close_pipe(fd, run)

    def on_timers(self):
        now = time.monotonic()
        for run in self.runs():
            if run.killed is None and now >= run.deadline:
                self.stop(run, "timeout")
            elif run.sid is not None and run.kill_time is not None and now >= run.kill_time + RECOVER_S:
                s = self.sessions.get(run.sid)
                if s is not None and s.cell is run:
                    self.lose_session(
                        s, "session lost: it did not recover after the call was stopped (%s)" % run.killed
                    )
        for s in list(self.sessions.values()):
            if s.deadline is not None and now >= s.deadline and s.state == "starting":
                self.lose_session(s, "session lost: the fork did not finish in %.0f s" % FORK_S)

    def on_wake(self):
        for pid, _ in reap(self.wake_r):  # our children: the zygote, pipe writers, and every orphan
            if pid == self.zpid:
                self.zygote_died()
            self.helpers.discard(pid)
            self.head_exited(pid)


def call_timeout(value, default=10.0):
    """A call's timeout in seconds: the host's number if finite and positive, at most a day."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return default
    return min(float(value), MAX_CALL_S)  # inf becomes a day; nan failed `> 0`


def valid_sid(sid):
    return isinstance(sid, str) and 0 < len(sid) <= 64 and sid.isascii() and sid.isalnum()


def descends(pid, roots, heads, procs):
    """Whether `pid` is one of `roots` or below one, not through another head (a
    session forked from a head is its child, and its own tree)."""
    p, seen = pid, 0
    while p in procs and seen < 256:
        if p in roots:
            return True
        if p in heads:
            return False
        p, seen = procs[p][0], seen + 1
    return False


def warm_up(code):
    """Runs `code` once (output dropped, errors ignored) so that forked calls find
    lazily built tables and caches (sympy's above all) already made."""
    if not code:
        return
    null = open(os.devnull, "w")
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = null
    try:
        exec(compile(code, "<warmup>", "exec"), fresh_ns())
    except BaseException:
        pass
    finally:
        sys.stdout, sys.stderr = saved
        null.close()


def main(argv):
    """argv: one JSON object {"preload": [module, ...], "warmup": code, "nproc": n}."""
    set_not_dumpable()
    set_comm("sandbox-runner")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores default-action signals from inside
    if os.getuid() != 0:
        print("runner: must start as root (uid 0 with CAP_SETUID) to give each call its own uid", file=sys.stderr)
        sys.exit(2)
    opts = json.loads(argv[0]) if argv else {}
    preloaded = []
    for mod in opts.get("preload", []):
        try:
            __import__(mod)
            preloaded.append(mod)
        except Exception:
            pass
    os.makedirs(WORK, exist_ok=True)
    os.chmod(WORK, 0o711)  # others may enter their own directory, never list them
    close_shared_places()  # /work/<name> is the only place an episode may make a name
    os.chdir(WORK)
    warm_up(opts.get("warmup"))
    # Forked calls share these pages; frozen objects are never scanned by a
    # child's garbage collector, so a child does not copy the pages they live on.
    gc.collect()
    gc.freeze()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zpid = os.fork()  # now, before the first request: the zygote never sees one
    if zpid == 0:
        ours.close()
        try:
            zygote_main(theirs, int(opts.get("nproc", 64)))
        finally:
            os._exit(1)
    theirs.close()
    Runner(preloaded, ours, zpid).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
