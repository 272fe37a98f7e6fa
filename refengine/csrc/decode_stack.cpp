// The decoder layers of one pure-decode step in one call (refengine/decode_stack.py decides when).
//
// DecodeStack holds, per layer, the two RMSNorm weights, the four linears (fused q/k/v, o, fused
// gate/up, down; each a bf16 GEMM over pack_bf16's layout or a GGUF GEMM over quantized rows) and
// the layer's dense K and V pools [blocks, block_size, kv_heads, dims]. run(h [T, hidden], cos, sin
// [T, 1, d], slots [T], table [T, max_blocks], lens [T], starts) runs every layer on T decode rows
// (one query per sequence, rows in sequence order) and returns the new residual stream [T, hidden].
//
// Why: at one or a few rows a SmolLM2 step is ~0.7k small kernel calls, and the Python between
// them (module calls, views, checks) was ~1.2 ms of a ~6 ms Q4_1 step, with the second OpenMP
// thread idle through it. Here the same kernels run in the same order on the same operands as
// LlamaLayer.forward with CppOps and a plain paged cache, so the results are bit-equal (tests:
// tests/refengine/test_decode_stack.py); the GIL is released for the whole stack.
#include <torch/extension.h>

#include <vector>

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor table,
                           torch::Tensor lens, double scale, c10::optional<torch::Tensor> starts);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor add_rms_norm_(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps);
void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_mul(torch::Tensor gu);
torch::Tensor gguf_linear(torch::Tensor x, const std::vector<torch::Tensor>& raws, const std::vector<int64_t>& qtypes,
                          const std::vector<int64_t>& groups, int64_t impl);
torch::Tensor bf16_gemm(torch::Tensor x, torch::Tensor wp, int64_t n, c10::optional<torch::Tensor> bias);

namespace {

// One linear without a bias: kind 0 = bf16_gemm over `packed` (n outputs), 1 = gguf_linear over `raws`.
struct StackLinear {
  int64_t kind = 0;
  torch::Tensor packed;
  int64_t n = 0;
  std::vector<torch::Tensor> raws;
  std::vector<int64_t> qtypes, groups;
  int64_t impl = 0;

  torch::Tensor operator()(const torch::Tensor& x) const {
    if (kind == 0) return bf16_gemm(x.contiguous(), packed, n, c10::nullopt);
    torch::Tensor out = gguf_linear(x, raws, qtypes, groups, impl);
    return out.scalar_type() == x.scalar_type() ? out : out.to(x.scalar_type());
  }
};

struct StackLayer {
  torch::Tensor ln1, ln2, k_pool, v_pool;
  StackLinear qkv, o, gate_up, down;
};

}  // namespace

class DecodeStack {
 public:
  // nq / nk: q's and k's widths in the fused projection (heads x head_dim); v follows them.
  DecodeStack(int64_t nq, int64_t nk, int64_t head_dim, double scale, double eps)
      : nq_(nq), nk_(nk), d_(head_dim), scale_(scale), eps_(eps) {}

  void add_bf16_linear(torch::Tensor packed, int64_t n) {
    StackLinear l;
    l.kind = 0;
    l.packed = packed;
    l.n = n;
    pending_.push_back(std::move(l));
  }

  void add_gguf_linear(std::vector<torch::Tensor> raws, std::vector<int64_t> qtypes, std::vector<int64_t> groups,
                       int64_t impl) {
    StackLinear l;
    l.kind = 1;
    l.raws = std::move(raws);
    l.qtypes = std::move(qtypes);
    l.groups = std::move(groups);
    l.impl = impl;
    pending_.push_back(std::move(l));
  }

  // Takes the four linears added since the last layer: q/k/v, o, gate/up, down.
  void add_layer(torch::Tensor ln1, torch::Tensor ln2, torch::Tensor k_pool, torch::Tensor v_pool) {
    TORCH_CHECK(pending_.size() == 4, "DecodeStack.add_layer: expected 4 linears, got ", pending_.size());
    TORCH_CHECK(k_pool.dim() == 4 && v_pool.dim() == 4 && k_pool.size(3) == d_ && k_pool.is_contiguous() &&
                    v_pool.is_contiguous(),
                "DecodeStack.add_layer: contiguous pools [blocks, block_size, kv_heads, dims]");
    layers_.push_back({ln1, ln2, k_pool, v_pool, pending_[0], pending_[1], pending_[2], pending_[3]});
    pending_.clear();
  }

  torch::Tensor run(torch::Tensor h, torch::Tensor cos, torch::Tensor sin, torch::Tensor slots, torch::Tensor table,
                    torch::Tensor lens, c10::optional<torch::Tensor> starts) const {
    const int64_t T = h.size(0), H = nq_ / d_;
    for (const StackLayer& L : layers_) {
      const int64_t kvh = L.k_pool.size(2), dv = L.v_pool.size(3);
      torch::Tensor qkv = L.qkv(rms_norm(h, L.ln1, eps_));                  // [T, nq + nk + nv]
      torch::Tensor qk = qkv.narrow(1, 0, nq_ + nk_).view({T, -1, d_});     // Q's and K's heads, one RoPE call
      rope_(qk, cos, sin);
      torch::Tensor k = qk.narrow(1, H, nk_ / d_);                          // [T, kvh, d]
      torch::Tensor v = qkv.narrow(1, nq_ + nk_, kvh * dv).reshape({T, kvh, dv});
      L.k_pool.view({-1, kvh, d_}).index_copy_(0, slots, k.to(L.k_pool.scalar_type()));
      L.v_pool.view({-1, kvh, dv}).index_copy_(0, slots, v.to(L.v_pool.scalar_type()));
      // the query heads sharing a KV head as that head's rows: [T, kvh, H / kvh, d]
      torch::Tensor qd = qk.narrow(1, 0, H).contiguous().view({T, kvh, H / kvh, d_});
      torch::Tensor a = paged_decode(qd, L.k_pool, L.v_pool, table, lens, scale_, starts);
      if (h.scalar_type() != at::kFloat) a = a.to(h.scalar_type());
      torch::Tensor r = L.o(a.reshape({T, -1}));
      torch::Tensor x = add_rms_norm_(r, h, L.ln2, eps_);                   // r += h; x = norm(r)
      h = r + L.down(silu_mul(L.gate_up(x)));
    }
    return h;
  }

 private:
  int64_t nq_, nk_, d_;
  double scale_, eps_;
  std::vector<StackLayer> layers_;
  std::vector<StackLinear> pending_;
};

void bind_decode_stack(pybind11::module& m) {
  namespace py = pybind11;
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  py::class_<DecodeStack>(m, "DecodeStack", "the decoder layers of a pure-decode step in one call")
      .def(py::init<int64_t, int64_t, int64_t, double, double>(), py::arg("nq"), py::arg("nk"), py::arg("head_dim"),
           py::arg("scale"), py::arg("eps"))
      .def("add_bf16_linear", &DecodeStack::add_bf16_linear)
      .def("add_gguf_linear", &DecodeStack::add_gguf_linear)
      .def("add_layer", &DecodeStack::add_layer)
      .def("run", &DecodeStack::run, nogil, py::arg("h"), py::arg("cos"), py::arg("sin"), py::arg("slots"),
           py::arg("table"), py::arg("lens"), py::arg("starts") = py::none());
}
