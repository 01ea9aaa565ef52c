// epic's compiled call path (epic/runtime/fastcall.py builds it once per torch and compiler).
//
// A call of a compiled program is one Python -> C++ transition: find the bound plan whose input
// signature (dtype, device, sizes, strides) the tensors match and whose pointers are 16-byte aligned,
// allocate the plan's buffers with ATen (the program's outputs one each; everything else -- tmp
// tensors, per-tile partials, combine results, gemm workspaces -- at their offsets in one arena),
// and call each kernel library's epic_launch through the function pointer the runtime registered.
// A plan is an Executable's table (epic/runtime/executable.py), handed over by fastcall.register:
// its slots, offsets and arena size are decided in Python, the same for the ctypes path; nothing
// here lays out memory of its own. Anything that does not match returns "no plan", and the Python
// path validates (and reports) as before: this file never decides that a call is wrong.
// Not a Jinja template: nothing in it depends on the program.
//
// Two entries: run() takes the table's input tensors (the program's, then any derived tensors that
// Python's host step computed) and the scalars in the program's order, and call() takes the caller's
// keyword dict as it is and returns the outputs' dict, so that a call does no Python work per
// argument (CompiledProgram.__call__ hands its **kwargs straight here; not for derived tensors).
#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

// The C ABI of every generated kernel library (templates/*.cu.j2).
using LaunchFn = int (*)(void**, const long long*, const float*, void*, void*, size_t);

struct Launch {
  LaunchFn fn;                        // null for a vendor gemm
  bool vendor = false;                // the vendor's gemm (epic/runtime/vendor_gemm.py): slots A, B, [C,] D,
  bool a_t = false, b_t = false;      // run with ATen's mm / addmm on torch's current stream
  std::vector<int64_t> slots;         // per pointer: index into the call's tensor table, -1 = none
  std::vector<long long> dims;
  std::vector<float> scalars;         // the fixed values; runtime scalars are written per call
  std::vector<std::pair<int64_t, int64_t>> runtime_scalars;   // (position, index of the call's scalar)
  int64_t workspace;
  int64_t workspace_offset = -1;      // its place in the call's arena (when workspace > 0)
};

struct Input {
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
};

struct Buffer {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  int64_t offset = -1;                // its place in the call's arena (freed, stream-ordered, when the call
                                      // returns, unless keep=True hands out views); -1: its own allocation

  int64_t nbytes() const {
    int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A buffer on a CUDA device straight from torch's caching allocator (what at::empty does for CUDA,
// without the dispatcher's round trip, about a microsecond on a slow host); elsewhere at::empty.
at::Tensor allocate(const Buffer& b, const c10::Device& device) {
  if (device.is_cuda()) {
    static c10::Allocator* cuda = c10::GetAllocator(c10::DeviceType::CUDA);   // registered by c10_cuda
    const c10::DeviceGuard guard(device);
    return at::detail::empty_generic(b.shape, cuda, c10::DispatchKeySet(c10::DispatchKey::CUDA), b.dtype,
                                     std::nullopt);
  }
  return at::empty(b.shape, at::TensorOptions().dtype(b.dtype).device(device));
}

// The raw stream the call's kernels go to: the current stream of the plan's device, as
// torch.cuda.current_stream(device).cuda_stream gives it; 0 for host plans (the tests' simulator).
int64_t current_stream(const c10::Device& device) {
  if (!device.is_cuda()) return 0;
  const c10::impl::VirtualGuardImpl impl(device.type());
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(impl.getStream(device).native_handle()));
}

struct Plan {
  c10::Device device{c10::kCPU};
  std::vector<Input> inputs;
  std::vector<Buffer> buffers;
  std::vector<Launch> launches;
  std::vector<int64_t> outputs, keep;  // indices into the table (inputs, derived tensors included, then buffers)
  std::vector<pybind11::object> output_keys, keep_keys;   // their names, for call()'s dict (label())
  int64_t arena = 0;                  // bytes of the call's one allocation for everything but outputs
  bool has_arena = false;             // something lies in it (a buffer or a workspace)

