#include "execution/device_submission.h"

#include <string>

#include "gpu/gpu_loader.h"

namespace collectives {

Status PrepareDeviceSubmission(Request& q, const void* input, const void* output, uintptr_t stream,
                               std::atomic<int>& process_device, gpu::EventPtr* ready, int32_t* device) {
  const std::string where = " (tensor '" + q.name + "')";
  if (!gpu::Libraries::Get().available())
    return Status::Error(StatusCode::UNSUPPORTED_TYPE, "tensor '" + q.name +
                                                           "' is in GPU memory, but collectives cannot use GPUs here: " +
                                                           gpu::Libraries::Get().problem());
  if (!IsDataOp(q.op) || q.op == OpType::BARRIER)
    return Status::Error(StatusCode::INVALID_ARGUMENT, std::string(OpTypeName(q.op)) + " takes no GPU tensor" + where);
  gpu::Runtime& rt = gpu::Runtime::Get();
  int dev = q.device;
  const void* any = input ? input : output;
  if (any) {
    Status st = rt.ResolveDevice(reinterpret_cast<uintptr_t>(any), q.device, &dev);
    if (!st.ok()) return Status::Error(st.code, st.message + where);
  }
  if (output && input && output != input) {
    int out_dev = dev;
    Status st = rt.ResolveDevice(reinterpret_cast<uintptr_t>(output), dev, &out_dev);
    if (!st.ok()) return Status::Error(st.code, "output: " + st.message + where);
  }
  if (dev < 0 && !any) dev = process_device;  // empty arrays own no memory: this process's GPU
  if (dev < 0) return Status::Error(StatusCode::INVALID_ARGUMENT, "cannot tell which GPU holds the tensor" + where);
  // One GPU per process, as in Horovod (each rank binds to its local_rank()'s GPU): the
  // communicators are per process set, and a rank's tensors must all use the same device.
  int expected = -1;
  if (!process_device.compare_exchange_strong(expected, dev) && expected != dev)
    return Status::Error(StatusCode::INVALID_ARGUMENT,
                         "collectives uses one GPU per process: this process uses GPU " + std::to_string(expected) +
                             ", but the tensor is on GPU " + std::to_string(dev) +
                             " (bind each rank to one device, e.g. torch.cuda.set_device(local_rank()))" + where);
  rt.SetProcessDevice(dev);
  Status st = rt.RecordEvent(dev, stream, ready);
  if (!st.ok()) return Status::Error(st.code, st.message + where);
  *device = dev;
  q.device = 0;  // what ranks negotiate is "GPU memory"; each one uses its own GPU
  return Status::Ok();
}

}  // namespace collectives
