// hlotk's native launcher: one compiled CUDA executable = one captured CUDA graph, launched
// from an XLA FFI custom call on XLA's own stream (runtime/cuda/native/__init__.py says why).
//
// The graph is instantiated a few times ("slots", Exec::Choose). Per call the handler reads
// the device addresses XLA gives the call's operands and results, picks the slot whose
// addresses differ least, writes those that differ into that instantiation's kernel
// parameters at the places the capture diff found (patch.py), and launches it. Nothing here
// allocates, synchronizes or calls back into Python.
// Memcpy/memset nodes are read (so that the diff sees what they touch) but never patched:
// before the diff, those that touch an argument or result are replaced by kernel nodes of
// two small copy/fill kernels (kCopyKernelsPtx, LowerCopies), whose parameters can be.
//
// The CUDA driver API is resolved from libcuda.so.1 at run time (no CUDA headers or
// libraries are needed to build this file); every call's status is checked and turned into
// a message naming the call. The file builds with any C++17 compiler and the XLA FFI headers
// that jaxlib ships (jax.ffi.include_dir()).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

#define HK_EXPORT extern "C" __attribute__((visibility("default")))

namespace hk {

// --- the CUDA driver API, as much as is used (layouts as in cuda.h, CUDA 12.x/13.x) -------
using CUresult = int;
using CUdeviceptr = unsigned long long;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphNode_st* CUgraphNode;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUfunc_st* CUfunction;
typedef struct CUkern_st* CUkernel;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUmod_st* CUmodule;
typedef struct CUevent_st* CUevent;

constexpr CUresult kInvalidValue = 1;  // CUDA_ERROR_INVALID_VALUE
constexpr int kAlignment = 64;          // launcher.ALIGNMENT: what the captures assumed

enum NodeType : int {
  kKernel = 0, kMemcpy = 1, kMemset = 2, kHost = 3, kChildGraph = 4, kEmpty = 5,
  kWaitEvent = 6, kEventRecord = 7,
};

struct KernelNodeParams {  // CUDA_KERNEL_NODE_PARAMS_v2
  CUfunction func;
  unsigned int grid[3];
  unsigned int block[3];
  unsigned int shared_mem_bytes;
  void** kernel_params;
  void** extra;
  CUkernel kern;
  CUcontext ctx;
};
static_assert(sizeof(KernelNodeParams) == 72, "CUDA_KERNEL_NODE_PARAMS_v2 is 72 bytes");

// CUDA_MEMCPY3D (200 bytes) and CUDA_MEMSET_NODE_PARAMS (40 bytes) are kept as raw bytes:
// their address fields are found by the same word diff as kernel parameters.
constexpr size_t kMemcpy3DSize = 200;
constexpr size_t kMemsetSize = 40;
constexpr int kMemoryHost = 1, kMemoryDevice = 2, kMemoryUnified = 4;  // CUmemorytype
constexpr int kPointerMemoryType = 2;   // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerRangeStart = 11;  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR

// The fields of CUDA_MEMCPY3D and CUDA_MEMSET_NODE_PARAMS that LowerCopies reads.
struct Memcpy3D {
  uint64_t src_x, src_y, src_z, src_lod;
  int32_t src_type, pad0;
  uint64_t src_host, src_device, src_array, reserved0, src_pitch, src_height;
  uint64_t dst_x, dst_y, dst_z, dst_lod;
  int32_t dst_type, pad1;
  uint64_t dst_host, dst_device, dst_array, reserved1, dst_pitch, dst_height;
  uint64_t width, height, depth;
};
static_assert(sizeof(Memcpy3D) == kMemcpy3DSize, "CUDA_MEMCPY3D is 200 bytes");
struct MemsetParams {
  uint64_t dst, pitch;
  uint32_t value, element_size;
  uint64_t width, height;
};
static_assert(sizeof(MemsetParams) == kMemsetSize, "CUDA_MEMSET_NODE_PARAMS is 40 bytes");

struct Driver {
  CUresult (*Init)(unsigned int);
  CUresult (*GetErrorName)(CUresult, const char**);
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*GraphGetNodes)(CUgraph, CUgraphNode*, size_t*);
  CUresult (*GraphNodeGetType)(CUgraphNode, int*);
  CUresult (*GraphKernelNodeGetParams)(CUgraphNode, KernelNodeParams*);
  CUresult (*GraphMemcpyNodeGetParams)(CUgraphNode, void*);
  CUresult (*GraphMemsetNodeGetParams)(CUgraphNode, void*);
  CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*);
  CUresult (*KernelGetParamInfo)(CUkernel, size_t, size_t*, size_t*);  // may be absent
  CUresult (*FuncGetName)(const char**, CUfunction);                    // may be absent
  CUresult (*GraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode, const KernelNodeParams*);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext*);
  CUresult (*CtxSynchronize)();
  // Replacing copy/fill nodes by kernels (LowerCopies) and classifying words; optional:
  // without them the copies stay memcpy/memset nodes (and keep such programs on Python).
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*GraphNodeGetDependencies)(CUgraphNode, CUgraphNode*, void*, size_t*);   // _v2
  CUresult (*GraphNodeGetDependentNodes)(CUgraphNode, CUgraphNode*, void*, size_t*); // _v2
  CUresult (*GraphAddDependencies)(CUgraph, const CUgraphNode*, const CUgraphNode*,
                                   const void*, size_t);                              // _v2
  CUresult (*GraphAddKernelNode)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                 const KernelNodeParams*);                            // _v2
  CUresult (*GraphDestroyNode)(CUgraphNode);
  CUresult (*PointerGetAttribute)(void*, int, CUdeviceptr);
  // Events around a launch (trace mode, benchmarks/call_timeline.py); optional.
  CUresult (*EventCreate)(CUevent*, unsigned);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*EventDestroy)(CUevent);
};

struct Failure {
  std::string message;
  explicit Failure(std::string m) : message(std::move(m)) {}
};

Driver g_cu;
bool g_loaded = false;
std::string g_load_error;
std::mutex g_load_mu;

std::string Describe(const char* call, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (g_cu.GetErrorName) g_cu.GetErrorName(r, &name);
  if (g_cu.GetErrorString) g_cu.GetErrorString(r, &text);
  return std::string(call) + " failed: " + (name ? name : "CUDA error") + " (" +
         std::to_string(r) + (text ? std::string(": ") + text : std::string()) + ")";
}