  // An offset the Python side gave: -1 (not in the arena) or a 16-byte aligned place inside it.
  bool placed(int64_t offset, int64_t bytes) {
    if (offset == -1) return false;
    TORCH_CHECK(offset >= 0 && offset % 16 == 0 && bytes >= 0 && offset + bytes <= arena,
                "an arena offset outside the arena or misaligned");
    has_arena = true;
    return true;
  }

  bool matches(const std::vector<at::Tensor>& t) const {
    if (t.size() != inputs.size()) return false;
    for (size_t i = 0; i < t.size(); ++i) {
      const at::Tensor& x = t[i];
      const Input& e = inputs[i];
      if (!x.defined() || x.scalar_type() != e.dtype || x.device() != device) return false;
      // sizes(), strides() and data_ptr() throw for these: sparse, nested, and storage-less (vmap's
      // batched, functorch's wrapped) tensors go to the Python path, which refuses them clearly
      if (x.is_nested() || x.layout() != at::kStrided || !x.has_storage()) return false;
      if (x.sizes() != at::IntArrayRef(e.sizes) || x.strides() != at::IntArrayRef(e.strides)) return false;
      if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) return false;
    }
    return true;
  }
};

// One call's tensors: the inputs, then the plan's buffers (undefined where a buffer lives in the
// arena), every entry's device pointer, and the arena.
struct Table {
  std::vector<at::Tensor> tensors;
  std::vector<void*> ptrs;
  at::Tensor arena;

  // Entry i as a tensor: an arena buffer becomes a view of the arena (keep=True only).
  at::Tensor tensor(const Plan& p, int64_t i) const {
    if (tensors[i].defined()) return tensors[i];
    const Buffer& b = p.buffers[i - static_cast<int64_t>(p.inputs.size())];
    return arena.narrow(0, b.offset, b.nbytes()).view(b.dtype).view(b.shape);
  }
};

