// The engine that framework kernels submit to (today: the TensorFlow ops registered through
// TensorFlow's C API, tensorflow_kernels.cc). Python owns engines; a kernel runs on a framework
// thread with no Python, so it finds the running engine here, and holds a lease on it while it
// submits and waits, so that the engine is not destroyed under it.
#pragma once

namespace collectives {

class Engine;

// Set when an engine has started; cleared before it is destroyed, waiting out the leases on it
// (the slot may already hold a newer engine by then).
void SetSlotEngine(Engine* engine);
void ClearSlotEngine(Engine* engine);

// A lease on the slot's engine (null when no engine has started).
class EngineLease {
 public:
  EngineLease();
  ~EngineLease();
  EngineLease(const EngineLease&) = delete;
  EngineLease& operator=(const EngineLease&) = delete;
  Engine* get() const { return engine_; }

 private:
  Engine* engine_ = nullptr;
};

}  // namespace collectives