// Every driver call goes through HK_CHECK: a failure becomes a Failure naming the call.
#define HK_CHECK(call)                                                          \
  do {                                                                          \
    ::hk::CUresult hk_status_ = (call);                                         \
    if (hk_status_ != 0) throw ::hk::Failure(::hk::Describe(#call, hk_status_)); \
  } while (0)

bool LoadDriver(std::string* error) {
  std::lock_guard<std::mutex> lock(g_load_mu);
  if (g_loaded) return true;
  if (!g_load_error.empty()) {
    *error = g_load_error;
    return false;
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    g_load_error = std::string("cannot load the CUDA driver library libcuda.so.1: ") +
                   (why ? why : "unknown reason");
    *error = g_load_error;
    return false;
  }
  struct Entry {
    const char* name;
    void** slot;
    bool required;
  };
  Entry entries[] = {
      {"cuInit", reinterpret_cast<void**>(&g_cu.Init), true},
      {"cuGetErrorName", reinterpret_cast<void**>(&g_cu.GetErrorName), true},
      {"cuGetErrorString", reinterpret_cast<void**>(&g_cu.GetErrorString), true},
      {"cuGraphGetNodes", reinterpret_cast<void**>(&g_cu.GraphGetNodes), true},
      {"cuGraphNodeGetType", reinterpret_cast<void**>(&g_cu.GraphNodeGetType), true},
      {"cuGraphKernelNodeGetParams_v2", reinterpret_cast<void**>(&g_cu.GraphKernelNodeGetParams), true},
      {"cuGraphMemcpyNodeGetParams", reinterpret_cast<void**>(&g_cu.GraphMemcpyNodeGetParams), true},
      {"cuGraphMemsetNodeGetParams", reinterpret_cast<void**>(&g_cu.GraphMemsetNodeGetParams), true},
      {"cuFuncGetParamInfo", reinterpret_cast<void**>(&g_cu.FuncGetParamInfo), true},
      {"cuKernelGetParamInfo", reinterpret_cast<void**>(&g_cu.KernelGetParamInfo), false},
      {"cuFuncGetName", reinterpret_cast<void**>(&g_cu.FuncGetName), false},
      {"cuGraphInstantiateWithFlags", reinterpret_cast<void**>(&g_cu.GraphInstantiateWithFlags), true},
      {"cuGraphExecDestroy", reinterpret_cast<void**>(&g_cu.GraphExecDestroy), true},
      {"cuGraphLaunch", reinterpret_cast<void**>(&g_cu.GraphLaunch), true},
      {"cuGraphExecKernelNodeSetParams_v2", reinterpret_cast<void**>(&g_cu.GraphExecKernelNodeSetParams), true},
      {"cuCtxGetCurrent", reinterpret_cast<void**>(&g_cu.CtxGetCurrent), true},
      {"cuCtxPushCurrent_v2", reinterpret_cast<void**>(&g_cu.CtxPushCurrent), true},
      {"cuCtxPopCurrent_v2", reinterpret_cast<void**>(&g_cu.CtxPopCurrent), true},
      {"cuCtxSynchronize", reinterpret_cast<void**>(&g_cu.CtxSynchronize), true},
      {"cuModuleLoadData", reinterpret_cast<void**>(&g_cu.ModuleLoadData), false},
      {"cuModuleGetFunction", reinterpret_cast<void**>(&g_cu.ModuleGetFunction), false},
      {"cuGraphNodeGetDependencies_v2", reinterpret_cast<void**>(&g_cu.GraphNodeGetDependencies), false},
      {"cuGraphNodeGetDependentNodes_v2", reinterpret_cast<void**>(&g_cu.GraphNodeGetDependentNodes), false},
      {"cuGraphAddDependencies_v2", reinterpret_cast<void**>(&g_cu.GraphAddDependencies), false},
      {"cuGraphAddKernelNode_v2", reinterpret_cast<void**>(&g_cu.GraphAddKernelNode), false},
      {"cuGraphDestroyNode", reinterpret_cast<void**>(&g_cu.GraphDestroyNode), false},
      {"cuPointerGetAttribute", reinterpret_cast<void**>(&g_cu.PointerGetAttribute), false},
      {"cuEventCreate", reinterpret_cast<void**>(&g_cu.EventCreate), false},
      {"cuEventRecord", reinterpret_cast<void**>(&g_cu.EventRecord), false},
      {"cuEventSynchronize", reinterpret_cast<void**>(&g_cu.EventSynchronize), false},
      {"cuEventDestroy_v2", reinterpret_cast<void**>(&g_cu.EventDestroy), false},
  };
  for (const Entry& e : entries) {
    *e.slot = dlsym(lib, e.name);
    if (*e.slot == nullptr && e.required) {
      g_load_error = std::string("the CUDA driver has no ") + e.name +
                     " (a driver for CUDA 12.4 or newer is needed)";
      *error = g_load_error;
      return false;
    }
  }
  for (const char* name : {"cuEventElapsedTime_v2", "cuEventElapsedTime"}) {
    g_cu.EventElapsedTime = reinterpret_cast<CUresult (*)(float*, CUevent, CUevent)>(dlsym(lib, name));
    if (g_cu.EventElapsedTime) break;
  }
  CUresult r = g_cu.Init(0);
  if (r != 0) {
    g_load_error = Describe("cuInit(0)", r);
    *error = g_load_error;
    return false;
  }
  g_loaded = true;
  return true;
}

// --- reading a captured graph -----------------------------------------------------------
struct NodeView {
  int type = -1;
  std::vector<unsigned char> key;   // what must match between two captures
  std::vector<unsigned char> blob;  // parameter bytes (kernel) or the node's struct
  std::vector<size_t> offsets;      // kernel parameter offsets in blob
  std::string name;                 // kernel name where the driver gives one
  KernelNodeParams kernel{};
  size_t extra_size = 0;            // > 0: parameters passed as one 'extra' buffer
};

template <typename T>
void Append(std::vector<unsigned char>* out, const T& v) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(&v);
  out->insert(out->end(), p, p + sizeof(T));
}

std::vector<CUgraphNode> Nodes(CUgraph graph) {
  size_t n = 0;
  HK_CHECK(g_cu.GraphGetNodes(graph, nullptr, &n));
  std::vector<CUgraphNode> nodes(n);
  if (n) HK_CHECK(g_cu.GraphGetNodes(graph, nodes.data(), &n));
  nodes.resize(n);
  return nodes;
}

// The parameter bytes of a kernel launched with a parameter list (Triton, torch): laid out
// at the offsets cuFuncGetParamInfo gives.
void ReadParamList(const KernelNodeParams& p, NodeView* v) {
  std::vector<std::pair<size_t, size_t>> layout;  // (offset, size) per parameter
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    CUresult r;
    if (p.func != nullptr) {
      r = g_cu.FuncGetParamInfo(p.func, i, &offset, &size);
    } else if (g_cu.KernelGetParamInfo != nullptr) {
      r = g_cu.KernelGetParamInfo(p.kern, i, &offset, &size);
    } else {
      throw Failure("a kernel node without a CUfunction and no cuKernelGetParamInfo");
    }
    if (r == kInvalidValue && i > 0) break;  // past the last parameter
    // A kernel whose parameters cannot be listed, or with none (no kernel of ours has
    // none): its addresses would go unseen, so the executable is not patchable.
    if (r != 0) throw Failure(Describe("cuFuncGetParamInfo", r) + " for parameter " +
                              std::to_string(i) + " of kernel " + v->name);
    layout.emplace_back(offset, size);
    if (i > 4096) throw Failure("a kernel with more than 4096 parameters");
  }
  size_t total = 0;
  for (auto& [offset, size] : layout) total = std::max(total, offset + size);
  v->blob.assign((total + 7) / 8 * 8, 0);
  for (size_t i = 0; i < layout.size(); ++i) {
    std::memcpy(v->blob.data() + layout[i].first, p.kernel_params[i], layout[i].second);
    v->offsets.push_back(layout[i].first);
    Append(&v->key, static_cast<uint64_t>(layout[i].first));
    Append(&v->key, static_cast<uint64_t>(layout[i].second));
  }
}

