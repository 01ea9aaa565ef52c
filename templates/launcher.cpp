// epic's compiled call path (epic/runtime/fastcall.py builds it once per torch and compiler).
//
// A call of a compiled program is one Python -> C++ transition: find the bound plan whose input
// signature (dtype, device, sizes, strides) the tensors match and whose pointers are 16-byte aligned,
// allocate the plan's buffers with ATen, and call each kernel library's epic_launch through the
// function pointer the runtime registered. Anything that does not match returns "no plan", and the
// Python path validates (and reports) as before: this file never decides that a call is wrong.
// Not a Jinja template: nothing in it depends on the program.
#include <torch/extension.h>

#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

namespace {

// The C ABI of every generated kernel library (templates/*.cu.j2).
using LaunchFn = int (*)(void**, const long long*, const float*, void*, void*, size_t);

struct Launch {
  LaunchFn fn;
  std::vector<int64_t> slots;         // per pointer: index into the call's tensor table, -1 = none
  std::vector<long long> dims;
  std::vector<float> scalars;         // the fixed values; runtime scalars are written per call
  std::vector<std::pair<int64_t, int64_t>> runtime_scalars;   // (position, index of the call's scalar)
  int64_t workspace;
};

struct Input {
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
};

struct Buffer {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

struct Plan {
  c10::Device device{c10::kCPU};
  std::vector<Input> inputs;
  std::vector<Buffer> buffers;
  std::vector<Launch> launches;
  std::vector<int64_t> outputs, keep;  // indices into the table (inputs first, then buffers)

  bool matches(const std::vector<at::Tensor>& t) const {
    if (t.size() != inputs.size()) return false;
    for (size_t i = 0; i < t.size(); ++i) {
      const at::Tensor& x = t[i];
      const Input& e = inputs[i];
      if (!x.defined() || x.scalar_type() != e.dtype || x.device() != device) return false;
      if (x.sizes() != at::IntArrayRef(e.sizes) || x.strides() != at::IntArrayRef(e.strides)) return false;
      if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) return false;
    }
    return true;
  }
};

class Launcher {
 public:
  // One plan per bound signature; the newest is tried first, and at most `kMaxPlans` are kept.
  int64_t add(int64_t device_type, int64_t device_index,
              const std::vector<at::Tensor>& input_dtypes, const std::vector<std::vector<int64_t>>& input_sizes,
              const std::vector<std::vector<int64_t>>& input_strides,
              const std::vector<at::Tensor>& buffer_dtypes, const std::vector<std::vector<int64_t>>& buffer_shapes,
              const std::vector<int64_t>& fns, const std::vector<std::vector<int64_t>>& slots,
              const std::vector<std::vector<int64_t>>& dims, const std::vector<std::vector<double>>& scalars,
              const std::vector<std::vector<int64_t>>& runtime_scalars, const std::vector<int64_t>& workspaces,
              const std::vector<int64_t>& outputs, const std::vector<int64_t>& keep) {
    Plan p;
    p.device = c10::Device(static_cast<c10::DeviceType>(device_type), static_cast<c10::DeviceIndex>(device_index));
    TORCH_CHECK(input_dtypes.size() == input_sizes.size() && input_sizes.size() == input_strides.size());
    for (size_t i = 0; i < input_dtypes.size(); ++i)
      p.inputs.push_back({input_dtypes[i].scalar_type(), input_sizes[i], input_strides[i]});
    TORCH_CHECK(buffer_dtypes.size() == buffer_shapes.size());
    for (size_t i = 0; i < buffer_dtypes.size(); ++i)
      p.buffers.push_back({buffer_dtypes[i].scalar_type(), buffer_shapes[i]});
    const int64_t table = static_cast<int64_t>(p.inputs.size() + p.buffers.size());
    TORCH_CHECK(fns.size() == slots.size() && slots.size() == dims.size() && dims.size() == scalars.size() &&
                scalars.size() == runtime_scalars.size() && runtime_scalars.size() == workspaces.size());
    for (size_t k = 0; k < fns.size(); ++k) {
      Launch l;
      l.fn = reinterpret_cast<LaunchFn>(static_cast<uintptr_t>(fns[k]));
      TORCH_CHECK(l.fn != nullptr, "a null launch function");
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
    for (size_t pi = 0; pi < plans_.size(); ++pi) {
      const Plan& p = plans_[pi];
      if (!p.matches(tensors)) continue;
      std::vector<at::Tensor> table(tensors);
      table.reserve(tensors.size() + p.buffers.size());
      for (const Buffer& b : p.buffers)
        table.push_back(at::empty(b.shape, at::TensorOptions().dtype(b.dtype).device(p.device)));
      std::vector<void*> ptrs;
      std::vector<float> scalars;
      for (size_t k = 0; k < p.launches.size(); ++k) {
        const Launch& l = p.launches[k];
        ptrs.assign(l.slots.size() + 1, nullptr);
        for (size_t j = 0; j < l.slots.size(); ++j)
          ptrs[j] = l.slots[j] < 0 ? nullptr : table[l.slots[j]].data_ptr();
        scalars = l.scalars;
        scalars.push_back(0.0f);      // never an empty array
        for (const auto& rs : l.runtime_scalars) {
          if (rs.second < 0 || rs.second >= static_cast<int64_t>(call_scalars.size()))
            return {ids_[pi], static_cast<int64_t>(k), -100, {}};
          scalars[rs.first] = static_cast<float>(call_scalars[rs.second]);
        }
        at::Tensor ws;
        if (l.workspace > 0) ws = at::empty({l.workspace}, at::TensorOptions().dtype(at::kByte).device(p.device));
        int rc = l.fn(ptrs.data(), l.dims.data(), scalars.data(), reinterpret_cast<void*>(static_cast<uintptr_t>(stream)),
                      l.workspace > 0 ? ws.data_ptr() : nullptr, static_cast<size_t>(l.workspace));
        if (rc != 0) return {ids_[pi], static_cast<int64_t>(k), rc, {}};
      }
      std::vector<at::Tensor> out;
      for (int64_t i : keep ? p.keep : p.outputs) out.push_back(table[i]);
      return {ids_[pi], -1, 0, std::move(out)};
    }
    return {-1, -1, 0, {}};
  }

  int64_t size() const { return static_cast<int64_t>(plans_.size()); }

 private:
  static constexpr size_t kMaxPlans = 8;
  std::vector<Plan> plans_;
  std::vector<int64_t> ids_;
  int64_t next_id_ = 0;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "epic's compiled call path (templates/launcher.cpp)";
  m.attr("ABI") = 1;
  pybind11::class_<Launcher>(m, "Launcher")
      .def(pybind11::init<>())
      .def("add", &Launcher::add)
      .def("run", &Launcher::run)
      .def("__len__", &Launcher::size);
}
