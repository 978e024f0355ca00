#include "tensorflow/tensorflow_c_api.h"

#include <dlfcn.h>

#include <mutex>

namespace collectives {
namespace tf {
namespace {

// Each entry: the Api member and TensorFlow's name for it.
template <typename F>
bool Find(void* lib, const char* name, F* slot, std::string* missing) {
  *slot = reinterpret_cast<F>(dlsym(lib, name));
  if (*slot == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
  }
  return *slot != nullptr;
}

Api g_api;
const Api* g_loaded = nullptr;
std::string g_why;

void Load() {
  // The library TensorFlow's Python module has loaded; RTLD_NOLOAD never loads a second copy.
  void* lib = dlopen("libtensorflow_framework.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {
    g_why = "libtensorflow_framework.so.2 is not loaded in this process (import tensorflow first)";
    return;
  }
  std::string missing;
  Api& a = g_api;
#define COLLECTIVES_TF_FIND(member) Find(lib, "TF_" #member, &a.member, &missing)
  COLLECTIVES_TF_FIND(NewStatus);
  COLLECTIVES_TF_FIND(DeleteStatus);
  COLLECTIVES_TF_FIND(SetStatus);
  COLLECTIVES_TF_FIND(GetCode);
  COLLECTIVES_TF_FIND(Message);
  COLLECTIVES_TF_FIND(NewOpDefinitionBuilder);
  COLLECTIVES_TF_FIND(OpDefinitionBuilderAddInput);
  COLLECTIVES_TF_FIND(OpDefinitionBuilderAddOutput);
  COLLECTIVES_TF_FIND(OpDefinitionBuilderAddAttr);
  COLLECTIVES_TF_FIND(OpDefinitionBuilderSetIsStateful);
  COLLECTIVES_TF_FIND(OpDefinitionBuilderSetShapeInferenceFunction);
  COLLECTIVES_TF_FIND(RegisterOpDefinition);
  COLLECTIVES_TF_FIND(ShapeInferenceContextNumInputs);
  COLLECTIVES_TF_FIND(NewShapeHandle);
  COLLECTIVES_TF_FIND(DeleteShapeHandle);
  COLLECTIVES_TF_FIND(ShapeInferenceContextGetInput);
  COLLECTIVES_TF_FIND(ShapeInferenceContextSetOutput);
  COLLECTIVES_TF_FIND(NewKernelBuilder);
  COLLECTIVES_TF_FIND(RegisterKernelBuilder);
  COLLECTIVES_TF_FIND(OpKernelConstruction_GetAttrSize);
  COLLECTIVES_TF_FIND(OpKernelConstruction_GetAttrString);
  COLLECTIVES_TF_FIND(OpKernelConstruction_GetAttrInt32);
  COLLECTIVES_TF_FIND(OpKernelConstruction_GetAttrFloat);
  COLLECTIVES_TF_FIND(OpKernelConstruction_GetAttrInt32List);
  COLLECTIVES_TF_FIND(OpKernelConstruction_Failure);
  COLLECTIVES_TF_FIND(NumInputs);
  COLLECTIVES_TF_FIND(GetInput);
  COLLECTIVES_TF_FIND(SetOutput);
  COLLECTIVES_TF_FIND(AllocateOutput);
  COLLECTIVES_TF_FIND(OpKernelContext_Failure);
  COLLECTIVES_TF_FIND(NewTensor);
  COLLECTIVES_TF_FIND(DeleteTensor);
  COLLECTIVES_TF_FIND(TensorType);
  COLLECTIVES_TF_FIND(NumDims);
  COLLECTIVES_TF_FIND(Dim);
  COLLECTIVES_TF_FIND(TensorByteSize);
  COLLECTIVES_TF_FIND(TensorData);
#undef COLLECTIVES_TF_FIND
  if (!missing.empty()) {
    g_why = "libtensorflow_framework.so.2 lacks " + missing;
    return;
  }
  g_loaded = &g_api;
}

}  // namespace

const Api* LoadApi(std::string* why) {
  static std::once_flag once;
  std::call_once(once, Load);
  if (g_loaded == nullptr && why != nullptr) *why = g_why;
  return g_loaded;
}

}  // namespace tf
}  // namespace collectives