// The parameter buffer of a kernel launched with `extra` options (cuBLAS): pairs of
// CU_LAUNCH_PARAM_BUFFER_POINTER (1) / CU_LAUNCH_PARAM_BUFFER_SIZE (2), ended by 0.
void ReadExtra(const KernelNodeParams& p, NodeView* v) {
  const void* buffer = nullptr;
  size_t size = 0;
  bool sized = false;
  for (int i = 0; p.extra[i] != nullptr; i += 2) {
    uintptr_t option = reinterpret_cast<uintptr_t>(p.extra[i]);
    if (i > 16) throw Failure("a kernel node with too many 'extra' launch options");
    if (option == 1) {
      buffer = p.extra[i + 1];
    } else if (option == 2) {
      size = *static_cast<const size_t*>(p.extra[i + 1]);
      sized = true;
    } else {
      throw Failure("a kernel node with an unknown 'extra' launch option " + std::to_string(option));
    }
  }
  if (buffer == nullptr || !sized) throw Failure("a kernel node's 'extra' has no parameter buffer");
  v->extra_size = size;
  v->blob.assign((size + 7) / 8 * 8, 0);
  std::memcpy(v->blob.data(), buffer, size);
  Append(&v->key, static_cast<uint64_t>(0xE7E7E7E7));  // "extra", then its size
  Append(&v->key, static_cast<uint64_t>(size));
}

NodeView Read(CUgraphNode node) {
  NodeView v;
  HK_CHECK(g_cu.GraphNodeGetType(node, &v.type));
  if (v.type == kKernel) {
    KernelNodeParams p{};
    HK_CHECK(g_cu.GraphKernelNodeGetParams(node, &p));
    if (p.func != nullptr && g_cu.FuncGetName != nullptr) {
      const char* name = nullptr;
      if (g_cu.FuncGetName(&name, p.func) == 0 && name) v.name = name;
    }
    Append(&v.key, reinterpret_cast<uintptr_t>(p.func));
    Append(&v.key, reinterpret_cast<uintptr_t>(p.kern));
    for (unsigned g : p.grid) Append(&v.key, g);
    for (unsigned b : p.block) Append(&v.key, b);
    Append(&v.key, p.shared_mem_bytes);
    if (p.kernel_params != nullptr) {
      ReadParamList(p, &v);
    } else if (p.extra != nullptr) {
      ReadExtra(p, &v);
    } else {
      throw Failure("a kernel node with neither a parameter list nor 'extra'");
    }
    p.kernel_params = nullptr;  // owned by the node; the exec keeps its own copy
    p.extra = nullptr;
    v.kernel = p;
  } else if (v.type == kMemcpy) {
    v.blob.assign(kMemcpy3DSize, 0);
    HK_CHECK(g_cu.GraphMemcpyNodeGetParams(node, v.blob.data()));
  } else if (v.type == kMemset) {
    v.blob.assign(kMemsetSize, 0);
    HK_CHECK(g_cu.GraphMemsetNodeGetParams(node, v.blob.data()));
  }
  return v;
}

// --- copies and fills as kernels ------------------------------------------------------------
// cuGraphExecMemcpyNodeSetParams refused to re-point a captured memcpy node at XLA's buffers
// (CUDA_ERROR_INVALID_VALUE, benchmarks/NOTES.md issue 12 run 3), while kernel parameters are
// re-pointed freely. So a memcpy (device to device, 1-D) or memset node that touches an
// argument or result is replaced, in the captured graph and before the diff, by a kernel
// node with the same dependencies: hk_copy(dst, src, n) or hk_fill(dst, pitch, value,
// element size, width, height). Written in PTX (the driver compiles it for the device on
// first use: no CUDA toolkit is needed to build or run), checked with ptxas for sm_80/sm_90.
const char kCopyKernelsPtx[] = R"PTX(
.version 7.0
.target sm_80
.address_size 64

// dst[0:n] = src[0:n] (bytes): 16-byte moves where both addresses allow, then bytes.
.visible .entry hk_copy(.param .u64 p_dst, .param .u64 p_src, .param .u64 p_n)
{
  .reg .pred %p<4>;
  .reg .b16 %h<2>;
  .reg .b32 %r<9>;
  .reg .b64 %d<16>;
  ld.param.u64 %d1, [p_dst];
  ld.param.u64 %d2, [p_src];
  ld.param.u64 %d3, [p_n];
  cvta.to.global.u64 %d1, %d1;
  cvta.to.global.u64 %d2, %d2;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mov.u32 %r4, %nctaid.x;
  mul.wide.u32 %d4, %r1, %r2;
  cvt.u64.u32 %d5, %r3;
  add.u64 %d4, %d4, %d5;
  mul.wide.u32 %d6, %r4, %r2;
  mov.u64 %d12, 0;
  or.b64 %d7, %d1, %d2;
  and.b64 %d7, %d7, 15;
  setp.ne.u64 %p1, %d7, 0;
  @%p1 bra TAIL;
  shr.u64 %d8, %d3, 4;
  mov.u64 %d9, %d4;
WIDE:
  setp.ge.u64 %p2, %d9, %d8;
  @%p2 bra WIDE_DONE;
  shl.b64 %d10, %d9, 4;
  add.u64 %d11, %d2, %d10;
  ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%d11];
  add.u64 %d11, %d1, %d10;
  st.global.v4.u32 [%d11], {%r5, %r6, %r7, %r8};
  add.u64 %d9, %d9, %d6;
  bra WIDE;
WIDE_DONE:
  shl.b64 %d12, %d8, 4;
TAIL:
  add.u64 %d9, %d12, %d4;
BYTE:
  setp.ge.u64 %p3, %d9, %d3;
  @%p3 bra DONE;
  add.u64 %d11, %d2, %d9;
  ld.global.u8 %h1, [%d11];
  add.u64 %d11, %d1, %d9;
  st.global.u8 [%d11], %h1;
  add.u64 %d9, %d9, %d6;
  bra BYTE;
DONE:
  ret;
}

// cuMemsetD2D{8,16,32}: height rows of width elements of elem (1, 2 or 4) bytes, rows pitch
// bytes apart, each element set to value's low elem bytes.
.visible .entry hk_fill(.param .u64 p_dst, .param .u64 p_pitch, .param .u32 p_value,
                        .param .u32 p_elem, .param .u64 p_width, .param .u64 p_height)
{
  .reg .pred %p<4>;
  .reg .b16 %h<2>;
  .reg .b32 %r<8>;
  .reg .b64 %d<16>;
  ld.param.u64 %d1, [p_dst];
  ld.param.u64 %d2, [p_pitch];
  ld.param.u32 %r5, [p_value];
  ld.param.u32 %r6, [p_elem];
  ld.param.u64 %d3, [p_width];
  ld.param.u64 %d4, [p_height];
  cvta.to.global.u64 %d1, %d1;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mov.u32 %r4, %nctaid.x;
  mul.wide.u32 %d5, %r1, %r2;
  cvt.u64.u32 %d6, %r3;
  add.u64 %d5, %d5, %d6;
  mul.wide.u32 %d6, %r4, %r2;
  mul.lo.u64 %d7, %d3, %d4;
  cvt.u64.u32 %d8, %r6;
  cvt.u16.u32 %h1, %r5;
LOOP:
  setp.ge.u64 %p1, %d5, %d7;
  @%p1 bra DONE;
  div.u64 %d9, %d5, %d3;
  mul.lo.u64 %d10, %d9, %d3;
  sub.u64 %d10, %d5, %d10;
  mul.lo.u64 %d9, %d9, %d2;
  mul.lo.u64 %d10, %d10, %d8;
  add.u64 %d9, %d9, %d10;
  add.u64 %d9, %d1, %d9;
  setp.eq.u32 %p2, %r6, 4;
  @%p2 st.global.u32 [%d9], %r5;
  setp.eq.u32 %p3, %r6, 2;
  @%p3 st.global.u16 [%d9], %h1;
  setp.eq.u32 %p2, %r6, 1;
  @%p2 st.global.u8 [%d9], %h1;
  add.u64 %d5, %d5, %d6;
  bra LOOP;
DONE:
  ret;
}
)PTX";

