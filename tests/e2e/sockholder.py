"""What systemd's socket unit does for `tarn@.socket`, for tests/e2e/restart.sh.

  sockholder.py PORT RESTARTS INTERVAL -- tarn serve ...

Binds 127.0.0.1:PORT and listens (the socket unit), then starts the command
with the socket as descriptor 3 and LISTEN_FDS=1, LISTEN_PID=its pid,
LISTEN_FDNAMES=nbd (sd_listen_fds semantics). Every INTERVAL seconds, RESTARTS
times, it restarts the service as `systemctl restart` does: SIGTERM, wait
for the exit, start again, while the socket stays open here, so clients
queue in its backlog. On SIGTERM it stops the last one and exits. One line
per event on stdout: "start PID", "exit PID RC".
"""
import os
import signal
import socket
import subprocess
import sys
import time


def main():
    port, restarts, interval = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    cmd = sys.argv[sys.argv.index("--") + 1:]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

    def start():
        def child():
            if sock.fileno() != 3:
                os.dup2(sock.fileno(), 3)
            os.set_inheritable(3, True)
            os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES="nbd")
        # preexec_fn runs in the child after fork: LISTEN_PID is the pid
        # the command will have after exec
        p = subprocess.Popen(cmd, preexec_fn=child, pass_fds=(), close_fds=False)
        print(f"start {p.pid}", flush=True)
        return p

    def halt(p):
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = f"killed({p.wait()})"
        print(f"exit {p.pid} {rc}", flush=True)

    p = start()
    for _ in range(restarts):
        end = time.monotonic() + interval
        while time.monotonic() < end and not stop:
            time.sleep(0.05)
        if stop:
            break
        halt(p)
        p = start()
    while not stop:
        time.sleep(0.05)
    halt(p)


main()
