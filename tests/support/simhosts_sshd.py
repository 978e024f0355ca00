"""The sshd of a simulated host (tests/support/simhosts.py starts one inside each host's namespace):
serves the ssh stand-in (simhosts_ssh.py) on port 22 of the host's own address, so a session's
command, its output and its exit status all travel over the host's link, as with ssh. A cut
link therefore stalls the session; a crashed host (this server killed with everything else)
ends it; a host that was never reachable never answers.

Usage: simhosts_sshd.py REFUSE_DIR     (logins are refused while REFUSE_DIR/<hostname> exists)

Each session runs ``sh -c COMMAND`` in a session of its own with a login's environment. When
the client goes away first, the command's pipes close (as with ssh without a terminal; the
command is not killed).
"""
import json
import os
import socket
import subprocess
import sys
import threading

from simhosts_wire import EXIT, PORT, STDERR, STDIN, STDOUT, frame, read_frame, read_line

LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def login_environment(user):
    env = {"PATH": LOGIN_PATH, "HOME": "/root" if user == "root" else f"/home/{user}", "USER": user,
           "LOGNAME": user, "SHELL": "/bin/sh"}
    if "LANG" in os.environ:
        env["LANG"] = os.environ["LANG"]
    return env


class Session:
    def __init__(self, conn, refuse_dir):
        self.conn = conn
        self.refuse_dir = refuse_dir
        self.send_lock = threading.Lock()

    def send(self, channel, data=b""):
        with self.send_lock:
            try:
                self.conn.sendall(frame(channel, data))
                return True
            except OSError:
                return False

    def run(self):
        try:
            request = json.loads(read_line(self.conn) or b"")
        except (OSError, ValueError):
            self.conn.close()
            return
        user, hostname = request.get("user") or "root", socket.gethostname()
        if os.path.exists(os.path.join(self.refuse_dir, hostname)):
            self.send(STDERR, f"{user}@{hostname}: Permission denied (publickey,password).\n".encode())
            self.send(EXIT, b"255")
            self.close(reader=threading.Thread(target=self.drain, daemon=True))
            return
        child = subprocess.Popen(["sh", "-c", request["command"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=login_environment(user), start_new_session=True)
        pumps = [threading.Thread(target=self.pump_out, args=(child.stdout, STDOUT), daemon=True),
                 threading.Thread(target=self.pump_out, args=(child.stderr, STDERR), daemon=True)]
        for t in pumps:
            t.start()
        reader = threading.Thread(target=self.pump_in, args=(child.stdin,), daemon=True)
        reader.start()
        code = child.wait()
        for t in pumps:
            t.join()
        self.send(EXIT, str(code if code >= 0 else 255).encode())
        self.close(reader)

    def close(self, reader):
        """End the session once the client has nothing more in flight. Closing a socket with
        unread input makes the kernel send a reset, and a client that gets it before reading the
        last frames loses them (a refused login then looked like "Connection ... closed by remote
        host" instead of "Permission denied"): so say that we are done writing, let ``reader``
        (started here if not yet) consume the client's input to its end, then close."""
        try:
            self.conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if not reader.is_alive() and reader.ident is None:
            reader.start()
        reader.join(timeout=5)
        self.conn.close()

    def drain(self):
        """Read and drop the client's input until it closes (a refused session reads nothing)."""
        try:
            while self.conn.recv(65536):
                pass
        except OSError:
            pass

    def pump_out(self, pipe, channel):
        while True:
            data = os.read(pipe.fileno(), 65536)
            if not data or not self.send(channel, data):
                break
        pipe.close()

    def pump_in(self, pipe):
        while True:
            got = read_frame(self.conn)
            if got is None or (got[0] == STDIN and not got[1]):
                break
            try:
                pipe.write(got[1])
                pipe.flush()
            except OSError:
                break
        try:
            pipe.close()
        except OSError:
            pass


def main():
    refuse_dir = sys.argv[1]
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", PORT))
    server.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=Session(conn, refuse_dir).run, daemon=True).start()


if __name__ == "__main__":
    main()
