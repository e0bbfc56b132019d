// cuDNN and cuBLAS under the emulator: not emulated. Handles can be created and bound to a stream
// (so that the real CudaContext and backends build), every other call returns the library's
// "not supported" status, which the backend's checks turn into an error naming the call. Tests
// of convolution, cuBLAS GEMMs and fp32 batch norm therefore run only on a GPU.
//
// cudnn.h and cublas_v2.h are deliberately not included: the stubs are C functions, linked by
// name, that ignore whatever arguments the caller passes (in registers under the x86-64 and
// AArch64 C calling conventions) and return the status as an int, the size of the status enums.
#include <cstdint>

namespace {
constexpr int kCudnnSuccess = 0, kCudnnNotSupported = 3000;  // CUDNN_STATUS_*
constexpr int kCublasSuccess = 0, kCublasNotSupported = 15;  // CUBLAS_STATUS_*
int g_handle;  // what every handle points at
}  // namespace

extern "C" {

int cudnnCreate(void** handle) {
  *handle = &g_handle;
  return kCudnnSuccess;
}
int cudnnDestroy(void*) { return kCudnnSuccess; }
int cudnnSetStream(void*, void*) { return kCudnnSuccess; }
const char* cudnnGetErrorString(int status) {
  return status == kCudnnNotSupported ? "CUDNN_STATUS_NOT_SUPPORTED (cuDNN is not emulated)"
                                      : "cuDNN status (emulator)";
}
// Destroying what was never created succeeds, as with a null descriptor in cuDNN.
int cudnnDestroyTensorDescriptor(void*) { return kCudnnSuccess; }
int cudnnDestroyFilterDescriptor(void*) { return kCudnnSuccess; }
int cudnnDestroyConvolutionDescriptor(void*) { return kCudnnSuccess; }

#define RT_EMU_CUDNN_UNSUPPORTED(name) \
  int name() { return kCudnnNotSupported; }
RT_EMU_CUDNN_UNSUPPORTED(cudnnCreateTensorDescriptor)
RT_EMU_CUDNN_UNSUPPORTED(cudnnCreateFilterDescriptor)
RT_EMU_CUDNN_UNSUPPORTED(cudnnCreateConvolutionDescriptor)
RT_EMU_CUDNN_UNSUPPORTED(cudnnSetTensor4dDescriptor)
RT_EMU_CUDNN_UNSUPPORTED(cudnnSetFilter4dDescriptor)
RT_EMU_CUDNN_UNSUPPORTED(cudnnSetConvolution2dDescriptor)
RT_EMU_CUDNN_UNSUPPORTED(cudnnSetConvolutionMathType)
RT_EMU_CUDNN_UNSUPPORTED(cudnnDeriveBNTensorDescriptor)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolution2dForwardOutputDim)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionForwardAlgorithmMaxCount)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionBackwardDataAlgorithmMaxCount)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionForwardAlgorithm_v7)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionBackwardDataAlgorithm_v7)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionBackwardFilterAlgorithm_v7)
RT_EMU_CUDNN_UNSUPPORTED(cudnnFindConvolutionForwardAlgorithm)
RT_EMU_CUDNN_UNSUPPORTED(cudnnFindConvolutionBackwardDataAlgorithm)
RT_EMU_CUDNN_UNSUPPORTED(cudnnFindConvolutionBackwardFilterAlgorithm)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionForwardWorkspaceSize)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionBackwardDataWorkspaceSize)
RT_EMU_CUDNN_UNSUPPORTED(cudnnGetConvolutionBackwardFilterWorkspaceSize)
RT_EMU_CUDNN_UNSUPPORTED(cudnnConvolutionForward)
RT_EMU_CUDNN_UNSUPPORTED(cudnnConvolutionBackwardData)
RT_EMU_CUDNN_UNSUPPORTED(cudnnConvolutionBackwardFilter)
RT_EMU_CUDNN_UNSUPPORTED(cudnnConvolutionBackwardBias)
RT_EMU_CUDNN_UNSUPPORTED(cudnnAddTensor)
RT_EMU_CUDNN_UNSUPPORTED(cudnnBatchNormalizationForwardTraining)
RT_EMU_CUDNN_UNSUPPORTED(cudnnBatchNormalizationForwardInference)
RT_EMU_CUDNN_UNSUPPORTED(cudnnBatchNormalizationBackward)

int cublasCreate_v2(void** handle) {
  *handle = &g_handle;
  return kCublasSuccess;
}
int cublasDestroy_v2(void*) { return kCublasSuccess; }
int cublasSetStream_v2(void*, void*) { return kCublasSuccess; }
int cublasSetMathMode(void*, int) { return kCublasSuccess; }
const char* cublasGetStatusName(int) { return "CUBLAS_STATUS_NOT_SUPPORTED"; }
const char* cublasGetStatusString(int) { return "operation not supported (cuBLAS is not emulated)"; }
int cublasGemmEx() { return kCublasNotSupported; }
int cublasSgemm_v2() { return kCublasNotSupported; }
int cublasSgemv_v2() { return kCublasNotSupported; }
int cublasSger_v2() { return kCublasNotSupported; }

}  // extern "C"
