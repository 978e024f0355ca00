"""The MPIJob manifests in examples/kubernetes/ checked as a cluster would check them, without a
cluster (none can run here):

  * against the operator's published CRD schema (tests/clusters/data/kubeflow.org_mpijobs.yaml, its
    origin noted there) with the ``jsonschema`` package, unknown fields being errors (the API
    server would silently drop them: a typo would be lost without a word);
  * against the Kubernetes and mpi-operator rules for the fields they use, written out below:
    names (DNS-1123 labels and subdomains, the Service's DNS-1035 label, port names as
    IANA_SVC_NAME), resource quantities (they parse; requests do not exceed limits; GPUs whole
    and not overcommitted), port ranges and protocols, the operator's own validation
    (pkg/apis/kubeflow/validation/validation.go: one launcher, restart and clean-pod policies,
    non-negative run-policy numbers), and consistency with the image (the sshd port of
    examples/kubernetes/ssh/, the key mount path, one rank per GPU, a launcher command that
    takes its hosts from the operator's hostfile).

Each rule is also shown to reject a broken copy of a manifest (test_each_rule_rejects_...), so
none of them passes vacuously. About 1 s.
"""
import copy
import os
import re
from decimal import Decimal

import pytest

yaml = pytest.importorskip("yaml", reason="the manifest checks need PyYAML (scripts/setup_env.sh test installs it)")
jsonschema = pytest.importorskip("jsonschema", reason="the manifest checks need jsonschema (setup_env.sh test)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "kubernetes")
CRD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "kubeflow.org_mpijobs.yaml")
MANIFESTS = ["mpijob-cpu.yaml", "mpijob-gpu.yaml"]

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # at most 63 characters
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # at most 63 characters
IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")  # at most 15, a letter, no "--"
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# k8s.io/apimachinery resource.Quantity: a signed decimal number and a suffix.
QUANTITY = re.compile(r"^(?P<number>[+-]?(\d+(\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
SUFFIX = {"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10 ** 3, "M": 10 ** 6,
          "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30,
          "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
INT_FORMATS = {"int32": (-2 ** 31, 2 ** 31 - 1), "int64": (-2 ** 63, 2 ** 63 - 1)}


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


# ----------------------------------------------------------------- the CRD's schema

def strict(schema):
    """The CRD's structural schema as JSON Schema that rejects unknown fields: every object with
    `properties` and no `additionalProperties` gets `additionalProperties: false` (the API server
    prunes such fields; here they are errors). Other Kubernetes extensions (x-kubernetes-*) add
    nothing to check for these manifests and are dropped."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in schema and "additionalProperties" not in schema and \
            not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if "anyOf" in out and "pattern" in out:  # int-or-string: the pattern applies to strings only
        out["anyOf"] = [dict(s, pattern=out["pattern"]) if s.get("type") == "string" else s for s in out["anyOf"]]
        del out["pattern"]
    return out


def format_checker():
    checker = jsonschema.FormatChecker()
    for name, (low, high) in INT_FORMATS.items():
        checker.checks(name)(lambda value, low=low, high=high: not isinstance(value, int) or low <= value <= high)
    return checker


def crd_validator():
    crd = load(CRD)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v2beta1"]
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]), format_checker=format_checker())


def schema_errors(manifest):
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in crd_validator().iter_errors(manifest)]


# ----------------------------------------------------------------- Kubernetes' rules, one at a time

def quantity(text):
    """A resource quantity's value (Decimal), or ValueError as the API server would refuse it."""
    m = QUANTITY.match(str(text))
    if not m:
        raise ValueError(f"quantity {text!r} does not parse")
    suffix = m.group("suffix") or ""
    scale = Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else Decimal(SUFFIX[suffix])
    return Decimal(m.group("number")) * scale


def label_errors(what, value, pattern=DNS1123_LABEL, limit=63):
    if not isinstance(value, str) or len(value) > limit or not pattern.match(value):
        return [f"{what} {value!r} is not a valid name (at most {limit} characters, {pattern.pattern})"]
    return []


def subdomain_errors(what, value):
    if not isinstance(value, str) or len(value) > 253 or not all(DNS1123_LABEL.match(p) for p in value.split(".")):
        return [f"{what} {value!r} is not a DNS-1123 subdomain"]
    return []


def port_name_errors(what, name):
    if len(name) > 15 or not IANA_SVC_NAME.match(name) or "--" in name or not re.search("[a-z]", name):
        return [f"{what} {name!r} is not an IANA_SVC_NAME (at most 15 lowercase letters, digits, single '-')"]
    return []


def resource_errors(where, resources):
    errors = []
    parsed = {}
    for kind in ("limits", "requests"):
        for name, value in (resources.get(kind) or {}).items():
            prefix, _, base = name.rpartition("/")
            if not QUALIFIED_NAME.match(base) or (prefix and subdomain_errors("", prefix)):
                errors.append(f"{where}.{kind}: {name!r} is not a qualified resource name")
            try:
                parsed[kind, name] = quantity(value)
            except ValueError as e:
                errors.append(f"{where}.{kind}.{name}: {e}")
                continue
            if parsed[kind, name] < 0:
                errors.append(f"{where}.{kind}.{name}: {value!r} is negative")
            if name not in STANDARD_RESOURCES and "/" in name and parsed[kind, name] != int(parsed[kind, name]):
                errors.append(f"{where}.{kind}.{name}: extended resources must be whole numbers, not {value!r}")
    for (kind, name), value in parsed.items():
        if kind == "requests" and ("limits", name) in parsed and value > parsed["limits", name]:
            errors.append(f"{where}: requests.{name} {value} exceeds limits.{name} {parsed['limits', name]}")
        if kind == "requests" and name not in STANDARD_RESOURCES and ("limits", name) in parsed and \
                value != parsed["limits", name]:
            errors.append(f"{where}: {name} cannot be overcommitted (requests must equal limits)")
    return errors


def container_errors(where, container):
    errors = label_errors(f"{where}.name", container.get("name"))
    if not container.get("image"):
        errors.append(f"{where}.image is empty")
    for field in ("command", "args"):
        if any(not isinstance(w, str) or not w for w in container.get(field) or []):
            errors.append(f"{where}.{field} has an empty or non-string word")
    named = {}
    seen = set()
    for i, port in enumerate(container.get("ports") or []):
        p = f"{where}.ports[{i}]"
        number = port.get("containerPort")
        if not isinstance(number, int) or not 0 < number < 65536:
            errors.append(f"{p}.containerPort {number!r} is not in 1-65535")
        protocol = port.get("protocol", "TCP")
        if protocol not in ("TCP", "UDP", "SCTP"):
            errors.append(f"{p}.protocol {protocol!r} is not TCP, UDP or SCTP")
        if (number, protocol) in seen:
            errors.append(f"{p}: port {number}/{protocol} listed twice")
        seen.add((number, protocol))
        if "name" in port:
            errors += port_name_errors(f"{p}.name", port["name"])
            named[port["name"]] = number
    probe_port = ((container.get("readinessProbe") or {}).get("tcpSocket") or {}).get("port")
    if probe_port is not None:
        if isinstance(probe_port, int):
            if not 0 < probe_port < 65536:
                errors.append(f"{where}.readinessProbe.tcpSocket.port {probe_port} is not in 1-65535")
        elif probe_port not in named:
            errors.append(f"{where}.readinessProbe.tcpSocket.port {probe_port!r} names no port of the container")
    errors += resource_errors(f"{where}.resources", container.get("resources") or {})
    return errors


def kubernetes_errors(manifest):
    """Kubernetes' and the operator's rules for the fields the examples use."""
    errors = []
    name = manifest["metadata"]["name"]
    spec = manifest["spec"]
    replicas = spec["mpiReplicaSpecs"]
    workers = (replicas.get("Worker") or {}).get("replicas", 1)
    errors += subdomain_errors("metadata.name", name)
    # The operator's pods are named (and their hostnames set) <job>-launcher, <job>-worker-<i>, and
    # its headless Service <job>: Services need DNS-1035 labels.
    errors += label_errors("the launcher pod's hostname", f"{name}-launcher")
    errors += label_errors("the last worker pod's hostname", f"{name}-worker-{workers - 1}")
    errors += label_errors("the job's Service name", name, DNS1035_LABEL)
    if replicas.get("Launcher", {}).get("replicas") != 1:
        errors.append("mpiReplicaSpecs.Launcher.replicas must be 1")
    if not isinstance(workers, int) or workers < 1:
        errors.append("mpiReplicaSpecs.Worker.replicas must be at least 1")
    for role, replica in replicas.items():
        if role not in ("Launcher", "Worker"):
            errors.append(f"mpiReplicaSpecs.{role}: only Launcher and Worker are replica types")
        if replica.get("restartPolicy", "Never") not in ("Never", "OnFailure"):
            errors.append(f"mpiReplicaSpecs.{role}.restartPolicy {replica['restartPolicy']!r} is not Never or OnFailure")
        containers = replica["template"]["spec"]["containers"]
        if not containers:
            errors.append(f"mpiReplicaSpecs.{role}: no container")
        names = [c.get("name") for c in containers]
        if len(set(names)) != len(names):
            errors.append(f"mpiReplicaSpecs.{role}: container names repeat: {names}")
        for i, container in enumerate(containers):
            errors += container_errors(f"mpiReplicaSpecs.{role}.template.spec.containers[{i}]", container)
    if spec.get("slotsPerWorker", 1) < 0:
        errors.append("slotsPerWorker must not be negative")
    policy = spec.get("runPolicy") or {}
    if policy.get("cleanPodPolicy", "Running") not in ("None", "Running", "All"):
        errors.append(f"runPolicy.cleanPodPolicy {policy['cleanPodPolicy']!r} is not None, Running or All")
    for field in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if field in policy and policy[field] < 0:
            errors.append(f"runPolicy.{field} must not be negative")
    if not spec.get("sshAuthMountPath", "/root/.ssh"):
        errors.append("sshAuthMountPath is empty")
    return errors


def image_errors(manifest):
    """The manifest and the image (examples/kubernetes/Dockerfile and ssh/) agree."""
    errors = []
    with open(os.path.join(EXAMPLES, "ssh", "sshd_config")) as f:
        (sshd_port,) = [int(line.split()[1]) for line in f if line.startswith("Port ")]
    spec = manifest["spec"]
    if spec.get("mpiImplementation") != "MPICH":
        errors.append("mpiImplementation must be MPICH (the image's MPI is the mpich wheel's)")
    if spec.get("sshAuthMountPath", "/root/.ssh") != "/root/.ssh":
        errors.append("sshAuthMountPath must be /root/.ssh: the image logs in as root")
    (launcher,) = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    words = launcher.get("command", []) + launcher.get("args", [])
    if words[:1] != ["collectivesrun"]:
        errors.append(f"the launcher runs {words[:1]}, not collectivesrun")
    if any(w in ("-np", "--num-proc", "-H", "--hosts", "--hostfile", "-hostfile") for w in words):
        errors.append("the launcher's command names hosts or -np: the operator's hostfile would be ignored")
    (worker,) = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    if worker.get("command", []) + worker.get("args", []) != ["/usr/sbin/sshd", "-De"]:
        errors.append("the workers must run the image's sshd in the foreground: /usr/sbin/sshd -De")
    ports = [p["containerPort"] for p in worker.get("ports", [])]
    probe = worker.get("readinessProbe", {}).get("tcpSocket", {}).get("port")
    if ports != [sshd_port] or probe != sshd_port:
        errors.append(f"the workers' port {ports} and readiness probe {probe!r} must be the sshd's port {sshd_port}")
    gpus = (worker.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu")
    if gpus is not None and int(gpus) != spec.get("slotsPerWorker", 1):
        errors.append(f"slotsPerWorker {spec.get('slotsPerWorker', 1)} must equal the GPUs per worker ({gpus})")
    return errors


# ----------------------------------------------------------------- the tests

@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_matches_the_operators_crd(name):
    manifest = load(os.path.join(EXAMPLES, name))
    assert manifest["apiVersion"] == "kubeflow.org/v2beta1" and manifest["kind"] == "MPIJob"
    assert schema_errors(manifest) == []


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_follows_kubernetes_rules(name):
    assert kubernetes_errors(load(os.path.join(EXAMPLES, name))) == []


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_fits_the_image(name):
    assert image_errors(load(os.path.join(EXAMPLES, name))) == []


def _set(path, value):
    def change(m):
        *parents, last = path
        for key in parents:
            m = m[key]
        m[last] = value
    return change


WORKER = ["spec", "mpiReplicaSpecs", "Worker", "template", "spec", "containers", 0]
LAUNCHER = ["spec", "mpiReplicaSpecs", "Launcher", "template", "spec", "containers", 0]
BROKEN = {  # what is broken: (which check must say so, the change)
    "an MPI the CRD does not know": (schema_errors, _set(["spec", "mpiImplementation"], "MPICH2")),
    "a misspelt field": (schema_errors, _set(["spec", "slotPerWorker"], 2)),
    "a misspelt container field": (schema_errors, _set(WORKER + ["readynessProbe"], {})),
    "slots as a string": (schema_errors, _set(["spec", "slotsPerWorker"], "2")),
    "an int32 overflow": (schema_errors, _set(["spec", "mpiReplicaSpecs", "Worker", "replicas"], 2 ** 31)),
    "a quantity that does not parse": (schema_errors, _set(WORKER + ["resources", "limits", "memory"], "4 GB")),
    "a job name with capitals": (kubernetes_errors, _set(["metadata", "name"], "Collectives-MNIST")),
    "a job name too long for its pods' hostnames": (kubernetes_errors, _set(["metadata", "name"], "j" * 60)),
    "a job name starting with a digit (its Service)": (kubernetes_errors, _set(["metadata", "name"], "1job")),
    "two launchers": (kubernetes_errors, _set(["spec", "mpiReplicaSpecs", "Launcher", "replicas"], 2)),
    "a restart policy the operator refuses": (kubernetes_errors,
                                              _set(["spec", "mpiReplicaSpecs", "Worker", "restartPolicy"], "Always")),
    "a port out of range": (kubernetes_errors, _set(WORKER + ["ports", 0, "containerPort"], 70000)),
    "a port name too long": (kubernetes_errors, _set(WORKER + ["ports", 0, "name"], "secure-shell-port")),
    "a probe on a port name not declared": (kubernetes_errors,
                                            _set(WORKER + ["readinessProbe", "tcpSocket", "port"], "sshd")),
    "requests above limits": (kubernetes_errors, _set(WORKER + ["resources", "requests", "memory"], "5Gi")),
    "half a GPU": (kubernetes_errors, _set(WORKER + ["resources", "limits", "nvidia.com/gpu"], "0.5")),
    "a negative backoff limit": (kubernetes_errors, _set(["spec", "runPolicy", "backoffLimit"], -1)),
    "a clean-pod policy that does not exist": (kubernetes_errors, _set(["spec", "runPolicy", "cleanPodPolicy"], "Some")),
    "a launcher command naming hosts": (image_errors, _set(LAUNCHER + ["command"],
                                                           ["collectivesrun", "-np", "4", "python", "train.py"])),
    "workers listening elsewhere": (image_errors, _set(WORKER + ["ports", 0, "containerPort"], 22)),
    "a non-root key mount": (image_errors, _set(["spec", "sshAuthMountPath"], "/home/mpiuser/.ssh")),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_each_rule_rejects_a_broken_manifest(what):
    check, change = BROKEN[what]
    manifest = load(os.path.join(EXAMPLES, "mpijob-cpu.yaml"))
    assert check(manifest) == [], "the unbroken manifest must pass"
    broken = copy.deepcopy(manifest)
    change(broken)
    assert check(broken), f"{check.__name__} accepted a manifest with {what}"


def test_gpu_slots_must_match_the_gpus():
    manifest = load(os.path.join(EXAMPLES, "mpijob-gpu.yaml"))
    manifest["spec"]["slotsPerWorker"] = 8
    assert any("slotsPerWorker 8 must equal the GPUs per worker (4)" in e for e in image_errors(manifest))


def test_quantities_parse_as_kubernetes_reads_them():
    assert quantity("2") == 2 and quantity("500m") == Decimal("0.5") and quantity("4Gi") == 4 * 2 ** 30
    assert quantity("1e3") == 1000 and quantity("1.5k") == 1500 and quantity(".5") == Decimal("0.5")
    for bad in ("4 GB", "4gb", "Gi", "1.2.3", "--1", "4KiB"):
        with pytest.raises(ValueError):
            quantity(bad)
