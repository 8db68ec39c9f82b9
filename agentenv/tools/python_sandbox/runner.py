"""The runner: PID 1 of every sandbox container. Standard library only.

The host starts it as `python3 -I -c <this file's source> '{"preload": [...],
"warmup": "..."}'` (modules imported and warm-up code run once, so forked
calls share them). It speaks one JSON
object per line over stdin/stdout (the docker attach stream). JSON is written
with `ensure_ascii`, so the stream never holds a control byte that docker
could read as its detach keys.

Requests (each carries "id" and "op"; every request gets one reply with "id"):
    hello {}                                     -> pid, uid, python, preloaded
    run {code, timeout, print_last, limits, sid} -> the call's result
    open {sid}                                   -> a fresh empty session
    fork {sid, new}                              -> session `new` = a copy of `sid`
    close {sid}                                  -> the session's processes die

A stateless `run` (no sid) forks the runner: a fresh process with nothing of
any earlier call. A session is a head process that holds the session's
variables; each cell runs in a fork of the head (so a cell that times out or
is killed leaves the state as it was before the cell) and the fork becomes the
new head when the cell finishes. `fork` forks the head. Being PID 1, the
runner cannot be killed from inside the container; it reaps orphans and kills
processes that outlive their call ("sweep").
"""

import ast
import builtins
import fcntl
import gc
import io
import json
import linecache
import os
import selectors
import shutil
import signal
import socket
import sys
import time
import traceback

WORK = "/work"
CELL = "<cell>"
F_SETPIPE_SZ = 1031
PIPE_SIZE = 1 << 20
MSG_MAX = 1 << 16


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


# ----------------------------------------------------------------------------
# Process plumbing shared by every child.


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


def close_fds_except(keep):
    keep = sorted(set(keep) | {0, 1, 2})
    lo = 0
    for fd in keep + [1 << 16]:
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1


def child_init(keep, cwd):
    """First thing in every forked child: own signals, own fds, own directory."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    close_fds_except(keep)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # the OOM killer takes a call's process, never the runner
    except OSError:
        pass
    os.chdir(cwd)
    os.environ["HOME"] = os.environ["TMPDIR"] = cwd
    sys.argv = [""]
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)


def limit_address_space(limits):
    """Caps virtual memory so a huge allocation fails at once with MemoryError
    instead of thrashing up to the container's memory limit and an OOM kill."""
    n = int((limits or {}).get("address_space", 0))
    if n > 0:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (n, n))
        except (ImportError, ValueError, OSError):
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


