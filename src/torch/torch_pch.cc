// The one source of fusedopt_torch_pch, the target that owns the precompiled <torch/torch.h> the
// libtorch-using targets share (src/torch/CMakeLists.txt: fopt_torch_pch).
