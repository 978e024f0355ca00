"""docs/errors.md (issue 37 item 5): every error message the code raises has a cause and a fix.
scripts/error_messages.py reads the messages from the code (Python raises, collectivesrun's usage
errors, the engine's Status::Error); scripts/error_catalog.py gives each its entry; the page is
what scripts/errors_page.py generates now. The later tests prove the checks can fail: a new
message without an entry, an entry left without messages, and a stale page are reported."""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_every_message_has_an_entry_and_the_page_is_current():
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "errors_page.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_messages_are_read_from_python_and_the_engine(tmp_path):
    messages = load("error_messages")
    (tmp_path / "collectives").mkdir()
    (tmp_path / "collectives" / "m.py").write_text(
        "def f(x):\n"
        "    raise InvalidArgumentError(f'tensor {x} has no rows')\n"
        "def g(p, text):\n"
        "    p.error('-np N is required')\n"
        "    raise ValueError(text)\n")
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "a.cc").write_text(
        'Status Check(int n) {\n'
        '  if (n < 0) return Status::Error(StatusCode::INVALID_ARGUMENT, "negative count " + std::to_string(n) +\n'
        '                                  " in the request");\n'
        '  return Status::Ok();\n}\n')
    found = {(m.exception, m.text, m.where) for m in messages.all_messages(str(tmp_path))}
    assert ("InvalidArgumentError", "tensor … has no rows", "collectives/m.py:f") in found
    assert ("usage", "-np N is required", "collectives/m.py:g") in found
    assert ("ValueError", messages.COMPUTED, "collectives/m.py:g") in found
    assert ("InvalidArgumentError", "negative count … in the request", "csrc/a.cc:Check") in found


def test_unmatched_messages_and_unused_entries_are_reported():
    messages = load("error_messages")
    page = load("errors_page")
    catalog = load("error_catalog")
    real = messages.all_messages()
    new = messages.Message("InvalidArgumentError", "a message nobody documented", "collectives/x.py:f", 1)
    _, unmatched, unused = page.assign(real + [new], catalog.CATALOG)
    assert unmatched == [new] and unused == []
    extra = catalog.Entry("never", "Never raised", "c", "f", match=(r"^no message says this$",))
    _, unmatched, unused = page.assign(real, catalog.CATALOG + [extra])
    assert unmatched == [] and unused == ["never"]
    # The catalog is not a catch-all: without the dtype entry the dtype messages are unmatched.
    without = [e for e in catalog.CATALOG if e.key != "dtype"]
    _, unmatched, _ = page.assign(real, without)
    assert unmatched and all("dtype" in m.text or "data type" in m.text or "bool" in m.text for m in unmatched)


def test_stale_page_is_reported(tmp_path):
    stale = tmp_path / "errors.md"
    stale.write_text("# Errors\n")
    script = os.path.join(SCRIPTS, "errors_page.py")
    proc = subprocess.run([sys.executable, script, "--check", "--page", str(stale)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "stale" in proc.stderr