def null_stdio():
    """Points fds 0-2 at /dev/null (a head must not hold the runner's host stream)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
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


# ----------------------------------------------------------------------------
# Session heads (run in forked processes, never return to the runner loop).


def head_main(ctrl, cwd):
    """A session head: owns the variables, forks per cell and per session fork."""
    ns = fresh_ns()
    while True:
        reap_children()
        try:
            data, fds, _, _ = socket.recv_fds(ctrl, MSG_MAX, 4)
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # the runner closed the session
        msg = json.loads(data)
        kind = msg.get("t")
        if kind == "run":
            ctrl, cwd = head_cell(ctrl, cwd, ns, msg, fds)
        elif kind == "fork":
            ctrl, cwd = head_fork(ctrl, cwd, msg, fds[0])
        else:
            os._exit(0)


def reap_children():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


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


def head_cell(ctrl, cwd, ns, msg, fds):
    """Runs one cell in a fork; on success the fork becomes the head."""
    code_fd, out_fd, err_fd = fds
    rid = msg.get("rid")  # echoed, so the runner never takes one cell's message for another's
    code = read_all(code_fd).decode("utf-8", "replace")
    group = os.getpgid(0)
    commit_r, commit_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        for fd in (out_fd, err_fd, commit_r, commit_w):
            os.close(fd)
        send_msg(
            ctrl, {"t": "died", "rid": rid, "head": os.getpid(), "error": short("could not start the cell: %s" % e)}
        )
        return ctrl, cwd
    if pid == 0:
        os.close(commit_r)
        os.setpgid(0, 0)  # own group: a timeout kills the cell and what it started, not the head
        attach_stdio(out_fd, err_fd)
        os.close(out_fd)
        os.close(err_fd)
        exit_code, error = run_cell(code, ns, msg.get("print_last", True))
        detach_stdio()
        try:
            os.setpgid(0, group)  # back to the session's group; the runner may kill the cell's
        except OSError:
            pass
        # "done" before the commit: once the old head exits we are an orphan, and the
        # runner's sweep must already be able to read that we are the head.
        send_msg(
            ctrl,
            {"t": "done", "rid": rid, "head": os.getpid(), "exit": exit_code, "error": error, "pgid": os.getpgid(0)},
        )
        try:
            os.write(commit_w, b"c")
        except OSError:
            pass
        os.close(commit_w)
        return ctrl, cwd
    for fd in (out_fd, err_fd, commit_w):
        os.close(fd)
    send_msg(ctrl, {"t": "cell", "rid": rid, "pid": pid})
    while True:
        try:
            committed = os.read(commit_r, 1) == b"c"
            break
        except InterruptedError:
            continue
    os.close(commit_r)
    if committed:
        os._exit(0)  # the cell's process holds the new state and is the head now
    _, status = os.waitpid(pid, 0)
    send_msg(ctrl, {"t": "died", "rid": rid, "head": os.getpid(), "status": status})
    return ctrl, cwd


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
        os.setpgid(0, 0)
        new_cwd = msg["dir"]
        try:
            shutil.copytree(cwd, new_cwd, symlinks=True)
        except (OSError, shutil.Error):
            os.makedirs(new_cwd, exist_ok=True)
        os.chdir(new_cwd)
        os.environ["HOME"] = os.environ["TMPDIR"] = new_cwd
        if sys.path[:1] == [cwd]:
            sys.path[0] = new_cwd
        send_msg(new_ctrl, {"t": "forked", "head": os.getpid()})
        return new_ctrl, new_cwd
    os.close(new_ctrl_fd)
    return ctrl, cwd


# ----------------------------------------------------------------------------
# The runner loop (PID 1).


class Run:
    """One execution in flight: a stateless call or a session cell."""

    def __init__(self, req, sid):
        limits = req.get("limits", {})
        self.req = req
        self.id = req["id"]
        self.sid = sid
        self.t0 = time.monotonic()
        self.deadline = self.t0 + float(req.get("timeout", 10.0))
        self.limit = int(limits.get("output_limit", 16 << 20))
        self.out = Capture(int(limits.get("head", 4096)), int(limits.get("tail", 4096)))
        self.err = Capture(int(limits.get("head", 4096)), int(limits.get("tail", 4096)))
        self.fds = {}  # read end -> Capture
        self.pid = None
        self.killed = None  # "timeout" | "output"
        self.status = b""  # the child's {"exit", "error"} as read so far
        self.status_fd = None
        self.kill_time = None
        self.oom0 = oom_kills()
        self.dir = None

    def kill(self, why):
        if self.killed is None:
            self.killed = why
            self.kill_time = time.monotonic()
        if self.pid:
            for target in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
                try:
                    target()
                except OSError:
                    pass

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
    """A stateless call's process forked ahead of time, waiting for its request on `req_w`."""

    def __init__(self, pid, cwd, req_w, out_r, err_r, status_r):
        self.pid, self.dir = pid, cwd
        self.req_w, self.out_r, self.err_r, self.status_r = req_w, out_r, err_r, status_r


class Session:
    def __init__(self, sid, ctrl, head, cwd):
        self.sid = sid
        self.ctrl = ctrl  # the runner's end of a SOCK_SEQPACKET pair
        self.head = head
        self.dir = cwd
        self.state = "ready" if head else "starting"  # starting | ready | busy | lost
        self.queue = []
        self.current = None  # the request being served
        self.cell = None  # its Run, for `run`
        self.fork_reply = None  # the `fork` request that created this session, answered on "forked"
        self.child = None  # the session a pending `fork` creates
        self.parent = None  # for a session being forked: the session it copies
        self.theirs = None  # for a session being forked: the head's end of `ctrl`, not yet sent
        self.inbox = []  # messages read from `ctrl`, not handled yet (None: end of file)