struct CopyKernels {
  CUfunction copy = nullptr;
  CUfunction fill = nullptr;
};
std::mutex g_kernels_mu;
std::unordered_map<CUcontext, CopyKernels> g_kernels;  // per context: modules are per context

CopyKernels KernelsOfCurrentContext() {
  if (!g_cu.ModuleLoadData || !g_cu.ModuleGetFunction || !g_cu.GraphNodeGetDependencies ||
      !g_cu.GraphNodeGetDependentNodes || !g_cu.GraphAddDependencies ||
      !g_cu.GraphAddKernelNode || !g_cu.GraphDestroyNode) {
    throw Failure("the CUDA driver lacks the graph-editing calls (CUDA 12.3 or newer) needed "
                  "to replace copy nodes by kernels");
  }
  CUcontext ctx = nullptr;
  HK_CHECK(g_cu.CtxGetCurrent(&ctx));
  if (ctx == nullptr) throw Failure("no current CUDA context");
  std::lock_guard<std::mutex> lock(g_kernels_mu);
  auto it = g_kernels.find(ctx);
  if (it != g_kernels.end()) return it->second;
  CUmodule module = nullptr;
  HK_CHECK(g_cu.ModuleLoadData(&module, kCopyKernelsPtx));
  CopyKernels k;
  HK_CHECK(g_cu.ModuleGetFunction(&k.copy, module, "hk_copy"));
  HK_CHECK(g_cu.ModuleGetFunction(&k.fill, module, "hk_fill"));
  g_kernels.emplace(ctx, k);
  return k;
}

struct Range {
  uint64_t start, size;
};

bool Touches(const std::vector<Range>& ranges, uint64_t start, uint64_t size) {
  for (const Range& r : ranges) {
    if (start < r.start + r.size && r.start < start + size) return true;
  }
  return false;
}

std::vector<CUgraphNode> Neighbours(CUgraphNode node, bool dependencies) {
  auto query = dependencies ? g_cu.GraphNodeGetDependencies : g_cu.GraphNodeGetDependentNodes;
  size_t n = 0;
  HK_CHECK(query(node, nullptr, nullptr, &n));
  std::vector<CUgraphNode> out(n);
  if (n) HK_CHECK(query(node, out.data(), nullptr, &n));
  out.resize(n);
  return out;
}

// Replaces `node` by a kernel node (same dependencies and dependents).
void ReplaceByKernel(CUgraph graph, CUgraphNode node, CUfunction func, unsigned blocks,
                     void** params) {
  std::vector<CUgraphNode> deps = Neighbours(node, true);
  std::vector<CUgraphNode> dependents = Neighbours(node, false);
  KernelNodeParams p{};
  p.func = func;
  p.grid[0] = blocks;
  p.grid[1] = p.grid[2] = 1;
  p.block[0] = 256;
  p.block[1] = p.block[2] = 1;
  p.kernel_params = params;
  CUgraphNode kernel = nullptr;
  HK_CHECK(g_cu.GraphAddKernelNode(&kernel, graph, deps.data(), deps.size(), &p));
  if (!dependents.empty()) {
    std::vector<CUgraphNode> from(dependents.size(), kernel);
    HK_CHECK(g_cu.GraphAddDependencies(graph, from.data(), dependents.data(), nullptr,
                                       dependents.size()));
  }
  HK_CHECK(g_cu.GraphDestroyNode(node));
}

unsigned BlocksFor(uint64_t units) {  // 256 threads a block, grid-stride loops past 4096
  uint64_t blocks = (units + 255) / 256;
  return static_cast<unsigned>(std::min<uint64_t>(std::max<uint64_t>(blocks, 1), 4096));
}

// A memcpy operand's device address, or 0 where it is not plain device memory (host, an
// array, unified memory that is not on the device, a 2-D/3-D offset).
uint64_t DeviceOperand(int type, uint64_t device, uint64_t x, uint64_t y, uint64_t z) {
  if (y != 0 || z != 0) return 0;
  if (type == kMemoryUnified) {
    unsigned int kind = 0;
    if (!g_cu.PointerGetAttribute ||
        g_cu.PointerGetAttribute(&kind, kPointerMemoryType, device) != 0 ||
        kind != kMemoryDevice) {
      return 0;
    }
  } else if (type != kMemoryDevice) {
    return 0;
  }
  return device + x;
}

// Replaces every 1-D device-to-device memcpy node and every memset node of `graph` that
// touches one of `ranges` by a copy/fill kernel node; returns how many it replaced. A copy
// it cannot express stays as it is (the diff then says which node keeps the Python path).
int LowerCopies(CUgraph graph, const std::vector<Range>& ranges) {
  int replaced = 0;
  CopyKernels k;
  for (CUgraphNode node : Nodes(graph)) {
    int type = -1;
    HK_CHECK(g_cu.GraphNodeGetType(node, &type));
    if (type == kMemcpy) {
      Memcpy3D c{};
      HK_CHECK(g_cu.GraphMemcpyNodeGetParams(node, &c));
      if (c.height != 1 || c.depth != 1 || c.width == 0) continue;
      uint64_t src = DeviceOperand(c.src_type, c.src_device, c.src_x, c.src_y, c.src_z);
      uint64_t dst = DeviceOperand(c.dst_type, c.dst_device, c.dst_x, c.dst_y, c.dst_z);
      if (src == 0 || dst == 0) continue;
      if (!Touches(ranges, src, c.width) && !Touches(ranges, dst, c.width)) continue;
      if (k.copy == nullptr) k = KernelsOfCurrentContext();
      uint64_t n = c.width;
      void* params[] = {&dst, &src, &n};
      ReplaceByKernel(graph, node, k.copy, BlocksFor(n / 16 + 1), params);
      ++replaced;
    } else if (type == kMemset) {
      MemsetParams m{};
      HK_CHECK(g_cu.GraphMemsetNodeGetParams(node, &m));
      uint32_t elem = m.element_size;
      if ((elem != 1 && elem != 2 && elem != 4) || m.width == 0 || m.height == 0) continue;
      uint64_t pitch = m.height > 1 ? m.pitch : m.width * elem;
      uint64_t extent = (m.height - 1) * pitch + m.width * elem;
      if (!Touches(ranges, m.dst, extent)) continue;
      if (k.fill == nullptr) k = KernelsOfCurrentContext();
      uint64_t dst = m.dst, width = m.width, height = m.height;
      uint32_t value = m.value;
      void* params[] = {&dst, &pitch, &value, &elem, &width, &height};
      ReplaceByKernel(graph, node, k.fill, BlocksFor(width * height), params);
      ++replaced;
    }
  }
  return replaced;
}