class Launcher {
 public:
  // One plan per bound signature; the newest is tried first, and at most `kMaxPlans` are kept.
  int64_t add(int64_t device_type, int64_t device_index,
              const std::vector<at::Tensor>& input_dtypes, const std::vector<std::vector<int64_t>>& input_sizes,
              const std::vector<std::vector<int64_t>>& input_strides,
              const std::vector<at::Tensor>& buffer_dtypes, const std::vector<std::vector<int64_t>>& buffer_shapes,
              const std::vector<int64_t>& buffer_offsets, const std::vector<int64_t>& fns,
              const std::vector<std::vector<int64_t>>& slots, const std::vector<std::vector<int64_t>>& dims,
              const std::vector<std::vector<double>>& scalars, const std::vector<std::vector<int64_t>>& runtime_scalars,
              const std::vector<int64_t>& workspaces, const std::vector<int64_t>& workspace_offsets, int64_t arena,
              const std::vector<int64_t>& outputs, const std::vector<int64_t>& keep,
              const std::vector<std::vector<int64_t>>& vendor) {
    Plan p;
    p.device = c10::Device(static_cast<c10::DeviceType>(device_type), static_cast<c10::DeviceIndex>(device_index));
    TORCH_CHECK(input_dtypes.size() == input_sizes.size() && input_sizes.size() == input_strides.size());
    for (size_t i = 0; i < input_dtypes.size(); ++i)
      p.inputs.push_back({input_dtypes[i].scalar_type(), input_sizes[i], input_strides[i]});
    TORCH_CHECK(buffer_dtypes.size() == buffer_shapes.size() && buffer_shapes.size() == buffer_offsets.size());
    TORCH_CHECK(arena >= 0, "an arena of negative size");
    p.arena = arena;
    for (size_t i = 0; i < buffer_dtypes.size(); ++i) {
      p.buffers.push_back({buffer_dtypes[i].scalar_type(), buffer_shapes[i]});
      Buffer& b = p.buffers.back();
      TORCH_CHECK(b.nbytes() >= 0, "a buffer of negative size");
      if (p.placed(buffer_offsets[i], b.nbytes())) b.offset = buffer_offsets[i];
    }
    const int64_t table = static_cast<int64_t>(p.inputs.size() + p.buffers.size());
    TORCH_CHECK(fns.size() == slots.size() && slots.size() == dims.size() && dims.size() == scalars.size() &&
                scalars.size() == runtime_scalars.size() && runtime_scalars.size() == workspaces.size() &&
                workspaces.size() == workspace_offsets.size() && workspace_offsets.size() == vendor.size());
    for (size_t k = 0; k < fns.size(); ++k) {
      Launch l;
      l.fn = reinterpret_cast<LaunchFn>(static_cast<uintptr_t>(fns[k]));
      if (!vendor[k].empty()) {
        TORCH_CHECK(vendor[k].size() == 2 && l.fn == nullptr && (slots[k].size() == 3 || slots[k].size() == 4),
                    "a vendor gemm: two transposes, no launch function, slots A, B, [C,] D");
        for (int64_t s : slots[k]) TORCH_CHECK(s >= 0, "a vendor gemm's slot is empty");
        l.vendor = true;
        l.a_t = vendor[k][0] != 0;
        l.b_t = vendor[k][1] != 0;
      }
      TORCH_CHECK(l.fn != nullptr || l.vendor, "a null launch function");
      for (int64_t s : slots[k]) TORCH_CHECK(s >= -1 && s < table, "a pointer slot outside the table");
      l.slots = slots[k];
      l.dims.assign(dims[k].begin(), dims[k].end());
      for (double v : scalars[k]) l.scalars.push_back(static_cast<float>(v));
      TORCH_CHECK(runtime_scalars[k].size() % 2 == 0);
      for (size_t j = 0; j < runtime_scalars[k].size(); j += 2) {
        TORCH_CHECK(runtime_scalars[k][j] >= 0 && runtime_scalars[k][j] < static_cast<int64_t>(l.scalars.size()));
        l.runtime_scalars.emplace_back(runtime_scalars[k][j], runtime_scalars[k][j + 1]);
      }
      TORCH_CHECK(workspaces[k] >= 0);
      l.workspace = workspaces[k];
      if (l.workspace > 0) {
        TORCH_CHECK(p.placed(workspace_offsets[k], l.workspace), "a workspace outside the arena");
        l.workspace_offset = workspace_offsets[k];
      }
      p.launches.push_back(std::move(l));
    }
    for (int64_t i : outputs) TORCH_CHECK(i >= 0 && i < table);
    for (int64_t i : keep) TORCH_CHECK(i >= 0 && i < table);
    p.outputs = outputs;
    p.keep = keep;
    plans_.insert(plans_.begin(), std::move(p));
    ids_.insert(ids_.begin(), next_id_);
    if (plans_.size() > kMaxPlans) {
      plans_.pop_back();
      ids_.pop_back();
    }
    return next_id_++;
  }

  // (plan id or -1 when no plan matches, index of the launch that failed or -1, its status, tensors)
  std::tuple<int64_t, int64_t, int64_t, std::vector<at::Tensor>> run(
      const std::vector<at::Tensor>& tensors, const std::vector<double>& call_scalars, int64_t stream, bool keep) {
    const int64_t pi = find(tensors);
    if (pi < 0) return {-1, -1, 0, {}};
    const Plan& p = plans_[pi];
    Table table;
    const auto [failed, rc] = execute(p, tensors, call_scalars, stream, table);
    if (failed >= 0) return {ids_[pi], failed, rc, {}};
    std::vector<at::Tensor> out;
    for (int64_t i : keep ? p.keep : p.outputs) out.push_back(table.tensor(p, i));
    return {ids_[pi], -1, 0, std::move(out)};
  }

  // The program's argument names, in run()'s order, and each scalar's default (nan: none).
  void names(const std::vector<std::string>& tensors, const std::vector<std::string>& scalars,
             const std::vector<double>& defaults) {
    TORCH_CHECK(scalars.size() == defaults.size());
    tensor_keys_.clear();
    scalar_keys_.clear();
    for (const auto& n : tensors) tensor_keys_.push_back(interned(n));
    for (const auto& n : scalars) scalar_keys_.push_back(interned(n));
    scalar_defaults_ = defaults;
  }

