// The Python module of the CPU kernels (built by refengine/paged_kernel.py): the paged attention
// ops, the fused element-wise ops of fused_ops.cpp, the GGUF quantized GEMM of quant_gguf.cpp,
// the bf16 GEMM of gemm_bf16.cpp, the W8A8 activation ops of int8_act.cpp and decode_stack.cpp's
// layer loop. Every op releases the GIL: the engine thread must not hold it while a kernel runs.
#include <torch/extension.h>

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor table,
                           torch::Tensor lens, double scale, c10::optional<torch::Tensor> starts);
void paged_prefill(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor blocks, int64_t start,
                   double scale, torch::Tensor out, int64_t window);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor add_rms_norm_(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps);
void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_mul(torch::Tensor gu);
torch::Tensor gguf_dequant(torch::Tensor raw, int64_t qtype, int64_t cols);
torch::Tensor gguf_linear(torch::Tensor x, const std::vector<torch::Tensor>& raws, const std::vector<int64_t>& qtypes,
                          const std::vector<int64_t>& groups, int64_t impl);
std::vector<torch::Tensor> act_quant(torch::Tensor x, int64_t impl);
void gguf_gemm(torch::Tensor q, torch::Tensor d, torch::Tensor ds, torch::Tensor s16, torch::Tensor raw,
               int64_t qtype, torch::Tensor out, int64_t col0, int64_t impl, int64_t group);
bool gguf_has_avx2();
bool gguf_has_vnni();
std::tuple<torch::Tensor, torch::Tensor> int8_quant_rows(torch::Tensor x, int64_t qmax);
void int8_rescale(torch::Tensor y, torch::Tensor s, torch::Tensor bias, torch::Tensor out);
torch::Tensor bf16_gemm(torch::Tensor x, torch::Tensor wp, int64_t n, c10::optional<torch::Tensor> bias);
bool bf16_gemm_available();
void bind_decode_stack(pybind11::module& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  bind_decode_stack(m);
  m.def("paged_decode", &paged_decode, "paged decode attention over a block pool (CPU)", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("table"), py::arg("lens"), py::arg("scale"), py::arg("starts") = py::none(), nogil);
  m.def("paged_prefill", &paged_prefill, "causal (optionally windowed) prefill attention over a block pool (CPU), "
        "into out", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("blocks"), py::arg("start"), py::arg("scale"),
        py::arg("out"), py::arg("window") = 0, nogil);
  m.def("rms_norm", &rms_norm, "RMSNorm of float32 or bfloat16 rows (CPU)", nogil);
  m.def("add_rms_norm_", &add_rms_norm_, "x += r, then RMSNorm of x (CPU, float32 or bfloat16)", nogil);
  m.def("rope_", &rope_, "rotary embedding in place, neox layout (CPU, float32 or bfloat16)", nogil);
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused gate-up row (CPU, float32 or bfloat16)", nogil);
  m.def("gguf_dequant", &gguf_dequant, "GGUF blocks [rows, bytes] -> float32 [rows, cols] (llama.cpp's reference values)",
        py::arg("raw"), py::arg("qtype"), py::arg("cols"), nogil);
  m.def("act_quant", &act_quant, "rows of x -> int8 per 32 values with scales (q, d, ds, s16) for gguf_gemm",
        py::arg("x"), py::arg("impl") = 0, nogil);
  m.def("gguf_gemm", &gguf_gemm, "out[:, col0:col0+N] = x @ W^T, x from act_quant, W GGUF blocks [N, bytes]",
        py::arg("q"), py::arg("d"), py::arg("ds"), py::arg("s16"), py::arg("raw"), py::arg("qtype"), py::arg("out"),
        py::arg("col0") = 0, py::arg("impl") = 0, py::arg("group") = 1, nogil);
  m.def("gguf_linear", &gguf_linear, "x @ W^T for W the rows of `raws` (one format and grouping each), x quantized "
        "once (act_quant + one gguf_gemm per run)", py::arg("x"), py::arg("raws"), py::arg("qtypes"), py::arg("groups"),
        py::arg("impl") = 0, nogil);
  m.def("gguf_has_avx2", &gguf_has_avx2, "the GGUF kernels were built with AVX2 + FMA");
  m.def("gguf_has_vnni", &gguf_has_vnni, "gguf_gemm's impl 2 (AVX-512 VNNI, Q4_0 / Q4_1 / Q4_K / Q6_K) runs here");
  m.def("bf16_gemm", &bf16_gemm, "x [M, K] @ W^T for a bf16 weight blocked by refengine.linear.pack_bf16 "
        "(AVX-512-BF16; batch-invariant)", py::arg("x"), py::arg("wp"), py::arg("n"), py::arg("bias") = py::none(), nogil);
  m.def("int8_quant_rows", &int8_quant_rows, "W8A8 activations: rows -> (u8 with the zero point qmax + 1, scales)",
        py::arg("x"), py::arg("qmax"), nogil);
  m.def("int8_rescale", &int8_rescale, "out = y * s[:, None] (+ bias), rounded once to out's dtype (W8A8 output)",
        py::arg("y"), py::arg("s"), py::arg("bias"), py::arg("out"), nogil);
  m.def("bf16_gemm_available", &bf16_gemm_available, "bf16_gemm was built (the CPU has AVX-512-BF16)");
}