// --- an executable: patch plan + (optionally) the instantiated graph -------------------------
struct Site {
  uint32_t offset;  // byte offset of the 8-byte word in the node's blob
  uint32_t buffer;  // which argument/result buffer
  int64_t delta;    // address = buffer address + delta
};

struct PatchNode {
  int type = kKernel;
  CUgraphNode node = nullptr;
  KernelNodeParams kernel{};
  std::vector<unsigned char> blob;
  std::vector<void*> param_ptrs;    // parameter list: pointers into blob
  size_t extra_size = 0;            // 'extra' launch: blob is the parameter buffer
  void* extra[5] = {};
  std::vector<Site> sites;
  uint64_t dirty_epoch = 0;
};

struct Stats {
  uint64_t calls = 0, nodes_patched = 0, address_changes = 0;
  uint64_t ns_gather = 0, ns_patch = 0, ns_launch = 0;
};

struct Exec {
  std::mutex mu;
  CUgraphExec exec = nullptr;  // execs[0]; null: a dry-run plan (tests), nothing is launched
  CUcontext ctx = nullptr;
  int device = -1;
  std::vector<PatchNode> nodes;
  std::vector<std::vector<uint32_t>> nodes_of_buffer;
  // Instantiations of the graph ("slots"), each with the address of every buffer its nodes
  // were last patched to (0: never). A call launches the slot whose addresses differ least
  // from the call's, so that calls alternating between a few address sets (results kept
  // until the next call returns, ping-pong training state) patch nothing: no
  // cuGraphExecKernelNodeSetParams and the cheaper launch of an unchanged graph.
  std::vector<CUgraphExec> execs;
  std::vector<std::vector<uint64_t>> lasts;
  std::vector<uint64_t> used;       // epoch of each slot's last call (0: never used)
  std::vector<uint64_t> addrs;      // this call's addresses
  size_t slot = 0;                  // the slot of the last call
  std::vector<int32_t> ret_buffer;  // result j -> buffer, or -1 (aliased to an argument)
  std::vector<int32_t> ret_of_buffer;  // buffer num_args + i -> its result
  int32_t num_args = 0;
  uint64_t epoch = 0;
  std::vector<uint32_t> dirty;
  Stats stats;
  // Trace (benchmarks/call_timeline.py): host times of the last call (CLOCK_MONOTONIC ns:
  // entry, after patching, after launching) and events recorded around its launch.
  bool trace = false;
  CUevent ev_before = nullptr, ev_after = nullptr;
  uint64_t trace_ns[3] = {0, 0, 0};

  ~Exec() {
    if (!g_loaded) return;
    if (g_cu.EventDestroy) {
      if (ev_before) g_cu.EventDestroy(ev_before);
      if (ev_after) g_cu.EventDestroy(ev_after);
    }
    if (exec != nullptr) {
      // Launches already queued may still read the parameters: wait for the device first.
      if (ctx != nullptr && g_cu.CtxPushCurrent(ctx) == 0) {
        g_cu.CtxSynchronize();
        CUcontext popped;
        g_cu.CtxPopCurrent(&popped);
      }
      for (CUgraphExec x : execs) g_cu.GraphExecDestroy(x);
    }
  }

  size_t num_buffers() const { return nodes_of_buffer.size(); }

  void Build(int n_buffers, const int32_t* ret_map, int32_t n_rets, int32_t n_args) {
    nodes_of_buffer.assign(n_buffers, {});
    for (uint32_t n = 0; n < nodes.size(); ++n) {
      for (const Site& s : nodes[n].sites) {
        if (s.buffer >= static_cast<uint32_t>(n_buffers)) throw Failure("a site names a buffer out of range");
        if (s.offset + 8 > nodes[n].blob.size()) throw Failure("a site lies outside its node's parameters");
        auto& list = nodes_of_buffer[s.buffer];
        if (list.empty() || list.back() != n) list.push_back(n);
      }
      PatchNode& pn = nodes[n];
      if (pn.type == kKernel && pn.extra_size > 0) {
        // One parameter buffer: this node's own copy, passed through 'extra'.
        pn.extra[0] = reinterpret_cast<void*>(1);
        pn.extra[1] = pn.blob.data();
        pn.extra[2] = reinterpret_cast<void*>(2);
        pn.extra[3] = &pn.extra_size;
        pn.extra[4] = nullptr;
        pn.kernel.kernel_params = nullptr;
        pn.kernel.extra = pn.extra;
      } else if (pn.type == kKernel) {
        // kernel_params point into this node's own copy of the parameter bytes.
        pn.kernel.kernel_params = pn.param_ptrs.data();
      }
    }
    execs.assign(1, exec);
    lasts.assign(1, std::vector<uint64_t>(n_buffers, 0));
    used.assign(1, 0);
    addrs.assign(n_buffers, 0);
    if (n_args < 0 || n_args > n_buffers) throw Failure("more arguments than buffers");
    num_args = n_args;
    ret_buffer.assign(ret_map, ret_map + n_rets);
    ret_of_buffer.assign(n_buffers - n_args, -1);
    for (int32_t j = 0; j < n_rets; ++j) {
      int32_t b = ret_buffer[j];
      if (b < 0) continue;  // aliased: the argument's buffer is the result's
      if (b < n_args || b >= n_buffers || ret_of_buffer[b - n_args] != -1) {
        throw Failure("result " + std::to_string(j) + " maps to buffer " + std::to_string(b) +
                      ", which is an argument, out of range or taken");
      }
      ret_of_buffer[b - n_args] = j;
    }
    for (int32_t r : ret_of_buffer) {
      if (r < 0) throw Failure("a result buffer no result maps to");
    }
    dirty.reserve(nodes.size());
  }

  // A further instantiation of `graph` (the one `exec` came from) as a new slot; a dry-run
  // plan gets a slot with nothing to launch (tests of the choice).
  void AddSlot(CUgraph graph) {
    CUgraphExec x = nullptr;
    if (exec != nullptr) HK_CHECK(g_cu.GraphInstantiateWithFlags(&x, graph, 0));
    execs.push_back(x);
    lasts.emplace_back(num_buffers(), 0);
    used.push_back(0);
  }

  // How many of this call's addresses differ from slot j's, counting no further than `cap`.
  size_t Diff(size_t j, size_t cap) const {
    const uint64_t* last = lasts[j].data();
    size_t d = 0;
    for (size_t k = 0; k < addrs.size() && d < cap; ++k) d += addrs[k] != last[k];
    return d;
  }

  // The slot for this call: the last one if nothing moved; else the one that differs least;
  // where every used slot differs, a never-used slot (patched in full once, then kept for
  // this address set) before overwriting a used one; ties go to the least recently used.
  size_t Choose() {
    size_t best = slot, best_diff = Diff(slot, SIZE_MAX);
    if (best_diff == 0 || execs.size() == 1) return best;
    for (size_t j = 0; j < execs.size(); ++j) {
      if (j == slot || used[j] == 0) continue;
      size_t d = Diff(j, best_diff + 1);
      if (d < best_diff || (d == best_diff && used[j] < used[best])) {
        best = j;
        best_diff = d;
      }
    }
    if (best_diff == 0) return best;
    for (size_t j = 0; j < execs.size(); ++j) {
      if (used[j] == 0) return j;
    }
    return best;
  }

