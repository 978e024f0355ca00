// The part of TensorFlow's stable C API (its kernel, op and tensor functions) that our
// TensorFlow ops use, declared here and looked up at run time in the libtensorflow_framework
// that the process has already loaded, so that the engine is built without TensorFlow's
// headers and without linking against any framework. The signatures and enum values are
// TensorFlow's (tensorflow/c/kernels.h, ops.h, tf_tensor.h, tf_status.h, tf_datatype.h); the
// C API keeps them stable across releases.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

extern "C" {
struct TF_Status;
struct TF_Tensor;
struct TF_OpDefinitionBuilder;
struct TF_KernelBuilder;
struct TF_OpKernelConstruction;
struct TF_OpKernelContext;
struct TF_ShapeInferenceContext;
struct TF_ShapeHandle;
}

namespace collectives {
namespace tf {

// TF_Code values.
enum Code : int {
  kOk = 0, kUnknown = 2, kInvalidArgument = 3, kResourceExhausted = 8, kFailedPrecondition = 9, kAborted = 10,
  kUnimplemented = 12, kInternal = 13,
};

// TF_DataType values.
enum DataType : int {
  kFloat = 1, kDouble = 2, kInt32 = 3, kUint8 = 4, kInt16 = 5, kInt8 = 6, kInt64 = 9, kBool = 10, kBfloat16 = 14,
  kHalf = 19,
};

struct Api {
  TF_Status* (*NewStatus)();
  void (*DeleteStatus)(TF_Status*);
  void (*SetStatus)(TF_Status*, int code, const char* message);
  int (*GetCode)(const TF_Status*);
  const char* (*Message)(const TF_Status*);

  TF_OpDefinitionBuilder* (*NewOpDefinitionBuilder)(const char* op_name);
  void (*OpDefinitionBuilderAddInput)(TF_OpDefinitionBuilder*, const char* spec);
  void (*OpDefinitionBuilderAddOutput)(TF_OpDefinitionBuilder*, const char* spec);
  void (*OpDefinitionBuilderAddAttr)(TF_OpDefinitionBuilder*, const char* spec);
  void (*OpDefinitionBuilderSetIsStateful)(TF_OpDefinitionBuilder*, bool);
  void (*OpDefinitionBuilderSetShapeInferenceFunction)(TF_OpDefinitionBuilder*,
                                                       void (*)(TF_ShapeInferenceContext*, TF_Status*));
  void (*RegisterOpDefinition)(TF_OpDefinitionBuilder*, TF_Status*);

  int64_t (*ShapeInferenceContextNumInputs)(TF_ShapeInferenceContext*);
  TF_ShapeHandle* (*NewShapeHandle)();
  void (*DeleteShapeHandle)(TF_ShapeHandle*);
  void (*ShapeInferenceContextGetInput)(TF_ShapeInferenceContext*, int i, TF_ShapeHandle*, TF_Status*);
  void (*ShapeInferenceContextSetOutput)(TF_ShapeInferenceContext*, int i, TF_ShapeHandle*, TF_Status*);

  TF_KernelBuilder* (*NewKernelBuilder)(const char* op_name, const char* device_name,
                                        void* (*create)(TF_OpKernelConstruction*),
                                        void (*compute)(void*, TF_OpKernelContext*), void (*destroy)(void*));
  void (*RegisterKernelBuilder)(const char* kernel_name, TF_KernelBuilder*, TF_Status*);

  void (*OpKernelConstruction_GetAttrSize)(TF_OpKernelConstruction*, const char* name, int32_t* list_size,
                                           int32_t* total_size, TF_Status*);
  void (*OpKernelConstruction_GetAttrString)(TF_OpKernelConstruction*, const char* name, char* value,
                                             size_t max_length, TF_Status*);
  void (*OpKernelConstruction_GetAttrInt32)(TF_OpKernelConstruction*, const char* name, int32_t* value, TF_Status*);
  void (*OpKernelConstruction_GetAttrFloat)(TF_OpKernelConstruction*, const char* name, float* value, TF_Status*);
  void (*OpKernelConstruction_GetAttrInt32List)(TF_OpKernelConstruction*, const char* name, int32_t* values,
                                                int max_values, TF_Status*);
  void (*OpKernelConstruction_Failure)(TF_OpKernelConstruction*, TF_Status*);

  int (*NumInputs)(TF_OpKernelContext*);
  void (*GetInput)(TF_OpKernelContext*, int i, TF_Tensor**, TF_Status*);
  void (*SetOutput)(TF_OpKernelContext*, int i, const TF_Tensor*, TF_Status*);
  TF_Tensor* (*AllocateOutput)(TF_OpKernelContext*, int i, int dtype, const int64_t* dims, int num_dims,
                               size_t bytes, TF_Status*);
  void (*OpKernelContext_Failure)(TF_OpKernelContext*, TF_Status*);

  TF_Tensor* (*NewTensor)(int dtype, const int64_t* dims, int num_dims, void* data, size_t bytes,
                          void (*deallocator)(void* data, size_t bytes, void* arg), void* arg);
  void (*DeleteTensor)(TF_Tensor*);
  int (*TensorType)(const TF_Tensor*);
  int (*NumDims)(const TF_Tensor*);
  int64_t (*Dim)(const TF_Tensor*, int i);
  size_t (*TensorByteSize)(const TF_Tensor*);
  void* (*TensorData)(const TF_Tensor*);
};

// Looks the functions up in the loaded libtensorflow_framework (once). Null, with `why`, when
// TensorFlow is not loaded or lacks one of them.
const Api* LoadApi(std::string* why);

}  // namespace tf
}  // namespace collectives
