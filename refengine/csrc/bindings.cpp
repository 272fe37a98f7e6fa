// The Python module of the CPU attention kernels (built by refengine/paged_kernel.py).
// Both ops release the GIL: the engine thread must not hold it while a kernel runs.
#include <torch/extension.h>

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor table,
                           torch::Tensor lens, double scale);
void paged_prefill(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor blocks, int64_t start,
                   double scale, torch::Tensor out);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention over a block pool (CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("paged_prefill", &paged_prefill, "causal prefill attention over a block pool (CPU), into out",
        py::call_guard<py::gil_scoped_release>());
}