  // Patches the nodes whose buffers moved and launches. `addr(k)` is buffer k's address.
  template <typename AddressOf>
  void Run(AddressOf addr, CUstream stream) {
    auto t0 = std::chrono::steady_clock::now();
    ++epoch;
    dirty.clear();
    size_t n_buffers = num_buffers();
    // Every address is checked before any slot records it: a refused call leaves no slot
    // believing its nodes hold addresses they were never patched to.
    for (size_t k = 0; k < n_buffers; ++k) {
      uint64_t a = addr(k);
      if (a % kAlignment != 0) {
        char msg[200];
        std::snprintf(msg, sizeof msg, "buffer %zu's device address 0x%llx is not %d-byte "
                      "aligned (the captured kernels assume it; launcher.ALIGNMENT)", k,
                      (unsigned long long)a, kAlignment);
        throw Failure(msg);
      }
      addrs[k] = a;
    }
    slot = Choose();
    used[slot] = epoch;
    std::vector<uint64_t>& last = lasts[slot];
    CUgraphExec x = execs[slot];
    if (x == nullptr && exec != nullptr) {
      // Never launch nothing in silence: the results would be whatever XLA allocated.
      throw Failure("slot " + std::to_string(slot) + " has no instantiated graph");
    }
    for (size_t k = 0; k < n_buffers; ++k) {
      uint64_t a = addrs[k];
      if (a == last[k]) continue;
      last[k] = a;
      ++stats.address_changes;
      for (uint32_t n : nodes_of_buffer[k]) {
        if (nodes[n].dirty_epoch != epoch) {
          nodes[n].dirty_epoch = epoch;
          dirty.push_back(n);
        }
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    try {
      for (uint32_t n : dirty) {
        PatchNode& pn = nodes[n];
        // Every site of the node from this slot's addresses (the blob may hold another
        // slot's), then the whole parameter set into this slot's instantiation.
        for (const Site& s : pn.sites) {
          uint64_t v = last[s.buffer] + static_cast<uint64_t>(s.delta);
          std::memcpy(pn.blob.data() + s.offset, &v, 8);
        }
        if (x != nullptr) HK_CHECK(g_cu.GraphExecKernelNodeSetParams(x, pn.node, &pn.kernel));
      }
    } catch (const Failure&) {
      std::fill(last.begin(), last.end(), 0);  // unknown state: patch everything next time
      throw;
    }
    stats.nodes_patched += dirty.size();
    auto t2 = std::chrono::steady_clock::now();
    if (x != nullptr) {
      if (trace) HK_CHECK(g_cu.EventRecord(ev_before, stream));
      HK_CHECK(g_cu.GraphLaunch(x, stream));
      if (trace) HK_CHECK(g_cu.EventRecord(ev_after, stream));
    }
    auto t3 = std::chrono::steady_clock::now();
    ++stats.calls;
    using ns = std::chrono::nanoseconds;
    stats.ns_gather += std::chrono::duration_cast<ns>(t1 - t0).count();
    stats.ns_patch += std::chrono::duration_cast<ns>(t2 - t1).count();
    stats.ns_launch += std::chrono::duration_cast<ns>(t3 - t2).count();
    if (trace) {
      // steady_clock is CLOCK_MONOTONIC on Linux, as Python's time.perf_counter_ns().
      trace_ns[0] = std::chrono::duration_cast<ns>(t0.time_since_epoch()).count();
      trace_ns[1] = std::chrono::duration_cast<ns>(t2.time_since_epoch()).count();
      trace_ns[2] = std::chrono::duration_cast<ns>(t3.time_since_epoch()).count();
    }
  }
};

std::mutex g_registry_mu;
std::unordered_map<int64_t, std::shared_ptr<Exec>> g_registry;
int64_t g_next_id = 1;  // never reused: a stale id in a cached XLA executable finds nothing

std::shared_ptr<Exec> Lookup(int64_t id) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = g_registry.find(id);
  return it == g_registry.end() ? nullptr : it->second;
}

int Fail(char* err, size_t cap, const std::string& message) {
  if (err != nullptr && cap > 0) std::snprintf(err, cap, "%s", message.c_str());
  return -1;
}

void AddSites(Exec* e, int32_t n_sites, const int32_t* site_node, const int64_t* site_offset,
              const int32_t* site_buffer, const int64_t* site_delta) {
  for (int32_t i = 0; i < n_sites; ++i) {
    if (site_node[i] < 0 || static_cast<size_t>(site_node[i]) >= e->nodes.size()) {
      throw Failure("a patch site names a node out of range");
    }
    if (site_offset[i] < 0 || site_offset[i] % 8 != 0 || site_buffer[i] < 0) {
      throw Failure("a patch site with a bad offset or buffer");
    }
    e->nodes[site_node[i]].sites.push_back(
        Site{static_cast<uint32_t>(site_offset[i]), static_cast<uint32_t>(site_buffer[i]),
             site_delta[i]});
  }
}

int64_t Register(std::shared_ptr<Exec> e) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  int64_t id = g_next_id++;
  g_registry.emplace(id, std::move(e));
  return id;
}

// --- the FFI handler ------------------------------------------------------------------
// A view of the call's remaining arguments/results with raw access to their buffers (the
// base classes keep the frame's arrays protected).
struct ArgsView : xla::ffi::RemainingArgs {
  explicit ArgsView(const xla::ffi::RemainingArgs& r) : xla::ffi::RemainingArgs(r) {}
  uint64_t address(size_t i) const {
    const XLA_FFI_Args* a = args();
    size_t idx = offset() + i;
    if (a->types[idx] != XLA_FFI_ArgType_BUFFER) return 1;  // odd: fails the alignment check
    return reinterpret_cast<uint64_t>(static_cast<XLA_FFI_Buffer*>(a->args[idx])->data);
  }
};

struct RetsView : xla::ffi::RemainingRets {
  explicit RetsView(const xla::ffi::RemainingRets& r) : xla::ffi::RemainingRets(r) {}
  uint64_t address(size_t i) const {
    const XLA_FFI_Rets* r = rets();
    size_t idx = offset() + i;
    if (r->types[idx] != XLA_FFI_RetType_BUFFER) return 1;
    return reinterpret_cast<uint64_t>(static_cast<XLA_FFI_Buffer*>(r->rets[idx])->data);
  }
};

xla::ffi::Error RunFromFfi(void* stream, int32_t device, int64_t id,
                           xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets,
                           bool dry_run) {
  std::shared_ptr<Exec> e = Lookup(id);
  if (e == nullptr) {
    return xla::ffi::Error::Internal("hlotk native graph: executable " + std::to_string(id) +
                                     " is gone (its Python object was freed)");
  }
  std::lock_guard<std::mutex> lock(e->mu);
  if (static_cast<int64_t>(args.size()) != e->num_args ||
      rets.size() != e->ret_buffer.size()) {
    return xla::ffi::Error::InvalidArgument(
        "hlotk native graph: called with " + std::to_string(args.size()) + " operands and " +
        std::to_string(rets.size()) + " results; compiled for " + std::to_string(e->num_args) +
        " and " + std::to_string(e->ret_buffer.size()));
  }
  if (!dry_run && device != e->device) {
    return xla::ffi::Error::InvalidArgument(
        "hlotk native graph: the executable was built for CUDA device " +
        std::to_string(e->device) + ", XLA runs this call on device " + std::to_string(device));
  }
  ArgsView a(args);
  RetsView r(rets);
  // Buffers: the arguments in order, then the results that are not an argument's alias.
  size_t n_args = static_cast<size_t>(e->num_args);
  const int32_t* ret_of = e->ret_of_buffer.data();
  auto address = [&](size_t k) -> uint64_t {
    return k < n_args ? a.address(k) : r.address(ret_of[k - n_args]);
  };
  try {
    e->Run(address, static_cast<CUstream>(stream));
  } catch (const Failure& f) {
    return xla::ffi::Error::Internal("hlotk native graph: " + f.message);
  }
  return xla::ffi::Error::Success();
}

