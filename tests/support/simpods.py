"""An MPIJob's pods on simulated hosts (simhosts.py), set up as Kubeflow's mpi-operator v2 sets
them up for ``mpiImplementation: MPICH`` (kubeflow/mpi-operator pkg/controller/mpi_job_controller.go
at cbe4f8aab9445f80bdae60868a040f59a3863c81), so that the launch the operator performs runs here:

  * one network namespace per pod, its hostname the pod's (``<job>-launcher``, ``<job>-worker-<i>``),
    its subdomain the job's headless Service ``<job>``, which selects the launcher and the workers;
  * names resolved as in the cluster: each pod's /etc/hosts has the kubelet's line for itself
    (``IP <pod>.<job>.<ns>.svc.cluster.local <pod>``) and, standing in for cluster DNS and each
    pod's search list (``<ns>.svc.cluster.local svc.cluster.local cluster.local``, and on workers
    also ``<job>.<ns>.svc.cluster.local``, which the operator adds so that the workers reach the
    launcher by its bare hostname), exactly the names that search list makes resolvable:
    ``<pod>.<job>.<ns>.svc[.cluster.local]`` and ``<pod>.<job>`` everywhere, a bare ``<pod>`` only
    on workers (and for itself);
  * the job's ssh key pair (an ECDSA P-521 key in PEM, named id_rsa as the operator names it)
    with id_rsa.pub and authorized_keys at /root/.ssh, the default sshAuthMountPath, in every pod;
  * the hostfile at /etc/mpi/hostfile in the launcher, in the operator's MPICH format
    (``<job>-worker-<i>.<job>.<ns>.svc:<slots>``), and the launcher's variables
    (HYDRA_HOST_FILE, HYDRA_LAUNCH_EXTRA_ARGS, K_MPI_JOB_ROLE, the emptied NVIDIA_* ones);
  * every worker runs a real OpenSSH sshd (``/usr/sbin/sshd -De``, the operator's default
    command for workers) configured by examples/kubernetes/ssh/, the files the image carries;
    the launcher's ssh is the real OpenSSH client, configured by the same files.

Each pod gets a file system of its own where a container has one: /etc and /root are overlays
(the pod's files on top of this machine's), /run a tmpfs, all in the mount namespace that
``ip netns exec`` makes for each command, so nothing of it is visible outside the pod and it
vanishes with the pod's processes. The overlays' upper layers live in the SimHosts run
directory, removed at teardown with everything else.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import simhosts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SSH_CONFIG_DIR = os.path.join(ROOT, "examples", "kubernetes", "ssh")
SSHD = "/usr/sbin/sshd"
SSH_PORT = 2222  # examples/kubernetes/ssh/*.conf (the operator's base image uses it too)
HOSTFILE = "/etc/mpi/hostfile"
# Per command, before the program: the pod's file system, then its hostname.
POD_SHELL = ('set -e; d="$1"; shift; '
             'mount -t overlay pod-etc -o "lowerdir=/etc,upperdir=$d/etc,workdir=$d/etc.work" /etc; '
             'mount -t overlay pod-root -o "lowerdir=/root,upperdir=$d/root,workdir=$d/root.work" /root; '
             'mount -t tmpfs pod-run /run; mkdir -p /run/sshd; '
             'hostname "$0"; exec "$@"')


def unavailable_reason():
    """None when pods can be simulated here, else why not (for pytest.skip)."""
    reason = simhosts.unavailable_reason()
    if reason:
        return reason
    for tool in (SSHD, "ssh-keygen", "ssh"):
        if shutil.which(tool) is None:
            return f"simulated pods need OpenSSH ({tool}; Debian's openssh-server and openssh-client)"
    if not os.path.isdir(SSH_CONFIG_DIR):
        return f"{SSH_CONFIG_DIR} is missing"
    return _overlay_reason()


def _overlay_reason():
    """None when an overlay can be mounted over /etc in a mount namespace of its own (each pod's
    file system), else why not."""
    d = tempfile.mkdtemp(prefix="simpods-probe-")
    try:
        os.makedirs(os.path.join(d, "up"))
        os.makedirs(os.path.join(d, "work"))
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "overlay", "probe",
                               "-o", f"lowerdir=/etc,upperdir={d}/up,workdir={d}/work", "/etc"],
                              capture_output=True, text=True, timeout=simhosts.COMMAND_TIMEOUT_S)
        if proc.returncode != 0:
            return f"simulated pods need overlayfs for their own /etc and /root: {proc.stderr.strip()}"
        return None
    finally:
        shutil.rmtree(d, ignore_errors=True)


class SimPods:
    """The pods of one MPIJob (``job`` in namespace ``namespace``, ``workers`` workers with
    ``slots`` slots each) on simulated hosts; a context manager that always tears them down."""

    def __init__(self, job="pi", namespace="default", workers=2, slots=1):
        self.job, self.namespace, self.slots = job, namespace, slots
        self.service = job  # the headless Service: every pod's subdomain
        self.launcher = f"{job}-launcher"
        self.workers = [f"{job}-worker-{i}" for i in range(workers)]
        self.sim = simhosts.SimHosts([self.launcher] + self.workers)
        self.sshd: Dict[str, subprocess.Popen] = {}
        self._launches = 0
        try:
            self._keys = self._make_keys()
            for pod in self.workers:
                self.start_sshd(pod)
        except BaseException:
            self.teardown()
            raise

    # ------------------------------------------------------------ names and files

    def fqdn(self, pod):
        """The name the operator's hostfile uses for a worker (`<pod>.<job>.<ns>.svc`)."""
        return f"{pod}.{self.service}.{self.namespace}.svc"

    def hostfile_text(self):
        return "".join(f"{self.fqdn(pod)}:{self.slots}\n" for pod in self.workers)

    def _names_from(self, here, pod):
        """The names of ``pod`` that resolve in pod ``here`` (cluster DNS through its search list)."""
        base = f"{pod}.{self.service}"
        names = [f"{base}.{self.namespace}.svc.cluster.local", f"{base}.{self.namespace}.svc", base]
        if here != self.launcher or pod == here:
            names.append(pod)  # workers search <job>.<ns>.svc.cluster.local; every pod knows itself
        return names

    def etc_hosts(self, here):
        hosts = self.sim.hosts
        lines = ["127.0.0.1 localhost"]
        lines += [f"{hosts[p].address} {' '.join(self._names_from(here, p))}" for p in [self.launcher] + self.workers]
        return "# the kubelet's lines and, in their stead, the cluster DNS records this pod can reach\n" + \
            "\n".join(lines) + "\n"

    def resolv_conf(self, here):
        search = f"{self.namespace}.svc.cluster.local svc.cluster.local cluster.local"
        if here != self.launcher:
            search += f" {self.service}.{self.namespace}.svc.cluster.local"
        return f"search {search}\n"

    def _make_keys(self):
        keys = os.path.join(self.sim.dir, "job-ssh")
        os.makedirs(keys)
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-C", "",
                        "-f", os.path.join(keys, "id_rsa")], check=True, capture_output=True, timeout=30)
        shutil.copy(os.path.join(keys, "id_rsa.pub"), os.path.join(keys, "authorized_keys"))
        return keys

    def _pod_dir(self, pod):
        """A fresh upper layer for one command in ``pod`` (two overlays may not share one)."""
        self._launches += 1
        d = os.path.join(self.sim.dir, "pods", f"{pod}.{self._launches}")
        for sub in ("etc", "etc.work", "root", "root.work", "etc/ssh/sshd_config.d", "etc/ssh/ssh_config.d"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, "etc", "hosts"), "w") as f:
            f.write(self.etc_hosts(pod))
        with open(os.path.join(d, "etc", "resolv.conf"), "w") as f:
            f.write(self.resolv_conf(pod))
        shutil.copy(os.path.join(SSH_CONFIG_DIR, "sshd_config"), os.path.join(d, "etc/ssh/sshd_config.d/mpijob.conf"))
        shutil.copy(os.path.join(SSH_CONFIG_DIR, "ssh_config"), os.path.join(d, "etc/ssh/ssh_config.d/mpijob.conf"))
        ssh = os.path.join(d, "root", ".ssh")  # the Secret volume at sshAuthMountPath, mode 0600
        os.makedirs(ssh)
        for name in ("id_rsa", "id_rsa.pub", "authorized_keys"):
            shutil.copy(os.path.join(self._keys, name), os.path.join(ssh, name))
            os.chmod(os.path.join(ssh, name), 0o600)
        if pod == self.launcher:  # the ConfigMap volume at /etc/mpi
            os.makedirs(os.path.join(d, "etc", "mpi"))
            with open(os.path.join(d, "etc", "mpi", "hostfile"), "w") as f:
                f.write(self.hostfile_text())
        return d

    def command_in(self, pod, argv):
        h = self.sim.hosts[pod]
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "sh", "-c", POD_SHELL, pod, self._pod_dir(pod),
                *map(str, argv)]

    # ------------------------------------------------------------ processes

    def start_sshd(self, pod):
        log = open(os.path.join(self.sim.dir, f"openssh-{pod}.log"), "ab")
        proc = subprocess.Popen(self.command_in(pod, [SSHD, "-D", "-e"]), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/bin"})
        log.close()
        self.sshd[pod] = proc
        deadline = time.monotonic() + simhosts.COMMAND_TIMEOUT_S
        probe = [sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {SSH_PORT}), 1)"]
        while True:  # the pod is ready when its port answers (the example manifest's readinessProbe)
            ready = subprocess.run(["ip", "netns", "exec", self.sim.hosts[pod].netns, *probe], capture_output=True,
                                   timeout=simhosts.COMMAND_TIMEOUT_S).returncode == 0
            if ready:
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(self.sim.dir, f"openssh-{pod}.log")) as f:
                    raise simhosts.SimHostsError(f"the sshd of pod {pod} did not start: {f.read()[-2000:]}")
            time.sleep(0.1)

    def launcher_env(self, extra=None):
        """The launcher container's environment: the image's (PATH with this venv, as the
        image's), and what the operator adds for MPICH."""
        env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/sbin:/usr/local/bin",
                                        "/usr/sbin:/usr/bin:/sbin:/bin"]),
               "HOME": "/root", "HOSTNAME": self.launcher, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
               # the operator's, for MPICH:
               "K_MPI_JOB_ROLE": "launcher", "HYDRA_HOST_FILE": HOSTFILE,
               "HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10",
               "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": "",
               # simulated hosts share one kernel: keep UCX to TCP so that traffic crosses the links
               "UCX_TLS": "tcp,self",
               "PYTHONPATH": simhosts.HERE}
        if "LANG" in os.environ:
            env["LANG"] = os.environ["LANG"]
        env.update(extra or {})
        return env

    def popen_launcher(self, argv, env=None):
        """The launcher pod's container running ``argv``, its output piped."""
        return subprocess.Popen(self.command_in(self.launcher, argv), env=self.launcher_env(env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)

    def run_launcher(self, argv, timeout, env=None):
        start = time.monotonic()
        proc = self.popen_launcher(argv, env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_jobs(proc)
            out, err = proc.communicate()
            raise AssertionError(f"{argv} in the launcher pod timed out after {timeout} s (killed)\n"
                                 f"--- stdout ---\n{out}\n--- stderr ---\n{err}") from None
        return simhosts.Result(proc.returncode, out, err, time.monotonic() - start)

    def processes(self) -> Dict[str, List[int]]:
        """Pids in each pod besides its sshd (OpenSSH's listener and the stand-in's)."""
        found = {}
        for pod, h in self.sim.hosts.items():
            keep = {p.pid for p in (self.sshd.get(pod), self.sim.sshd.get(pod)) if p is not None and p.poll() is None}
            found[pod] = [p for p in simhosts.netns_pids(h.netns) if p not in keep]
        return found

    def kill_jobs(self, proc=None):
        """Kill ``proc``'s group and everything in every pod but the sshds, until nothing is left."""
        if proc is not None:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 10
        while any(self.processes().values()) and time.monotonic() < end:
            for pids in self.processes().values():
                for pid in pids:
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)

    def crash(self, pod):
        """The pod dies (its node fails, or it is deleted): every process in it is killed."""
        simhosts.kill_netns_processes(self.sim.hosts[pod].netns)
        for table in (self.sshd, self.sim.sshd):
            proc = table.pop(pod, None)
            if proc is not None:
                proc.wait()

    def restore(self):
        """Every pod back up with its sshds, and no job left."""
        self.kill_jobs()
        for pod in self.workers:
            if pod not in self.sim.sshd:
                self.sim.boot(pod)
            if pod not in self.sshd or self.sshd[pod].poll() is not None:
                self.start_sshd(pod)

    def teardown(self):
        self.sim.teardown()
        for proc in self.sshd.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.teardown()