class Runner:
    def __init__(self, preloaded):
        self.preloaded = preloaded
        self.sel = selectors.DefaultSelector()
        self.jobs = {}  # pid -> Run (stateless)
        self.sessions = {}  # sid -> Session
        self.pipes = {}  # fd -> Run
        self.inbuf = bytearray()
        self.sweep_at = None
        self.standby = None  # the next stateless call's process, forked ahead
        self.standby_n = 0
        self.helpers = set()  # our own short-lived processes (code writers): never strays
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, ("stdin", None))
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))

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
            timeout = self.next_timeout()
            for key, _ in self.sel.select(timeout):
                # An earlier event of this batch may have closed this fd, and a new pipe may
                # have taken its number (a finished call's standby does): reading it as the
                # old one's would block the runner on a pipe nobody writes yet.
                if self.sel.get_map().get(key.fd) is not key:
                    continue
                kind, obj = key.data
                try:
                    if kind == "stdin":
                        self.on_stdin()
                    elif kind == "wake":
                        self.on_wake()
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
                for s in list(self.sessions.values()):
                    if s.inbox:  # a sweep read them off the socket
                        self.on_ctrl(s)
            except Exception:
                traceback.print_exc()

    def next_timeout(self):
        now = time.monotonic()
        times = [r.deadline for r in self.runs() if r.killed is None]
        times += [r.kill_time + 1.5 for r in self.runs() if r.kill_time is not None]
        if self.sweep_at is not None:
            times.append(self.sweep_at)
        return max(0.0, min(times) - now) if times else None

    def runs(self):
        runs = list(self.jobs.values())
        runs += [s.cell for s in self.sessions.values() if s.cell is not None]
        return runs

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

    def shutdown(self):
        for s in list(self.sessions.values()):
            self.kill_session(s)
        os._exit(0)

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
                    }
                )
            elif op == "run" and req.get("sid") is None:
                self.start_job(req)
            elif op == "open":
                self.open_session(req)
            elif op in ("run", "fork"):
                s = self.sessions.get(req["sid"])
                if s is None or s.state == "lost":
                    self.fail(req_id, "session lost")
                elif op == "fork" and req["new"] in self.sessions:
                    self.fail(req_id, "session %s exists" % req["new"])
                else:
                    if op == "fork":
                        # The child exists at once, so calls to it queue behind the fork.
                        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                        child = Session(req["new"], mine, None, os.path.join(WORK, "s-%s" % req["new"]))
                        child.fork_reply, child.parent, child.theirs = req, s, theirs
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

    # -- stateless calls ----------------------------------------------------

    def fork_child(self):
        try:
            return os.fork()
        except BlockingIOError:  # pids limit: leftovers of an earlier call; kill them and retry once
            self.sweep()
            time.sleep(0.05)
            self.reap()
            return os.fork()

    def new_pipes(self, run):
        """stdout and stderr pipes of `run`; returns their write ends for the child."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.watch_pipes(run, out_r, err_r)
        return out_w, err_w

    def watch_pipes(self, run, out_r, err_r):
        run.fds = {out_r: run.out, err_r: run.err}
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, ("pipe", run))
            self.pipes[fd] = run

    def watch_status(self, run, status_r):
        """The child writes {"exit", "error"} here once its output is flushed; the call
        is answered then, while the process is still tearing its memory down."""
        run.status_fd = status_r
        os.set_blocking(status_r, False)
        self.sel.register(status_r, selectors.EVENT_READ, ("status", run))

    def start_job(self, req):
        sb = self.take_standby()
        if sb is not None:
            run = Run(req, None)
            run.pid, run.dir = sb.pid, sb.dir
            self.watch_pipes(run, sb.out_r, sb.err_r)
            self.watch_status(run, sb.status_r)
            self.jobs[run.pid] = run
            data = json.dumps(
                {"code": req["code"], "print_last": req.get("print_last", True), "limits": req.get("limits")}
            )
            try:
                write_all(sb.req_w, data.encode())
            except OSError:
                pass  # it died meanwhile: its exit status answers the call
            os.close(sb.req_w)
            return
        cwd = os.path.join(WORK, "job-%s" % req["id"])
        os.makedirs(cwd, exist_ok=True)
        run = Run(req, None)
        out_w, err_w = self.new_pipes(run)
        run.dir = cwd
        status_r, status_w = os.pipe()
        try:
            pid = self.fork_child()
        except OSError as e:
            for fd in (out_w, err_w, status_r, status_w):
                os.close(fd)
            self.close_run_pipes(run)
            shutil.rmtree(cwd, ignore_errors=True)
            self.send(run.reply(None, None, short("could not start a process: %s" % e)))
            return
        if pid == 0:
            self.job_child(req, cwd, out_w, err_w, status_w)
        os.close(out_w)
        os.close(err_w)
        os.close(status_w)
        run.pid = pid
        self.watch_status(run, status_r)
        self.jobs[pid] = run

    def job_child(self, req, cwd, out_w, err_w, status_w, req_r=None):
        """A stateless call's process. With `req_r` it is a standby: forked ahead of
        time, it waits for its call on that pipe."""
        exit_code = 70
        try:
            os.setsid()
            keep = (out_w, err_w, status_w) + ((req_r,) if req_r is not None else ())
            child_init(keep, cwd)
            if req_r is not None:
                req = json.loads(read_all(req_r))
            limit_address_space(req.get("limits"))
            attach_stdio(out_w, err_w)
            os.close(out_w)
            os.close(err_w)
            exit_code, error = run_cell(req["code"], fresh_ns(), req.get("print_last", True))
            detach_stdio()
            os.write(status_w, json.dumps({"exit": exit_code, "error": error}).encode())
        except BaseException:
            pass
        os._exit(exit_code & 0xFF if isinstance(exit_code, int) else 1)

    def make_standby(self):
        """Forks the next stateless call's process now, so a call does not wait for a fork."""
        if self.standby is not None or self.sessions:
            return
        self.standby_n += 1
        cwd = os.path.join(WORK, "job-w%d" % self.standby_n)
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            fcntl.fcntl(req_w, F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass
        try:
            os.makedirs(cwd, exist_ok=True)
            pid = os.fork()
        except OSError:
            for fd in (req_r, req_w, out_r, out_w, err_r, err_w, status_r, status_w):
                os.close(fd)
            return
        if pid == 0:
            self.job_child(None, cwd, out_w, err_w, status_w, req_r=req_r)
        for fd in (req_r, out_w, err_w, status_w):
            os.close(fd)
        for fd in (out_r, err_r, status_r):
            os.set_blocking(fd, False)  # the loop never blocks on a child's pipe, stale event or not
        self.standby = Standby(pid, cwd, req_w, out_r, err_r, status_r)

    def take_standby(self):
        sb, self.standby = self.standby, None
        return sb

    def drop_standby(self):
        sb = self.take_standby()
        if sb is None:
            return
        try:
            os.kill(sb.pid, signal.SIGKILL)
        except OSError:
            pass
        for fd in (sb.req_w, sb.out_r, sb.err_r, sb.status_r):
            os.close(fd)
        shutil.rmtree(sb.dir, ignore_errors=True)

    def on_status(self, run):
        try:
            data = os.read(run.status_fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # died without a word: its exit status (reap) answers the call
            self.close_status(run)
            return
        run.status += data
        try:
            status = json.loads(run.status)
        except ValueError:
            return  # not all of it yet
        if self.jobs.get(run.pid) is run:
            self.finish_job(run, status.get("exit"), None, status.get("error"))

    def close_status(self, run):
        fd, run.status_fd = run.status_fd, None
        if fd is not None:
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)

    def finish_job(self, run, exit_code, sig, error=None):
        """Answers a stateless call (once), kills what it left, readies the next process."""
        self.jobs.pop(run.pid, None)
        if run.status_fd is not None and error is None and not run.status:
            try:
                run.status += os.read(run.status_fd, 1 << 16)  # reaped before its status was read
                error = json.loads(run.status).get("error")
            except (OSError, ValueError):
                pass
        self.close_status(run)
        try:
            os.killpg(run.pid, signal.SIGKILL)  # whatever the call left running in its group
        except OSError:
            pass
        self.drain(run)
        self.settle()  # before the reply: the next call must find no leftovers of this one
        self.send(run.reply(exit_code, sig, error))
        shutil.rmtree(run.dir, ignore_errors=True)
        self.clean_workdir()
        self.make_standby()

    # -- sessions -----------------------------------------------------------

    def open_session(self, req):
        sid = req["sid"]
        if sid in self.sessions:
            self.fail(req["id"], "session %s exists" % sid)
            return
        cwd = os.path.join(WORK, "s-%s" % sid)
        os.makedirs(cwd, exist_ok=True)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = self.fork_child()
        except OSError as e:
            mine.close()
            theirs.close()
            self.fail(req["id"], short("could not start a session: %s" % e))
            return
        if pid == 0:
            try:
                os.setsid()
                child_init((theirs.fileno(),), cwd)
                limit_address_space(req.get("limits"))
                null_stdio()
                head_main(theirs, cwd)
            finally:
                os._exit(0)
        theirs.close()
        s = Session(sid, mine, pid, cwd)
        self.register_session(s)
        self.send({"id": req["id"], "ok": True})

    def register_session(self, s):
        s.ctrl.setblocking(False)
        self.sessions[s.sid] = s
        self.sel.register(s.ctrl.fileno(), selectors.EVENT_READ, ("ctrl", s))

    def pump(self, s):
        if s.state != "ready" or not s.queue:
            return
        req = s.queue.pop(0)
        s.current = req
        s.state = "busy"
        if req["op"] == "run":
            run = Run(req, s.sid)
            out_w, err_w = self.new_pipes(run)
            code_r = self.code_pipe(req["code"].encode("utf-8", "surrogatepass"))
            s.cell = run
            try:
                send_msg(
                    s.ctrl,
                    {"t": "run", "rid": run.id, "print_last": req.get("print_last", True)},
                    (code_r, out_w, err_w),
                )
            except OSError as e:
                self.lose_session(s, "session lost: its process died (%s)" % e.__class__.__name__)
            finally:
                for fd in (code_r, out_w, err_w):
                    os.close(fd)
        else:
            child = req["_child"]
            s.child = child
            theirs, child.theirs = child.theirs, None
            try:
                send_msg(s.ctrl, {"t": "fork", "dir": child.dir}, (theirs.fileno(),))
            except OSError as e:
                self.lose_session(s, "session lost: its process died (%s)" % e.__class__.__name__)
            finally:
                theirs.close()

    def code_pipe(self, data):
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, max(len(data) + 1, 4096))
        except OSError:
            pass
        os.set_blocking(w, False)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(w, view) :]
        except BlockingIOError:
            # Bigger than the pipe holds: a helper process writes the rest as the head reads.
            pid = os.fork()
            if pid == 0:
                close_fds_except((w,))
                os.set_blocking(w, True)
                try:
                    write_all(w, view)
                finally:
                    os._exit(0)
            self.helpers.add(pid)
        os.close(w)
        return r

    def read_ctrl(self, s):
        """Moves the messages waiting on a session's socket into its inbox (None = EOF)."""
        while s.state != "lost" and (not s.inbox or s.inbox[-1] is not None):
            try:
                data = s.ctrl.recv(MSG_MAX)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                s.inbox.append(None)
                return
            try:
                s.inbox.append(json.loads(data))
            except ValueError:
                continue

    def on_ctrl(self, s):
        self.read_ctrl(s)
        while s.inbox and s.state != "lost" and self.sessions.get(s.sid) is s:
            msg = s.inbox.pop(0)
            if msg is None:
                self.lose_session(s, "session lost: its process died")
                return
            try:
                self.on_message(s, msg)
            except (KeyError, TypeError, ValueError):
                continue

    def on_message(self, s, msg):
        kind = msg.get("t")
        if kind in ("cell", "done", "died") and (s.cell is None or msg.get("rid") != s.cell.id):
            if kind == "done":
                s.head = int(msg["head"])  # a late message of a finished cell still names the head
            return
        if kind == "cell":
            s.cell.pid = int(msg["pid"])
            if s.cell.killed:
                s.cell.kill(s.cell.killed)
        elif kind == "done":
            s.head = int(msg["head"])
            run = s.cell
            cell_group = run.pid
            if cell_group and cell_group != msg.get("pgid"):
                try:
                    os.killpg(cell_group, signal.SIGKILL)  # background processes the cell left
                except OSError:
                    pass
            self.finish_cell(s, msg.get("exit"), None, msg.get("error"))
        elif kind == "died":
            s.head = int(msg.get("head") or s.head)
            exit_code, sig = decode_status(msg["status"]) if "status" in msg else (None, None)
            self.finish_cell(s, exit_code, sig, msg.get("error"), rolled_back=True)
        elif kind == "fork_failed" and s.child is not None:
            self.lose_session(s.child, msg.get("error") or "fork failed")
        elif kind == "forked" and s.state == "starting":
            s.head = int(msg["head"])
            s.state = "ready"
            req, s.fork_reply = s.fork_reply, None
            if req is not None:
                self.send({"id": req["id"], "ok": True})
            self.fork_settled(s)
            self.pump(s)

    def fork_settled(self, child):
        """The parent stays busy (its descendants protected) until its fork child reports."""
        parent = child.parent
        child.parent = None
        if parent is not None and parent.child is child:
            parent.child, parent.current = None, None
            if parent.state == "busy":
                parent.state = "ready"
            self.pump(parent)

    def finish_cell(self, s, exit_code, sig, error, rolled_back=False):
        run = s.cell
        self.drain(run)
        reply = run.reply(exit_code, sig, error)
        if rolled_back:
            reply["rolled_back"] = True
        s.cell, s.current = None, None
        if s.state == "busy":
            s.state = "ready"
        self.settle()
        self.send(reply)
        self.pump(s)

    def lose_session(self, s, why):
        """The session's process is gone: fail what it owed, forget it."""
        if s.state == "lost":
            return
        self.kill_session(s, why)

    def kill_session(self, s, why="session closed"):
        s.state = "lost"
        for pid in (s.cell.pid if s.cell else None, s.head):
            if pid:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        try:
            self.sel.unregister(s.ctrl.fileno())
        except (KeyError, ValueError):
            pass
        s.ctrl.close()
        self.sessions.pop(s.sid, None)
        if s.cell is not None:
            run, s.cell = s.cell, None
            self.drain(run)
            reply = run.reply(None, None, why)
            reply["session_lost"] = True
            self.send(reply)
        elif s.child is not None:
            self.lose_session(s.child, why)
        if s.fork_reply is not None:
            self.fail(s.fork_reply["id"], why)
            s.fork_reply = None
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
        s.current = None
        shutil.rmtree(s.dir, ignore_errors=True)
        self.sweep()

    # -- pipes, timers, children --------------------------------------------

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
        """Kills a call's processes. When nothing else lives in the container, kills
        every process but us at once (kill(-1) cannot race with a fork bomb's forks)."""
        run.kill(why)
        if run.sid is None and not self.sessions and set(self.jobs) <= {run.pid}:
            self.drop_standby()
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass

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

    def close_run_pipes(self, run):
        for fd in list(run.fds):
            self.close_pipe(fd, run)

    def on_timers(self):
        now = time.monotonic()
        for run in self.runs():
            if run.killed is None and now >= run.deadline:
                self.stop(run, "timeout")
            elif run.kill_time is not None and now >= run.kill_time + 1.5 and run.sid is not None:
                # The cell's head did not report within 1.5 s of the kill: the session is gone.
                s = self.sessions.get(run.sid)
                if s is not None and s.cell is run:
                    self.lose_session(
                        s, "session lost: it did not recover after the call was stopped (%s)" % run.killed
                    )
            elif run.kill_time is not None and now >= run.kill_time + 1.5:
                run.kill(run.killed)
                run.kill_time = now
        if self.sweep_at is not None and now >= self.sweep_at:
            self.sweep_at = None
            self.sweep()

    def on_wake(self):
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self.reap()

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.helpers.discard(pid)
            run = self.jobs.get(pid)
            if run is not None:
                self.finish_job(run, *decode_status(status))
            elif self.standby is not None and pid == self.standby.pid:
                self.drop_standby()

    def settle(self, budget=1.0):
        """Sweeps until no stray is left alive (killed processes need CPU time to exit
        and a throttled container may not give it at once), for at most `budget` s."""
        end = time.monotonic() + budget
        if not self.jobs and not self.sessions:
            # Nothing may live: everything but us is a stray. kill(-1) reaches every
            # process, one that is being forked too, so there is nothing to wait for.
            self.drop_standby()
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            self.sweep()
            return
        while self.sweep() and time.monotonic() < end:
            time.sleep(0.005)
            self.reap()

    def sweep(self):
        """Kills every process that no call in flight and no session owns; returns how many."""
        parents = {}
        zombies = set()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                parents[int(name)] = int(fields[1])
                if fields[0] in (b"Z", b"X"):
                    zombies.add(int(name))
            except (OSError, ValueError, IndexError):
                continue
        me = os.getpid()
        roots = set(self.jobs)  # their descendants may live
        heads = set(self.helpers)
        if self.standby is not None:
            heads.add(self.standby.pid)
        for s in list(self.sessions.values()):
            # Heads change hands by message: read them first, so a cell that just became
            # its session's head (and an orphan) is not taken for a stray.
            self.read_ctrl(s)
            pids = [s.head] + [m.get("head") or m.get("pid") for m in s.inbox if m]
            if s.cell is not None:
                pids.append(s.cell.pid)
            for pid in pids:
                if isinstance(pid, int) and pid > 1:
                    heads.add(pid)
                    if s.state in ("busy", "starting"):
                        roots.add(pid)
        killed = 0
        for pid in parents:
            if pid in (me, 1) or pid in heads or pid in roots:
                continue
            p, seen = parents.get(pid), 0
            while p not in (None, 0, 1, me) and p not in roots and seen < 256:
                p, seen = parents.get(p), seen + 1
            if p in roots or pid in zombies:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        if killed:
            self.sweep_at = time.monotonic() + 0.2  # leftovers may still be forking
        return killed

    def clean_workdir(self):
        keep = {os.path.basename(s.dir) for s in self.sessions.values()}
        if self.standby is not None:
            keep.add(os.path.basename(self.standby.dir))
        keep |= {os.path.basename(r.dir) for r in self.jobs.values() if r.dir}
        try:
            names = os.listdir(WORK)
        except OSError:
            return
        for name in names:
            if name in keep:
                continue
            path = os.path.join(WORK, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def decode_status(status):
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def set_not_dumpable():
    """Code running as our uid may not open /proc/1/fd (our host stream) nor ptrace us."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


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
    """argv: one JSON object {"preload": [module, ...], "warmup": code}."""
    set_not_dumpable()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores default-action signals from inside
    opts = json.loads(argv[0]) if argv else {}
    preloaded = []
    for mod in opts.get("preload", []):
        try:
            __import__(mod)
            preloaded.append(mod)
        except Exception:
            pass
    os.makedirs(WORK, exist_ok=True)
    os.chdir(WORK)
    warm_up(opts.get("warmup"))
    # Forked calls share these pages; frozen objects are never scanned by a
    # child's garbage collector, so a child does not copy the pages they live on.
    gc.collect()
    gc.freeze()
    Runner(preloaded).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