xla::ffi::Error LaunchImpl(void* stream, int32_t device, int64_t id,
                           xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets) {
  return RunFromFfi(stream, device, id, args, rets, false);
}

xla::ffi::Error DryRunImpl(int64_t id, xla::ffi::RemainingArgs args,
                           xla::ffi::RemainingRets rets) {
  return RunFromFfi(nullptr, -1, id, args, rets, true);
}

}  // namespace hk

HK_EXPORT XLA_FFI_Error* hk_ffi_graph_launch(XLA_FFI_CallFrame* call_frame);
HK_EXPORT XLA_FFI_Error* hk_ffi_dry_run(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hk_ffi_graph_launch, hk::LaunchImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<void*>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Attr<int64_t>("exe")
                                  .RemainingArgs()
                                  .RemainingRets());

// The same argument mapping and patching without CUDA (tests on a machine without a GPU).
XLA_FFI_DEFINE_HANDLER_SYMBOL(hk_ffi_dry_run, hk::DryRunImpl,
                              xla::ffi::Ffi::Bind()
                                  .Attr<int64_t>("exe")
                                  .RemainingArgs()
                                  .RemainingRets());

// --- the C interface (ctypes) -------------------------------------------------------------
HK_EXPORT int hk_version() { return 1; }

HK_EXPORT int hk_init(char* err, size_t cap) {
  std::string error;
  if (!hk::LoadDriver(&error)) return hk::Fail(err, cap, error);
  return 0;
}

