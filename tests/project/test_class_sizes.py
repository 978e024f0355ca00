"""The engine's classes stay small (issue 39: "the Engine as a small facade over objects with narrow
interfaces ... No class over ~25 members") and its files short: every class and struct defined
under csrc/, nested ones included, has at most 25 members as scripts/class_sizes.py counts them
(methods, constructors included, and fields), and no file there is over 500 lines.

Listed apart, with why: the tables of C function pointers that mirror a library's API.
"""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")
MAX_MEMBERS = 25
MAX_LINES = 500

# Fields only, one per entry point of the C API they mirror, filled from the library at run time
# (dlsym): no behaviour to split, and checked entry by entry against the library's own headers
# (tests/gpu/test_gpu_api_headers.py) or names (tensorflow_c_api.cc).
FUNCTION_TABLES = {
    ("csrc/gpu/gpu_api.h", "CudaApi"): "the CUDA driver API's entry points",
    ("csrc/tensorflow/tensorflow_c_api.h", "Api"): "TensorFlow's C API entry points",
}

def _class_sizes():
    spec = importlib.util.spec_from_file_location("class_sizes", os.path.join(ROOT, "scripts", "class_sizes.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SIZES = _class_sizes()


def test_the_counter_counts_methods_and_fields():
    text = """
    class Sample : public Base {
     public:
      Sample() = default;                                // method
      ~Sample();                                         // method
      int Get() const { return x_; }                     // method
      static constexpr int kLimit = 3;                   // field
      using Done = std::function<void(const Status&)>;   // not a member
      struct Nested { int a; int b() const; };           // not a member of Sample
     private:
      int (*fn_)(int, char*) = nullptr;                  // field: a pointer to a function
      std::function<void(int)> on_idle_;                 // field
      std::map<int, std::vector<int>> sets_;             // field
      int x_ = 0, y_ = 0;                                // field (one declaration)
    };
    """
    assert SIZES.count_members(text, "Sample") == (3, 5)
    assert SIZES.count_members(text, "Nested") == (1, 1)


def test_the_scan_finds_every_class_of_csrc():
    found = {(path, name) for path, name, _, _ in SIZES.all_classes(CSRC)}
    assert ("csrc/core/engine.h", "Engine") in found
    assert ("csrc/backends/nccl/nccl_backend.h", "NcclBackend") in found
    assert set(FUNCTION_TABLES) <= found, "a function table moved: update FUNCTION_TABLES"
    assert len(found) > 100


def test_no_class_has_more_than_25_members():
    over = [f"{name} ({path}): {methods} methods + {fields} fields = {methods + fields}"
            for path, name, methods, fields in SIZES.all_classes(CSRC)
            if methods + fields > MAX_MEMBERS and (path, name) not in FUNCTION_TABLES]
    assert not over, (f"classes over {MAX_MEMBERS} members (split them into objects with narrow interfaces, "
                      "docs/architecture.md):\n" + "\n".join(over))


def test_the_function_tables_hold_fields_only():
    sizes = {(path, name): methods for path, name, methods, _ in SIZES.all_classes(CSRC)}
    assert all(sizes[key] == 0 for key in FUNCTION_TABLES), "a function table gained behaviour: split it"


def test_no_engine_file_is_over_500_lines():
    long = []
    for folder, _, names in os.walk(CSRC):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, errors="replace") as f:
                lines = sum(1 for _ in f)
            if lines > MAX_LINES:
                long.append(f"{os.path.relpath(path, ROOT)}: {lines} lines")
    assert not long, "files over 500 lines (split them, one job each):\n" + "\n".join(long)