  // The names of a plan's outputs and of its keep=True tensors, in its outputs/keep order.
  void label(int64_t id, const std::vector<std::string>& outputs, const std::vector<std::string>& keep) {
    for (size_t pi = 0; pi < plans_.size(); ++pi) {
      if (ids_[pi] != id) continue;
      Plan& p = plans_[pi];
      TORCH_CHECK(outputs.size() == p.outputs.size() && keep.size() == p.keep.size(), "names for another plan");
      p.output_keys.clear();
      p.keep_keys.clear();
      for (const auto& n : outputs) p.output_keys.push_back(interned(n));
      for (const auto& n : keep) p.keep_keys.push_back(interned(n));
      return;
    }
    TORCH_CHECK(false, "no plan ", id);
  }

  // A call with the caller's keyword arguments: the outputs' dict; None where the Python path must
  // take it (a name it does not know, a missing or non-tensor argument, a scalar that is not a plain
  // finite number, no matching plan, names not given); (plan id, failed launch, status) on a failure.
  pybind11::object call(const pybind11::dict& args, bool keep) {
    PyObject* dict = args.ptr();
    const Py_ssize_t given = PyDict_Size(dict);
    Py_ssize_t found = 0;
    std::vector<at::Tensor> tensors;
    tensors.reserve(tensor_keys_.size());
    for (const auto& key : tensor_keys_) {
      PyObject* v = PyDict_GetItem(dict, key.ptr());        // borrowed
      if (v == nullptr || !THPVariable_Check(v)) return pybind11::none();
      tensors.push_back(THPVariable_Unpack(v));
      ++found;
    }
    std::vector<double> scalars(scalar_keys_.size());
    for (size_t i = 0; i < scalar_keys_.size(); ++i) {
      PyObject* v = PyDict_GetItem(dict, scalar_keys_[i].ptr());
      double x = scalar_defaults_[i];
      if (v != nullptr) {
        ++found;
        if (PyFloat_CheckExact(v)) {
          x = PyFloat_AS_DOUBLE(v);
        } else if (PyLong_CheckExact(v)) {
          x = PyLong_AsDouble(v);
          if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return pybind11::none();
          }
        } else if (THPVariable_Check(v)) {                   // one number in host memory, as .item() reads it
          const at::Tensor& t = THPVariable_Unpack(v);
          if (!t.device().is_cpu() || t.numel() != 1 || t.is_complex() || t.scalar_type() == at::kBool)
            return pybind11::none();
          x = t.item<double>();
        } else {
          return pybind11::none();                          // bool, numpy, a device tensor: Python decides
        }
      }
      if (!std::isfinite(x)) return pybind11::none();       // also: no default and not given
      scalars[i] = x;
    }
    if (found != given || tensor_keys_.empty()) return pybind11::none();
    const int64_t pi = find(tensors);
    if (pi < 0) return pybind11::none();
    const Plan& p = plans_[pi];
    const auto& keys = keep ? p.keep_keys : p.output_keys;
    const auto& which = keep ? p.keep : p.outputs;
    if (keys.size() != which.size()) return pybind11::none();
    Table table;
    const auto [failed, rc] = execute(p, tensors, scalars, current_stream(p.device), table);
    if (failed >= 0) return pybind11::make_tuple(ids_[pi], failed, rc);
    pybind11::dict out;
    for (size_t j = 0; j < which.size(); ++j)
      out[keys[j]] = pybind11::reinterpret_steal<pybind11::object>(THPVariable_Wrap(table.tensor(p, which[j])));
    return std::move(out);
  }

  int64_t size() const { return static_cast<int64_t>(plans_.size()); }

 private:
  static pybind11::object interned(const std::string& name) {
    return pybind11::reinterpret_steal<pybind11::object>(PyUnicode_InternFromString(name.c_str()));
  }

  // The newest plan whose signature the tensors match, or -1.
  int64_t find(const std::vector<at::Tensor>& tensors) const {
    for (size_t pi = 0; pi < plans_.size(); ++pi)
      if (plans_[pi].matches(tensors)) return static_cast<int64_t>(pi);
    return -1;
  }

  // Allocate the plan's buffers into `table` (after the inputs) and launch its kernels in order:
  // (index of the launch that failed or -1, its status).
  static std::pair<int64_t, int64_t> execute(const Plan& p, const std::vector<at::Tensor>& tensors,
                                             const std::vector<double>& call_scalars, int64_t stream,
                                             Table& table) {
    const size_t n = tensors.size() + p.buffers.size();
    table.tensors.reserve(n);
    table.tensors.assign(tensors.begin(), tensors.end());
    table.ptrs.reserve(n);
    for (const at::Tensor& x : tensors) table.ptrs.push_back(x.data_ptr());
    if (p.has_arena) table.arena = allocate(Buffer{at::kByte, {p.arena}}, p.device);
    char* base = p.has_arena ? static_cast<char*>(table.arena.data_ptr()) : nullptr;
    for (const Buffer& b : p.buffers) {
      if (b.offset >= 0) {
        table.tensors.emplace_back();             // a view only if keep=True asks for it
        table.ptrs.push_back(base + b.offset);
      } else {
        table.tensors.push_back(allocate(b, p.device));
        table.ptrs.push_back(table.tensors.back().data_ptr());
      }
    }
    std::vector<void*> ptrs;
    std::vector<float> scalars;
    for (size_t k = 0; k < p.launches.size(); ++k) {
      const Launch& l = p.launches[k];
      if (l.vendor) {
        const int64_t rc = vendor_gemm(p, l, table, stream);
        if (rc != 0) return {static_cast<int64_t>(k), rc};
        continue;
      }
      ptrs.assign(l.slots.size() + 1, nullptr);
      for (size_t j = 0; j < l.slots.size(); ++j)
        ptrs[j] = l.slots[j] < 0 ? nullptr : table.ptrs[l.slots[j]];
      scalars = l.scalars;
      scalars.push_back(0.0f);      // never an empty array
      for (const auto& rs : l.runtime_scalars) {
        if (rs.second < 0 || rs.second >= static_cast<int64_t>(call_scalars.size())) return {static_cast<int64_t>(k), -100};
        scalars[rs.first] = static_cast<float>(call_scalars[rs.second]);
      }
      void* ws = l.workspace > 0 ? base + l.workspace_offset : nullptr;
      int rc = l.fn(ptrs.data(), l.dims.data(), scalars.data(), reinterpret_cast<void*>(static_cast<uintptr_t>(stream)),
                    ws, static_cast<size_t>(l.workspace));
      if (rc != 0) return {static_cast<int64_t>(k), rc};
    }
    return {-1, 0};
  }

  // A vendor gemm: d = a @ b (+ c) with ATen on the table's tensors (arena buffers as views), as
  // runtime/vendor_gemm.py does; its statuses: -101 the stream is not torch's current one (where
  // ATen launches), -102 ATen refused.
  static int64_t vendor_gemm(const Plan& p, const Launch& l, const Table& table, int64_t stream) {
    if (stream != current_stream(p.device)) return -101;
    try {
      const size_t n = l.slots.size();
      at::Tensor a = table.tensor(p, l.slots[0]), b = table.tensor(p, l.slots[1]);
      at::Tensor d = table.tensor(p, l.slots[n - 1]);
      if (l.a_t) a = a.t();
      if (l.b_t) b = b.t();
      if (n == 4) {
        at::addmm_out(d, l.slots[2] == l.slots[n - 1] ? d : table.tensor(p, l.slots[2]), a, b);   // d += a @ b
      } else {
        at::mm_out(d, a, b);
      }
    } catch (const std::exception&) {
      return -102;
    }
    return 0;
  }

  static constexpr size_t kMaxPlans = 8;
  std::vector<Plan> plans_;
  std::vector<int64_t> ids_;
  int64_t next_id_ = 0;
  std::vector<pybind11::object> tensor_keys_, scalar_keys_;
  std::vector<double> scalar_defaults_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "epic's compiled call path (templates/launcher.cpp)";
  m.attr("ABI") = 4;
  pybind11::class_<Launcher>(m, "Launcher")
      .def(pybind11::init<>())
      .def("add", &Launcher::add)
      .def("run", &Launcher::run)
      .def("names", &Launcher::names)
      .def("label", &Launcher::label)
      .def("call", &Launcher::call)
      .def("__len__", &Launcher::size);
}