// Every node of a captured graph (a cudaGraph_t / CUgraph address), serialized: per node
// int32 type, uint32 key length, uint32 blob length, uint32 name length, then the key (what
// must match between two captures), the blob (the bytes to diff) and the kernel's name.
// `len`: capacity in, size out; returns 1 (nothing written) when the capacity is too small.
HK_EXPORT int hk_graph_describe(uint64_t graph, uint8_t* out, uint64_t* len, char* err,
                                size_t cap) {
  try {
    std::vector<unsigned char> bytes;
    for (hk::CUgraphNode node : hk::Nodes(reinterpret_cast<hk::CUgraph>(graph))) {
      hk::NodeView v = hk::Read(node);
      hk::Append(&bytes, static_cast<int32_t>(v.type));
      hk::Append(&bytes, static_cast<uint32_t>(v.key.size()));
      hk::Append(&bytes, static_cast<uint32_t>(v.blob.size()));
      hk::Append(&bytes, static_cast<uint32_t>(v.name.size()));
      bytes.insert(bytes.end(), v.key.begin(), v.key.end());
      bytes.insert(bytes.end(), v.blob.begin(), v.blob.end());
      bytes.insert(bytes.end(), v.name.begin(), v.name.end());
    }
    bool fits = bytes.size() <= *len;
    if (fits && !bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
    *len = bytes.size();
    return fits ? 0 : 1;
  } catch (const hk::Failure& f) {
    return hk::Fail(err, cap, f.message);
  }
}

// Replaces the memcpy/memset nodes of a captured graph that touch one of the `n` byte ranges
// (starts[i], sizes[i]) by copy/fill kernel nodes (LowerCopies); returns how many, or -1.
HK_EXPORT int hk_graph_lower_copies(uint64_t graph, int32_t n, const uint64_t* starts,
                                    const uint64_t* sizes, char* err, size_t cap) {
  try {
    std::vector<hk::Range> ranges;
    for (int32_t i = 0; i < n; ++i) ranges.push_back(hk::Range{starts[i], sizes[i]});
    return hk::LowerCopies(reinterpret_cast<hk::CUgraph>(graph), ranges);
  } catch (const hk::Failure& f) {
    return hk::Fail(err, cap, f.message);
  }
}

// For each of `n` words: the start of the memory range the CUDA driver manages around it
// (a cuMemAlloc'd block: device, pinned or managed memory), or 0 where it manages none there
// (CUDA_ERROR_INVALID_VALUE: a host heap pointer, a number). Returns -1 where it cannot tell
// (no such driver call, no current context, another error).
HK_EXPORT int hk_cuda_allocations(const uint64_t* words, int32_t n, uint64_t* out) {
  if (!hk::g_cu.PointerGetAttribute) return -1;
  for (int32_t i = 0; i < n; ++i) {
    hk::CUdeviceptr start = 0;
    hk::CUresult r = hk::g_cu.PointerGetAttribute(&start, hk::kPointerRangeStart, words[i]);
    if (r != 0 && r != hk::kInvalidValue) return -1;
    out[i] = r == 0 ? start : 0;
  }
  return 0;
}

// Instantiates `graph` and attaches the patch sites; returns an id (> 0) or -1.
HK_EXPORT int64_t hk_exec_create(uint64_t graph, int32_t device, int32_t n_buffers,
                                 int32_t n_args, int32_t n_rets, const int32_t* ret_buffer,
                                 int32_t n_sites, const int32_t* site_node,
                                 const int64_t* site_offset, const int32_t* site_buffer,
                                 const int64_t* site_delta, char* err, size_t cap) {
  try {
    auto e = std::make_shared<hk::Exec>();
    e->device = device;
    HK_CHECK(hk::g_cu.CtxGetCurrent(&e->ctx));
    if (e->ctx == nullptr) throw hk::Failure("no current CUDA context");
    auto nodes = hk::Nodes(reinterpret_cast<hk::CUgraph>(graph));
    e->nodes.resize(nodes.size());
    for (size_t n = 0; n < nodes.size(); ++n) {
      hk::PatchNode& pn = e->nodes[n];
      pn.node = nodes[n];
      HK_CHECK(hk::g_cu.GraphNodeGetType(nodes[n], &pn.type));
    }
    hk::AddSites(e.get(), n_sites, site_node, site_offset, site_buffer, site_delta);
    for (size_t n = 0; n < nodes.size(); ++n) {
      hk::PatchNode& pn = e->nodes[n];
      if (pn.sites.empty()) continue;
      hk::NodeView v = hk::Read(nodes[n]);
      pn.blob = std::move(v.blob);
      // Only kernel nodes are re-pointed: the driver refused to re-point a memcpy node at
      // XLA's buffers (cuGraphExecMemcpyNodeSetParams: CUDA_ERROR_INVALID_VALUE), patch.py.
      if (pn.type != hk::kKernel) throw hk::Failure("patch sites on a node that is not a kernel");
      pn.kernel = v.kernel;
      pn.extra_size = v.extra_size;
      for (size_t off : v.offsets) pn.param_ptrs.push_back(pn.blob.data() + off);
    }
    e->Build(n_buffers, ret_buffer, n_rets, n_args);
    HK_CHECK(hk::g_cu.GraphInstantiateWithFlags(&e->exec, reinterpret_cast<hk::CUgraph>(graph), 0));
    e->execs[0] = e->exec;  // slot 0 (Build made the slots before the instantiation existed)
    return hk::Register(std::move(e));
  } catch (const hk::Failure& f) {
    return hk::Fail(err, cap, f.message);
  }
}

// A plan without a graph: nodes given as blobs (tests of the patching on any machine).
HK_EXPORT int64_t hk_exec_create_dry(int32_t n_nodes, const int32_t* types,
                                     const uint8_t* const* blobs, const uint64_t* blob_lens,
                                     int32_t n_buffers, int32_t n_args, int32_t n_rets,
                                     const int32_t* ret_buffer, int32_t n_sites,
                                     const int32_t* site_node, const int64_t* site_offset,
                                     const int32_t* site_buffer, const int64_t* site_delta,
                                     char* err, size_t cap) {
  try {
    auto e = std::make_shared<hk::Exec>();
    e->nodes.resize(n_nodes);
    for (int32_t n = 0; n < n_nodes; ++n) {
      e->nodes[n].type = types[n];
      e->nodes[n].blob.assign(blobs[n], blobs[n] + blob_lens[n]);
    }
    hk::AddSites(e.get(), n_sites, site_node, site_offset, site_buffer, site_delta);
    e->Build(n_buffers, ret_buffer, n_rets, n_args);
    return hk::Register(std::move(e));
  } catch (const hk::Failure& f) {
    return hk::Fail(err, cap, f.message);
  }
}

// Patch and launch with addresses given by the caller, on `stream` (0: the legacy stream).
HK_EXPORT int hk_exec_launch(int64_t id, const uint64_t* addrs, int32_t n, uint64_t stream,
                             char* err, size_t cap) {
  auto e = hk::Lookup(id);
  if (e == nullptr) return hk::Fail(err, cap, "no such executable");
  std::lock_guard<std::mutex> lock(e->mu);
  if (static_cast<size_t>(n) != e->num_buffers()) {
    return hk::Fail(err, cap, "expected " + std::to_string(e->num_buffers()) + " addresses");
  }
  try {
    e->Run([&](size_t k) { return addrs[k]; }, reinterpret_cast<hk::CUstream>(stream));
    return 0;
  } catch (const hk::Failure& f) {
    return hk::Fail(err, cap, f.message);
  }
}

// Adds `extra` instantiations of `graph` (the graph executable `id` was created from; unused
// for a dry-run plan) as further slots (Exec::Choose); returns how many slots it has, or -1
// (message in err).
HK_EXPORT int hk_exec_add_slots(int64_t id, uint64_t graph, int32_t extra, char* err, size_t cap) {
  auto e = hk::Lookup(id);
  if (e == nullptr) return hk::Fail(err, cap, "no such executable");
  std::lock_guard<std::mutex> lock(e->mu);
  try {
    for (int32_t i = 0; i < extra; ++i) e->AddSlot(reinterpret_cast<hk::CUgraph>(graph));
    return static_cast<int>(e->execs.size());
  } catch (const hk::Failure& f) {
    return hk::Fail(err, cap, f.message);
  }
}

// --- tracing one call (benchmarks/call_timeline.py) ----------------------------------------
hk::CUevent g_trace_base = nullptr;

// Records the base event on `stream` (a raw CUstream; 0: the legacy stream); later trace
// reads give the handler's launch events relative to it. Returns 0 or -1.
HK_EXPORT int hk_trace_base(uint64_t stream) {
  if (!hk::g_cu.EventCreate || !hk::g_cu.EventRecord || !hk::g_cu.EventElapsedTime) return -1;
  if (g_trace_base == nullptr && hk::g_cu.EventCreate(&g_trace_base, 0) != 0) return -1;
  return hk::g_cu.EventRecord(g_trace_base, reinterpret_cast<hk::CUstream>(stream)) == 0 ? 0 : -1;
}

// Turns the trace of executable `id` on (events around each launch, host times) or off.
HK_EXPORT int hk_exec_trace(int64_t id, int on) {
  auto e = hk::Lookup(id);
  if (e == nullptr || !hk::g_cu.EventCreate || !hk::g_cu.EventRecord) return -1;
  std::lock_guard<std::mutex> lock(e->mu);
  if (on && e->ev_before == nullptr) {
    if (hk::g_cu.EventCreate(&e->ev_before, 0) != 0 || hk::g_cu.EventCreate(&e->ev_after, 0) != 0) {
      return -1;
    }
  }
  e->trace = on != 0 && e->exec != nullptr;
  return 0;
}

// The last traced call: host_ns = {entry, patched, launched} (CLOCK_MONOTONIC), ms = {base
// event -> before the launch, before -> after the launch (the device time of the launch),
// base -> after}. Waits for the launch to finish. Returns 0 or -1.
HK_EXPORT int hk_exec_trace_read(int64_t id, uint64_t* host_ns, float* ms) {
  auto e = hk::Lookup(id);
  if (e == nullptr || !e->trace || g_trace_base == nullptr || !hk::g_cu.EventSynchronize) return -1;
  std::lock_guard<std::mutex> lock(e->mu);
  if (hk::g_cu.EventSynchronize(e->ev_after) != 0) return -1;
  for (int i = 0; i < 3; ++i) host_ns[i] = e->trace_ns[i];
  if (hk::g_cu.EventElapsedTime(&ms[0], g_trace_base, e->ev_before) != 0 ||
      hk::g_cu.EventElapsedTime(&ms[1], e->ev_before, e->ev_after) != 0 ||
      hk::g_cu.EventElapsedTime(&ms[2], g_trace_base, e->ev_after) != 0) {
    return -1;
  }
  return 0;
}

// The current bytes of node `node` (after the last patch); size in/out as hk_graph_node.
HK_EXPORT int hk_exec_blob(int64_t id, int32_t node, uint8_t* out, uint64_t* len) {
  auto e = hk::Lookup(id);
  if (e == nullptr || node < 0 || static_cast<size_t>(node) >= e->nodes.size()) return -1;
  std::lock_guard<std::mutex> lock(e->mu);
  const auto& blob = e->nodes[node].blob;
  bool fits = blob.size() <= *len;
  if (fits && !blob.empty()) std::memcpy(out, blob.data(), blob.size());
  *len = blob.size();
  return fits ? 0 : 1;
}

// calls, nodes patched, address changes, ns gathering, ns patching, ns launching.
HK_EXPORT int hk_exec_stats(int64_t id, uint64_t* out) {
  auto e = hk::Lookup(id);
  if (e == nullptr) return -1;
  std::lock_guard<std::mutex> lock(e->mu);
  const hk::Stats& s = e->stats;
  uint64_t values[] = {s.calls, s.nodes_patched, s.address_changes,
                       s.ns_gather, s.ns_patch, s.ns_launch};
  std::memcpy(out, values, sizeof values);
  return 0;
}

HK_EXPORT void hk_exec_destroy(int64_t id) {
  std::shared_ptr<hk::Exec> e;
  {
    std::lock_guard<std::mutex> lock(hk::g_registry_mu);
    auto it = hk::g_registry.find(id);
    if (it == hk::g_registry.end()) return;
    e = std::move(it->second);
    hk::g_registry.erase(it);
  }
  // Destroyed here (after any running call released its reference).
}
